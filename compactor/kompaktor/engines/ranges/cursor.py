"""Reading a range: :class:`InputCursor` streams one input forward, range after range, record
batch by record batch, so a range takes only the rows it needs and an input's memory is bounded
by the range plus one batch, never by the row-group size; :func:`merge_range` merges one range of
every input.

Part of :mod:`kompaktor.engines.ranges`; imports only :mod:`.inputs`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kompaktor.engines.api import MergeError
from kompaktor.engines.ranges.inputs import Bound, reading, row_column, row_stats
from kompaktor.files.arrowstack import first_row_decrease, merge_tables
from kompaktor.files.sortedfile import COLUMNS, SCHEMA, conform, range_filter
from kompaktor.files.storage import Storage
from kompaktor.model.errors import BadFileError, UnsortedError
from kompaktor.model.iterators import IteratorSettings
from kompaktor.model.keys import span_overlaps

#: rows per record batch when streaming a row group (an input holds its range plus one batch)
BATCH_ROWS = 64 * 1024
#: and at most about this many uncompressed bytes per batch, by the row group's average entry
#: (issue 46: 64K entries of 4 KiB values made a 256 MiB batch per input, every input's rows
#: decoded at once, whatever the range size)
BATCH_BYTES = 16 << 20
#: memory one merge task may use, by default; its range's input data may take 1/MERGE_FACTOR
TASK_MEMORY = 4 << 30
#: a merge holds about this many times its range's input data (inputs, sorted copy, output)
MERGE_FACTOR = 4
#: how an input is opened for streaming: no pre-buffering (pyarrow's default pre_buffer=True reads
#: a row group's whole column chunks at once, so memory would follow the row-group size), and a
#: 1 MiB read buffer: without one (buffer_size=0) parquet-cpp reads each column chunk whole, so an
#: input held its current row group's compressed bytes (a one-row-group file: all of it). Measured
#: on 4M entries in 8 one-row-group files: peak RSS growth 1.40 GB -> 1.11-1.18 GB, time the same
READ_OPTIONS: dict[str, Any] = {"pre_buffer": False, "buffer_size": 1 << 20}
#: on an object store every read is a request with its latency: a row group's column chunks are
#: fetched together (pyarrow coalesces them into one ranged GET), 9 GETs per small input → 3
OBJECT_STORE_READ_OPTIONS: dict[str, Any] = {"pre_buffer": True, "buffer_size": 0}


class TaskMemoryExceeded(MergeError):
    """A key range holds more data than the task memory allows (a single row bigger than the
    task, since the planner cuts anywhere else)."""


def _first_row(t: pa.Table) -> bytes:
    row: bytes = t.column("row")[0].as_py()
    return row


def _last_row(t: pa.Table) -> bytes:
    row: bytes = t.column("row")[t.num_rows - 1].as_py()
    return row


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
        self._file: pa.NativeFile | None = None
        with reading(path, on_error=self.close):
            self._file = storage.open_input(path)
            self._pf = pq.ParquetFile(
                self._file, **(READ_OPTIONS if storage.renames_atomically else OBJECT_STORE_READ_OPTIONS)
            )
            conform(self._pf.schema_arrow.empty_table(), path)
            md = self._pf.metadata
        row_col = row_column(md)
        self._groups: list[tuple[int, bytes | None, bytes | None]] = []  # (index, min row, max row)
        for g in range(md.num_row_groups):
            stats = row_stats(md, row_col, g)
            if stats is not None and not span_overlaps(stats[0], stats[1], prev, end):
                continue
            self._groups.append((g, *stats) if stats is not None else (g, None, None))
        self._next_group = 0  # index into _groups of the next row group to open
        self._open: Iterator[pa.Table] | None = None  # the batches of the row group being read
        self._ended = False  # a row after the tablet seen: nothing later is read
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

    def _next_batch(self, hi: Bound) -> pa.Table | None:
        """The input's next batch of rows in (prev, end], checked; None at the end, or when the
        next row group starts after ``hi`` (by its statistics: it is not opened yet)."""
        while True:
            if self._open is not None:
                t = next(self._open, None)
                if t is not None:
                    return t
                self._open = None
            if self._ended or self._next_group >= len(self._groups):
                return None
            g, lo, hi_g = self._groups[self._next_group]
            if self.end is not None and lo is not None and lo > self.end:
                return None  # rows never decrease: nothing later is inside the tablet
            if hi is not None and lo is not None and lo > hi:
                return None
            self._next_group += 1
            self._open = self._group_batches(g, lo, hi_g)

    def _group_batches(self, g: int, lo: bytes | None, hi: bytes | None) -> Iterator[pa.Table]:
        """Row group ``g``'s rows in (prev, end], batch by batch, checked."""
        rg = self._pf.metadata.row_group(g)
        self.bytes_read += sum(rg.column(c).total_compressed_size for c in range(rg.num_columns))
        rows = min(self.batch_rows, max(1024, BATCH_BYTES * max(1, rg.num_rows) // max(1, rg.total_byte_size)))
        offset = 0
        mask = None
        with reading(self.path, row_group=g):
            batches = self._pf.iter_batches(batch_size=rows, row_groups=[g], columns=COLUMNS)
            for batch in batches:
                t = conform(pa.Table.from_batches([batch]), self.path)
                n = t.num_rows
                if not n:
                    continue
                last = self._check(t, g, offset, lo, hi)
                offset += n
                if self.prev is not None and last <= self.prev:
                    continue  # the whole batch is before the tablet
                if self.end is not None and _first_row(t) > self.end:
                    self._ended = True
                    return
                if (self.prev is not None and _first_row(t) <= self.prev) or (self.end is not None and last > self.end):
                    if mask is None:
                        mask = range_filter(self.prev, self.end)
                    if mask is not None:  # always: a bound is set
                        t = t.filter(mask)
                if t.num_rows:
                    yield t

    def skip(self, groups: tuple[int, ...], last_row: bytes) -> None:
        """Pass over row groups ``groups`` (the next ones of the file, none of them opened yet)
        without reading them: the merge copies them as they are (docs/architecture.md "Copying row
        groups through"), after checking that their rows lie within their statistics, the last of
        them at most ``last_row``."""
        nxt = self._next_group
        if self._pending is not None or self._open is not None or self._ended:
            raise RuntimeError(f"{self.path}: row groups {groups} skipped while one is being read")
        if tuple(g for g, _lo, _hi in self._groups[nxt : nxt + len(groups)]) != groups:
            raise RuntimeError(f"{self.path}: row groups {groups} are not the next ones to read")
        self._next_group += len(groups)
        self._last_row = last_row

    def _check(self, t: pa.Table, g: int, offset: int, lo: bytes | None, hi: bytes | None) -> bytes:
        """Refuse ``t`` if its rows decrease or lie outside its row group's statistics; its last row."""
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
        if lo is not None and hi is not None and (first < lo or last > hi):
            row = first if first < lo else last
            raise BadFileError(
                f"{self.path}: row group {g} holds row {row!r}, outside the rows its footer "
                f"statistics claim ({lo!r} to {hi!r})"
            )
        self._last_row = last
        return last

    def take(self, hi: Bound, memory_limit: int | None = None) -> pa.Table:
        """The input's rows after the previous ``take`` and up to ``hi`` (inclusive). Raises
        :class:`TaskMemoryExceeded` when they hold more than ``memory_limit`` bytes."""
        parts: list[pa.Table] = []
        held = 0
        while True:
            if self._pending is None:
                self._pending = self._next_batch(hi)
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
                    else int(pc.sum(pc.less_equal(t.column("row"), pa.scalar(hi, pa.binary()))).as_py() or 0)  # type: ignore[type-var]  # pyarrow-stubs: pyarrow sums booleans
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
    storage: Storage,
    path: str,
    lo: Bound,
    hi: Bound,
    memory_limit: int | None = None,
    stats: dict[str, int] | None = None,
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
    stats: dict[str, int] | None = None,
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
