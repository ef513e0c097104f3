"""Sorted files: Parquet with one fixed schema, written atomically, read by row range.

Schema (users can write it themselves for bulk import): ``row``, ``cf``, ``cq``, ``vis``
(binary), ``ts`` (int64), ``deleted`` (bool), ``value`` (binary); rows in key order
(:mod:`kompaktor.model.keys`). The footer's key/value metadata records ``kompaktor.entries``,
``kompaktor.deletes``, ``kompaktor.first`` and ``kompaktor.last`` (hex keys, JSON).

File names tell where a file came from, as Accumulo's prefixes do: ``F`` flush (ingest),
``I`` bulk import, ``C`` partial compaction, ``A`` full compaction (all of a tablet's files).
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kompaktor.files.storage import Storage
from kompaktor.model.errors import BadFileError, UnsortedError
from kompaktor.model.keys import ARROW_SORT_KEYS, Entry, SortKey, sort_key
from kompaktor.model.tablet import TS_MAX, FileInfo

_FIELDS: list[pa.Field[Any]] = [
    pa.field("row", pa.binary(), nullable=False),
    pa.field("cf", pa.binary(), nullable=False),
    pa.field("cq", pa.binary(), nullable=False),
    pa.field("vis", pa.binary(), nullable=False),
    pa.field("ts", pa.int64(), nullable=False),
    pa.field("deleted", pa.bool_(), nullable=False),
    pa.field("value", pa.binary(), nullable=False),
]
SCHEMA = pa.schema(_FIELDS)
COLUMNS = SCHEMA.names
ROW_GROUP_SIZE = 128 * 1024
#: how every sorted file is encoded (SortedFileWriter, encode_table): zstd; dictionary pages for
#: the key columns only (rows repeat per qualifier, families, qualifiers and visibilities are
#: few). Timestamps and values are mostly distinct: a dictionary of them was built for each
#: column chunk until it outgrew its page limit, then dropped for plain encoding — 10 to 20% of
#: the encode's CPU for nothing, and larger files (issue 46)
WRITER_OPTIONS: dict[str, Any] = {"compression": "zstd", "use_dictionary": ["row", "cf", "cq", "vis"]}


def entries_to_table(entries: Iterable[Entry]) -> pa.Table:
    cols: list[list[object]] = [[] for _ in COLUMNS]
    for e in entries:
        for i, v in enumerate(e):
            cols[i].append(v)
    return pa.Table.from_arrays([pa.array(c, type=f.type) for c, f in zip(cols, SCHEMA, strict=True)], schema=SCHEMA)


def table_to_entries(table: pa.Table) -> Iterator[Entry]:
    cols = [table.column(n).to_pylist() for n in COLUMNS]
    for t in zip(*cols, strict=True):
        yield Entry(*t)


def conform(table: pa.Table, source: str = "input") -> pa.Table:
    """Return ``table`` in the file schema, or raise :class:`BadFileError` naming what is wrong."""
    names = table.schema.names
    missing = [n for n in COLUMNS if n not in names]
    extra = [n for n in names if n not in COLUMNS]
    if missing or extra:
        raise BadFileError(
            f"{source}: wrong schema: missing columns {missing or 'none'}, unexpected {extra or 'none'}; "
            f"expected {COLUMNS}"
        )
    table = table.select(COLUMNS)
    for f in SCHEMA:
        got = table.schema.field(f.name).type
        ok = got == f.type or (f.type == pa.binary() and got in (pa.large_binary(), pa.string(), pa.large_string()))
        if not ok:
            raise BadFileError(f"{source}: column {f.name!r} has type {got}, expected {f.type}")
        if table.column(f.name).null_count:
            raise BadFileError(f"{source}: column {f.name!r} has null values")
    return table.cast(SCHEMA)


def _key_at(table: pa.Table, i: int) -> SortKey:
    return sort_key(Entry(*(table.column(n)[i].as_py() for n in COLUMNS)))


def show_key(k: SortKey) -> str:
    """A sort_key tuple as a person reads it (timestamp and delete flag as stored)."""
    return f"(row={k[0]!r}, cf={k[1]!r}, cq={k[2]!r}, vis={k[3]!r}, ts={-k[4]}, deleted={not k[5]})"


def check_sorted(table: pa.Table, source: str = "input", offset: int = 0) -> None:
    """Raise :class:`UnsortedError` at the first row out of key order (``offset``: rows of the
    file before this table, so the message gives the row number in the file)."""
    n = table.num_rows
    if n < 2:
        return
    idx = pc.sort_indices(table, sort_keys=ARROW_SORT_KEYS)
    # sort_indices is stable: already-sorted input gives exactly 0..n-1.
    expected = pa.array(range(n), type=pa.uint64())
    if idx.equals(expected):
        return
    # The first position where the sorted order differs is not always the first descent
    # (it can be where a later, smaller key belongs); find the first pair out of order.
    start = max(pc.index(pc.not_equal(idx, expected), True).as_py() - 1, 0)
    prev = _key_at(table, start)
    for i in range(start + 1, n):
        cur = _key_at(table, i)
        if cur < prev:
            raise UnsortedError(
                f"{source}: entries are not in key order at row {offset + i}: {show_key(prev)} then {show_key(cur)}"
            )
        prev = cur
    raise UnsortedError(f"{source}: entries are not in key order")  # not reached


def ts_bounds(table: pa.Table) -> tuple[int, int | None]:
    """The oldest put's timestamp (:data:`TS_MAX` when there is no put) and the newest delete
    marker's (None when there is none) of a conformed table."""
    deleted = table.column("deleted")
    puts = pc.filter(table.column("ts"), pc.invert(deleted))
    dels = pc.filter(table.column("ts"), deleted)
    put_min = pc.min(puts).as_py() if len(puts) else None
    del_max = pc.max(dels).as_py() if len(dels) else None
    return (TS_MAX if put_min is None else int(put_min)), (None if del_max is None else int(del_max))


