"""Key-range merge planning and reading, shared by every engine.

A merge is cut into **key ranges on row boundaries**: ``(lo, hi]`` row intervals chosen so that
every range holds about the same number of entries. A column key's versions share its row, so
no range boundary ever separates them, and each range can be merged on its own: read the rows in
``(lo, hi]`` from every input, merge and apply the iterator stack with
:mod:`kompaktor.files.arrowstack`. Concatenating the ranges in order gives exactly
``merged_view`` of the whole inputs.

Neither planning nor reading depends on how the inputs were cut into row groups:

- **Planning** starts from the footers' row-group statistics (min/max ``row``, entries, bytes).
  A row group too big to be a good cut granularity (Spark and Hive write 128 MB row groups; a
  file may be one row group) is *sampled*: only its ``row`` column is read, in batches, and each
  batch becomes a segment (first row, last row, entries) — a fraction of the cost of decoding
  the row group, and only done when the merge needs more than one range.
- **Reading** (:class:`InputCursor`) streams each row group in record batches
  (``ParquetFile.iter_batches``), so a range takes only the rows it needs and an input's memory
  is bounded by the range plus one batch, never by the row-group size.

Statistics only decide the balance of the cut, never correctness; a row group whose rows fall
outside what its footer claims is refused (:class:`BadFileError`), and so is a file whose rows
decrease anywhere (inside a row group or across row groups).
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kompaktor.engines.api import MergeCancelled, MergeError, MergeRequest
from kompaktor.files.arrowstack import first_row_decrease, merge_tables
from kompaktor.files.sortedfile import COLUMNS, SCHEMA, conform, range_filter
from kompaktor.files.storage import Storage
from kompaktor.model.errors import BadFileError, UnsortedError
from kompaktor.model.iterators import IteratorSettings
from kompaktor.model.keys import span_overlaps

Bound = bytes | None
#: uncompressed bytes per key range at most (about; from row-group sizes)
RANGE_BYTES = 256 << 20
#: rows per record batch when streaming a row group (an input holds its range plus one batch)
BATCH_ROWS = 64 * 1024
#: a row group is sampled for cut points when it holds more than this share of a range
SAMPLE_SHARE = 0.25
#: rows per sampled segment at most / at least
SEGMENT_ROWS_MAX = 64 * 1024
SEGMENT_ROWS_MIN = 1024
#: memory one merge task may use, by default; its range's input data may take 1/MERGE_FACTOR
TASK_MEMORY = 4 << 30
#: a merge holds about this many times its range's input data (inputs, sorted copy, output)
MERGE_FACTOR = 4
#: how an input is opened for streaming: no pre-buffering (pyarrow's default pre_buffer=True reads
#: a row group's whole column chunks at once, so memory would follow the row-group size), and a
#: 1 MiB read buffer: without one (buffer_size=0) parquet-cpp reads each column chunk whole, so an
#: input held its current row group's compressed bytes (a one-row-group file: all of it). Measured
#: on 4M entries in 8 one-row-group files: peak RSS growth 1.40 GB -> 1.11-1.18 GB, time the same
READ_OPTIONS: dict = {"pre_buffer": False, "buffer_size": 1 << 20}
#: on an object store every read is a request with its latency: a row group's column chunks are
#: fetched together (pyarrow coalesces them into one ranged GET), 9 GETs per small input → 3
OBJECT_STORE_READ_OPTIONS: dict = {"pre_buffer": True, "buffer_size": 0}


class TaskMemoryExceeded(MergeError):
    """A key range holds more data than the task memory allows (a single row bigger than the
    task, since the planner cuts anywhere else)."""


@dataclass(frozen=True)
class InputMeta:
    path: str
    size: int
    entries: int
    #: (min row, max row, entries, uncompressed bytes) of each row group with row statistics, in
    #: file order — or of each segment of a row group that was sampled (:func:`refine_inputs`)
    groups: tuple[tuple[bytes, bytes, int, int], ...]
    has_stats: bool
    data_bytes: int = 0  # uncompressed size of all row groups
    #: index of the row group each entry of ``groups`` belongs to (empty: one entry per group)
    group_index: tuple[int, ...] = ()


def _as_bytes(v) -> bytes:
    return v.encode() if isinstance(v, str) else bytes(v)


def _open_error(path: str, exc: BaseException) -> BadFileError:
    if isinstance(exc, FileNotFoundError):
        return BadFileError(f"{path}: input file not found")
    return BadFileError(f"{path}: not a readable Parquet file: {exc}")


def _row_stats(md, row_col: int | None, g: int) -> tuple[bytes, bytes] | None:
    st = md.row_group(g).column(row_col).statistics if row_col is not None else None
    if st is None or not st.has_min_max:
        return None
    return _as_bytes(st.min), _as_bytes(st.max)


def _row_column(md) -> int | None:
    return next((i for i in range(md.num_columns) if md.schema.column(i).path == "row"), None)


def inspect_inputs(storage: Storage, inputs: tuple[str, ...] | list[str]) -> list[InputMeta]:
    """Open every input's footer: a clear :class:`BadFileError` for a missing, non-Parquet or
    wrongly-shaped file before any work starts; row-group statistics for planning."""
    metas = []
    for path in inputs:
        try:
            size = storage.size(path)
            with storage.open_input(path) as f:
                pf = pq.ParquetFile(f)
                conform(pf.schema_arrow.empty_table(), path)
                md = pf.metadata
        except BadFileError:
            raise
        except (OSError, pa.ArrowException) as exc:
            raise _open_error(path, exc) from exc
        row_col = _row_column(md)
        groups, index, has_stats = [], [], row_col is not None
        for g in range(md.num_row_groups):
            rg = md.row_group(g)
            stats = _row_stats(md, row_col, g)
            if stats is None:
                has_stats = False
                continue
            if stats[0] > stats[1]:
                raise BadFileError(
                    f"{path}: the footer statistics of row group {g} are invalid "
                    f"(min row {stats[0]!r} > max row {stats[1]!r})"
                )
            if groups and stats[0] < groups[-1][1]:
                raise UnsortedError(
                    f"{path}: entries are not in key order: row group {g} starts before the end "
                    f"of row group {index[-1]} (footer statistics)"
                )
            groups.append((*stats, rg.num_rows, rg.total_byte_size))
            index.append(g)
        data_bytes = sum(md.row_group(g).total_byte_size for g in range(md.num_row_groups))
        metas.append(InputMeta(path, size, md.num_rows, tuple(groups), has_stats, data_bytes, tuple(index)))
    return metas


def estimate_entries(metas: list[InputMeta], prev: Bound, end: Bound) -> int:
    """Entries of the inputs in rows (prev, end], counted by whole row groups or sampled
    segments (an upper bound)."""
    total = 0
    for m in metas:
        if not m.has_stats:
            total += m.entries
        else:
            total += sum(n for lo, hi, n, _b in m.groups if span_overlaps(lo, hi, prev, end))
    return total


def _sample_group(
    pf: pq.ParquetFile, path: str, g: int, claimed: tuple[bytes, bytes] | None, nbytes: int, seg_rows: int
) -> list[tuple[bytes, bytes, int, int]]:
    """Segments of row group ``g`` from its ``row`` column alone, ``seg_rows`` rows each; checked
    against the rows its footer claims (``claimed``, None: no statistics)."""
    segs = []
    total = pf.metadata.row_group(g).num_rows
    seen = 0
    for batch in pf.iter_batches(batch_size=seg_rows, row_groups=[g], columns=["row"]):
        rows = batch.column(0)
        n = len(rows)
        if not n:
            continue
        first, last = _as_bytes(rows[0].as_py()), _as_bytes(rows[n - 1].as_py())
        if claimed is not None and (first < claimed[0] or last > claimed[1]):
            bad = first if first < claimed[0] else last
            raise BadFileError(
                f"{path}: row group {g} holds row {bad!r}, outside the rows its footer "
                f"statistics claim ({claimed[0]!r} to {claimed[1]!r})"
            )
        segs.append((first, last, n, round(nbytes * n / max(1, total))))
        seen += n
    if seen != total:
        raise BadFileError(f"{path}: row group {g} holds {seen} rows, its footer claims {total}")
    return segs


def refine_inputs(
    storage: Storage,
    metas: list[InputMeta],
    prev: Bound,
    end: Bound,
    target_entries: int,
    target_bytes: int = RANGE_BYTES,
) -> list[InputMeta]:
    """Replace every row group that overlaps (prev, end] and holds more than
    :data:`SAMPLE_SHARE` of a range by segments sampled from its ``row`` column, so that the
    planner can cut inside it. Files whose row groups are small enough are returned as they are
    (no I/O)."""
    limit = max(1, int(target_entries * SAMPLE_SHARE))
    limit_bytes = max(1, int(target_bytes * SAMPLE_SHARE))
    seg_rows = max(SEGMENT_ROWS_MIN, min(SEGMENT_ROWS_MAX, limit // 2))
    out = []
    for m in metas:
        if not m.has_stats:  # some row group has no row statistics: sample them all
            if m.entries > limit or m.data_bytes > limit_bytes:
                out.append(_sample_file(storage, m, seg_rows))
            else:
                out.append(m)
            continue
        big = {
            i
            for i, (lo, hi, n, nb) in enumerate(m.groups)
            if (n > limit or nb > limit_bytes) and n > seg_rows and span_overlaps(lo, hi, prev, end)
        }
        if not big:
            out.append(m)
            continue
        index = m.group_index or tuple(range(len(m.groups)))
        groups: list[tuple[bytes, bytes, int, int]] = []
        new_index: list[int] = []
        try:
            with storage.open_input(m.path) as f:
                pf = pq.ParquetFile(f)
                for i, grp in enumerate(m.groups):
                    if i in big:
                        segs = _sample_group(pf, m.path, index[i], (grp[0], grp[1]), grp[3], seg_rows)
                    else:
                        segs = [grp]
                    groups.extend(segs)
                    new_index.extend([index[i]] * len(segs))
        except BadFileError:
            raise
        except (OSError, pa.ArrowException) as exc:
            raise _open_error(m.path, exc) from exc
        out.append(InputMeta(m.path, m.size, m.entries, tuple(groups), m.has_stats, m.data_bytes, tuple(new_index)))
    return out


def _sample_file(storage: Storage, m: InputMeta, seg_rows: int) -> InputMeta:
    """Segments of every row group of a file whose footer lacks row statistics (somewhere)."""
    groups: list[tuple[bytes, bytes, int, int]] = []
    index: list[int] = []
    try:
        with storage.open_input(m.path) as f:
            pf = pq.ParquetFile(f)
            md = pf.metadata
            row_col = _row_column(md)
            for g in range(md.num_row_groups):
                segs = _sample_group(
                    pf, m.path, g, _row_stats(md, row_col, g), md.row_group(g).total_byte_size, seg_rows
                )
                groups.extend(segs)
                index.extend([g] * len(segs))
    except BadFileError:
        raise
    except (OSError, pa.ArrowException) as exc:
        raise _open_error(m.path, exc) from exc
    return InputMeta(m.path, m.size, m.entries, tuple(groups), True, m.data_bytes, tuple(index))


def plan_ranges(
    metas: list[InputMeta], prev: Bound, end: Bound, target_entries: int, target_bytes: int = RANGE_BYTES
) -> list[tuple[Bound, Bound]]:
    """Cut (prev, end] into consecutive row ranges (lo, hi] of about ``target_entries`` entries
    and at most about ``target_bytes`` of uncompressed data each (large values make big ranges).

    Cut points are the max rows of row groups or sampled segments; any cut is *correct*,
    statistics only decide the balance."""
    scale = target_entries / max(1, target_bytes)

    def weight(n: int, nbytes: int) -> float:  # in entries, or the entries that many bytes are worth
        return max(float(n), nbytes * scale)

    cands: list[tuple[bytes, float]] = []
    total = 0.0
    for m in metas:
        if not m.has_stats:
            total += weight(m.entries, m.data_bytes)
        for lo, hi, n, nbytes in m.groups:
            if span_overlaps(lo, hi, prev, end):
                cands.append((hi, weight(n, nbytes)))
                total += cands[-1][1]
    if total <= target_entries:
        return [(prev, end)]
    cands.sort()
    k = math.ceil(total / target_entries)
    step = total / k
    cuts: list[bytes] = []
    acc = 0
    for row, n in cands:
        acc += n
        if acc >= total:
            break  # a cut at the very last row would leave an empty range
        if acc >= step * (len(cuts) + 1) and len(cuts) < k - 1:
            if (prev is not None and row <= prev) or (end is not None and row >= end):
                continue
            if cuts and row <= cuts[-1]:
                continue
            cuts.append(row)
    bounds: list[Bound] = [prev, *cuts, end]
    return list(itertools.pairwise(bounds))


def plan(
    storage: Storage,
    metas: list[InputMeta],
    prev: Bound,
    end: Bound,
    target_entries: int,
    target_bytes: int = RANGE_BYTES,
) -> list[tuple[Bound, Bound]]:
    """:func:`plan_ranges` after sampling the row groups too big to cut at (only when the merge
    needs more than one range)."""
    if estimate_entries(metas, prev, end) > target_entries or sum(m.data_bytes for m in metas) > target_bytes:
        metas = refine_inputs(storage, metas, prev, end, target_entries, target_bytes)
    return plan_ranges(metas, prev, end, target_entries, target_bytes)


def _first_row(t: pa.Table) -> bytes:
    return t.column("row")[0].as_py()


def _last_row(t: pa.Table) -> bytes:
    return t.column("row")[t.num_rows - 1].as_py()


class InputCursor:
    """Reads one sorted input forward, range after range, streaming each row group in record
    batches of ``batch_rows`` (decoded once each).

    Row groups are skipped by their row statistics when they lie outside the tablet range
    (prev, end]; :meth:`take` returns the rows up to ``hi`` and keeps the rest of the last
    batch for the next range, so the cursor holds at most one range plus one batch. Refuses a
    file whose rows decrease (inside or across row groups; splitting by row relies on it) or
    whose row groups hold rows outside their footer statistics. Order within a row need not be
    checked, since every range is sorted by the full key anyway."""

    def __init__(self, storage: Storage, path: str, prev: Bound, end: Bound, *, batch_rows: int = BATCH_ROWS) -> None:
        self.path, self.prev, self.end = path, prev, end
        self.batch_rows = batch_rows
        try:
            self._file = storage.open_input(path)
            self._pf = pq.ParquetFile(
                self._file, **(READ_OPTIONS if storage.renames_atomically else OBJECT_STORE_READ_OPTIONS)
            )
            conform(self._pf.schema_arrow.empty_table(), path)
            md = self._pf.metadata
        except BadFileError:
            self.close()
            raise
        except (OSError, pa.ArrowException) as exc:
            self.close()
            raise _open_error(path, exc) from exc
        row_col = _row_column(md)
        self._groups: list[tuple[int, bytes | None, bytes | None]] = []  # (index, min row, max row)
        for g in range(md.num_row_groups):
            stats = _row_stats(md, row_col, g)
            if stats is not None and not span_overlaps(stats[0], stats[1], prev, end):
                continue
            self._groups.append((g, *stats) if stats is not None else (g, None, None))
        self._batches = self._stream()
        self._pending: pa.Table | None = None
        self._last_row: bytes | None = None
        self.entries_read = 0
        #: compressed bytes of the row groups this cursor started decoding (what a resumed
        #: merge reports as re-read)
        self.bytes_read = 0

    def close(self) -> None:
        f = getattr(self, "_file", None)
        if f is not None:
            f.close()
            self._file = None

    def _stream(self) -> Iterator[pa.Table]:
        """The input's rows in (prev, end], batch by batch, checked."""
        mask = None
        for g, lo, hi in self._groups:
            if self.end is not None and lo is not None and lo > self.end:
                return  # rows never decrease: nothing later is inside the tablet
            rg = self._pf.metadata.row_group(g)
            self.bytes_read += sum(rg.column(c).total_compressed_size for c in range(rg.num_columns))
            offset = 0
            try:
                batches = self._pf.iter_batches(batch_size=self.batch_rows, row_groups=[g], columns=COLUMNS)
                for batch in batches:
                    t = conform(pa.Table.from_batches([batch]), self.path)
                    n = t.num_rows
                    if not n:
                        continue
                    self._check(t, g, offset, lo, hi)
                    offset += n
                    if self.prev is not None and self._last_row <= self.prev:
                        continue  # the whole batch is before the tablet
                    if self.end is not None and _first_row(t) > self.end:
                        return
                    if (self.prev is not None and _first_row(t) <= self.prev) or (
                        self.end is not None and self._last_row > self.end
                    ):
                        if mask is None:
                            mask = range_filter(self.prev, self.end)
                        t = t.filter(mask)
                    if t.num_rows:
                        yield t
            except BadFileError:
                raise
            except (OSError, pa.ArrowException) as exc:
                raise BadFileError(f"{self.path}: not a readable Parquet file (row group {g}): {exc}") from exc

    def _check(self, t: pa.Table, g: int, offset: int, lo: bytes | None, hi: bytes | None) -> None:
        bad = first_row_decrease(t)
        if bad is not None:
            raise UnsortedError(
                f"{self.path}: entries are not in key order: row {offset + bad} of row group {g} "
                f"sorts before the previous row"
            )
        first, last = _first_row(t), _last_row(t)
        if self._last_row is not None and first < self._last_row:
            where = f"row group {g} starts" if offset == 0 else f"row {offset} of row group {g} is"
            raise UnsortedError(
                f"{self.path}: entries are not in key order: {where} before the end of the previous one"
            )
        if lo is not None and (first < lo or last > hi):
            row = first if first < lo else last
            raise BadFileError(
                f"{self.path}: row group {g} holds row {row!r}, outside the rows its footer "
                f"statistics claim ({lo!r} to {hi!r})"
            )
        self._last_row = last

    def take(self, hi: Bound, memory_limit: int | None = None) -> pa.Table:
        """The input's rows after the previous ``take`` and up to ``hi`` (inclusive). Raises
        :class:`TaskMemoryExceeded` when they hold more than ``memory_limit`` bytes."""
        parts: list[pa.Table] = []
        held = 0
        while True:
            if self._pending is None:
                self._pending = next(self._batches, None)
                if self._pending is None:
                    break
            t = self._pending
            if hi is None or _last_row(t) <= hi:
                parts.append(t)
                self._pending = None
            else:
                n = (
                    0
                    if _first_row(t) > hi
                    else int(pc.sum(pc.less_equal(t.column("row"), pa.scalar(hi, pa.binary()))).as_py() or 0)
                )
                if n:
                    parts.append(t.slice(0, n))
                    self._pending = t.slice(n)
                break
            held += parts[-1].nbytes
            if memory_limit is not None and held > memory_limit:
                raise TaskMemoryExceeded(
                    f"{self.path}: the key range up to row {hi!r} holds more than {memory_limit >> 20} MiB of "
                    f"this input, more than the task memory allows (a row too big to split)"
                )
        out = pa.concat_tables(parts) if parts else SCHEMA.empty_table()
        self.entries_read += out.num_rows
        return out


