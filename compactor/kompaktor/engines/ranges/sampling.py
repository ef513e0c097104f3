"""Sampling: a row group too big to cut at (Spark and Hive write 128 MB row groups; a file may be
one row group) is read from its ``row`` column alone, in batches, each batch becoming a segment
(first row, last row, entries) the planner can cut at.

Part of :mod:`kompaktor.engines.ranges`; imports only :mod:`.inputs`.
"""

from __future__ import annotations

import pyarrow.parquet as pq

from kompaktor.engines.ranges.inputs import RANGE_BYTES, Bound, InputMeta, as_bytes, reading, row_column, row_stats
from kompaktor.files.storage import Storage
from kompaktor.model.errors import BadFileError
from kompaktor.model.keys import span_overlaps

#: a row group is sampled for cut points when it holds more than this share of a range
SAMPLE_SHARE = 0.25
#: rows per sampled segment at most / at least
SEGMENT_ROWS_MAX = 64 * 1024
SEGMENT_ROWS_MIN = 1024


def segment_rows(seg_rows: int, entries: int, nbytes: int, limit_bytes: int) -> int:
    """Rows per sampled segment of a row group of ``entries`` holding ``nbytes``: ``seg_rows``,
    fewer where its entries are big, so that a segment holds at most half of ``limit_bytes``
    (a file of 4 KiB values may be one row group of 62,500 rows and 256 MB: fewer rows than a
    segment by count, yet a whole range by size). Never fewer than :data:`SEGMENT_ROWS_MIN`."""
    per_entry = nbytes / max(1, entries)
    by_bytes = int(limit_bytes / 2 / per_entry) if per_entry > 0 else seg_rows
    return max(SEGMENT_ROWS_MIN, min(seg_rows, by_bytes))


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
        first, last = as_bytes(rows[0].as_py()), as_bytes(rows[n - 1].as_py())
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
                out.append(_sample_file(storage, m, seg_rows, limit_bytes))
            else:
                out.append(m)
            continue
        big = {
            i
            for i, (lo, hi, n, nb) in enumerate(m.groups)
            if (n > limit or nb > limit_bytes)
            and n > segment_rows(seg_rows, n, nb, limit_bytes)
            and span_overlaps(lo, hi, prev, end)
        }
        if not big:
            out.append(m)
            continue
        index = m.group_index or tuple(range(len(m.groups)))
        groups: list[tuple[bytes, bytes, int, int]] = []
        new_index: list[int] = []
        with reading(m.path), storage.open_input(m.path) as f:
            pf = pq.ParquetFile(f)
            for i, grp in enumerate(m.groups):
                segs = [grp]
                if i in big:
                    rows = segment_rows(seg_rows, grp[2], grp[3], limit_bytes)
                    segs = _sample_group(pf, m.path, index[i], (grp[0], grp[1]), grp[3], rows)
                groups.extend(segs)
                new_index.extend([index[i]] * len(segs))
        out.append(InputMeta(m.path, m.size, m.entries, tuple(groups), m.has_stats, m.data_bytes, tuple(new_index)))
    return out


def _sample_file(storage: Storage, m: InputMeta, seg_rows: int, limit_bytes: int) -> InputMeta:
    """Segments of every row group of a file whose footer lacks row statistics (somewhere)."""
    groups: list[tuple[bytes, bytes, int, int]] = []
    index: list[int] = []
    with reading(m.path), storage.open_input(m.path) as f:
        pf = pq.ParquetFile(f)
        md = pf.metadata
        row_col = row_column(md)
        for g in range(md.num_row_groups):
            rg = md.row_group(g)
            rows = segment_rows(seg_rows, rg.num_rows, rg.total_byte_size, limit_bytes)
            segs = _sample_group(pf, m.path, g, row_stats(md, row_col, g), rg.total_byte_size, rows)
            groups.extend(segs)
            index.extend([g] * len(segs))
    return InputMeta(m.path, m.size, m.entries, tuple(groups), True, m.data_bytes, tuple(index))
