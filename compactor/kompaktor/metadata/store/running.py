"""Running compactions and what becomes of them, in the metadata store: the index of running
compactions (ECID -> tablet, kept by ``lua/mutate.lua``), their heartbeats, the log of dead ones,
and failed jobs (backoff, dead letters; ``lua/failures.lua``).

The protocol that reserves, commits and releases a compaction is
:mod:`kompaktor.metadata.compactions`; retry policy is :mod:`kompaktor.metadata.failures`; dead
compactions are found by :mod:`kompaktor.coordinator.dead`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, ClassVar, TypedDict

from kompaktor import keyspace
from kompaktor.connection import text

if TYPE_CHECKING:
    from kompaktor.metadata.store.base import StoreCore

DEADLOG_LENGTH = 10_000  # ECIDs of the last dead compactions kept
_FAILURES = resources.files("kompaktor.metadata").joinpath("lua/failures.lua").read_text()


def _count(fields: Mapping[str, str], name: str) -> int:
    try:
        return int(float(fields.get(name, 0)))
    except ValueError:
        return 0


def _figure(fields: Mapping[str, str], name: str) -> int | None:
    try:
        return int(float(fields[name])) if name in fields else None
    except ValueError:
        return None


def _seconds(fields: Mapping[str, str], name: str) -> float | None:
    try:
        return float(fields[name]) if name in fields else None
    except ValueError:
        return None


@dataclass(frozen=True)
class ResumeCounts:
    """What a resumable merge took over from an earlier attempt (``engines.api.ResumeFigures``)."""

    parts_reused: int
    entries_reused: int
    bytes_reused: int
    input_bytes_reread: int
    parts_rejected: int


@dataclass(frozen=True)
class Heartbeat:
    """A running compaction's last heartbeat (``kz:hb:<ecid>``, a hash of strings: its compactor
    writes the merge's progress report there as it is, see ``engines.api.MergeProgress``). A
    figure or time not reported (or not a number) is None; ``resume`` is None for a merge that is
    not resumable (its counts read as 0 where not numbers)."""

    compactor: str | None = None
    updated: float | None = None
    entries_read: int | None = None
    entries_written: int | None = None
    bytes_read: int | None = None
    bytes_written: int | None = None
    parts_done: int | None = None
    parts: int | None = None
    elapsed_s: float | None = None
    #: the seconds the job still needs, by its compactor's estimate
    remaining_s: float | None = None
    resume: ResumeCounts | None = None

    @classmethod
    def from_fields(cls, f: Mapping[str, str]) -> Heartbeat:
        resume = None
        if "parts_reused" in f:
            resume = ResumeCounts(
                _count(f, "parts_reused"),
                _count(f, "entries_reused"),
                _count(f, "bytes_reused"),
                _count(f, "input_bytes_reread"),
                _count(f, "parts_rejected"),
            )
        return cls(
            compactor=f.get("compactor"),
            updated=_seconds(f, "updated"),
            entries_read=_figure(f, "entries_read"),
            entries_written=_figure(f, "entries_written"),
            bytes_read=_figure(f, "bytes_read"),
            bytes_written=_figure(f, "bytes_written"),
            parts_done=_figure(f, "parts_done"),
            parts=_figure(f, "parts"),
            elapsed_s=_seconds(f, "elapsed_s"),
            remaining_s=_seconds(f, "remaining_s"),
            resume=resume,
        )


class FailedJobJson(TypedDict):
    """A failure as a caller reports it to ``lua/failures.lua`` (its ``record`` argument)."""

    tablet: str
    group: str
    files: list[str]
    last_error: str


class FailureJson(FailedJobJson):
    """A failed job's record as ``kz:failures`` and ``kz:deadletter`` hold it (JSON written by
    ``lua/failures.lua``), and as ``kompaktor status --json`` shows the dead letters."""

    count: int
    retry_at: float
    redirtied: bool


@dataclass(frozen=True)
class FailedJob:
    """One failure of a job (its tablet and files), as its compactor or the coordinator reports it."""

    tablet: str
    group: str
    files: tuple[str, ...]
    last_error: str

    def to_json(self) -> FailedJobJson:
        return {"tablet": self.tablet, "group": self.group, "files": list(self.files), "last_error": self.last_error}


@dataclass(frozen=True)
class FailureRecord:
    """A failed job as stored: how often it failed, when it may run again and whether its tablet
    was marked for planning again since (once per backoff). Dead letters keep their last one."""

    tablet: str
    group: str
    files: tuple[str, ...]
    last_error: str
    count: int
    retry_at: float
    redirtied: bool

    def to_json(self) -> FailureJson:
        return {
            "tablet": self.tablet,
            "group": self.group,
            "files": list(self.files),
            "last_error": self.last_error,
            "count": self.count,
            "retry_at": self.retry_at,
            "redirtied": self.redirtied,
        }

    @classmethod
    def from_json(cls, raw: str | bytes) -> FailureRecord:
        """The record's stored JSON. Lua's cjson writes an empty list as ``{}``, and a record put
        by hand may lack the counts: both read as what they mean."""
        d = json.loads(raw)
        return cls(
            tablet=str(d["tablet"]),
            group=str(d.get("group", "")),
            files=tuple(d.get("files") or ()),
            last_error=str(d.get("last_error", "")),
            count=int(d.get("count", 0)),
            retry_at=float(d.get("retry_at", 0.0)),
            redirtied=bool(d.get("redirtied", False)),
        )


class RunningStore:
    """``kz:running``, ``kz:hb:<ecid>``, ``kz:deadlog``, ``kz:failures``, ``kz:deadletter``."""

    #: this part's Lua, in the store's function library (:func:`~kompaktor.metadata.store.base.library`)
    SCRIPTS: ClassVar[dict[str, str]] = {"_failures": _FAILURES}

    def __init__(self, core: StoreCore) -> None:
        self._core = core
        self._r = core.client
        self._failures = core.function("_failures")

    # -- heartbeats of running compactions -------------------------------------------------
    def put_heartbeat(self, ecid: str, fields: Mapping[str, object]) -> None:
        """Each field as its ``str()``: a merge's progress report is flat (names to figures)."""
        self._core.call(self._r.hset, keyspace.heartbeat_key(ecid), mapping={k: str(v) for k, v in fields.items()})

    def heartbeat(self, ecid: str) -> Heartbeat:
        """The compaction's last heartbeat (all None when it has sent none)."""
        raw = self._core.call(self._r.hgetall, keyspace.heartbeat_key(ecid))
        return Heartbeat.from_fields({text(k): text(v) for k, v in raw.items()})

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
    def failure(self, fp: str) -> FailureRecord | None:
        raw = self._core.call(self._r.hget, keyspace.FAILURES, fp)
        return None if raw is None else FailureRecord.from_json(raw)

    def put_failure(self, fp: str, rec: FailureRecord) -> None:
        self._core.write(("HSET", keyspace.FAILURES, fp, json.dumps(rec.to_json())))

    def count_failure(
        self, fp: str, job: FailedJob, now: float, base_backoff_s: float, max_backoff_s: float, max_attempts: int
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
                json.dumps(job.to_json()),
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

    def failures(self) -> dict[str, FailureRecord]:
        return {
            text(k): FailureRecord.from_json(v) for k, v in self._core.call(self._r.hgetall, keyspace.FAILURES).items()
        }

    def forget_failures(self, fps: list[str]) -> None:
        if fps:
            self._core.write(("HDEL", keyspace.FAILURES, *fps))

    def dead_letter(self, fp: str, rec: FailureRecord) -> None:
        """Move a job from the failures to the dead letters (counted), atomically."""
        self._core.write(
            ("HSET", keyspace.DEADLETTER, fp, json.dumps(rec.to_json())),
            ("HDEL", keyspace.FAILURES, fp),
            ("HINCRBY", keyspace.COUNTERS, "dead_lettered", 1),
        )

    def dead_letters(self) -> dict[str, FailureRecord]:
        return {
            text(k): FailureRecord.from_json(v)
            for k, v in self._core.call(self._r.hgetall, keyspace.DEADLETTER).items()
        }
