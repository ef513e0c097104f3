"""Deletes stay deleted: the delete horizon's decisions (pure).

A full compaction drops delete markers together with the puts they hide. Once a marker is gone,
a put of its key at the same or an older timestamp that arrives later (an import of older data,
a flush with explicit timestamps) would be visible — a deleted entry come back. Each tablet keeps
a **delete horizon**, the newest timestamp of any delete marker a full compaction of it dropped
(carried through splits and merges), and a flush or import whose oldest put in a tablet is at or
before that tablet's horizon is refused, unless the table opted into Accumulo's semantics
(``table.delete.semantics=accumulo``) or the import asked for ``--set-time``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kompaktor.model.errors import KompaktorError
from kompaktor.model.tablet import TS_MIN, FileMeta, Tablet
from kompaktor.policy.splits import show_row


class DeleteHorizonError(KompaktorError):
    """A put that a dropped delete marker may have hidden was refused; nothing changed."""


def oldest_put(files: Iterable[FileMeta]) -> int:
    """The oldest put timestamp among ``files`` (:data:`TS_MIN` when one is not recorded)."""
    return min((TS_MIN if fm.put_min is None else fm.put_min for fm in files), default=TS_MIN)


def _extent(t: Tablet) -> str:
    lo = "-inf" if t.prev is None else show_row(t.prev)
    hi = "+inf" if t.end is None else show_row(t.end)
    return f"({lo}, {hi}]"


def refusal(table: str, t: Tablet, files: Mapping[str, FileMeta]) -> str | None:
    """Why adding ``files`` to tablet ``t`` of ``table`` could bring a deleted entry back, in one
    line with the way out, or None when it cannot."""
    if t.horizon is None:
        return None
    for path, fm in sorted(files.items()):
        pmin = TS_MIN if fm.put_min is None else fm.put_min
        if pmin <= t.horizon:
            return (
                f"refused: table {table!r} tablet {_extent(t)} has delete horizon "
                f"{t.horizon} (a full compaction dropped delete markers up to that timestamp) and {path} "
                f"holds a put at {pmin}, which one of them may have hidden; nothing was written. Write it with "
                "newer timestamps, import it with --set-time (every entry gets the import's time), or set "
                "table.delete.semantics=accumulo to let such puts show again"
            )
    return None


def set_time_for(tablets: Iterable[Tablet], now_ms: int) -> int:
    """The time ``--set-time`` gives an import: now, or just past the newest delete horizon of the
    tablets when that is later (timestamps chosen by users may run ahead of the clock)."""
    horizons = [t.horizon for t in tablets if t.horizon is not None]
    return max([now_ms, *(h + 1 for h in horizons)])
