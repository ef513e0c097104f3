"""The merge semantics, in one pure module: what scans return and what compactions write.

Every engine (this one, the Arrow engine, the Spark engine) is held to these functions by
property tests. Rules, applied per column key (row, cf, cq, vis) in key order:

1. Sources are merged in key order. Entries with an identical key (same timestamp and delete
   flag) from different sources are ordered newest source first (the later in the input list).
2. USER-compaction filters drop non-delete entries first: age-off (timestamp older than
   ``now_ms - ttl_ms``) and a row filter (regex match, or a [start, end) range).
3. The newest delete marker hides every entry of the same column key at or below its
   timestamp (a put with the same timestamp is hidden too: the marker sorts first).
4. Of the visible puts, the newest ``max_versions`` are kept.
5. Scans and full compactions drop delete markers; a partial compaction keeps the newest marker
   of the key (Accumulo's "propagate deletes"), since older files outside the job may still
   hold what it hides.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from kompaktor.model.keys import Entry, SortKey, sort_key


class IteratorOptions(TypedDict, total=False):
    """A user compaction's iterators, as it is started with them and its record keeps them (JSON):
    what :meth:`IteratorSettings.from_json` reads besides the table's own settings. Rows are hex."""

    ageoff_ttl_ms: int
    row_regex: str
    row_start: str
    row_end: str


@dataclass(frozen=True)
class IteratorSettings:
    """The iterator stack of a merge. Built from table properties and a USER compaction's
    iterators; ``now_ms`` is fixed when the job is created so every engine sees the same cut."""

    max_versions: int = 1
    full: bool = True  # True: drop delete markers (full compaction or scan)
    ageoff_ttl_ms: int | None = None
    now_ms: int = 0
    row_regex: str | None = None
    row_start: bytes | None = None  # row filter range [row_start, row_end), drop rows inside
    row_end: bytes | None = None

    def __post_init__(self) -> None:
        if self.max_versions < 1:
            raise ValueError(f"max_versions must be >= 1, got {self.max_versions}")
        if self.ageoff_ttl_ms is not None and self.ageoff_ttl_ms < 0:
            raise ValueError(f"ageoff ttl must be >= 0 ms, got {self.ageoff_ttl_ms}")
        if self.row_regex is not None:
            try:
                re.compile(self.row_regex.encode())
            except re.error as exc:
                raise ValueError(f"row filter regex {self.row_regex!r} is invalid: {exc}") from exc

    @property
    def ageoff_cutoff(self) -> int | None:
        """Entries with ts < cutoff are aged off."""
        return None if self.ageoff_ttl_ms is None else self.now_ms - self.ageoff_ttl_ms

    @property
    def has_row_filter(self) -> bool:
        return self.row_regex is not None or self.row_start is not None or self.row_end is not None

    def row_dropped(self, row: bytes) -> bool:
        """True when the row filter removes this row."""
        if self.row_regex is not None and re.search(self.row_regex.encode(), row):
            return True
        if self.row_start is not None or self.row_end is not None:
            return (self.row_start is None or row >= self.row_start) and (self.row_end is None or row < self.row_end)
        return False

    def to_json(self) -> dict[str, Any]:
        return {
            "max_versions": self.max_versions,
            "full": self.full,
            "ageoff_ttl_ms": self.ageoff_ttl_ms,
            "now_ms": self.now_ms,
            "row_regex": self.row_regex,
            "row_start": None if self.row_start is None else self.row_start.hex(),
            "row_end": None if self.row_end is None else self.row_end.hex(),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> IteratorSettings:
        return cls(
            max_versions=d.get("max_versions", 1),
            full=d.get("full", True),
            ageoff_ttl_ms=d.get("ageoff_ttl_ms"),
            now_ms=d.get("now_ms", 0),
            row_regex=d.get("row_regex"),
            row_start=None if d.get("row_start") is None else bytes.fromhex(d["row_start"]),
            row_end=None if d.get("row_end") is None else bytes.fromhex(d["row_end"]),
        )


SCAN = IteratorSettings()


def merge_sources(sources: Sequence[Iterable[Entry]]) -> Iterator[Entry]:
    """k-way merge of sorted sources; identical keys come newest source (highest index) first."""
    n = len(sources)

    def ranked(src: Iterable[Entry], rank: int) -> Iterator[tuple[SortKey, int, Entry]]:
        # a function, not a nested generator expression: that would read ``i`` late, giving
        # every source the last rank (and identical keys oldest source first)
        for e in src:
            yield sort_key(e), rank, e

    streams = [ranked(src, n - i) for i, src in enumerate(sources)]
    for _k, _rank, e in heapq.merge(*streams, key=lambda t: (t[0], t[1])):
        yield e


def apply_stack(merged: Iterable[Entry], settings: IteratorSettings = SCAN) -> Iterator[Entry]:
    """Apply rules 2–5 to entries already in merged key order."""
    cutoff = settings.ageoff_cutoff
    row_filter = settings.has_row_filter
    max_v = settings.max_versions
    keep_markers = not settings.full
    current: tuple[bytes, bytes, bytes, bytes] | None = None
    deleted = False
    kept = 0
    last_row: bytes | None = None
    row_drop = False
    for e in merged:
        ck = (e.row, e.cf, e.cq, e.vis)
        if ck != current:
            current, deleted, kept = ck, False, 0
        if deleted:
            continue  # hidden by the newest marker of this key
        if e.deleted:
            deleted = True
            if keep_markers:
                yield e
            continue
        if cutoff is not None and e.ts < cutoff:
            continue
        if row_filter:
            if e.row != last_row:
                last_row, row_drop = e.row, settings.row_dropped(e.row)
            if row_drop:
                continue
        if kept < max_v:
            kept += 1
            yield e


def merged_view(sources: Sequence[Iterable[Entry]], settings: IteratorSettings = SCAN) -> Iterator[Entry]:
    """What a scan (or a compaction with ``settings``) produces from sorted sources."""
    return apply_stack(merge_sources(sources), settings)
