"""The broker: the coordinator makes the writes compactors ask for, and only those.

A compactor reads untrusted files, so it is the component most likely to be taken over; its
Redis user may write nothing but requests (:mod:`kompaktor.metadata.brokered`). The broker
takes them from ``kzb:requests`` and makes the write with the coordinator's rights
(:class:`~kompaktor.metadata.jobs.DirectJobs`), as Accumulo's compactors ask the coordinator
(its manager, in 4.0) to reserve and to commit:

* ``reserve`` reserves a job of the group asked for and gives the compactor a new secret; the
  broker keeps the reservation with the secret's SHA-256 (``kz:resv:<ECID>``, a key compactors
  may read but not write);
* every other request about a compaction (heartbeat, progress, commit, release, failure) names
  its ECID and carries the secret: a request without the secret of a reservation the broker made
  is refused, and the write uses the reservation the broker recorded — its tablet, inputs,
  output and whether it is full — never what the request says they are;
* ``history``, a holder's last request about its compaction, adds the job's record to the
  compaction history of the reservation's group (``kz:history:<group>``), once: the compactor
  says what only it measured (the outcome, the reason, its figures), the broker the rest from the
  reservation; the compactor's user may write no history stream itself;
* ``register``, ``unregister``, ``mark_drained`` and ``count_written`` are a compactor's state and
  a statistic: what they write is bounded to those keys;
* with a group key (``KOMPAKTOR_GROUP_KEY``, which the operator holds too), ``reserve`` and a
  compactor's state need its group's token (:mod:`kompaktor.model.grouptoken`, in its pod's
  spec): a compactor reserves and speaks for its own group only.

Every coordinator, leader or not, serves the broker (its writes are conditional mutations: they
need no lease). Requests nobody waits for any more (past their ``exp``) are skipped.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kompaktor import keyspace
from kompaktor.metadata import broker_messages as m
from kompaktor.metadata import compactions, history
from kompaktor.metadata import progress as resume_records
from kompaktor.metadata.brokered import (
    Refused,
    encode_reply,
    reservation_record,
    send_answers,
    take_requests,
    take_reservation_record,
)
from kompaktor.metadata.compactions import Reservation
from kompaktor.metadata.jobs import DirectJobs
from kompaktor.metadata.store import MetadataStore
from kompaktor.model.errors import ConditionFailed, StoreUnavailable
from kompaktor.model.grouptoken import holds
from kompaktor.resources.models import check_group_name

log = logging.getLogger("kompaktor.broker")

#: a reservation's record lives this long (a merge never takes longer; a record outliving its
#: compaction refuses nothing but a holder's late progress) ...
RESERVATION_TTL_S = 2 * 24 * 3600
#: ... and this long once its compaction committed or was released
DONE_TTL_S = 600
#: an answer waits this long for its asker
REPLY_TTL_S = 60
#: requests answered in one round trip at most
BATCH = 32
#: reservation records a broker keeps in memory
KNOWN_MAX = 10_000


@dataclass
class Answer:
    """An answer, where it goes, and the reservation records to write before it."""

    reply: str
    text: str = ""
    records: list[tuple[str, str]] = field(default_factory=list)
    #: reservation records whose compaction ended: kept :data:`DONE_TTL_S` more (its progress may
    #: still be forgotten), then gone
    done: list[str] = field(default_factory=list)


def digest(cap: str) -> str:
    return hashlib.sha256(cap.encode()).hexdigest()


class Broker:
    """Serves compactors' requests from ``kzb:requests`` (:meth:`handle` one, :meth:`serve` forever)."""

    def __init__(self, store: MetadataStore, group_key: str | None = None) -> None:
        self.store = store
        #: with a key, a request about a group must carry the group's token
        #: (:mod:`kompaktor.model.grouptoken`): a compactor acts for its own group only
        self.group_key = group_key or None
        self.jobs = DirectJobs(store)
        #: reservation records read or made, oldest first (:meth:`_remember`)
        self._known: dict[str, tuple[str, Reservation]] = {}
        self._lock = threading.Lock()
        self.ops: dict[type[m.Request], Callable[[Any], Any]] = {
            m.Register: self._register,
            m.Unregister: self._unregister,
            m.MarkDrained: self._mark_drained,
            m.CountWritten: self._count_written,
        }
        self.held_ops: dict[type[m.Held], Callable[[Reservation, Any], Any]] = {
            m.Heartbeat: lambda res, req: self.jobs.heartbeat(res, req.progress),
            m.Commit: lambda res, req: self.jobs.commit(res, req.meta),
            m.Release: lambda res, _req: compactions.release_metadata(self.store, res),
            m.Failure: lambda res, req: self.jobs.record_failure(res, req.reason),
            m.History: self._history,
            m.DropHeartbeat: lambda res, _req: self.jobs.drop_heartbeat(res),
            m.ProgressStart: self._progress_start,
            m.ProgressPart: self._progress_part,
            m.ProgressDrop: self._progress_drop,
            m.ProgressForget: self._progress_forget,
        }

    # -- the loop ------------------------------------------------------------------------------------
    def serve(self, stop: threading.Event, wait_s: float = 1.0) -> None:
        """Answer requests until ``stop``; an unreachable store is waited out."""
        while not stop.is_set():
            try:
                self.serve_one(wait_s)
            except StoreUnavailable as exc:
                log.warning("broker: metadata store unavailable: %s", exc)
                stop.wait(1.0)

    def start(self, stop: threading.Event, threads: int = 2, wait_s: float = 1.0) -> list[threading.Thread]:
        """Serve in ``threads`` daemon threads (one compactor's slow commit does not hold the rest)."""
        out = []
        for i in range(threads):
            th = threading.Thread(target=self.serve, args=(stop, wait_s), name=f"broker-{i}", daemon=True)
            th.start()
            out.append(th)
        return out

    def serve_one(self, wait_s: float) -> bool:
        """Wait up to ``wait_s`` for requests and answer those waiting (up to :data:`BATCH`, their
        answers sent in one round trip); whether there was one."""
        got = take_requests(self.store, wait_s, BATCH)
        self.send([a for raw in got if (a := self.respond(raw)) is not None])
        return bool(got)

    def handle(self, raw: bytes | str) -> None:
        """Answer one request (nothing when it is malformed or expired: nobody can be told)."""
        got = self.respond(raw)
        if got is not None:
            self.send([got])

    def respond(self, raw: bytes | str) -> Answer | None:
        """The answer to one request, or None when nobody can be told."""
        got = m.envelope(raw)
        if got is None:
            log.warning("broker: malformed request dropped")
            return None
        env, doc = got
        if env.exp < time.time():
            return None
        out = Answer(env.reply)
        try:
            out.text = encode_reply(self.answer(m.decode(doc), out))
        except Exception as exc:  # told to the asker, whatever it is
            if not isinstance(exc, (Refused, StoreUnavailable, ConditionFailed)):
                log.warning("broker: %s failed: %s", doc.get("op"), exc)
            out.text, out.records = encode_reply(error=exc), []
        return out

    def send(self, answers: list[Answer]) -> None:
        """The answers, each after what its request records (one round trip)."""
        if not answers:
            return
        try:
            send_answers(
                self.store,
                [(a.reply, a.text, a.records, a.done) for a in answers],
                (RESERVATION_TTL_S, DONE_TTL_S, REPLY_TTL_S),
            )
        except StoreUnavailable as exc:  # the askers time out and retry
            log.warning("broker: cannot answer: %s", exc)

    def answer(self, req: m.Request, out: Answer) -> Any:
        """Make the write ``req`` asks for, if its sender may; the value to answer."""
        if isinstance(req, m.Reserve):
            return self._reserve(req, out)
        if isinstance(req, m.Held):
            res = self.held(req)
            value = self.held_ops[type(req)](res, req)
            if req.ends:  # the compaction ended: its record goes soon
                out.done.append(keyspace.reservation_key(res.ecid))
                with self._lock:
                    self._known.pop(res.ecid, None)
            return value
        return self.ops[type(req)](req)

    def held(self, req: m.Held) -> Reservation:
        """The reservation a request names, if it carries the secret of its holder."""
        known = self._known.get(req.ecid)
        if known is None:
            doc = reservation_record(self.store, req.ecid)
            if doc is None:
                raise Refused(f"{req.ecid:.40}: no reservation of the broker's by that ECID")
            known = self._remember(req.ecid, doc["cap"], Reservation.from_json(doc["res"]))
        if not secrets.compare_digest(known[0], digest(req.cap)):
            raise Refused(f"{req.ecid}: not the holder of this compaction")
        return dataclasses.replace(known[1], cap=req.cap)

    def _remember(self, ecid: str, cap_digest: str, res: Reservation) -> tuple[str, Reservation]:
        """A reservation record, kept here too (records never change): a holder's next requests
        need no read of it."""
        known = (cap_digest, res)
        with self._lock:
            self._known[ecid] = known
            while len(self._known) > KNOWN_MAX:
                self._known.pop(next(iter(self._known)))
        return known

    # -- requests without a reservation -------------------------------------------------------------
    def _group(self, group: str, token: str | None) -> str:
        """``group``, if the request comes from one of its compactors."""
        try:
            check_group_name(group)
        except ValueError as exc:
            raise Refused(f"bad group name: {exc}") from None
        if self.group_key is not None and not holds(self.group_key, group, token):
            raise Refused(f"not a compactor of group {group}: its group token does not match")
        return group

    def _reserve(self, req: m.Reserve, out: Answer) -> Any:
        res = self.jobs.reserve(self._group(req.group, req.token), req.compactor)
        if res is None:
            return None
        cap = secrets.token_urlsafe(24)
        doc, cap_digest = res.to_json(), digest(cap)
        out.records.append((keyspace.reservation_key(res.ecid), json.dumps({"res": doc, "cap": cap_digest})))
        self._remember(res.ecid, cap_digest, Reservation.from_json(doc))
        return {"res": doc, "cap": cap}

    def _register(self, req: m.Register) -> None:
        self.jobs.register(self._group(req.group, req.token), req.compactor, req.state, req.ecid)

    def _unregister(self, req: m.Unregister) -> None:
        self.jobs.unregister(self._group(req.group, req.token), req.compactor, req.keep)

    def _mark_drained(self, req: m.MarkDrained) -> None:
        self.jobs.mark_drained(self._group(req.group, req.token), req.compactor)

    def _count_written(self, req: m.CountWritten) -> None:
        self.jobs.count_written(req.n)

    # -- the job's record in its group's history ------------------------------------------------------
    def _history(self, res: Reservation, req: m.History) -> bool:
        """Append the job's record to the reservation's group's history, once: the reservation's
        record goes with it, so a second request about it (another coordinator's broker that
        still knows the reservation, a replay) is refused. The compactor's user may not write
        any history stream itself (:mod:`kompaktor.metadata.acl`)."""
        if not take_reservation_record(self.store, res.ecid):
            raise Refused(f"{res.ecid}: its history record was written already")
        rec = history.Record(
            ecid=res.ecid,
            outcome=req.outcome,
            group=res.job.group,
            table=res.table,
            tablet=res.tablet,
            kind=res.job.kind,
            compactor=res.compactor,
            finished=time.time(),
            reason=req.reason,
            engine=req.engine,
            input_files=len(res.inputs),
            input_bytes=sum(res.job.files.values()),
            **dataclasses.asdict(req.figures),
        )
        return history.append(self.store, rec, history.HistoryLimits(req.max_records, req.max_age_s))

    # -- a merge's progress record, of a reservation's holder ----------------------------------------
    def _fingerprint(self, res: Reservation, req: m.Progress) -> str:
        fp = res.fingerprint
        if req.fp != fp:
            raise Refused(f"{res.ecid}: not the progress record of this compaction")
        return fp

    def _progress_start(self, res: Reservation, req: m.ProgressStart) -> None:
        self.jobs.resume_log(res, self._fingerprint(res, req)).start(req.cuts, req.now_ms)

    def _progress_part(self, res: Reservation, req: m.ProgressPart) -> None:
        self.jobs.resume_log(res, self._fingerprint(res, req)).record(req.part)

    def _progress_drop(self, res: Reservation, req: m.ProgressDrop) -> None:
        self.jobs.resume_log(res, self._fingerprint(res, req)).drop(req.index)

    def _progress_forget(self, res: Reservation, req: m.ProgressForget) -> None:
        resume_records.forget(self.store, self._fingerprint(res, req))
