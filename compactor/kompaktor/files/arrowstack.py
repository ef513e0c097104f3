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
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from kompaktor.files.phases import phase
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
#: a range whose entries share their 8-byte row prefix this many times over, on average, is
#: ordered by its key columns' ranks (:func:`_ranked`) instead of a sort of its key columns
RANKED_ENTRIES_PER_PREFIX = 4
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
    if table.num_rows == 0:
        return np.zeros(0, dtype=bool)
    start, row_starts = _starts(table)
    return _keep(
        start,
        row_starts,
        _np_bool(table.column("deleted")),
        settings,
        lambda: table.column("ts").to_numpy(),
        lambda: table,
    )


def _keep(
    start: Mask,
    row_starts: Mask,
    dele: Mask,
    settings: IteratorSettings,
    ts: Callable[[], NDArray[np.int64]],
    rows: Callable[[], pa.Table],
) -> Mask:
    """:func:`keep_mask` from the merged order's column-key and row starts and delete flags;
    ``ts`` and ``rows`` (a table with the ``row`` column) give the timestamps and rows in merged
    order, asked for only when the settings need them (age-off, a row filter)."""
    n = len(start)
    filtered = settings.ageoff_cutoff is not None or settings.has_row_filter
    if settings.full and settings.max_versions == 1 and not filtered:
        # the common system compaction: the newest entry of each key, unless it is a marker
        out: Mask = start & ~dele
        return out

    hidden = _within_group_exclusive(dele, start) > 0
    visible = ~hidden
    markers = dele & visible if not settings.full else np.zeros(n, dtype=bool)

    cand = visible & ~dele
    cutoff = settings.ageoff_cutoff
    if cutoff is not None:
        cand &= ts() >= cutoff
    if settings.has_row_filter:
        cand &= ~_row_dropped(rows(), row_starts, settings)
    rank = _within_group_exclusive(cand, start)  # candidates before this one
    kept: Mask = markers | (cand & (rank < settings.max_versions))
    return kept


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
    Their concatenation in that order is then their merged order: no sort, no merge (inputs whose
    key ranges do not overlap, and the ranges where only one input has entries: docs/architecture.md
    "Key shapes, and merging without a sort").
    Python compares bytes as unsigned bytes, as Arrow orders binary columns."""
    spans = [(_column_key(t, 0), _column_key(t, t.num_rows - 1), i) for i, t in enumerate(tables) if t.num_rows]
    spans.sort()
    if any(prev[1] >= nxt[0] for prev, nxt in itertools.pairwise(spans)):
        return None
    return [i for _first, _last, i in spans]


def merged_already(tables: Sequence[pa.Table]) -> list[int] | None:
    """:func:`disjoint_order` when each table is also in key order within its rows, so that their
    concatenation in that order *is* their merged order; else None (they are merged). The cursors
    check only that an input's rows never decrease: an input out of order within a row is merged
    even where it is alone in a range."""
    order = disjoint_order(tables)
    if order is None or any(first_unsorted(tables[i]) is not None for i in order):
        return None
    return order


def _common_prefix(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


#: masks keeping the first 0..8 bytes of a big-endian 64-bit word
_KEEP = np.array([0] + [((1 << (8 * k)) - 1) << (64 - 8 * k) for k in range(1, 9)], dtype=np.uint64)


def _offsets(values: pa.Array[Any]) -> NDArray[np.int32]:
    """The value offsets of a binary array (``len + 1`` of them, into its data buffer), no copy."""
    buf = values.buffers()[1]
    assert buf is not None  # a binary array always has offsets
    return np.frombuffer(memoryview(buf), dtype=np.int32, count=len(values) + 1, offset=4 * values.offset)


def _row_prefixes(rows: pa.Array[Any], skip: int) -> tuple[NDArray[np.uint64], NDArray[np.int64]]:
    """(prefix, length) of each row: bytes ``skip`` to ``skip + 8`` as a big-endian unsigned
    integer, zero padded — a value that never decreases as the row increases — and the row's
    length in bytes."""
    offsets = _offsets(rows).astype(np.int64)
    buf = rows.buffers()[2]
    data = np.frombuffer(memoryview(buf), dtype=np.uint8) if buf is not None and buf.size else np.zeros(0, np.uint8)
    data = np.concatenate([data, np.zeros(8, np.uint8)])  # a word read at any row's start stays inside
    # every byte offset seen as the start of a big-endian word (unaligned, no copy)
    words = np.ndarray(shape=(len(data) - 7,), dtype=">u8", buffer=data, strides=(1,))
    start = offsets[:-1] + skip
    length = offsets[1:] - offsets[:-1]
    got = words[np.minimum(start, len(words) - 1)].astype(np.uint64)
    return got & _KEEP[np.clip(length - skip, 0, 8)], length


def merge_indices(tables_oldest_first: Sequence[pa.Table]) -> np.ndarray:
    """Indexes into the concatenation of ``tables_oldest_first`` in merged order
    (:data:`MERGE_SORT_KEYS`), made from the inputs' order instead of a comparison sort of the
    whole range (docs/architecture.md "Merging sorted inputs"; :func:`_merged`)."""
    return _merged(tables_oldest_first)[0]


def _merged(tables: Sequence[pa.Table]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(order, column-key starts, row starts) of the sorted ``tables`` (oldest first; each one's
    rows never decrease, as the cursors check): ``order`` indexes their concatenation in merged
    order, the starts are in that order.

    Each row is cut to the 8 bytes that follow the prefix every row of the range shares, as an
    unsigned integer that orders as the row does (equal integers: rows equal in those bytes).
    numpy's stable sort of those integers is a timsort: it finds the runs the sorted inputs
    make and merges them (O(n log k)). An entry whose integer no other entry shares is a row of
    its own (a key start and a row start). Only the entries that share one are ordered by the
    rest of the key (Arrow's ``sort_indices``, newest input first among identical keys; on the
    integer and the row's length instead of the row when those 8 bytes hold every row whole)
    and put back in the positions they took — the integer orders them, group by group, as the
    full key does. Nothing is assumed of the order within a row (such an input comes out sorted)."""
    sizes = [t.num_rows for t in tables]
    n = sum(sizes)
    start, row_start = np.ones(n, dtype=bool), np.ones(n, dtype=bool)
    if not n:
        return np.zeros(0, dtype=np.int64), start, row_start
    rows = [t.column("row").combine_chunks() for t in tables]
    live = [r for r in rows if len(r)]
    skip = _common_prefix(min(r[0].as_py() for r in live), max(r[len(r) - 1].as_py() for r in live))
    got = [_row_prefixes(r, skip) for r in live]
    prefix = np.concatenate([p for p, _ in got])
    order = np.argsort(prefix, kind="stable")
    sp = prefix[order]
    tie = np.zeros(n, dtype=bool)
    tie[1:] = sp[1:] == sp[:-1]
    distinct = n - int(np.count_nonzero(tie))
    tie[:-1] |= tie[1:]  # both ends of an equal pair
    pos = np.flatnonzero(tie)
    if len(pos) > n // 2:  # mostly tied: one sort of them all costs less than picking them out
        # many entries per row (or rows alike in those 8 bytes): the key columns' ranks order
        # them, sorting only the few distinct rows (with few, ranking costs less than a sort)
        ranked = None
        if distinct <= n // RANKED_ENTRIES_PER_PREFIX:
            ranked = _ranked(tables, _prefix_row_ranks(order, sp, np.concatenate([ln for _, ln in got]), skip))
        if ranked is not None:
            return ranked
        pos = np.arange(n)
    if len(pos):
        length = np.concatenate([ln for _, ln in got])
        if len(pos) == n:
            sub, tied = pos, np.ones(n, dtype=bool)
        else:  # the tied entries in the inputs' order (read forward, not gathered)
            tied = np.zeros(n, dtype=bool)
            tied[order[pos]] = True
            sub = np.flatnonzero(tied)
            prefix, length = prefix[sub], length[sub]
        sidx, start[pos], row_start[pos] = _tie_order(tables, tied, prefix, length, skip)
        order[pos] = sub[sidx]
    return order, start, row_start