def _metadata(entries: int, deletes: int, first: SortKey | None, last: SortKey | None) -> dict[bytes, bytes]:
    def enc(k: SortKey | None) -> str | None:
        if k is None:
            return None
        return json.dumps([k[0].hex(), k[1].hex(), k[2].hex(), k[3].hex(), -k[4], not k[5]])

    return {
        b"kompaktor.entries": str(entries).encode(),
        b"kompaktor.deletes": str(deletes).encode(),
        b"kompaktor.first": (enc(first) or "null").encode(),
        b"kompaktor.last": (enc(last) or "null").encode(),
    }


def _decode_key(text: bytes | None) -> SortKey | None:
    if text is None or text == b"null":
        return None
    r, cf, cq, vis, ts, deleted = json.loads(text)
    return sort_key(Entry(bytes.fromhex(r), bytes.fromhex(cf), bytes.fromhex(cq), bytes.fromhex(vis), ts, deleted, b""))


class SortedFileWriter:
    """Streams batches into a Parquet file under a temporary name; :meth:`commit` makes it
    visible under its final name. Refuses out-of-order input (also across batches) and never
    leaves a partial file under the final name."""

    def __init__(
        self, storage: Storage, rel_path: str, *, tmp_tag: str | None = None, source: str | None = None
    ) -> None:
        self.storage = storage
        self.rel_path = rel_path
        self.source = source or rel_path  # what error messages name (e.g. the imported file)
        self.tmp_rel = storage.staging_name(rel_path, tmp_tag)
        storage.ensure_dir(posixpath.dirname(rel_path))
        self._sink = storage.open_output(self.tmp_rel)
        self._writer = pq.ParquetWriter(self._sink, SCHEMA, **WRITER_OPTIONS)
        self.entries = 0
        self.deletes = 0
        self.first: SortKey | None = None
        self.last: SortKey | None = None
        self.put_min: int = TS_MAX  # the oldest put so far (TS_MAX: none yet)
        self.del_max: int | None = None  # the newest delete marker so far
        self._closed = False

    def write_table(self, table: pa.Table, *, checked: bool = False) -> None:
        table = conform(table, self.source)
        if table.num_rows == 0:
            return
        if not checked:
            check_sorted(table, self.source, self.entries)
        first, last = _key_at(table, 0), _key_at(table, table.num_rows - 1)
        if self.last is not None and first < self.last:
            raise UnsortedError(
                f"{self.source}: entries are not in key order at row {self.entries}: "
                f"{show_key(self.last)} then {show_key(first)}"
            )
        self._writer.write_table(table, row_group_size=ROW_GROUP_SIZE)
        self.entries += table.num_rows
        self.deletes += int(pc.sum(table.column("deleted").cast(pa.int64())).as_py() or 0)
        put_min, del_max = ts_bounds(table)
        self.put_min = min(self.put_min, put_min)
        if del_max is not None:
            self.del_max = del_max if self.del_max is None else max(self.del_max, del_max)
        if self.first is None:
            self.first = first
        self.last = last

    def write_entries(self, entries: Iterable[Entry]) -> None:
        self.write_table(entries_to_table(entries))

    def commit(self, extra_metadata: dict[bytes, bytes] | None = None) -> FileInfo:
        """Close the file and move it to its final name; return what the metadata records.
        ``extra_metadata`` is added to the footer's key/value metadata."""
        info = self.finish(extra_metadata)
        self.storage.publish(self.tmp_rel, self.rel_path)
        return info

    def finish(self, extra_metadata: dict[bytes, bytes] | None = None) -> FileInfo:
        """Close the file under its staging name (:attr:`tmp_rel`) without publishing it: a Spark
        task's file, which only the driver's commit publishes (docs/spark.md, "Writing")."""
        self._writer.add_key_value_metadata(
            # pyarrow-stubs: dict[str, str], but pyarrow takes bytes keys and values as well
            {**(extra_metadata or {}), **_metadata(self.entries, self.deletes, self.first, self.last)}  # type: ignore[dict-item]
        )
        self._writer.close()
        # the size as written, not read back after publishing: once visible, the file may be
        # consumed and deleted at once (a Spark part by the driver), and on an object store a
        # read-back is one more request
        size = int(self._sink.tell())
        self._sink.close()
        self._closed = True
        return FileInfo(
            self.rel_path, size, self.entries, self.deletes, self.first, self.last, self.put_min, self.del_max
        )

    def position(self) -> int:
        """Bytes written so far (progress reports)."""
        try:
            return int(self._sink.tell())
        except Exception:
            return 0

    def abort(self) -> None:
        if not self._closed:
            try:
                self._writer.close()
                self._sink.close()
            except Exception:
                pass
            self._closed = True
        self.storage.delete(self.tmp_rel)

    def __enter__(self) -> SortedFileWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not None:
            self.abort()