def read_range(
    storage: Storage, path: str, lo: Bound, hi: Bound, memory_limit: int | None = None, stats: dict | None = None
) -> pa.Table:
    """An input's entries in rows (lo, hi], in the file schema; BadFileError when unreadable or
    out of key order. Decodes only the row groups whose statistics overlap the range, and
    inside them streams batch by batch up to ``hi``. ``stats["bytes_read"]`` (when given) grows
    by the compressed bytes of the row groups decoded."""
    cur = InputCursor(storage, path, lo, hi)
    try:
        return cur.take(hi, memory_limit)
    finally:
        if stats is not None:
            stats["bytes_read"] = stats.get("bytes_read", 0) + cur.bytes_read
        cur.close()


def merge_range(
    storage: Storage,
    inputs: tuple[str, ...] | list[str],
    lo: Bound,
    hi: Bound,
    settings: IteratorSettings,
    task_memory: int | None = None,
    stats: dict | None = None,
) -> tuple[pa.Table, int]:
    """Merge one key range of the inputs (oldest first); returns (output table, entries read).
    The range's input data may use at most ``task_memory`` / :data:`MERGE_FACTOR` bytes.
    ``stats["bytes_read"]``: see :func:`read_range`."""
    budget = None if task_memory is None else task_memory // MERGE_FACTOR
    tables: list[pa.Table] = []
    held = 0
    for p in inputs:
        tables.append(read_range(storage, p, lo, hi, None if budget is None else max(0, budget - held), stats))
        held += tables[-1].nbytes
    read = sum(t.num_rows for t in tables)
    return merge_tables(tables, settings), read


