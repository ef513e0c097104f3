"""A compactor's writes, asked of the coordinator's broker (:mod:`kompaktor.coordinator.broker`).

The compactor's Redis user may push requests onto one list (``kzb:requests``) and pop the answer
from a list whose name only it knows (``kzb:reply:<random>``); every other key it may only read
(:mod:`kompaktor.metadata.acl`). A request is one JSON document: the operation, its arguments,
where to answer, and until when an answer is of use (a broker that comes back after an outage
skips requests nobody waits for any more). For a reservation it holds, the compactor sends the
secret it was given when it reserved: the broker acts only for the holder.

No answer in time is :class:`~kompaktor.model.errors.StoreUnavailable`, as Redis being down is:
the compactor's handling of an outage (keep merging, retry the commit, back off when idle)
covers a coordinator that is down too. A retried commit whose first attempt did land is found
out the way it always was (the tablet lists the output).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import fields
from typing import Any, TypedDict, cast

from kompaktor import keyspace
from kompaktor.files.storage import Storage
from kompaktor.metadata import broker_messages as m
from kompaktor.metadata import history
from kompaktor.metadata import progress as resume_records
from kompaktor.metadata.broker_messages import Refused

__all__ = [
    "BrokeredJobs",
    "BrokeredResumeLog",
    "Refused",
    "decode_reply",
    "encode_reply",
    "reservation_record",
    "send_answers",
    "take_requests",
    "take_reservation_record",
]
from kompaktor.metadata.compactions import Reservation, delete_outputs
from kompaktor.metadata.store import MetadataStore
from kompaktor.model.errors import ConditionFailed, KompaktorError, StoreUnavailable
from kompaktor.model.redact import redact_text
from kompaktor.model.resume import Bound, PartRecord
from kompaktor.model.tablet import FileMeta

log = logging.getLogger(__name__)

#: one BLPOP waits at most this long (below the client's socket timeout); a request loops
_WAIT_STEP_S = 4.0


def encode_reply(value: Any = None, error: BaseException | None = None) -> str:
    """The broker's answer: the value, or what went wrong as the asker should see it."""
    if error is None:
        return json.dumps({"ok": value})
    if isinstance(error, ConditionFailed):
        return json.dumps({"err": "condition", "cond": error.condition, "detail": error.detail})
    kind = (
        "unavailable" if isinstance(error, StoreUnavailable) else "refused" if isinstance(error, Refused) else "error"
    )
    return json.dumps({"err": kind, "msg": str(error)})


def decode_reply(raw: bytes | str) -> Any:
    """The value of an answer, or its error raised."""
    d = json.loads(raw)
    if "ok" in d:
        return d["ok"]
    kind = d.get("err")
    if kind == "condition":
        raise ConditionFailed(d.get("cond", "?"), d.get("detail", ""))
    if kind == "unavailable":
        raise StoreUnavailable(d.get("msg", "the coordinator cannot reach the metadata store"))
    if kind == "refused":
        raise Refused(d.get("msg", "refused"))
    raise KompaktorError(f"the coordinator's broker failed: {d.get('msg', '?')}")


class BrokeredJobs:
    """:class:`~kompaktor.metadata.jobs.Jobs` through the coordinator's broker."""

    def __init__(
        self,
        store: MetadataStore,
        timeout_s: float = 20.0,
        heartbeat_timeout_s: float = 5.0,
        group_token: str | None = None,
    ) -> None:
        self.store = store
        #: proves requests about its group come from one of its compactors (the pod's spec)
        self.group_token = group_token
        self.timeout_s = timeout_s
        self.heartbeat_timeout_s = heartbeat_timeout_s

    def ask(self, req: m.Request, timeout_s: float | None = None) -> Any:
        """Send one request and wait for its answer (at most ``timeout_s``)."""
        wait = self.timeout_s if timeout_s is None else timeout_s
        return self.answer(req.op, self.send(req, wait), wait)

    def send(self, req: m.Request, wait: float) -> m.Envelope:
        """Push one request; where its answer comes, and until when it is of use."""
        env = m.Envelope.new(wait, time.time())
        self.store.call(self.store._r.lpush, keyspace.BROKER, m.encode(req, env))
        return env

    def answer(self, op: str, env: m.Envelope, wait: float) -> Any:
        """The answer to a request sent (its value, or its error raised)."""
        while (left := env.exp - time.time()) > 0:
            step = max(0.01, min(left, _WAIT_STEP_S))
            got = self.store.call(self.store._r.blpop, [keyspace.reply_key(env.reply)], timeout=step)
            if got is not None:
                return decode_reply(got[1])
        raise StoreUnavailable(f"no answer from the coordinator to {op} within {wait:g} s (is it running?)")

    def reserve(self, group: str, compactor: str) -> Reservation | None:
        got = self.ask(m.Reserve(group, compactor, self.group_token), self.heartbeat_timeout_s)
        return None if got is None else Reservation.from_json(got["res"], got["cap"])

    def heartbeat(self, res: Reservation, progress: Mapping[str, object]) -> None:
        beat = m.Heartbeat(res.ecid, res.cap, {k: str(v) for k, v in progress.items()})
        self.ask(beat, self.heartbeat_timeout_s)

    def commit(self, res: Reservation, meta: FileMeta) -> None:
        self.ask(m.Commit(res.ecid, res.cap, meta))

    def release(self, storage: Storage, res: Reservation) -> bool:
        removed = bool(self.ask(m.Release(res.ecid, res.cap)))
        delete_outputs(storage, res.output, res.ecid)
        return removed

    def record_failure(self, res: Reservation, reason: str) -> bool:
        return bool(self.ask(m.Failure(res.ecid, res.cap, reason[: m.REASON_MAX])))

    def drop_heartbeat(self, res: Reservation) -> None:
        self.ask(m.DropHeartbeat(res.ecid, res.cap))

    def count_written(self, n: int) -> None:
        self.ask(m.CountWritten(int(n)))

    def register(self, group: str, compactor: str, state: str, ecid: str | None) -> None:
        self.ask(m.Register(group, compactor, state, ecid, self.group_token), self.heartbeat_timeout_s)

    def unregister(self, group: str, compactor: str, keep_drain_mark: bool) -> None:
        self.ask(m.Unregister(group, compactor, keep_drain_mark, self.group_token), self.heartbeat_timeout_s)

    def mark_drained(self, group: str, compactor: str) -> None:
        self.ask(m.MarkDrained(group, compactor, self.group_token), self.heartbeat_timeout_s)

    def resume_log(self, res: Reservation, fingerprint: str) -> resume_records.RedisResumeLog:
        return BrokeredResumeLog(self, res, fingerprint)

    def record_history(self, res: Reservation, rec: history.Record, limits: history.HistoryLimits) -> bool:
        """Ask the broker to add the job's record to its group's history. Never raises, as
        :func:`history.append` does not: a record that cannot be written never fails the job."""
        figures = m.Figures(**{f.name: getattr(rec, f.name) for f in fields(m.Figures)})
        reason = history.clean_reason(rec.reason)
        req = m.History(
            res.ecid, res.cap, rec.outcome, reason, rec.engine, figures, limits.max_records, limits.max_age_s
        )
        try:
            return bool(self.ask(req))
        except Exception as exc:  # the history is a record of the job, never a reason to fail it
            log.warning("%s: not recorded in the history of %s: %s", rec.ecid, rec.group, redact_text(str(exc)))
            return False