class EncodedRange(NamedTuple):
    """One table encoded as a Parquet file in memory, and what its footer metadata would say."""

    data: pa.Buffer
    entries: int
    deletes: int
    first: SortKey | None
    last: SortKey | None


def count_deletes(table: pa.Table) -> int:
    """The delete markers among ``table``'s entries (one vectorized pass over its ``deleted`` column)."""
    return int(pc.sum(table.column("deleted").cast(pa.int64())).as_py() or 0) if table.num_rows else 0


#: a merged part's footer: the delete markers among the entries it read (what the merge dropped is
#: these minus the part's own ``kompaktor.deletes``)
DELETES_READ = b"kompaktor.deletes_read"


def add_deletes_read(total: int | None, part_meta: dict[bytes, bytes]) -> int | None:
    """``total`` plus the delete markers a part's range read (its footer's :data:`DELETES_READ`);
    None once a part does not say (written by an earlier version)."""
    d = part_meta.get(DELETES_READ)
    return None if total is None or d is None else total + int(d)


def encode_table(table: pa.Table, extra_metadata: dict[bytes, bytes] | None = None) -> EncodedRange:
    """``table`` (sorted: not checked) as a whole Parquet file in memory: the very bytes
    ``SortedFileWriter`` writes for it in one ``write_table`` call and ``commit(extra_metadata)``.
    Runs without the GIL for the most part, so ranges can be encoded on parallel threads, then
    written (:func:`write_encoded`) or spliced (:class:`~kompaktor.files.parquetconcat.SpliceWriter`)."""
    table = conform(table)
    n = table.num_rows
    deletes = int(pc.sum(table.column("deleted").cast(pa.int64())).as_py() or 0) if n else 0
    first = _key_at(table, 0) if n else None
    last = _key_at(table, n - 1) if n else None
    sink = pa.BufferOutputStream()
    w = pq.ParquetWriter(sink, SCHEMA, **WRITER_OPTIONS)
    if n:
        w.write_table(table, row_group_size=ROW_GROUP_SIZE)
    # pyarrow-stubs: dict[str, str], but pyarrow takes bytes keys and values as well
    w.add_key_value_metadata({**(extra_metadata or {}), **_metadata(n, deletes, first, last)})  # type: ignore[dict-item]
    w.close()
    return EncodedRange(sink.getvalue(), n, deletes, first, last)


