"""Rows of entries for tests that write tables: one builder, its defaults the common case."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from kompaktor.model.keys import Entry


def entries(
    rows: Iterable[int] | int,
    version: int = 0,
    *,
    prefix: str = "row",
    width: int = 5,
    cf: bytes = b"f",
    cq: bytes | Callable[[int], bytes] = b"q",
    ts: int | None = None,
    deleted: Callable[[int], bool] | None = None,
    value: Callable[[int], bytes] | None = None,
) -> list[Entry]:
    """One entry for each row number in ``rows`` (``range(rows)`` for an int), in row order:
    row ``{prefix}{r:0{width}d}``, column ``cf``:``cq`` (bytes, or a function of the row
    number), empty visibility, timestamp ``ts`` (``1000 + version`` by default), a delete marker
    where ``deleted(r)``, value ``value(r)`` (``v{version}-{r}`` by default)."""
    numbers = range(rows) if isinstance(rows, int) else rows
    stamp = 1000 + version if ts is None else ts
    return [
        Entry(
            f"{prefix}{r:0{width}d}".encode(),
            cf,
            cq(r) if callable(cq) else cq,
            b"",
            stamp,
            bool(deleted and deleted(r)),
            value(r) if value else f"v{version}-{r}".encode(),
        )
        for r in numbers
    ]
