"""The coordinator's lease in the metadata store: acquire (with a new fencing token), renew and
release it, each one compare-and-set script, and when a leader last completed a pass. The
election loop that uses them is :mod:`kompaktor.coordinator.lease`; every fenced write checks the
token (:meth:`StoreBase.fenced <kompaktor.metadata.store.base.StoreBase.fenced>`).
"""

from __future__ import annotations

import time

from kompaktor import keyspace as C
from kompaktor.metadata.store.base import StoreBase
from kompaktor.redisfunctions import LuaFunction

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


class LeaseStore(StoreBase):
    """``kz:coordinator:lease``, ``kz:coordinator:fence``, ``kz:coordinator:seen``."""

    SCRIPTS = {"_lease_acquire": _LEASE_ACQUIRE, "_lease_renew": _LEASE_RENEW, "_lease_release": _LEASE_RELEASE}
    _lease_acquire: LuaFunction
    _lease_renew: LuaFunction
    _lease_release: LuaFunction

    def coordinator_seen(self) -> float | None:
        """When a leading coordinator last completed a pass (epoch seconds), or None."""
        raw = self.call(self._r.get, C.COORDINATOR_SEEN)
        return None if raw is None else float(raw)

    def mark_coordinator_seen(self) -> None:
        self._write(("SET", C.COORDINATOR_SEEN, repr(time.time())))

    def acquire_lease(self, holder: str, lease_ms: int) -> int | None:
        """Take the coordinator lease if nobody holds it; returns the new fencing token, or None."""
        fence = self.call(self._lease_acquire, args=[holder, lease_ms])  # SET NX and INCR, atomically
        return None if fence is None else int(fence)

    def renew_lease(self, holder: str, lease_ms: int) -> bool:
        """Extend the lease if ``holder`` still holds it."""
        return bool(int(self.call(self._lease_renew, keys=[C.LEASE], args=[holder, lease_ms])))

    def release_lease(self, holder: str) -> None:
        """Give the lease up if ``holder`` holds it (compare and delete in one step: never the next
        leader's lease)."""
        self.call(self._lease_release, keys=[C.LEASE], args=[holder])