def _ranks(values: pa.Array[Any]) -> tuple[NDArray[np.uint64], int]:
    """Each value's rank among the distinct ``values`` (equal values, equal ranks; in the order
    Arrow sorts binary values: as unsigned bytes) and the bits a rank needs."""
    enc = cast("pa.DictionaryArray[Any, Any]", pc.dictionary_encode(values))
    distinct = enc.dictionary
    rank_of = np.empty(len(distinct), dtype=np.uint64)
    rank_of[pc.sort_indices(distinct).to_numpy()] = np.arange(len(distinct), dtype=np.uint64)
    ranks: NDArray[np.uint64] = rank_of[enc.indices.to_numpy()]
    return ranks, (len(distinct) - 1).bit_length()


def _constant(chunks: Sequence[pa.Array[Any]]) -> bool:
    """Whether every value of the binary ``chunks`` is the same (one family or visibility in the
    whole range, as is common): read from their offsets and bytes, no hashing."""
    first: bytes | None = None
    for ch in chunks:
        if not len(ch):
            continue
        offs = _offsets(ch)
        if first is None:
            first = cast(bytes, ch[0].as_py())
        if np.any(np.diff(offs) != len(first)):
            return False
        if first and (buf := ch.buffers()[2]) is not None:
            data = np.frombuffer(memoryview(buf), dtype=np.uint8)[offs[0] : offs[-1]]
            if not (data.reshape(-1, len(first)) == np.frombuffer(first, dtype=np.uint8)).all():
                return False
    return True


