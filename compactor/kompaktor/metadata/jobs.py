"""What a compactor does to the metadata about its own jobs, as one narrow seam.

A compactor reserves a job, heartbeats it, records its merge's progress, commits or releases it,
counts a failure, records the job in its group's history, and says whether it is idle, busy or
draining. :class:`Jobs` names exactly those writes; everything else a compactor does to Redis is
a read.

Two ways through the seam:

* :class:`DirectJobs` makes the writes itself (the conditional mutations of
  :mod:`kompaktor.metadata.compactions`): what the coordinator's broker runs, and a compactor
  whose Redis user may write (tests, a compactor run by hand against a Redis without users).
* :class:`kompaktor.metadata.brokered.BrokeredJobs` asks the coordinator's broker
  (:mod:`kompaktor.coordinator.broker`) to make them: what a compactor pod runs, with a Redis user
  that may write nothing but its requests (:mod:`kompaktor.metadata.acl`). The broker checks that
  the compactor holds the reservation it names (the secret it got when it reserved) and uses the
  reservation it recorded, not what the compactor says the reservation was.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from kompaktor.files.storage import Storage
from kompaktor.metadata import compactions, failures, history
from kompaktor.metadata import progress as resume_records
from kompaktor.metadata.compactions import Reservation
from kompaktor.metadata.store import MetadataStore
from kompaktor.model.tablet import FileMeta


class Jobs(Protocol):
    """A compactor's writes to the metadata (reads go to the store)."""

    def reserve(self, group: str, compactor: str) -> Reservation | None: ...

    def heartbeat(self, res: Reservation, progress: Mapping[str, object]) -> None: ...

    def commit(self, res: Reservation, meta: FileMeta) -> None: ...

    def release(self, storage: Storage, res: Reservation) -> bool: ...

    def record_failure(self, res: Reservation, reason: str) -> bool: ...

    def drop_heartbeat(self, res: Reservation) -> None: ...

    def count_written(self, n: int) -> None: ...

    def register(self, group: str, compactor: str, state: str, ecid: str | None) -> None: ...

    def unregister(self, group: str, compactor: str, keep_drain_mark: bool) -> None: ...

    def mark_drained(self, group: str, compactor: str) -> None: ...

    def resume_log(self, res: Reservation, fingerprint: str) -> resume_records.RedisResumeLog: ...

    def record_history(self, res: Reservation, rec: history.Record, limits: history.HistoryLimits) -> bool: ...


class DirectJobs:
    """The writes made with the store's own rights."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store

    def reserve(self, group: str, compactor: str) -> Reservation | None:
        return compactions.reserve(self.store, self.store.queues, group, compactor)

    def heartbeat(self, res: Reservation, progress: Mapping[str, object]) -> None:
        compactions.heartbeat(self.store, res, progress)

    def commit(self, res: Reservation, meta: FileMeta) -> None:
        compactions.commit(self.store, res, meta)

    def release(self, storage: Storage, res: Reservation) -> bool:
        return compactions.release(self.store, storage, res)

    def record_failure(self, res: Reservation, reason: str) -> bool:
        return failures.record_failure(self.store, res.tablet, res.inputs, res.job.group, reason)

    def drop_heartbeat(self, res: Reservation) -> None:
        self.store.running.drop_heartbeat(res.ecid)

    def count_written(self, n: int) -> None:
        self.store.bookkeeping.incr("bytes_written", n)

    def register(self, group: str, compactor: str, state: str, ecid: str | None) -> None:
        self.store.fleet.register_compactor(group, compactor, state, ecid)

    def unregister(self, group: str, compactor: str, keep_drain_mark: bool) -> None:
        self.store.fleet.unregister_compactor(group, compactor, keep_drain_mark=keep_drain_mark)

    def mark_drained(self, group: str, compactor: str) -> None:
        self.store.fleet.request_drain(compactor)

    def resume_log(self, res: Reservation, fingerprint: str) -> resume_records.RedisResumeLog:
        return resume_records.RedisResumeLog(
            self.store, fingerprint, res.tablet, res.inputs, res.prev, res.end, res.job.selection
        )

    def record_history(self, res: Reservation, rec: history.Record, limits: history.HistoryLimits) -> bool:
        return history.append(self.store, rec, limits)
