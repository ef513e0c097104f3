"""Compaction selectors (docs/planner.md §5): table-configured rules that choose files for a SELECTOR
compaction. Pure policy; must not import redis, pyspark, kopf or kubernetes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["DEFAULT_DELETES_THRESHOLD", "FileStats", "too_many_deletes"]

#: ``TooManyDeletesSelector``'s default ``threshold``.
DEFAULT_DELETES_THRESHOLD = 0.25


@dataclass(frozen=True, slots=True)
class FileStats:
    """What a file's summary records: its entries, and its delete entries (None when unknown)."""

    entries: int
    deletes: int | None = None


def too_many_deletes(
    files: Mapping[str, FileStats],
    threshold: float = DEFAULT_DELETES_THRESHOLD,
    proceed_zero_no_summary: bool = False,
) -> list[str]:
    """``TooManyDeletesSelector``: all of the tablet's files (sorted by name) when
    ``deletes / (entries - deletes) >= threshold`` over the whole tablet, otherwise none.

    A file with no recorded delete count adds its entries and no deletes; if such a file has 0
    entries, nothing is selected unless ``proceed_zero_no_summary``. Deletes over zero
    non-deletes count as infinite; 0/0 selects nothing. ``threshold`` must be in (0, 1].
    """
    if (
        isinstance(threshold, bool)
        or not isinstance(threshold, int | float)
        or math.isnan(threshold)
        or not 0 < threshold <= 1
    ):
        raise ValueError(f"threshold: must be a number in (0, 1], got {threshold!r}")
    total = 0
    deletes = 0
    for stats in files.values():
        total += stats.entries
        if stats.deletes is None:
            if stats.entries == 0 and not proceed_zero_no_summary:
                return []
        else:
            deletes += stats.deletes
    non_deletes = total - deletes
    if non_deletes < 0 or deletes == 0:
        return []  # includes 0/0; 0/x is below any threshold > 0
    if non_deletes == 0 or deletes / non_deletes >= threshold:
        return sorted(files)
    return []