def _prefix_row_ranks(
    order: np.ndarray, sp: np.ndarray, length: np.ndarray, skip: int
) -> tuple[NDArray[np.uint64], int] | None:
    """The rows' ranks (and the bits they need) from the sort by their 8-byte prefixes
    (``order``, ``sp``: the sorted prefixes; ``length``: the rows' lengths, in input order) when
    those hold every row whole and no two rows of different lengths share one (a row and itself
    plus zero bytes); else None (:func:`_ranks` ranks them)."""
    if int(length.max()) > skip + 8:
        return None
    ls = length[order]
    same = sp[1:] == sp[:-1]
    if np.any(same & (ls[1:] != ls[:-1])):
        return None
    new = np.ones(len(sp), dtype=np.uint64)
    new[1:] = ~same
    sorted_ranks = np.cumsum(new) - np.uint64(1)
    ranks = np.empty(len(sp), dtype=np.uint64)
    ranks[order] = sorted_ranks
    return ranks, int(sorted_ranks[-1]).bit_length()


def _column_key_ids(
    tables: Sequence[pa.Table], row_ranks: tuple[NDArray[np.uint64], int] | None = None
) -> tuple[NDArray[np.uint64], int] | None:
    """Each entry's column key (row, cf, cq, vis) as one unsigned integer that orders as the key
    does — the ranks of its row (``row_ranks`` when given), family, qualifier and visibility
    among the range's distinct ones, side by side — and the bits below the row's rank; None when
    they need over 64 bits."""
    n = sum(t.num_rows for t in tables)
    ids = np.zeros(n, dtype=np.uint64)
    shift = 0
    for c in reversed(KEY_COLUMNS):  # vis in the lowest bits, the row in the highest
        chunks = [ch for t in tables for ch in t.column(c).chunks]
        if c == "row" and row_ranks is not None:
            ranks, bits = row_ranks
        elif _constant(chunks):  # one family, one visibility...: no bits at all
            ranks, bits = ids, 0
        else:
            ranks, bits = _ranks(pa.concat_arrays(chunks))
        if shift + bits > 64:
            return None
        if bits:
            ids |= ranks << np.uint64(shift)
        shift += bits
    return ids, shift - bits


