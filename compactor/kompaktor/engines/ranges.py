"""Key-range merge planning and reading, shared by every engine.

A merge is cut into **key ranges on row boundaries**: ``(lo, hi]`` row intervals chosen from the
inputs' Parquet row-group statistics (the max ``row`` of each row group, weighted by its entry
count), so every range holds about the same number of entries. A column key's versions share
its row, so no range boundary ever separates them, and each range can be merged on its own:
read the rows in ``(lo, hi]`` from every input (row-group statistics prune what is read), merge
and apply the iterator stack with :mod:`kompaktor.files.arrowstack`. Concatenating the ranges in
order gives exactly ``merged_view`` of the whole inputs.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kompaktor.engines.api import MergeCancelled, MergeRequest
from kompaktor.files.arrowstack import first_row_decrease, merge_tables
from kompaktor.files.sortedfile import SCHEMA, conform, range_filter
from kompaktor.files.storage import Storage
from kompaktor.model.errors import BadFileError, UnsortedError
from kompaktor.model.iterators import IteratorSettings
from kompaktor.model.keys import span_overlaps

Bound = bytes | None
#: uncompressed bytes per key range at most (about; from row-group sizes)
RANGE_BYTES = 256 << 20


@dataclass(frozen=True)
class InputMeta:
    path: str
    size: int
    entries: int
    #: (min row, max row, entries, uncompressed bytes) of each row group with row statistics
    groups: tuple[tuple[bytes, bytes, int, int], ...]
    has_stats: bool
    data_bytes: int = 0  # uncompressed size of all row groups


def _as_bytes(v) -> bytes:
    return v.encode() if isinstance(v, str) else bytes(v)


def inspect_inputs(storage: Storage, inputs: tuple[str, ...] | list[str]) -> list[InputMeta]:
    """Open every input's footer: a clear :class:`BadFileError` for a missing, non-Parquet or
    wrongly-shaped file before any work starts; row-group statistics for planning."""
    metas = []
    for path in inputs:
        try:
            size = storage.size(path)
            with storage.fs.open_input_file(storage.path(path)) as f:
                pf = pq.ParquetFile(f)
                conform(pf.schema_arrow.empty_table(), path)
                md = pf.metadata
        except BadFileError:
            raise
        except FileNotFoundError as exc:
            raise BadFileError(f"{path}: input file not found") from exc
        except (OSError, pa.ArrowException) as exc:
            raise BadFileError(f"{path}: not a readable Parquet file: {exc}") from exc
        row_col = next((i for i in range(md.num_columns) if md.schema.column(i).path == "row"), None)
        groups, has_stats = [], row_col is not None
        for g in range(md.num_row_groups):
            rg = md.row_group(g)
            st = rg.column(row_col).statistics if row_col is not None else None
            if st is None or not st.has_min_max:
                has_stats = False
                continue
            groups.append((_as_bytes(st.min), _as_bytes(st.max), rg.num_rows, rg.total_byte_size))
        data_bytes = sum(md.row_group(g).total_byte_size for g in range(md.num_row_groups))
        metas.append(InputMeta(path, size, md.num_rows, tuple(groups), has_stats, data_bytes))
    return metas


def estimate_entries(metas: list[InputMeta], prev: Bound, end: Bound) -> int:
    """Entries of the inputs in rows (prev, end], counted by whole row groups (an upper bound)."""
    total = 0
    for m in metas:
        if not m.has_stats:
            total += m.entries
        else:
            total += sum(n for lo, hi, n, _b in m.groups if span_overlaps(lo, hi, prev, end))
    return total


def plan_ranges(metas: list[InputMeta], prev: Bound, end: Bound, target_entries: int,
                target_bytes: int = RANGE_BYTES) -> list[tuple[Bound, Bound]]:
    """Cut (prev, end] into consecutive row ranges (lo, hi] of about ``target_entries`` entries
    and at most about ``target_bytes`` of uncompressed data each (large values make big ranges).

    Cut points are row-group max rows (so a range rarely starts in the middle of a row group
    of every input); any cut is *correct*, statistics only decide the balance."""
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


class InputCursor:
    """Reads one sorted input forward, range after range, decoding each row group once.

    Row groups are skipped by their row statistics when they lie outside the tablet range
    (prev, end]; :meth:`take` returns the rows up to ``hi`` and keeps the rest of the last
    decoded row group for the next range. Refuses a file whose rows decrease (inside or across
    row groups): splitting by row relies on it. Order within a row need not be checked, since
    every range is sorted by the full key anyway."""

    def __init__(self, storage: Storage, path: str, prev: Bound, end: Bound) -> None:
        self.path, self.prev, self.end = path, prev, end
        try:
            self._file = storage.fs.open_input_file(storage.path(path))
            self._pf = pq.ParquetFile(self._file)
            conform(self._pf.schema_arrow.empty_table(), path)
            md = self._pf.metadata
        except BadFileError:
            self.close()
            raise
        except FileNotFoundError as exc:
            self.close()
            raise BadFileError(f"{path}: input file not found") from exc
        except (OSError, pa.ArrowException) as exc:
            self.close()
            raise BadFileError(f"{path}: not a readable Parquet file: {exc}") from exc
        row_col = next((i for i in range(md.num_columns) if md.schema.column(i).path == "row"), None)
        self._groups: list[tuple[int, bytes | None, bytes | None]] = []  # (index, min row, max row)
        for g in range(md.num_row_groups):
            st = md.row_group(g).column(row_col).statistics if row_col is not None else None
            lo_row, hi_row = (_as_bytes(st.min), _as_bytes(st.max)) if st is not None and st.has_min_max \
                else (None, None)
            if lo_row is not None and not span_overlaps(lo_row, hi_row, prev, end):
                continue
            self._groups.append((g, lo_row, hi_row))
        self._next = 0
        self._buf: pa.Table | None = None
        self._last_row: bytes | None = None
        self.entries_read = 0

    def close(self) -> None:
        f = getattr(self, "_file", None)
        if f is not None:
            f.close()
            self._file = None

    def _load(self) -> None:
        g = self._groups[self._next][0]
        self._next += 1
        try:
            t = conform(self._pf.read_row_group(g), self.path)
        except BadFileError:
            raise
        except (OSError, pa.ArrowException) as exc:
            raise BadFileError(f"{self.path}: not a readable Parquet file (row group {g}): {exc}") from exc
        if t.num_rows == 0:
            return
        bad = first_row_decrease(t)
        if bad is not None:
            raise UnsortedError(f"{self.path}: entries are not in key order: row {bad} of row group {g} "
                                f"sorts before the previous row")
        rows = t.column("row")
        if self._last_row is not None and rows[0].as_py() < self._last_row:
            raise UnsortedError(f"{self.path}: row group {g} starts before the end of the previous one")
        self._last_row = rows[-1].as_py()
        mask = range_filter(self.prev, self.end)
        if mask is not None:
            t = t.filter(mask)
        self._buf = t if self._buf is None or self._buf.num_rows == 0 else pa.concat_tables([self._buf, t])

    def take(self, hi: Bound) -> pa.Table:
        """The input's rows after the previous ``take`` and up to ``hi`` (inclusive)."""
        while self._next < len(self._groups):
            min_row = self._groups[self._next][1]
            if hi is not None and min_row is not None and min_row > hi:
                break  # that group (and every later one) starts after hi
            if hi is not None and min_row is None and self._buf is not None and self._buf.num_rows \
                    and self._buf.column("row")[-1].as_py() > hi:
                break
            self._load()
        buf = self._buf if self._buf is not None else SCHEMA.empty_table()
        if hi is None:
            out, self._buf = buf, None
        else:
            n = int(pc.sum(pc.less_equal(buf.column("row"), pa.scalar(hi, pa.binary()))).as_py() or 0)
            out, self._buf = buf.slice(0, n), buf.slice(n)
        self.entries_read += out.num_rows
        return out


