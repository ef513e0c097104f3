"""Range planning: cut a tablet's rows (prev, end] into consecutive ranges (lo, hi] of about equal
size, at the max rows of row groups or sampled segments. Statistics only decide the balance of the
cut, never its correctness.

Part of :mod:`kompaktor.engines.ranges`; imports :mod:`.inputs` and :mod:`.sampling`.
"""

from __future__ import annotations

import itertools
import math

from kompaktor.engines.ranges.inputs import RANGE_BYTES, Bound, InputMeta, estimate_entries
from kompaktor.engines.ranges.sampling import refine_inputs
from kompaktor.files.storage import Storage
from kompaktor.model.keys import span_overlaps


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
    acc = 0.0
    for row, weighed in cands:
        acc += weighed
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