def _ranked(
    tables: Sequence[pa.Table], row_ranks: tuple[NDArray[np.uint64], int] | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """:func:`_merged` by a normalized key (DataFusion's ``RowConverter`` does the same with
    bytes): each entry's column key as one integer (:func:`_column_key_ids`), sorted stably
    (a timsort: the sorted inputs are its runs); only the entries that share a column key with
    another are ordered by the rest of the key (newest timestamp, delete marker, newest input
    first). None when the column keys need over 64 bits."""
    got = _column_key_ids(tables, row_ranks)
    if got is None:
        return None
    ids, row_shift = got
    n = len(ids)
    order = np.argsort(ids, kind="stable")
    sk = ids[order]
    start, row_start = np.ones(n, dtype=bool), np.ones(n, dtype=bool)
    same = sk[1:] == sk[:-1]
    start[1:] = ~same
    row_start[1:] = (sk[1:] >> np.uint64(row_shift)) != (sk[:-1] >> np.uint64(row_shift))
    tie = np.zeros(n, dtype=bool)
    tie[1:] = same
    tie[:-1] |= same
    pos = np.flatnonzero(tie)
    if len(pos):
        sub = order[pos]
        ts = np.concatenate([t.column("ts").to_numpy() for t in tables])[sub]
        dele = np.concatenate([_np_bool(t.column("deleted")) for t in tables])[sub]
        src = np.repeat(np.arange(len(tables), dtype=np.int32), [t.num_rows for t in tables])[sub]
        order[pos] = sub[_versions_order(sk[pos], start[pos], ts, dele, src)]
    return order, start, row_start


def _versions_order(
    key: NDArray[np.uint64], first: Mask, ts: NDArray[np.int64], dele: Mask, src: NDArray[np.int32]
) -> NDArray[np.int64]:
    """The order of entries that share their column key with another (``key``; ``first``: where
    a key's group starts), given oldest input first and, within an input, in its key order: by
    newest timestamp, marker first, newest input first. A group in which each entry is newer
    than the one before it — versions imported one after another — is only reversed; the other
    groups are sorted (Arrow's ``sort_indices``)."""
    m = len(key)
    group = np.cumsum(first) - 1
    firsts = np.flatnonzero(first)
    lasts = np.append(firsts[1:], m) - 1
    perm: NDArray[np.int64] = (firsts + lasts)[group] - np.arange(m)  # every group reversed
    same_ts = ts[1:] == ts[:-1]
    newer = (ts[1:] > ts[:-1]) | (same_ts & (dele[1:] > dele[:-1]))
    newer |= same_ts & (dele[1:] == dele[:-1]) & (src[1:] > src[:-1])
    unordered = np.zeros(len(firsts), dtype=bool)
    unordered[group[1:][~newer & ~first[1:]]] = True
    if unordered.any():
        sel = np.flatnonzero(unordered[group])
        part = pa.table({"key": key[sel], "ts": ts[sel], "deleted": dele[sel], SOURCE: src[sel]})
        sort_keys: list[ArrowSortKey] = [("key", "ascending"), *ARROW_SORT_KEYS[4:], (SOURCE, "descending")]
        perm[sel] = sel[pc.sort_indices(part, sort_keys=sort_keys).to_numpy()]
    return perm


def _tie_order(
    tables: Sequence[pa.Table], tied: np.ndarray, prefix: np.ndarray, length: np.ndarray, skip: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The order of the ``tied`` entries of the concatenated inputs (``prefix``, ``length``: of
    their rows) by the full key, newest input first among identical keys, as indexes into those
    entries; and, in that order, where a column key and where a row starts."""
    keys = pa.concat_tables(
        t.select(["row", "cf", "cq", "vis", "ts", "deleted"]).append_column(
            SOURCE, pa.array(np.full(t.num_rows, i, dtype=np.int32))
        )
        for i, t in enumerate(tables)
    )
    part = (keys if tied.all() else keys.filter(pa.array(tied))).combine_chunks()
    if int(length.max()) <= skip + 8:  # the prefix and the length are the row
        part = part.drop_columns(["row"]).append_column("__prefix", pa.array(prefix))
        part = part.append_column("__length", pa.array(length))
        row_cols = ["__prefix", "__length"]
        sort_keys: list[ArrowSortKey] = [(c, "ascending") for c in row_cols] + MERGE_SORT_KEYS[1:]
    else:
        sort_keys, row_cols = MERGE_SORT_KEYS, ["row"]
    sidx = pc.sort_indices(part, sort_keys=sort_keys)
    ordered = part.select([*row_cols, "cf", "cq", "vis"]).take(sidx)
    m = part.num_rows
    start, row_start = np.ones(m, dtype=bool), np.ones(m, dtype=bool)
    if m > 1:
        diffs = [pc.not_equal(c.slice(1), c.slice(0, m - 1)) for c in ordered.columns]
        row_diff = diffs[0] if len(row_cols) == 1 else pc.or_(diffs[0], diffs[1])
        row_start[1:] = _np_bool(row_diff)
        key_start = row_diff
        for d in diffs[len(row_cols) :]:
            key_start = pc.or_(key_start, d)
        start[1:] = _np_bool(key_start)
    return sidx.to_numpy(), start, row_start


def _with_source(tables_oldest_first: Sequence[pa.Table]) -> list[pa.Table]:
    return [
        t.select(COLUMNS).append_column(SOURCE, pa.array(np.full(t.num_rows, i, dtype=np.int32)))
        for i, t in enumerate(tables_oldest_first)
    ]


def merge_order(tables_oldest_first: Sequence[pa.Table]) -> pa.Table:
    """Concatenate sorted tables with a source column, in merged order (:func:`merge_indices`;
    a plain concatenation in key order when their key ranges do not overlap, :func:`merged_already`)."""
    parts = _with_source(tables_oldest_first)
    if not parts:
        return SCHEMA.empty_table().append_column(SOURCE, pa.array([], pa.int32()))
    order = merged_already(parts)
    if order is not None:  # a single input, or inputs that do not overlap
        return pa.concat_tables([parts[i] for i in order] if order else parts)
    return _take(pa.concat_tables(parts), merge_indices(parts))


def _take(table: pa.Table, idx: np.ndarray) -> pa.Table:
    if table.nbytes < COMBINE_LIMIT:
        # contiguous columns: take is much faster than on chunks (binary columns have 32-bit
        # offsets: one contiguous column must stay under 2 GiB)
        table = table.combine_chunks()
    return table.take(pa.array(idx))


def merge_tables(tables_oldest_first: Sequence[pa.Table], settings: IteratorSettings = SCAN) -> pa.Table:
    """Merge sorted tables (oldest first) and apply the iterator stack; returns the file schema."""
    if len(tables_oldest_first) < 2 or disjoint_order(tables_oldest_first) is not None:
        merged = merge_order(tables_oldest_first)
        return apply_stack_table(merged, settings).drop_columns([SOURCE])
    table = pa.concat_tables(t.select(COLUMNS) for t in tables_oldest_first)
    return _take(table, merge_keep(tables_oldest_first, table, settings))


def merge_keep(tables_oldest_first: Sequence[pa.Table], table: pa.Table, settings: IteratorSettings) -> np.ndarray:
    """Indexes into ``table`` (the concatenation of ``tables_oldest_first``) of the entries the
    iterator stack keeps, in merged order: the stack runs on the merge's key starts and the
    inputs' delete flags, without the key columns ever being put into merged order."""
    order, start, row_start = _merged(tables_oldest_first)
    dele = _np_bool(table.column("deleted"))[order]
    keep = _keep(
        start,
        row_start,
        dele,
        settings,
        lambda: table.column("ts").to_numpy()[order],
        lambda: table.select(["row"]).take(pa.array(order)),
    )
    kept: NDArray[np.int64] = order[keep]
    return kept


def merge_tables_once(tables_oldest_first: Sequence[pa.Table], settings: IteratorSettings = SCAN) -> pa.Table:
    """What :func:`merge_tables` returns — the same entries, one contiguous chunk per column —
    with less copying: the iterator stack runs on the merge of the inputs (:func:`merge_keep`),
    and each kept entry's columns, the value among them, are taken once from the inputs (no
    sorted copy of the whole range, no filter pass over it)."""
    if len(tables_oldest_first) < 2 or sum(t.nbytes for t in tables_oldest_first) >= COMBINE_LIMIT:
        return merge_tables(tables_oldest_first, settings)
    with phase("merge"):
        order = merged_already(tables_oldest_first)
        if order is not None:  # already in merged order once concatenated: the stack alone
            table = pa.concat_tables([tables_oldest_first[i].select(COLUMNS) for i in order] or [SCHEMA.empty_table()])
            keep = keep_mask(table, settings)
        else:
            table = pa.concat_tables(t.select(COLUMNS) for t in tables_oldest_first)
            kept = merge_keep(tables_oldest_first, table, settings)
    with phase("take"):
        if order is not None:  # every entry kept (no versions, no markers): one copy of the range, not two
            return (table if keep.all() else table.filter(pa.array(keep))).combine_chunks()
        return table.take(pa.array(kept)).combine_chunks()


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
