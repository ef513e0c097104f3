"""The coordinator's bookkeeping in the metadata store: the dirty set (tablets changed since they
were last planned; ``lua/mutate.lua`` adds to it), the global counters, commits per tablet and the commit log, and
the clock of the automatic split check. Plain writes, fenced like every coordinator write.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from kompaktor import keyspace
from kompaktor.connection import text

if TYPE_CHECKING:
    from kompaktor.metadata.store.base import StoreCore


class BookkeepingStore:
    """``kz:dirty``, ``kz:counters``, ``kz:commits``, ``kz:commitlog`` (read), ``kz:split:checked``."""

    def __init__(self, core: StoreCore) -> None:
        self._core = core
        self._r = core.client

    # -- dirty tablets (for the coordinator) ----------------------------------------------
    def pop_dirty(self, count: int | None = None) -> list[str]:
        (raw,) = self._core.write(("SPOP", keyspace.DIRTY, min(count or self._core.scan_chunk, self._core.scan_chunk)))
        return sorted(r.decode() for r in raw or [])

    def clear_dirty(self) -> None:
        """Forget every dirty mark (a full scan plans everything): UNLINK frees a big set in the
        background, where SPOP of a million would hold Redis for the whole pop."""
        self._core.write(("UNLINK", keyspace.DIRTY))

    def mark_dirty(self, tablet_ids: Iterable[str]) -> None:
        ids = list(tablet_ids)
        for i in range(0, len(ids), 10_000):
            self._core.write(("SADD", keyspace.DIRTY, *ids[i : i + 10_000]))

    def dirty_ids(self) -> list[str]:
        return sorted(text(x) for x in self._core.call(self._r.smembers, keyspace.DIRTY))

    def dirty_count(self) -> int:
        return int(self._core.call(self._r.scard, keyspace.DIRTY))

    def claim_split_check(self, every_s: float) -> bool:
        """True for at most one caller per ``every_s`` seconds: time for a split check of every tablet."""
        (ok,) = self._core.write(("SET", keyspace.SPLIT_CHECK, time.time(), "NX", "EX", max(1, int(every_s))))
        return bool(ok)

    # -- counters -------------------------------------------------------------------------
    def incr(self, name: str, by: int = 1) -> int:
        (n,) = self._core.write(("HINCRBY", keyspace.COUNTERS, name, by))
        return int(n)

    def counters(self) -> dict[str, int]:
        return {text(k): int(v) for k, v in self._core.call(self._r.hgetall, keyspace.COUNTERS).items()}

    def commits_on(self, tablet_id: str) -> int:
        """Compactions committed on a tablet (counted by mutate.lua)."""
        return int(self._core.call(self._r.hget, keyspace.COMMITS_BY_TABLET, tablet_id) or 0)

    def commit_log(self) -> list[str]:
        """The ECIDs of the last commits applied, oldest first, once per commit applied
        (``keyspace.COMMITLOG``: what a check that no commit was lost or applied twice reads)."""
        return [text(e) for e in self._core.call(self._r.lrange, keyspace.COMMITLOG, 0, -1)]
