"""The merge bench's inputs (issues 5 §5, 17 §1, 37 §1), shared by ``bench.merge_bench`` and the
tests that merge its shapes: the key shapes (:data:`SHAPES`), the generator of sorted input files
of a shape (:func:`generate`), the ``--shapes`` parser, the pyarrow-only reference merge
(:func:`pyarrow_sort`, one of the bench's peers) and the check that two outputs hold the same
entries. The tests import them from here, never from ``bench`` (the benches use the test
harness, not the other way round; an import contract says so)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kompaktor.files.sortedfile import SCHEMA, write_sorted
from kompaktor.files.storage import Storage
from kompaktor.model.keys import ARROW_SORT_KEYS


def _binary(values: np.ndarray, width: int) -> pa.Array:
    """Fixed-width big-endian bytes of unsigned ints, as a binary array (any byte values)."""
    raw = values.astype(f">u{width}").tobytes()
    fsb = pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(values), [None, pa.py_buffer(raw)])
    return fsb.cast(pa.binary())


def _row_keys(values: np.ndarray, width: int) -> pa.Array:
    """Row keys of ``width`` bytes (>= 8): a fixed prefix, then the value big-endian."""
    if width <= 8:
        return _binary(values, width)
    raw = np.zeros((len(values), width), dtype=np.uint8)
    raw[:, : width - 8] = 0x6B  # 'k'
    raw[:, width - 8 :] = values.astype(">u8").view(np.uint8).reshape(-1, 8)
    fsb = pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(values), [None, pa.py_buffer(raw.tobytes())])
    return fsb.cast(pa.binary())


_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_DIGITS = np.frombuffer(b"0123456789", dtype=np.uint8)


def _fixed_rows(raw: np.ndarray) -> pa.Array:
    """A (n, width) uint8 matrix as a binary array of its rows."""
    n, width = raw.shape
    buf = pa.py_buffer(np.ascontiguousarray(raw).tobytes())
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), n, [None, buf]).cast(pa.binary())


def _scrambled(rows: np.ndarray) -> np.ndarray:
    """A row number mixed into 64 bits (a bijection: distinct rows stay distinct)."""
    with np.errstate(over="ignore"):
        x = rows.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        return x ^ (x >> np.uint64(29))


def _decimal(values: np.ndarray, digits: int) -> np.ndarray:
    """Zero-padded decimal digits of ``values``, as an (n, digits) uint8 matrix."""
    powers = 10 ** np.arange(digits - 1, -1, -1, dtype=np.int64)
    return _DIGITS[(values.astype(np.int64)[:, None] // powers) % 10]


def format_rows(rows: np.ndarray, row_format: str, width: int) -> pa.Array:
    """Row numbers as row keys: ``bin`` (``width`` bytes: :func:`_row_keys`), ``hex`` (16 hex
    digits of the scrambled row number), ``sensor`` (``sensor/NNNNNN/HHMMSS``: 86,400 seconds
    per sensor, so neighbouring rows share 14 of their 20 bytes), ``uuid`` (a UUID-shaped string
    of the scrambled row number, 36 bytes)."""
    if row_format == "bin":
        return _row_keys(rows, width)
    if row_format == "hex":
        x = _scrambled(rows)
        nib = (x[:, None] >> (np.arange(60, -4, -4, dtype=np.uint64))) & np.uint64(15)
        return _fixed_rows(_HEX[nib.astype(np.int64)])
    if row_format == "sensor":
        r = rows.astype(np.int64)
        sec = r % 86_400
        hhmmss = (sec // 3600) * 10_000 + (sec // 60 % 60) * 100 + sec % 60
        parts = [np.frombuffer(b"sensor/", np.uint8), _decimal(r // 86_400 % 1_000_000, 6), b"/", _decimal(hhmmss, 6)]
        return _fixed_rows(_concat_columns(parts, len(r)))
    if row_format == "uuid":
        x, y = _scrambled(rows), _scrambled(rows + np.uint64(1) if rows.dtype == np.uint64 else rows + 1)
        hexes = [(v[:, None] >> (np.arange(60, -4, -4, dtype=np.uint64))) & np.uint64(15) for v in (x, y)]
        h = _HEX[np.concatenate(hexes, axis=1).astype(np.int64)]
        dash = np.full((len(rows), 1), ord("-"), np.uint8)
        return _fixed_rows(
            np.concatenate([h[:, :8], dash, h[:, 8:12], dash, h[:, 12:16], dash, h[:, 16:20], dash, h[:, 20:]], axis=1)
        )
    raise ValueError(f"unknown row format {row_format!r}")


def _concat_columns(parts: list, n: int) -> np.ndarray:
    cols = [
        np.broadcast_to(
            np.frombuffer(p, np.uint8) if isinstance(p, bytes) else p,
            (n, len(p) if isinstance(p, bytes) else p.shape[-1]),
        )
        for p in parts
    ]
    return np.concatenate(cols, axis=1)


@dataclass(frozen=True)
class Shape:
    """A key shape (issue 37 §1): how the inputs' keys, values and overlaps look."""

    name: str
    row_bytes: int = 16
    #: column qualifiers per row (x 2 families: entries per row = 2 x quals)
    quals: int = 2
    value_bytes: int = 64
    #: fraction of each later file's entries that overwrite an older file's key
    overwrite: float = 0.10
    #: fraction of each later file's entries that are delete markers of older keys
    deletes: float = 0.02
    #: keys drawn from entries / versions distinct keys: each key has ~versions versions
    versions: int = 1
    #: each file holds its own contiguous key range (no overlaps, no overwrites)
    disjoint: bool = False
    #: the shape runs on entries // entries_div (large values: the same order of bytes)
    entries_div: int = 1
    #: column families per row (entries per row = families x quals)
    families: int = 2
    #: how a row number is spelt (:func:`format_rows`)
    row_format: str = "bin"
    #: keys are consecutive numbers (every row holds most of its families x quals entries, as
    #: time series and documents do), not scattered ones (a row with one or two entries)
    dense: bool = False
    #: append-mostly: each file holds the next stretch of keys, sharing this fraction of its
    #: entries with the stretch of the file before it (newer versions and deletes of its keys)
    edge_overlap: float = 0.0
    #: the layout the shape was reported in (issue 46), the bench's default for it
    layout: str | None = None