def write_encoded(storage: Storage, rel_path: str, enc: EncodedRange, *, tmp_tag: str | None = None) -> FileInfo:
    """Write an encoded file (:func:`encode_table`) atomically, as ``SortedFileWriter`` does."""
    tmp = storage.staging_name(rel_path, tmp_tag)
    storage.ensure_dir(posixpath.dirname(rel_path))
    try:
        sink = storage.open_output(tmp)
        try:
            sink.write(enc.data)
        finally:
            sink.close()
        storage.publish(tmp, rel_path)
    except BaseException:
        storage.delete(tmp)
        raise
    return FileInfo(rel_path, enc.data.size, enc.entries, enc.deletes, enc.first, enc.last)


def write_sorted(storage: Storage, rel_path: str, data: pa.Table | Iterable[Entry]) -> FileInfo:
    """Write one sorted file atomically; raise :class:`UnsortedError` and leave nothing if unsorted."""
    w = SortedFileWriter(storage, rel_path)
    try:
        if isinstance(data, pa.Table):
            w.write_table(data)
        else:
            w.write_entries(data)
        return w.commit()
    except BaseException:
        w.abort()
        raise


def read_info(storage: Storage, rel_path: str) -> FileInfo:
    """Footer metadata of a file; computed from the data for foreign files without it.
    Raises :class:`BadFileError` for unreadable or wrongly-shaped files."""
    try:
        with storage.open_input(rel_path) as f:
            pf = pq.ParquetFile(f)
            meta = pf.metadata.metadata or {}  # the footer's key/value metadata
            if b"kompaktor.entries" in meta:
                conform(pf.schema_arrow.empty_table(), rel_path)
                return FileInfo(
                    rel_path,
                    storage.size(rel_path),
                    int(meta[b"kompaktor.entries"]),
                    int(meta[b"kompaktor.deletes"]),
                    _decode_key(meta.get(b"kompaktor.first")),
                    _decode_key(meta.get(b"kompaktor.last")),
                )
            table = conform(pf.read(), rel_path)
    except (BadFileError, FileNotFoundError):
        raise
    except (OSError, pa.ArrowException) as exc:
        raise BadFileError(f"{rel_path}: not a readable Parquet file: {exc}") from exc
    check_sorted(table, rel_path)
    n = table.num_rows
    deletes = int(pc.sum(table.column("deleted").cast(pa.int64())).as_py() or 0)
    first = _key_at(table, 0) if n else None
    last = _key_at(table, n - 1) if n else None
    return FileInfo(rel_path, storage.size(rel_path), n, deletes, first, last)


def range_filter(prev_end: bytes | None, end: bytes | None) -> pc.Expression | None:
    """Arrow expression for rows in (prev_end, end]; None when unbounded."""
    expr = None
    if prev_end is not None:
        expr = pc.field("row") > pa.scalar(prev_end, pa.binary())
    if end is not None:
        e = pc.field("row") <= pa.scalar(end, pa.binary())
        expr = e if expr is None else (expr & e)
    return expr


def read_table(storage: Storage, rel_path: str, prev_end: bytes | None = None, end: bytes | None = None) -> pa.Table:
    """Read a file's entries within a tablet's row range, in the file schema."""
    try:
        with storage.open_input(rel_path) as f:
            table = pq.read_table(f, filters=range_filter(prev_end, end))
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowException) as exc:
        raise BadFileError(f"{rel_path}: not a readable Parquet file: {exc}") from exc
    return conform(table, rel_path)


def iter_entries(
    storage: Storage, rel_path: str, prev_end: bytes | None = None, end: bytes | None = None, batch_rows: int = 65536
) -> Iterator[Entry]:
    """Stream a file's entries within (prev_end, end], batch by batch (bounded memory)."""
    expr = range_filter(prev_end, end)
    try:
        f = storage.open_input(rel_path)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise BadFileError(f"{rel_path}: cannot open: {exc}") from exc
    with f:
        try:
            pf = pq.ParquetFile(f)
            conform(pf.schema_arrow.empty_table(), rel_path)
            for batch in pf.iter_batches(batch_size=batch_rows, columns=COLUMNS):
                t = pa.Table.from_batches([batch])
                if expr is not None:
                    t = t.filter(expr)
                yield from table_to_entries(conform(t, rel_path))
        except BadFileError:
            raise
        except (OSError, pa.ArrowException) as exc:
            raise BadFileError(f"{rel_path}: not a readable Parquet file: {exc}") from exc