def open_merge(
    storage: Storage, req: MergeRequest, cancel: threading.Event | None
) -> tuple[float, list[InputMeta], int]:
    """What every engine does first: refuse a request cancelled before it started, read the
    inputs' footers. Returns the start time, the inputs' metadata and their total bytes."""
    started = time.monotonic()
    if cancel is not None and cancel.is_set():
        raise MergeCancelled(f"merge into {req.output} cancelled before it started")
    metas = inspect_inputs(storage, req.inputs)
    return started, metas, sum(m.size for m in metas)


def progress_dict(
    entries_read: int,
    entries_written: int,
    bytes_read: int,
    bytes_written: int,
    parts_done: int,
    parts: int,
    started: float,
    **resume: int,
) -> dict:
    """A merge's progress report. A resumable merge adds (``resume``): ``parts_reused``,
    ``entries_reused`` and ``bytes_reused`` (input entries and compressed input bytes of the
    ranges taken from an earlier attempt's parts, not read again), ``input_bytes_reread``
    (compressed input bytes of the row groups this attempt decoded) and ``parts_rejected``
    (recorded parts that failed verification and were merged again)."""
    return {
        "entries_read": entries_read,
        "entries_written": entries_written,
        "bytes_read": bytes_read,
        "bytes_written": bytes_written,
        "parts_done": parts_done,
        "parts": parts,
        "elapsed_s": round(time.monotonic() - started, 3),
        **resume,
    }
