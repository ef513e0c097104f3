"""The key/value model and its one sort order (Accumulo semantics). Pure: no I/O.

Key = row, column family, column qualifier, visibility (bytes), timestamp (int64), delete flag.
Order: row, cf, cq, visibility ascending as unsigned bytes; timestamp descending (newest first);
for an equal key and timestamp the delete marker first. Python compares ``bytes`` as unsigned,
so :func:`sort_key` is exact; Arrow and Spark are held to the same order by property tests.
"""

from __future__ import annotations

import itertools
from typing import Literal, NamedTuple

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


class Entry(NamedTuple):
    """One key/value entry. A delete marker has ``deleted=True`` and an empty value."""

    row: bytes
    cf: bytes
    cq: bytes
    vis: bytes
    ts: int
    deleted: bool
    value: bytes

    @property
    def column_key(self) -> tuple[bytes, bytes, bytes, bytes]:
        """The part of the key that versions share: row, cf, cq, visibility."""
        return (self.row, self.cf, self.cq, self.vis)


#: :func:`sort_key`'s tuple: row, cf, cq, visibility, negated timestamp, not deleted.
SortKey = tuple[bytes, bytes, bytes, bytes, int, bool]


def sort_key(e: Entry) -> SortKey:
    """The total order of keys: use as ``sorted(entries, key=sort_key)``."""
    return (e.row, e.cf, e.cq, e.vis, -e.ts, not e.deleted)


#: a column and its direction, as Arrow's ``sort_indices`` takes them
ArrowSortKey = tuple[str, Literal["ascending", "descending"]]

#: The same order for Arrow's ``sort_indices`` / ``Table.sort_by`` (column, direction).
ARROW_SORT_KEYS: list[ArrowSortKey] = [
    ("row", "ascending"),
    ("cf", "ascending"),
    ("cq", "ascending"),
    ("vis", "ascending"),
    ("ts", "descending"),
    ("deleted", "descending"),
]


def is_sorted(entries: list[Entry]) -> bool:
    return all(sort_key(a) <= sort_key(b) for a, b in itertools.pairwise(entries))


def encode_row(row: bytes | None) -> str | None:
    """Rows in metadata and JSON travel as lowercase hex (order-preserving, any bytes)."""
    return None if row is None else row.hex()


def decode_row(text: str | None) -> bytes | None:
    return None if text is None else bytes.fromhex(text)


def row_in_range(row: bytes, prev_end: bytes | None, end: bytes | None) -> bool:
    """Tablet ranges are (prev_end, end]: exclusive start, inclusive end; None is unbounded."""
    return (prev_end is None or row > prev_end) and (end is None or row <= end)


def span_overlaps(first: bytes | None, last: bytes | None, prev: bytes | None, end: bytes | None) -> bool:
    """Can rows in [first, last] fall in the range (prev, end]? ``None`` for first/last means
    unknown or unbounded on that side (it overlaps), for prev/end unbounded. The one definition
    of row-range overlap: files against tablets, tablets against user ranges, row groups against
    merge ranges."""
    return (prev is None or last is None or last > prev) and (end is None or first is None or first <= end)


def check_row_range(start: bytes | None, end: bytes | None, what: str = "row range") -> None:
    """Refuse an empty inclusive row range [start, end] (start after end) with a ValueError that
    shows both rows."""
    if start is not None and end is not None and start > end:
        raise ValueError(f"empty {what}: --start {_show(start)} is after --end {_show(end)}")


def _show(row: bytes) -> str:
    return repr(row.decode("utf-8", "backslashreplace"))
