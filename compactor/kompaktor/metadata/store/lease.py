"""The coordinator's lease in the metadata store: acquire (with a new fencing token), renew and
release it, each one compare-and-set script, and when a leader last completed a pass. The
election loop that uses them is :mod:`kompaktor.coordinator.lease`; every fenced write checks the
token (:meth:`StoreCore.fenced <kompaktor.metadata.store.base.StoreCore.fenced>`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, ClassVar

from kompaktor import keyspace

if TYPE_CHECKING:
    from kompaktor.metadata.store.base import StoreCore

_LEASE_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
_LEASE_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
_LEASE_ACQUIRE = """
if redis.call('SET', K.lease, ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', K.fence)
end
return false
"""


class LeaseStore:
    """``kz:coordinator:lease``, ``kz:coordinator:fence``, ``kz:coordinator:seen``."""

    #: this part's Lua, in the store's function library (:func:`~kompaktor.metadata.store.base.library`)
    SCRIPTS: ClassVar[dict[str, str]] = {
        "_lease_acquire": _LEASE_ACQUIRE,
        "_lease_renew": _LEASE_RENEW,
        "_lease_release": _LEASE_RELEASE,
    }

    def __init__(self, core: StoreCore) -> None:
        self._core = core
        self._r = core.client
        self._lease_acquire = core.function("_lease_acquire")
        self._lease_renew = core.function("_lease_renew")
        self._lease_release = core.function("_lease_release")

    def coordinator_seen(self) -> float | None:
        """When a leading coordinator last completed a pass (epoch seconds), or None."""
        raw = self._core.call(self._r.get, keyspace.COORDINATOR_SEEN)
        return None if raw is None else float(raw)

    def mark_coordinator_seen(self) -> None:
        self._core.write(("SET", keyspace.COORDINATOR_SEEN, repr(time.time())))

    def acquire_lease(self, holder: str, lease_ms: int) -> int | None:
        """Take the coordinator lease if nobody holds it; returns the new fencing token, or None."""
        fence = self._core.call(self._lease_acquire, args=[holder, lease_ms])  # SET NX and INCR, atomically
        return None if fence is None else int(fence)

    def renew_lease(self, holder: str, lease_ms: int) -> bool:
        """Extend the lease if ``holder`` still holds it."""
        return bool(int(self._core.call(self._lease_renew, keys=[keyspace.LEASE], args=[holder, lease_ms])))

    def release_lease(self, holder: str) -> None:
        """Give the lease up if ``holder`` holds it (compare and delete in one step: never the next
        leader's lease)."""
        self._core.call(self._lease_release, keys=[keyspace.LEASE], args=[holder])
