"""The iterator stack (:func:`kompaktor.iterators.apply_stack`) as vectorized Arrow/numpy code.

Input is an Arrow table in *merged order*: key order (:data:`kompaktor.keys.ARROW_SORT_KEYS`),
and among identical keys the newest source first. The rules are those of
:mod:`kompaktor.iterators`, computed per column key (row, cf, cq, vis) with prefix sums instead
of a Python loop:

- a put is a *candidate* unless a delete marker earlier in its column key hides it, its
  timestamp is below the age-off cutoff, or its row is removed by the row filter;
- the first ``max_versions`` candidates of each column key are kept;
- the first marker of a column key (the newest) is kept only for partial compactions
  (``settings.full`` is False); every later marker is hidden by it.

Property tests hold the result to ``merged_view`` entry for entry.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kompaktor.iterators import SCAN, IteratorSettings
from kompaktor.keys import ARROW_SORT_KEYS
from kompaktor.sortedfile import COLUMNS, SCHEMA

KEY_COLUMNS = ("row", "cf", "cq", "vis")
SOURCE = "__source"
#: merged order: key order, then the newest source (highest index) first among identical keys.
MERGE_SORT_KEYS: list[tuple[str, str]] = [*ARROW_SORT_KEYS, (SOURCE, "descending")]


def _np_bool(arr) -> np.ndarray:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    return arr.to_numpy(zero_copy_only=False).astype(bool, copy=False)


def _changes(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Boolean array of len(col): True where the value differs from the previous one (and at 0)."""
    n = len(col)
    out = np.ones(n, dtype=bool)
    if n > 1:
        out[1:] = _np_bool(pc.not_equal(col.slice(1), col.slice(0, n - 1)))
    return out


def group_starts(table: pa.Table, columns: Sequence[str] = KEY_COLUMNS) -> np.ndarray:
    """True at the first entry of every run of equal ``columns`` (the column key by default)."""
    n = table.num_rows
    start = np.zeros(n, dtype=bool)
    if n == 0:
        return start
    for name in columns:
        start |= _changes(table.column(name))
    return start


def _row_dropped(table: pa.Table, row_starts: np.ndarray, settings: IteratorSettings) -> np.ndarray:
    """settings.row_dropped per entry; the regex runs once per distinct row (Python ``re``, the
    same engine as the reference), the range part is vectorized."""
    n = table.num_rows
    rows = table.column("row")
    dropped = np.zeros(n, dtype=bool)
    if settings.row_regex is not None:
        idx = np.flatnonzero(row_starts)
        distinct = rows.take(pa.array(idx)).to_pylist()
        pat = re.compile(settings.row_regex.encode())
        hit = np.fromiter((pat.search(r) is not None for r in distinct), dtype=bool, count=len(distinct))
        lengths = np.diff(np.append(idx, n))
        dropped |= np.repeat(hit, lengths)
    if settings.row_start is not None or settings.row_end is not None:
        inside = np.ones(n, dtype=bool)
        if settings.row_start is not None:
            inside &= _np_bool(pc.greater_equal(rows, pa.scalar(settings.row_start, pa.binary())))
        if settings.row_end is not None:
            inside &= _np_bool(pc.less(rows, pa.scalar(settings.row_end, pa.binary())))
        dropped |= inside
    return dropped


def _within_group_exclusive(flags: np.ndarray, gid: np.ndarray, gstart: np.ndarray) -> np.ndarray:
    """For each entry, how many ``flags`` precede it inside its group."""
    c = np.cumsum(flags, dtype=np.int64)
    excl = c - flags
    return excl - excl[gstart][gid]


def keep_mask(table: pa.Table, settings: IteratorSettings = SCAN) -> np.ndarray:
    """Boolean mask of the entries ``apply_stack`` keeps from ``table`` (in merged order)."""
    n = table.num_rows
    if n == 0:
        return np.zeros(0, dtype=bool)
    row_starts = _changes(table.column("row"))
    start = row_starts.copy()
    for name in KEY_COLUMNS[1:]:
        start |= _changes(table.column(name))
    gid = np.cumsum(start, dtype=np.int64) - 1
    gstart = np.flatnonzero(start)

    dele = _np_bool(table.column("deleted"))
    hidden = _within_group_exclusive(dele, gid, gstart) > 0
    visible = ~hidden
    markers = dele & visible if not settings.full else np.zeros(n, dtype=bool)

    cand = visible & ~dele
    cutoff = settings.ageoff_cutoff
    if cutoff is not None:
        ts = table.column("ts").to_numpy()
        cand &= ts >= cutoff
    if settings.has_row_filter:
        cand &= ~_row_dropped(table, row_starts, settings)
    rank = _within_group_exclusive(cand, gid, gstart)  # candidates before this one
    return markers | (cand & (rank < settings.max_versions))


def apply_stack_table(table: pa.Table, settings: IteratorSettings = SCAN) -> pa.Table:
    """The entries of ``table`` (merged order) that the iterator stack keeps, in order."""
    if table.num_rows == 0:
        return table
    return table.filter(pa.array(keep_mask(table, settings)))


def merge_order(tables_oldest_first: Sequence[pa.Table]) -> pa.Table:
    """Concatenate sorted tables with a source column and sort into merged order."""
    parts = []
    for i, t in enumerate(tables_oldest_first):
        t = t.select(COLUMNS)
        parts.append(t.append_column(SOURCE, pa.array(np.full(t.num_rows, i, dtype=np.int32))))
    if not parts:
        return SCHEMA.empty_table().append_column(SOURCE, pa.array([], pa.int32()))
    table = pa.concat_tables(parts)
    if len(parts) == 1:
        return table  # a single sorted input is already in merged order
    idx = pc.sort_indices(table, sort_keys=MERGE_SORT_KEYS)
    return table.take(idx)


def merge_tables(tables_oldest_first: Sequence[pa.Table], settings: IteratorSettings = SCAN) -> pa.Table:
    """Merge sorted tables (oldest first) and apply the iterator stack; returns the file schema."""
    merged = merge_order(tables_oldest_first)
    return apply_stack_table(merged, settings).drop_columns([SOURCE])


def first_unsorted(table: pa.Table) -> int | None:
    """Index of the first entry that sorts before its predecessor, or None when ``table`` is in
    key order. Vectorized: compares each entry with the previous one, column by column."""
    n = table.num_rows
    if n < 2:
        return None
    undecided = np.ones(n - 1, dtype=bool)  # all earlier columns equal so far
    bad = np.zeros(n - 1, dtype=bool)
    for name, direction in ARROW_SORT_KEYS:
        col = table.column(name)
        prev, cur = col.slice(0, n - 1), col.slice(1)
        if direction == "descending":
            prev, cur = cur, prev
        if name == "deleted":
            prev, cur = prev.cast(pa.int8()), cur.cast(pa.int8())
        lt = _np_bool(pc.less(cur, prev))
        bad |= undecided & lt
        undecided &= _np_bool(pc.equal(cur, prev))
        if not undecided.any():
            break
    hits = np.flatnonzero(bad)
    return int(hits[0]) + 1 if len(hits) else None