#: the key shapes (issue 37 §1); ``base`` is the bench's original shape
SHAPES: dict[str, Shape] = {
    s.name: s
    for s in (
        Shape("base"),
        Shape("row4", row_bytes=4),
        Shape("row200", row_bytes=200),
        Shape("fewcq", quals=1),
        Shape("manycq", quals=64),
        Shape("value0", value_bytes=0),
        Shape("value4k", value_bytes=4096, entries_div=32),
        Shape("dups", overwrite=0.6),
        Shape("versions", versions=16, overwrite=0.0, deletes=0.0),
        Shape("deletes", deletes=0.4),
        Shape("disjoint", overwrite=0.0, deletes=0.0, disjoint=True),
        # issue 46: shapes the bench did not generate
        Shape("hexonerg", row_format="hex", families=4, quals=16, dense=True, layout="one"),
        Shape("timeseries", row_format="sensor", families=1, quals=24, value_bytes=8, dense=True),
        Shape("edges", overwrite=0.0, deletes=0.0, dense=True, edge_overlap=0.10, layout="small"),
        Shape("uuiddocs", row_format="uuid", families=1, quals=4, value_bytes=200, dense=True),
    )
}


def make_table(
    ids: np.ndarray,
    ts: np.ndarray,
    deleted: np.ndarray,
    rng: np.random.Generator,
    value_bytes: int = 40,
    row_bytes: int = 8,
    quals: int = 2,
    families: int = 2,
    row_format: str = "bin",
) -> pa.Table:
    """Entries for column-key ids: row = id // (``families`` x ``quals``) (``row_bytes``, as
    ``row_format`` spells it), cf = ``families`` families, cq = ``quals`` qualifiers."""
    n = len(ids)
    per_row = families * quals
    row = format_rows(ids // per_row, row_format, row_bytes)
    fnames = np.array([b"f%d" % f for f in range(families)], dtype=object)
    fam = pa.array(fnames[((ids % per_row) // quals).astype(np.int64)], pa.binary())
    qnames = np.array([b"q%d" % q for q in range(quals)], dtype=object)
    qual = pa.array(qnames[(ids % quals).astype(np.int64)], pa.binary())
    vis = pa.array(np.where((ids % 3) == 0, b"", b"A&B"), pa.binary())
    vals = rng.integers(0, 256, size=n * value_bytes, dtype=np.uint8).tobytes()
    if value_bytes:
        value = pa.FixedSizeBinaryArray.from_buffers(pa.binary(value_bytes), n, [None, pa.py_buffer(vals)])
        value = value.cast(pa.binary())
    else:
        value = pa.array(np.full(n, b"", dtype=object), pa.binary())
    value = pc.if_else(pa.array(deleted), pa.scalar(b"", pa.binary()), value)
    t = pa.Table.from_arrays([row, fam, qual, vis, pa.array(ts, pa.int64()), pa.array(deleted), value], schema=SCHEMA)
    return t.sort_by(ARROW_SORT_KEYS)


def generate(
    storage: Storage,
    entries: int,
    files: int = 8,
    seed: int = 7,
    *,
    row_bytes: int = 8,
    value_bytes: int = 40,
    shape: Shape | None = None,
) -> list[str]:
    """Write ``files`` sorted inputs holding ``entries`` in total; return their paths, oldest first."""
    shape = shape or Shape("custom", row_bytes=row_bytes, value_bytes=value_bytes)
    rng = np.random.default_rng(seed)
    per = entries // files
    next_id = 0
    n_keys = max(1, entries // shape.versions) if shape.versions > 1 else entries * 2
    if shape.edge_overlap:
        return _generate_edges(storage, entries, files, rng, shape)
    universe = rng.permutation(np.arange(n_keys, dtype=np.uint64))
    if not shape.dense:
        universe = universe * np.uint64(2654435761) % np.uint64(2**61)
    if shape.disjoint:
        universe = np.sort(universe[:entries])
    paths: list[str] = []
    for f in range(files):
        n = per if f < files - 1 else entries - per * (files - 1)
        if shape.disjoint:
            ids, deleted = universe[f * per : f * per + n], np.zeros(n, dtype=bool)
        elif shape.versions > 1:  # every key in many files (and twice in some): draws from few keys
            ids = rng.choice(universe, size=n, replace=True)
            deleted = np.zeros(n, dtype=bool)
        else:
            n_over = int(n * shape.overwrite) if f else 0
            n_del = int(n * shape.deletes) if f else 0
            n_new = n - n_over - n_del
            new = universe[next_id : next_id + n_new]
            next_id += n_new
            old = universe[: next_id - n_new] if f else new
            picks = rng.choice(old, size=n_over + n_del, replace=True) if f else np.array([], np.uint64)
            ids = np.concatenate([new, picks])
            deleted = np.zeros(len(ids), dtype=bool)
            deleted[n_new + n_over :] = True
        if shape.versions > 1:  # distinct in a file: a key drawn twice is two versions, no tie
            ts = (f + 1) * 10_000_000 + rng.permutation(len(ids))
        else:
            ts = (f + 1) * 10_000_000 + rng.integers(0, 1_000_000, size=len(ids))
        paths.append(_write_file(storage, shape, f, ids, ts, deleted, rng))
    return paths


def _write_file(
    storage: Storage,
    shape: Shape,
    f: int,
    ids: np.ndarray,
    ts: np.ndarray,
    deleted: np.ndarray,
    rng: np.random.Generator,
) -> str:
    path = f"bench/{shape.name}/F{f:06d}.parquet"
    storage.ensure_dir(f"bench/{shape.name}")
    table = make_table(
        ids, ts, deleted, rng, shape.value_bytes, shape.row_bytes, shape.quals, shape.families, shape.row_format
    )
    write_sorted(storage, path, table)
    return path


def _generate_edges(storage: Storage, entries: int, files: int, rng: np.random.Generator, shape: Shape) -> list[str]:
    """Append-mostly files: file f holds the keys from f x per x (1 - overlap) on, ``per`` of
    them, so it shares ``overlap`` of its entries with the end of the file before it (newer
    versions of those keys, a fifth of them delete markers)."""
    per = entries // files
    step = max(1, int(per * (1 - shape.edge_overlap)))
    paths: list[str] = []
    for f in range(files):
        n = per if f < files - 1 else entries - per * (files - 1)
        ids = np.arange(f * step, f * step + n, dtype=np.uint64)
        deleted = np.zeros(n, dtype=bool)
        if f:
            shared = per - step
            deleted[:shared] = rng.random(shared) < 0.2
        ts = (f + 1) * 10_000_000 + rng.integers(0, 1_000_000, size=n)
        paths.append(_write_file(storage, shape, f, ids, ts, deleted, rng))
    return paths


def parse_shapes(text: str) -> list[Shape]:
    """The shapes a ``--shapes`` value names (``all``: every one); a clear error for a typo."""
    names = list(SHAPES) if text.strip() == "all" else [x.strip() for x in text.split(",") if x.strip()]
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        raise SystemExit(f"bench.merge_bench: unknown shape(s) {', '.join(unknown)}; known: {', '.join(SHAPES)}, all")
    return [SHAPES[n] for n in names]


def pyarrow_sort(storage: Storage, inputs: list[str], out: str) -> int:
    """pyarrow alone: read all, concat, sort, newest-version + delete suppression, write. Its own
    sort on every shape (not the engine's merge, which skips the sort where inputs do not overlap)."""
    from kompaktor.files.arrowstack import MERGE_SORT_KEYS, SOURCE, apply_stack_table

    tables = [pq.read_table(storage.path(p)) for p in inputs]
    table = _large_if_needed(
        pa.concat_tables(
            t.append_column(SOURCE, pa.array(np.full(t.num_rows, i, dtype=np.int32))) for i, t in enumerate(tables)
        )
    ).combine_chunks()
    table = table.take(pc.sort_indices(table, sort_keys=MERGE_SORT_KEYS))
    merged = apply_stack_table(table).drop_columns([SOURCE])
    pq.write_table(merged, storage.path(out), compression="zstd", row_group_size=128 * 1024)
    return merged.num_rows


def _large_if_needed(table: pa.Table) -> pa.Table:
    """``table`` with its binary columns of 2 GiB or more as ``large_binary``: one array of them
    (combined to be sorted and taken) needs 64-bit offsets (``row200`` at 16M entries)."""
    big = [
        i
        for i, f in enumerate(table.schema)
        if pa.types.is_binary(f.type) and table.column(i).nbytes >= (1 << 31) - (1 << 26)
    ]
    for i in big:
        table = table.set_column(
            i, table.schema.field(i).with_type(pa.large_binary()), table.column(i).cast(pa.large_binary())
        )
    return table


def same_entries(storage: Storage, a: str, b: str) -> bool:
    """Whether the files ``a`` and ``b`` hold the same entries, in the same order."""
    ta, tb = pq.read_table(storage.path(a)), pq.read_table(storage.path(b))
    return ta.select(SCHEMA.names).cast(SCHEMA).equals(tb.select(SCHEMA.names).cast(SCHEMA))