def read_range(storage: Storage, path: str, lo: Bound, hi: Bound) -> pa.Table:
    """An input's entries in rows (lo, hi], in the file schema; BadFileError when unreadable or
    out of key order. Decodes only the row groups whose statistics overlap the range."""
    cur = InputCursor(storage, path, lo, hi)
    try:
        return cur.take(hi)
    finally:
        cur.close()


def merge_range(storage: Storage, inputs: tuple[str, ...] | list[str], lo: Bound, hi: Bound,
                settings: IteratorSettings) -> tuple[pa.Table, int]:
    """Merge one key range of the inputs (oldest first); returns (output table, entries read)."""
    tables = [read_range(storage, p, lo, hi) for p in inputs]
    read = sum(t.num_rows for t in tables)
    return merge_tables(tables, settings), read


def open_merge(storage: Storage, req: MergeRequest,
               cancel: threading.Event | None) -> tuple[float, list[InputMeta], int]:
    """What every engine does first: refuse a request cancelled before it started, read the
    inputs' footers. Returns the start time, the inputs' metadata and their total bytes."""
    started = time.monotonic()
    if cancel is not None and cancel.is_set():
        raise MergeCancelled(f"merge into {req.output} cancelled before it started")
    metas = inspect_inputs(storage, req.inputs)
    return started, metas, sum(m.size for m in metas)


def progress_dict(entries_read: int, entries_written: int, bytes_read: int, bytes_written: int,
                  parts_done: int, parts: int, started: float) -> dict:
    return {"entries_read": entries_read, "entries_written": entries_written, "bytes_read": bytes_read,
            "bytes_written": bytes_written, "parts_done": parts_done, "parts": parts,
            "elapsed_s": round(time.monotonic() - started, 3)}
