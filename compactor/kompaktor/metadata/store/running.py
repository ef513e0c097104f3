"""Running compactions and what becomes of them, in the metadata store: the index of running
compactions (ECID -> tablet, kept by ``lua/mutate.lua``), their heartbeats, the log of dead ones,
and failed jobs (backoff, dead letters; ``lua/failures.lua``).

The protocol that reserves, commits and releases a compaction is
:mod:`kompaktor.metadata.compactions`; retry policy is :mod:`kompaktor.metadata.failures`; dead
compactions are found by :mod:`kompaktor.coordinator.dead`.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import TYPE_CHECKING, Any, ClassVar

from kompaktor import keyspace
from kompaktor.connection import text

if TYPE_CHECKING:
    from kompaktor.metadata.store.base import StoreCore

DEADLOG_LENGTH = 10_000  # ECIDs of the last dead compactions kept
_FAILURES = resources.files("kompaktor.metadata").joinpath("lua/failures.lua").read_text()


class RunningStore:
    """``kz:running``, ``kz:hb:<ecid>``, ``kz:deadlog``, ``kz:failures``, ``kz:deadletter``."""

    #: this part's Lua, in the store's function library (:func:`~kompaktor.metadata.store.base.library`)
    SCRIPTS: ClassVar[dict[str, str]] = {"_failures": _FAILURES}

    def __init__(self, core: StoreCore) -> None:
        self._core = core
        self._r = core.client
        self._failures = core.function("_failures")

    # -- heartbeats of running compactions -------------------------------------------------
    def put_heartbeat(self, ecid: str, fields: dict[str, Any]) -> None:
        self._core.call(self._r.hset, keyspace.heartbeat_key(ecid), mapping={k: str(v) for k, v in fields.items()})

    def heartbeat(self, ecid: str) -> dict[str, str]:
        return {text(k): text(v) for k, v in self._core.call(self._r.hgetall, keyspace.heartbeat_key(ecid)).items()}

    def drop_heartbeat(self, ecid: str) -> None:
        self._core.write(("DEL", keyspace.heartbeat_key(ecid)))

    # -- the index of running compactions (ECID -> tablet, maintained by mutate.lua) ----------
    def running_index(self) -> dict[str, str]:
        return {text(k): text(v) for k, v in self._core.call(self._r.hgetall, keyspace.RUNNING).items()}

    def running_tablet(self, ecid: str) -> str | None:
        raw = self._core.call(self._r.hget, keyspace.RUNNING, ecid)
        return None if raw is None else text(raw)

    def running_count(self) -> int:
        return int(self._core.call(self._r.hlen, keyspace.RUNNING))

    def forget_running(self, ecid: str) -> None:
        """Drop an index entry whose tablet no longer holds the compaction."""
        self._core.write(("HDEL", keyspace.RUNNING, ecid))

    def log_dead(self, ecid: str, group: str) -> None:
        """Count a dead compaction and remember its ECID (the last DEADLOG_LENGTH are kept)."""
        self._core.write(
            ("HINCRBY", keyspace.COUNTERS, "dead_compactions", 1),
            ("HINCRBY", keyspace.COUNTERS, f"dead_compactions:{group}", 1),
            ("RPUSH", keyspace.DEADLOG, ecid),
            ("LTRIM", keyspace.DEADLOG, -DEADLOG_LENGTH, -1),
        )

    def dead_log(self) -> set[str]:
        return {text(e) for e in self._core.call(self._r.lrange, keyspace.DEADLOG, 0, -1)}

    # -- failed jobs ----------------------------------------------------------------------------
    def failure(self, fp: str) -> dict[str, Any] | None:
        raw = self._core.call(self._r.hget, keyspace.FAILURES, fp)
        return None if raw is None else json.loads(raw)

    def put_failure(self, fp: str, rec: dict[str, Any]) -> None:
        self._core.write(("HSET", keyspace.FAILURES, fp, json.dumps(rec)))

    def count_failure(
        self, fp: str, rec: dict[str, Any], now: float, base_backoff_s: float, max_backoff_s: float, max_attempts: int
    ) -> tuple[int, bool]:
        """Count one failure of job ``fp`` in one atomic step (``lua/failures.lua``): its count
        goes up, it backs off, and at ``max_attempts`` it moves to the dead letters. Returns the
        count and whether it was dead-lettered."""
        count, dead = self._core.call(
            self._failures,
            args=[
                self._core.token(),
                "record",
                fp,
                json.dumps(rec),
                repr(now),
                repr(base_backoff_s),
                repr(max_backoff_s),
                max_attempts,
            ],
        )
        return int(count), bool(dead)

    def redirty_failed(self, now: float) -> list[str]:
        """Mark dirty, once, the tablets whose failed job's backoff has passed (atomically)."""
        return [t.decode() for t in self._core.call(self._failures, args=[self._core.token(), "redirty", repr(now)])]

    def failures(self) -> dict[str, dict[str, Any]]:
        return {text(k): json.loads(v) for k, v in self._core.call(self._r.hgetall, keyspace.FAILURES).items()}

    def forget_failures(self, fps: list[str]) -> None:
        if fps:
            self._core.write(("HDEL", keyspace.FAILURES, *fps))

    def dead_letter(self, fp: str, rec: dict[str, Any]) -> None:
        """Move a job from the failures to the dead letters (counted), atomically."""
        self._core.write(
            ("HSET", keyspace.DEADLETTER, fp, json.dumps(rec)),
            ("HDEL", keyspace.FAILURES, fp),
            ("HINCRBY", keyspace.COUNTERS, "dead_lettered", 1),
        )

    def dead_letters(self) -> dict[str, dict[str, Any]]:
        return {text(k): json.loads(v) for k, v in self._core.call(self._r.hgetall, keyspace.DEADLETTER).items()}
