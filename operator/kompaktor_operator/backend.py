"""The operator's Redis backend: the only operator module that talks to Redis (through the
core's store and queues).

Owns: the ``Backend`` protocol the handlers call — store service/group configs, read the
compactors' heartbeats and queue figures, ask a compactor to drain, start/track/cancel user
compactions — and its Redis implementation over ``kompaktor.metadata`` (store, user compactions)
and the queues. The operator's ``Runtime`` holds one (``connect``); tests give theirs another.
Errors reaching Redis surface as ``BackendUnavailable`` (handlers retry them).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import ParamSpec, Protocol, TypeVar

from kompaktor.model.iterators import IteratorOptions
from kompaktor.policy.services import GroupConfig, ServiceConfig
from kompaktor_operator.scaling import CompactorView

P = ParamSpec("P")
R = TypeVar("R")

#: A heartbeat older than this is no heartbeat: the pod is treated as having no compactor.
HEARTBEAT_STALE_SECONDS = 60.0


class BackendUnavailable(Exception):
    """Redis could not be reached or answered with an error; try again later."""


class CompactionRejected(Exception):
    """The store refused to start a user compaction (unknown or offline table, bad iterators)."""


@dataclass(frozen=True)
class QueueFigures:
    queued: int = 0
    running: int = 0
    rejected: int = 0
    dead_lettered: int = 0
    oldest_age_s: float = 0.0


@dataclass(frozen=True)
class Progress:
    phase: str  # a CompactionPhase value
    tablets_done: int
    tablets_total: int
    message: str = ""


class Backend(Protocol):
    def put_service(self, cfg: ServiceConfig) -> None: ...
    def delete_service(self, name: str) -> None: ...
    def put_group(self, cfg: GroupConfig) -> None: ...
    def delete_group(self, name: str) -> None: ...
    def groups(self) -> set[str]: ...
    def compactors(self, group: str) -> dict[str, CompactorView]: ...
    def request_drain(self, compactor_id: str) -> None: ...
    def queue_figures(self, group: str) -> QueueFigures: ...
    def start_compaction(
        self, request_id: str, table: str, start_row: bytes | None, end_row: bytes | None, iterators: IteratorOptions
    ) -> str: ...
    def compaction_progress(self, compaction_id: str) -> Progress: ...
    def cancel_compaction(self, compaction_id: str) -> None: ...


_PHASES = {
    "RUNNING": "Running",
    "SUCCEEDED": "Succeeded",
    "CANCELLED": "Cancelled",
    "FAILED": "Failed",
    "SELECTING": "Selecting",
    "PENDING": "Pending",
}


class RedisBackend:
    """The Backend over the core's Redis store."""

    def __init__(self, url: str) -> None:
        from kompaktor.metadata.store import MetadataStore

        self.url = url
        self.store = MetadataStore.from_url(url)
        self.queues = self.store.queues

    def _call(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        from kompaktor.model.errors import StoreUnavailable

        try:
            return fn(*args, **kwargs)
        except StoreUnavailable as exc:
            raise BackendUnavailable(str(exc)) from exc

    def put_service(self, cfg: ServiceConfig) -> None:
        self._call(self.store.fleet.put_service, cfg)

    def delete_service(self, name: str) -> None:
        self._call(self.store.fleet.delete_service, name)

    def put_group(self, cfg: GroupConfig) -> None:
        self._call(self.store.fleet.put_group, cfg)

    def delete_group(self, name: str) -> None:
        self._call(self.store.fleet.delete_group, name)

    def compactors(self, group: str) -> dict[str, CompactorView]:
        now = time.time()
        out: dict[str, CompactorView] = {}
        for info in self._call(self.store.fleet.compactors, group):
            if now - info.last_seen <= HEARTBEAT_STALE_SECONDS:
                remaining = self._remaining_s(info.ecid, now) if info.ecid else None
                out[info.id] = CompactorView(id=info.id, state=info.state, ecid=info.ecid, remaining_s=remaining)
        return out

    def _remaining_s(self, ecid: str, now: float) -> float | None:
        """How long the job ``ecid`` still runs, by its compactor's estimate in the job's last
        heartbeat (``remaining_s`` as of ``updated``); None when it gave none."""
        beat = self._call(self.store.running.heartbeat, ecid)
        if beat.remaining_s is None or beat.updated is None:
            return None
        return max(0.0, beat.remaining_s - max(0.0, now - beat.updated))

    def request_drain(self, compactor_id: str) -> None:
        self._call(self.store.fleet.request_drain, compactor_id)

    def groups(self) -> set[str]:
        """Names of the compactor groups the store knows."""
        return set(self._call(self.store.fleet.groups))

    def queue_figures(self, group: str) -> QueueFigures:
        s = self._call(self.queues.stats, group)
        return QueueFigures(
            queued=s.queued,
            running=s.running,
            rejected=s.rejected,
            dead_lettered=s.dead_lettered,
            oldest_age_s=float(s.oldest_age_s),
        )

    def start_compaction(
        self, request_id: str, table: str, start_row: bytes | None, end_row: bytes | None, iterators: IteratorOptions
    ) -> str:
        """Start once per request id (the Compaction's uid): a replayed handler gets the same id."""
        from kompaktor.metadata import user_compactions
        from kompaktor.model.errors import KompaktorError

        try:
            return self._call(
                user_compactions.start, self.store, table, start_row, end_row, iterators, request_id=request_id
            )
        except (KompaktorError, ValueError, KeyError) as exc:
            raise CompactionRejected(str(exc)) from exc

    def compaction_progress(self, compaction_id: str) -> Progress:
        from kompaktor.metadata import user_compactions as usercompaction

        uc = self._call(usercompaction.get, self.store, compaction_id)
        return Progress(
            phase=_PHASES.get(uc.state, "Running"), tablets_done=uc.done, tablets_total=uc.total, message=uc.message
        )

    def cancel_compaction(self, compaction_id: str) -> None:
        from kompaktor.metadata import user_compactions as usercompaction

        self._call(usercompaction.cancel, self.store, compaction_id, "the Compaction resource was deleted")


def connect(url: str | None) -> RedisBackend:
    """A RedisBackend on ``url`` (the operator's ``--redis`` / KOMPAKTOR_REDIS_URL)."""
    if not url:
        raise BackendUnavailable("KOMPAKTOR_REDIS_URL is not set")
    try:
        return RedisBackend(url)
    except Exception as exc:  # the store connects (with retries) on construction
        raise BackendUnavailable(f"cannot connect to Redis: {exc}") from exc
