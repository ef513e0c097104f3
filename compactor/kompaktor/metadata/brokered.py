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
import secrets
import time
from typing import Any, cast

from kompaktor import keyspace as C
from kompaktor.files.storage import Storage
from kompaktor.metadata import progress as resume_records
from kompaktor.metadata.compactions import Reservation, delete_outputs
from kompaktor.metadata.store import MetadataStore
from kompaktor.model.errors import ConditionFailed, KompaktorError, StoreUnavailable
from kompaktor.model.resume import Bound, PartRecord
from kompaktor.model.tablet import FileMeta

#: one BLPOP waits at most this long (below the client's socket timeout); a request loops
_WAIT_STEP_S = 4.0


class Refused(KompaktorError):
    """The broker refused a request (not the holder of the reservation, an unknown operation)."""


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

    def ask(self, op: str, timeout_s: float | None = None, **args: Any) -> Any:
        """Send one request and wait for its answer (at most ``timeout_s``)."""
        wait = self.timeout_s if timeout_s is None else timeout_s
        reply, deadline = self.send(op, wait, **args)
        return self.answer(op, reply, deadline, wait)

    def send(self, op: str, wait: float, **args: Any) -> tuple[str, float]:
        """Push one request; (where its answer comes, until when it is of use)."""
        reply = secrets.token_hex(16)
        deadline = time.time() + wait
        req = json.dumps({"op": op, "reply": reply, "exp": deadline, **args}, separators=(",", ":"))
        self.store.call(self.store._r.lpush, C.BROKER, req)
        return reply, deadline

    def answer(self, op: str, reply: str, deadline: float, wait: float) -> Any:
        """The answer to a request sent (its value, or its error raised)."""
        while (left := deadline - time.time()) > 0:
            step = max(0.01, min(left, _WAIT_STEP_S))
            got = self.store.call(self.store._r.blpop, [C.reply_key(reply)], timeout=step)
            if got is not None:
                return decode_reply(got[1])
        raise StoreUnavailable(f"no answer from the coordinator to {op} within {wait:g} s (is it running?)")

    def _held(self, op: str, res: Reservation, timeout_s: float | None = None, **args: Any) -> Any:
        return self.ask(op, timeout_s, ecid=res.ecid, cap=res.cap, **args)

    def reserve(self, group: str, compactor: str) -> Reservation | None:
        got = self._mine("reserve", group, compactor=compactor)
        return None if got is None else Reservation.from_json(got["res"], got["cap"])

    def heartbeat(self, res: Reservation, progress: dict[str, Any]) -> None:
        self._held("heartbeat", res, self.heartbeat_timeout_s, progress={k: str(v) for k, v in progress.items()})

    def commit(self, res: Reservation, meta: FileMeta) -> None:
        self._held("commit", res, meta=meta.to_json())

    def release(self, storage: Storage, res: Reservation) -> bool:
        removed = bool(self._held("release", res))
        delete_outputs(storage, res.output, res.ecid)
        return removed

    def record_failure(self, res: Reservation, reason: str) -> bool:
        return bool(self._held("failure", res, reason=reason[:500]))

    def drop_heartbeat(self, res: Reservation) -> None:
        self._held("drop_heartbeat", res)

    def count_written(self, n: int) -> None:
        self.ask("count_written", n=int(n))

    def register(self, group: str, compactor: str, state: str, ecid: str | None) -> None:
        self.ask(
            "register",
            self.heartbeat_timeout_s,
            group=group,
            compactor=compactor,
            state=state,
            ecid=ecid,
            token=self.group_token,
        )

    def unregister(self, group: str, compactor: str, keep_drain_mark: bool) -> None:
        self.ask(
            "unregister",
            self.heartbeat_timeout_s,
            group=group,
            compactor=compactor,
            keep=keep_drain_mark,
            token=self.group_token,
        )

    def mark_drained(self, group: str, compactor: str) -> None:
        self._mine("mark_drained", group, compactor=compactor)

    def _mine(self, op: str, group: str, **args: Any) -> Any:
        """A request about this compactor's group (with the group's token)."""
        return self.ask(op, self.heartbeat_timeout_s, group=group, token=self.group_token, **args)

    def resume_log(self, res: Reservation, fingerprint: str) -> resume_records.RedisResumeLog:
        return BrokeredResumeLog(self, res, fingerprint)


class BrokeredResumeLog(resume_records.RedisResumeLog):
    """A merge's progress record: read from the store, written through the broker."""

    def __init__(self, jobs: BrokeredJobs, res: Reservation, fingerprint: str) -> None:
        super().__init__(jobs.store, fingerprint, res.tablet, res.inputs, res.prev, res.end, res.job.selection)
        self.jobs = jobs
        self.res = res

    def start(self, cuts: tuple[tuple[Bound, Bound], ...], now_ms: int) -> None:
        from kompaktor.model.resume import encode_cuts

        self.jobs._held("progress_start", self.res, fp=self.fingerprint, cuts=encode_cuts(cuts), now_ms=now_ms)

    def record(self, part: PartRecord) -> None:
        self.jobs._held("progress_part", self.res, fp=self.fingerprint, part=part.to_json())
        self.recorded[part.index] = part

    def drop(self, index: int) -> None:
        self.jobs._held("progress_drop", self.res, fp=self.fingerprint, index=int(index))
        self.recorded.pop(index, None)

    def forget_record(self, fingerprint: str) -> None:
        self.jobs._held("progress_forget", self.res, fp=fingerprint)


# -- the broker's side (kompaktor.coordinator.broker): its Redis commands -------------------------
def take_requests(store: MetadataStore, wait_s: float, count: int) -> list[bytes]:
    """Wait up to ``wait_s`` for requests; up to ``count`` of those waiting, oldest first."""
    got = cast(
        "list[Any] | None",  # [key, [request, ...]]
        store.call(store._r.blmpop, wait_s, 1, C.BROKER, direction="RIGHT", count=count),
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
        p.rpush(C.reply_key(reply), text)
        p.expire(C.reply_key(reply), reply_ttl_s)
    store.call(p.execute)


def reservation_record(store: MetadataStore, ecid: str) -> dict[str, Any] | None:
    """The broker's record of a reservation (the reservation, the digest of its holder's secret)."""
    raw = store.call(store._r.get, C.reservation_key(ecid))
    return None if raw is None else dict(json.loads(raw))
