"""Copy-through (docs/architecture.md "Copying row groups through"): the row groups of an input
that the merge would output exactly as they are, copied into the output as column-chunk bytes,
without decoding their values.

A row group is copied only when both hold:

- **nothing else in the job has rows in its row range**: no row group of any input (its own file's
  included) has a row between its first and last row, by the footers' row statistics (the row
  group is then a key range of its own; the cuts around it are the highest row of the others below
  it and its own last row), and it lies inside the tablet's range (prev, end];
- **the iterator stack keeps every one of its entries unchanged**: its key columns (row, cf, cq,
  vis, ts, deleted) are decoded and checked — in full key order, inside its statistics, and
  :func:`~kompaktor.files.arrowstack.keep_mask` (the merge's own rule) keeps every entry: no delete
  marker a full compaction drops or one that hides an entry, no more versions of a column key than
  ``max_versions``, nothing aged off, no row the row filter removes. The statistics rule out the
  hopeless row groups before anything is decoded (a marker in a full compaction, a put older than
  the age-off cutoff, rows inside the row filter's range, any row regex).

A row group that fails the check is merged as any range is (alone: nothing else has rows there).
The file must have the sorted file schema and its chunks must lie one after the other
(:func:`~kompaktor.files.parquetconcat.copyable_row_group`). Part of :mod:`kompaktor.engines.ranges`;
imports only :mod:`.inputs`.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from kompaktor.engines.ranges.inputs import Bound, InputMeta, reading
from kompaktor.files.arrowstack import first_row_decrease, first_unsorted, keep_mask, merge_tables_once
from kompaktor.files.parquetconcat import (
    Struct,
    as_file,
    copyable_row_group,
    decode_footer,
    read_footer_bytes,
    relocated_row_group,
    row_group_file,
)
from kompaktor.files.sortedfile import EncodedRange, conform, count_deletes, encode_table
from kompaktor.files.storage import Storage
from kompaktor.model.errors import BadFileError, UnsortedError
from kompaktor.model.iterators import IteratorSettings
from kompaktor.model.keys import Entry, SortKey, sort_key

#: the smallest row group the engine copies (uncompressed bytes): a smaller one is merged, so that
#: outputs of small files (flushes, imports of a few entries) are not made of many tiny row groups
#: (each with its own footer entry and statistics, compressed apart); copying it saves little
COPY_MIN_BYTES = 1 << 20

#: the columns decoded to decide whether a row group is copied (all but the value)
KEY_COLUMNS = ["row", "cf", "cq", "vis", "ts", "deleted"]


@dataclass(frozen=True)
class CopyRun:
    """Consecutive row groups of one input, a key range of their own, to copy if they pass."""

    input: int  # index of the input in the request (oldest first)
    path: str
    groups: tuple[int, ...]  # row-group indexes in the file, consecutive
    claims: tuple[tuple[bytes, bytes], ...]  # each row group's (min row, max row) statistics
    spans: tuple[tuple[int, int], ...]  # where each row group's chunks lie (copyable_row_group)
    entries: int
    footer: Struct  # the file's footer, read and decoded when planning (not read again to copy)

    @property
    def last_row(self) -> bytes:
        return self.claims[-1][1]


@dataclass(frozen=True)
class Copied:
    """Row groups copied as they are: their chunks' bytes, their footer entries (offsets relative
    to ``data``), and what they hold."""

    data: bytes
    row_groups: list[Struct]
    entries: int
    deletes: int
    first: SortKey
    last: SortKey


def _column_stats(md: pq.FileMetaData, g: int, name: str) -> Any:
    rg = md.row_group(g)
    for c in range(rg.num_columns):
        col = rg.column(c)
        if col.path_in_schema == name:
            st = col.statistics
            return st if st is not None and st.has_min_max else None
    return None


def _hopeless(md: pq.FileMetaData, g: int, lo: bytes, hi: bytes, settings: IteratorSettings) -> bool:
    """True when the statistics show that the stack changes row group ``g`` (rows ``lo`` to ``hi``)."""
    if settings.row_regex is not None:
        return True
    start, end = settings.row_start, settings.row_end
    if (start is not None or end is not None) and (end is None or lo < end) and (start is None or hi >= start):
        return True  # some row may be inside the row filter's range
    if settings.full:
        dele = _column_stats(md, g, "deleted")
        if dele is None or dele.max:
            return True
    cutoff = settings.ageoff_cutoff
    if cutoff is not None:
        ts = _column_stats(md, g, "ts")
        if ts is None or ts.min < cutoff:
            return True
    return False


def _isolated(metas: list[InputMeta], prev: Bound, end: Bound) -> list[tuple[Bound, int, int, bytes, bytes, int, int]]:
    """The row groups no other row group of the job shares a row with, inside (prev, end]: (the
    highest row below them of any other row group, or prev; input; row group; min row; max row;
    entries; uncompressed bytes), in key order."""
    spans = sorted(
        (lo, hi, i, g, n, nb)
        for i, m in enumerate(metas)
        for (lo, hi, n, nb), g in zip(m.groups, m.group_index or range(len(m.groups)), strict=True)
        if (prev is None or hi > prev) and (end is None or lo <= end)
    )
    out = []
    below: Bound = prev
    for k, (lo, hi, i, g, n, nb) in enumerate(spans):
        clear = (below is None or below < lo) and (k + 1 == len(spans) or hi < spans[k + 1][0])
        inside = (prev is None or lo > prev) and (end is None or hi <= end)
        if clear and inside:
            out.append((below, i, g, lo, hi, n, nb))
        below = hi if below is None or hi > below else below
    return out


def _runs(
    storage: Storage,
    metas: list[InputMeta],
    prev: Bound,
    end: Bound,
    settings: IteratorSettings,
    max_bytes: int,
    min_bytes: int,
) -> list[tuple[Bound, CopyRun]]:
    """The runs of row groups that may be copied, in key order, each with the cut below it."""
    runs: list[tuple[Bound, CopyRun, int]] = []  # (cut below, run, uncompressed bytes)
    footers: dict[int, tuple[Struct, pq.FileMetaData]] = {}  # by input: decoded, and as pyarrow reads it
    for below, i, g, lo, hi, n, nb in _isolated(metas, prev, end):
        if nb > max_bytes or nb < min_bytes:
            continue
        if i not in footers:
            with reading(metas[i].path), storage.open_input(metas[i].path) as f:
                raw = read_footer_bytes(f, f.size(), metas[i].path)
                footers[i] = (decode_footer(raw, metas[i].path), pq.read_metadata(pa.BufferReader(as_file(raw))))
        footer, md = footers[i]
        span = copyable_row_group(footer, g)
        if span is None or _hopeless(md, g, lo, hi, settings):
            continue
        if runs and _follows(runs[-1][1], i, g, below) and runs[-1][2] + nb <= max_bytes:
            cut, r, nbytes = runs[-1]
            groups, claims, spans = (*r.groups, g), (*r.claims, (lo, hi)), (*r.spans, span)
            runs[-1] = (cut, CopyRun(i, r.path, groups, claims, spans, r.entries + n, footer), nbytes + nb)
        else:
            runs.append((below, CopyRun(i, metas[i].path, (g,), ((lo, hi),), (span,), n, footer), nb))
    return [(cut, run) for cut, run, _nb in runs]


def _follows(run: CopyRun, i: int, g: int, below: Bound) -> bool:
    """Row group ``g`` of input ``i`` comes right after ``run`` in the file and in key order."""
    return run.input == i and run.groups[-1] == g - 1 and run.last_row == below


def plan_copies(
    storage: Storage,
    metas: list[InputMeta],
    prev: Bound,
    end: Bound,
    settings: IteratorSettings,
    ranges: list[tuple[Bound, Bound]],
    max_bytes: int,
    min_bytes: int = 0,
) -> tuple[list[tuple[Bound, Bound]], dict[int, CopyRun]]:
    """``ranges`` (the plan of (prev, end]) cut again so that every run of consecutive row groups
    that may be copied (of one input, at most ``max_bytes`` uncompressed; row groups of at least
    ``min_bytes``, :data:`COPY_MIN_BYTES` in the engine) is a range of its own;
    the new ranges and, by range index, the run each copy range holds. Only the footers are read."""
    if not all(m.has_stats or not m.entries for m in metas):  # rows somewhere no statistics say
        return ranges, {}
    runs = _runs(storage, metas, prev, end, settings, max_bytes, min_bytes)
    if not runs:
        return ranges, {}
    spans = [(below, run.last_row) for below, run in runs]  # in key order, not overlapping
    tops = [b for _a, b in spans]
    cuts = {hi for _lo, hi in ranges[:-1] if not _inside(hi, spans, tops)}
    cuts.update(c for span in spans for c in span if c is not None and c != prev and c != end)
    bounds: list[Bound] = [prev, *sorted(c for c in cuts if c is not None), end]
    new = list(itertools.pairwise(bounds))
    by_span = {span: run for span, (_b, run) in zip(spans, runs, strict=True)}
    return new, {k: by_span[r] for k, r in enumerate(new) if r in by_span}


def _inside(row: Bound, spans: list[tuple[Bound, bytes]], tops: list[bytes]) -> bool:
    """``row`` strictly inside one of ``spans`` (in key order, not overlapping; ``tops``: their tops)."""
    if row is None:
        return False
    k = bisect.bisect_right(tops, row)
    if k == len(spans):
        return False
    lo, hi = spans[k]
    return (lo is None or row > lo) and row < hi


def _key(keys: pa.Table, i: int) -> SortKey:
    row, cf, cq, vis, ts, deleted = (keys.column(c)[i].as_py() for c in KEY_COLUMNS)
    return sort_key(Entry(row, cf, cq, vis, ts, deleted, b""))


def _claimed(path: str, g: int, t: pa.Table, claim: tuple[bytes, bytes]) -> None:
    """Refuse row group ``g`` when its rows decrease or lie outside its statistics (as the cursors do)."""
    if not t.num_rows:
        return
    bad = first_row_decrease(t)
    if bad is not None:
        raise UnsortedError(
            f"{path}: entries are not in key order: row {bad} of row group {g} sorts before the previous row"
        )
    first, last = t.column("row")[0].as_py(), t.column("row")[t.num_rows - 1].as_py()
    if first < claim[0] or last > claim[1]:
        row = first if first < claim[0] else last
        raise BadFileError(
            f"{path}: row group {g} holds row {row!r}, outside the rows its footer "
            f"statistics claim ({claim[0]!r} to {claim[1]!r})"
        )


class Piece(NamedTuple):
    """One row group of a copy run: copied, or merged (what the stack keeps of it, encoded); the
    entries and delete markers it read."""

    out: Copied | EncodedRange
    entries_read: int
    deletes_read: int


def copy_run(storage: Storage, run: CopyRun, settings: IteratorSettings) -> list[Piece]:
    """The run's row groups in order, each one :class:`Copied` when the stack keeps it unchanged,
    else merged alone (nothing else has rows there) and encoded. Each row group's bytes are read
    once (one request on an object store), for the check and the copy alike."""
    with reading(run.path), storage.open_input(run.path) as f:
        return [
            _piece(f, run, g, claim, span, settings)
            for g, claim, span in zip(run.groups, run.claims, run.spans, strict=True)
        ]


def _piece(
    f: Any, run: CopyRun, g: int, claim: tuple[bytes, bytes], span: tuple[int, int], settings: IteratorSettings
) -> Piece:
    with reading(run.path, row_group=g):
        start, end = span
        data = f.read_at(end - start, start)
        one = pq.ParquetFile(pa.BufferReader(row_group_file(run.footer, g, data, start)))
        got = _copied(one, run.footer, run.path, g, claim, settings, data, start)
        if got is not None:
            return Piece(got, got.entries, got.deletes)
        return _merged_alone(run.path, g, conform(one.read_row_group(0), run.path), claim, settings)


def _merged_alone(path: str, g: int, t: pa.Table, claim: tuple[bytes, bytes], settings: IteratorSettings) -> Piece:
    _claimed(path, g, t, claim)
    return Piece(encode_table(merge_tables_once([t], settings)), t.num_rows, count_deletes(t))


def _copied(
    one: pq.ParquetFile,
    md: Struct,
    path: str,
    g: int,
    claim: tuple[bytes, bytes],
    settings: IteratorSettings,
    data: bytes,
    start: int,
) -> Copied | None:
    """Row group ``g`` (``one``: it alone, decoded from ``data``) copied, or None when the merge
    would change it."""
    keys = one.read_row_group(0, columns=KEY_COLUMNS)
    if not keys.num_rows:
        return None
    _claimed(path, g, keys, claim)
    if first_unsorted(keys) is not None or not keep_mask(keys, settings).all():
        return None
    n = keys.num_rows
    return Copied(data, [relocated_row_group(md, g, start)], n, count_deletes(keys), _key(keys, 0), _key(keys, n - 1))