class BrokeredResumeLog(resume_records.RedisResumeLog):
    """A merge's progress record: read from the store, written through the broker."""

    def __init__(self, jobs: BrokeredJobs, res: Reservation, fingerprint: str) -> None:
        super().__init__(jobs.store, fingerprint, res.tablet, res.inputs, res.prev, res.end, res.job.selection)
        self.jobs = jobs
        self.res = res

    def start(self, cuts: tuple[tuple[Bound, Bound], ...], now_ms: int) -> None:
        self.jobs.ask(m.ProgressStart(self.res.ecid, self.res.cap, self.fingerprint, cuts, now_ms))

    def record(self, part: PartRecord) -> None:
        self.jobs.ask(m.ProgressPart(self.res.ecid, self.res.cap, self.fingerprint, part))
        self.recorded[part.index] = part

    def drop(self, index: int) -> None:
        self.jobs.ask(m.ProgressDrop(self.res.ecid, self.res.cap, self.fingerprint, int(index)))
        self.recorded.pop(index, None)

    def forget_record(self, fingerprint: str) -> None:
        self.jobs.ask(m.ProgressForget(self.res.ecid, self.res.cap, fingerprint))


# -- the broker's side (kompaktor.coordinator.broker): its Redis commands -------------------------
def take_requests(store: MetadataStore, wait_s: float, count: int) -> list[bytes]:
    """Wait up to ``wait_s`` for requests; up to ``count`` of those waiting, oldest first."""
    got = cast(
        "list[Any] | None",  # [key, [request, ...]]
        store.call(store._r.blmpop, wait_s, 1, keyspace.BROKER, direction="RIGHT", count=count),
    )
    return [] if got is None else list(got[1])


def send_answers(
    store: MetadataStore,
    answers: list[tuple[str, str, list[tuple[str, str]], list[str]]],
    ttls: tuple[int, int, int],
) -> None:
    """(where to answer, the answer, the records to write before it, the records whose
    compaction ended) each, in one round trip; ``ttls``: of a record, of an ended one's, of an
    answer."""
    record_ttl_s, done_ttl_s, reply_ttl_s = ttls
    p = store._r.pipeline(transaction=False)
    for reply, text, records, done in answers:
        for key, doc in records:
            p.set(key, doc, ex=record_ttl_s)
        for key in done:
            p.expire(key, done_ttl_s)
        p.rpush(keyspace.reply_key(reply), text)
        p.expire(keyspace.reply_key(reply), reply_ttl_s)
    store.call(p.execute)


class ReservationRecord(TypedDict):
    """The broker's record of a reservation (``kz:res:<ecid>``): the reservation's JSON
    (``Reservation.to_json``) and the digest of its holder's secret."""

    res: dict[str, Any]
    cap: str


def reservation_record(store: MetadataStore, ecid: str) -> ReservationRecord | None:
    """The broker's record of a reservation, or None."""
    raw = store.call(store._r.get, keyspace.reservation_key(ecid))
    return None if raw is None else cast(ReservationRecord, dict(json.loads(raw)))


def take_reservation_record(store: MetadataStore, ecid: str) -> bool:
    """Remove the broker's record of a reservation; whether it was there (one caller gets True)."""
    return bool(store.call(store._r.delete, keyspace.reservation_key(ecid)))
