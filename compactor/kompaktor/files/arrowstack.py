"""The iterator stack (:func:`kompaktor.model.iterators.apply_stack`) as vectorized Arrow/numpy code.

Input is an Arrow table in *merged order*: key order (:data:`kompaktor.model.keys.ARROW_SORT_KEYS`),
and among identical keys the newest source first. The rules are those of
:mod:`kompaktor.model.iterators`, computed per column key (row, cf, cq, vis) with prefix sums instead
of a Python loop:

- a put is a *candidate* unless a delete marker earlier in its column key hides it, its
  timestamp is below the age-off cutoff, or its row is removed by the row filter;
- the first ``max_versions`` candidates of each column key are kept;
- the first marker of a column key (the newest) is kept only for partial compactions
  (``settings.full`` is False); every later marker is hidden by it.

Property tests hold the result to ``merged_view`` entry for entry.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from kompaktor.files.sortedfile import COLUMNS, SCHEMA
from kompaktor.model.iterators import SCAN, IteratorSettings
from kompaktor.model.keys import ARROW_SORT_KEYS, ArrowSortKey

KEY_COLUMNS = ("row", "cf", "cq", "vis")
SOURCE = "__source"
#: merged order: key order, then the newest source (highest index) first among identical keys.
MERGE_SORT_KEYS: list[ArrowSortKey] = [*ARROW_SORT_KEYS, (SOURCE, "descending")]
#: below this size the inputs of a range are made contiguous before sorting (binary columns
#: have 32-bit offsets: one contiguous column must stay under 2 GiB)
COMBINE_LIMIT = 1 << 30
#: one flag per entry
Mask = NDArray[np.bool_]


def _np_bool(arr: pa.Array[Any] | pa.ChunkedArray[Any]) -> Mask:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    return arr.to_numpy(zero_copy_only=False).astype(bool, copy=False)


def _row_dropped(table: pa.Table, row_starts: Mask, settings: IteratorSettings) -> Mask:
    """settings.row_dropped per entry; the regex runs once per distinct row (Python ``re``, the
    same engine as the reference), the range part is vectorized."""
    n = table.num_rows
    rows = table.column("row")
    dropped = np.zeros(n, dtype=bool)
    if settings.row_regex is not None:
        idx = np.flatnonzero(row_starts)
        distinct = cast("list[bytes]", rows.take(pa.array(idx, pa.int64())).to_pylist())
        pat = re.compile(settings.row_regex.encode())
        hit = np.fromiter((pat.search(r) is not None for r in distinct), dtype=np.bool_, count=len(distinct))
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


def _starts(table: pa.Table) -> tuple[Mask, Mask]:
    """(column-key starts, row starts): True at the first entry of each column key / row."""
    n = table.num_rows
    key_start = np.ones(n, dtype=bool)
    row_start = np.ones(n, dtype=bool)
    if n > 1:
        diffs = [pc.not_equal(table.column(c).slice(1), table.column(c).slice(0, n - 1)) for c in KEY_COLUMNS]
        row_start[1:] = _np_bool(diffs[0])
        key_start[1:] = _np_bool(pc.or_(pc.or_(diffs[0], diffs[1]), pc.or_(diffs[2], diffs[3])))
    return key_start, row_start


def _within_group_exclusive(flags: Mask, start: Mask) -> NDArray[np.int64]:
    """For each entry, how many ``flags`` precede it inside its group (groups begin at ``start``)."""
    excl = np.cumsum(flags, dtype=np.int64) - flags
    # excl never decreases, so the running max of its values at group starts is the value at
    # the current group's start
    base = np.maximum.accumulate(np.where(start, excl, 0))
    return excl - base


def keep_mask(table: pa.Table, settings: IteratorSettings = SCAN) -> Mask:
    """Boolean mask of the entries ``apply_stack`` keeps from ``table`` (in merged order)."""
    n = table.num_rows
    if n == 0:
        return np.zeros(0, dtype=bool)
    start, row_starts = _starts(table)
    dele = _np_bool(table.column("deleted"))
    filtered = settings.ageoff_cutoff is not None or settings.has_row_filter
    if settings.full and settings.max_versions == 1 and not filtered:
        # the common system compaction: the newest entry of each key, unless it is a marker
        return start & ~dele

    hidden = _within_group_exclusive(dele, start) > 0
    visible = ~hidden
    markers = dele & visible if not settings.full else np.zeros(n, dtype=bool)

    cand = visible & ~dele
    cutoff = settings.ageoff_cutoff
    if cutoff is not None:
        ts = table.column("ts").to_numpy()
        cand &= ts >= cutoff
    if settings.has_row_filter:
        cand &= ~_row_dropped(table, row_starts, settings)
    rank = _within_group_exclusive(cand, start)  # candidates before this one
    return markers | (cand & (rank < settings.max_versions))


def apply_stack_table(table: pa.Table, settings: IteratorSettings = SCAN) -> pa.Table:
    """The entries of ``table`` (merged order) that the iterator stack keeps, in order."""
    if table.num_rows == 0:
        return table
    return table.filter(pa.array(keep_mask(table, settings)))


def _column_key(table: pa.Table, i: int) -> tuple[bytes, ...]:
    return tuple(table.column(c)[i].as_py() for c in KEY_COLUMNS)


def disjoint_order(tables: Sequence[pa.Table]) -> list[int] | None:
    """The indexes of the non-empty sorted ``tables`` in key order when their column-key ranges
    do not overlap (each one's last column key sorts before the next one's first), else None.
    Their concatenation in that order is then their merged order: no sort, no merge (issue 37:
    inputs whose key ranges do not overlap, and the ranges where only one input has entries).
    Python compares bytes as unsigned bytes, as Arrow orders binary columns."""
    spans = [(_column_key(t, 0), _column_key(t, t.num_rows - 1), i) for i, t in enumerate(tables) if t.num_rows]
    spans.sort()
    if any(prev[1] >= nxt[0] for prev, nxt in itertools.pairwise(spans)):
        return None
    return [i for _first, _last, i in spans]


def merge_order(tables_oldest_first: Sequence[pa.Table]) -> pa.Table:
    """Concatenate sorted tables with a source column and sort into merged order (a plain
    concatenation in key order when their key ranges do not overlap, :func:`disjoint_order`)."""
    parts = []
    for i, t in enumerate(tables_oldest_first):
        t = t.select(COLUMNS)
        parts.append(t.append_column(SOURCE, pa.array(np.full(t.num_rows, i, dtype=np.int32))))
    if not parts:
        return SCHEMA.empty_table().append_column(SOURCE, pa.array([], pa.int32()))
    order = disjoint_order(parts) if len(parts) > 1 else None
    if order is not None:
        parts = [parts[i] for i in order] or parts[:1]
    table = pa.concat_tables(parts)
    if len(parts) == 1 or order is not None:
        return table  # a single sorted input, or inputs that do not overlap: already in merged order
    if table.nbytes < COMBINE_LIMIT:
        # contiguous columns: sort_indices and especially take are much faster than on chunks
        table = table.combine_chunks()
    idx = pc.sort_indices(table, sort_keys=MERGE_SORT_KEYS)
    return table.take(idx)


def merge_tables(tables_oldest_first: Sequence[pa.Table], settings: IteratorSettings = SCAN) -> pa.Table:
    """Merge sorted tables (oldest first) and apply the iterator stack; returns the file schema."""
    merged = merge_order(tables_oldest_first)
    return apply_stack_table(merged, settings).drop_columns([SOURCE])


def merge_tables_once(tables_oldest_first: Sequence[pa.Table], settings: IteratorSettings = SCAN) -> pa.Table:
    """What :func:`merge_tables` returns — the same entries, one contiguous chunk per column —
    with less copying: only the key columns are made contiguous and sorted; the iterator stack
    runs on them, and each kept entry's columns, the value among them, are taken once from the
    inputs (no sorted copy of the whole range, no filter pass over it)."""
    if len(tables_oldest_first) < 2 or sum(t.nbytes for t in tables_oldest_first) >= COMBINE_LIMIT:
        return merge_tables(tables_oldest_first, settings)
    order = disjoint_order(tables_oldest_first)
    if order is not None:  # already in merged order once concatenated: the stack alone
        table = pa.concat_tables([tables_oldest_first[i].select(COLUMNS) for i in order] or [SCHEMA.empty_table()])
        keep = keep_mask(table, settings)
        # every entry kept (no versions, no markers): one copy of the range, not two
        return (table if keep.all() else table.filter(pa.array(keep))).combine_chunks()
    parts = []
    for i, t in enumerate(tables_oldest_first):
        t = t.select(COLUMNS)
        parts.append(t.append_column(SOURCE, pa.array(np.full(t.num_rows, i, dtype=np.int32))))
    table = pa.concat_tables(parts)
    keys = table.select([name for name, _ in MERGE_SORT_KEYS]).combine_chunks()
    idx = pc.sort_indices(keys, sort_keys=MERGE_SORT_KEYS)
    keep = keep_mask(keys.take(idx), settings)
    del keys
    return table.drop_columns([SOURCE]).take(idx.filter(pa.array(keep))).combine_chunks()


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


def first_row_decrease(table: pa.Table) -> int | None:
    """Index of the first entry whose row sorts before the previous entry's row, or None.
    A quarter of :func:`first_unsorted`'s cost; enough for the key-range merge, whose only
    assumption about an input is that its rows never decrease (it sorts each range itself)."""
    n = table.num_rows
    if n < 2:
        return None
    rows = table.column("row")
    dec = pc.less(rows.slice(1), rows.slice(0, n - 1))
    if not pc.any(dec).as_py():
        return None
    return int(pc.index(dec, True).as_py()) + 1
