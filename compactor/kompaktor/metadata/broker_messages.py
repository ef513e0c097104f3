"""The requests a compactor sends the coordinator's broker: one type per operation, both sides.

The compactor (:mod:`kompaktor.metadata.brokered`) builds a request and :func:`encode` puts it on
the wire; the broker (:mod:`kompaktor.coordinator.broker`) gets it back with :func:`decode`, which
refuses (:class:`Refused`, one line) an operation it does not know and an argument of the wrong
type or shape, before anything reads it. The broker then dispatches on the request's type.

The wire is one JSON object: ``op``, ``reply`` (where the answer goes), ``exp`` (until when an
answer is of use), and the operation's arguments under the names below — unchanged from 0.2.0,
whose compactors keep talking to a newer broker during a rolling upgrade (docs/upgrading.md);
``history`` is new in 0.3.0 (0.2.0's compactors appended their records themselves).
A request about a compaction carries its ``ecid`` and the holder's secret ``cap``
(:class:`Held`); a request about a compactor carries its ``group`` and the group's ``token``.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
from dataclasses import dataclass, fields
from typing import Any, ClassVar, TypeVar

from kompaktor.metadata.history import KILLED, OUTCOMES
from kompaktor.model.errors import KompaktorError
from kompaktor.model.resume import Bound, PartRecord, decode_cuts, encode_cuts
from kompaktor.model.tablet import FileMeta

#: the longest name (group, compactor, ECID) a request may carry
ID_MAX = 253
#: the compactor states a compactor may say it is in
STATES = ("idle", "busy", "draining")
#: the most progress fields one heartbeat carries, and their lengths
PROGRESS_MAX, PROGRESS_KEY_MAX, PROGRESS_VALUE_MAX = 32, 64, 256
REASON_MAX = 500


class Refused(KompaktorError):
    """The broker refused a request (not the holder of the reservation, an unknown operation)."""


def name(value: object, what: str) -> str:
    """``value`` if it is a printable name of at most :data:`ID_MAX` characters."""
    if not isinstance(value, str) or not 0 < len(value) <= ID_MAX or not value.isprintable():
        raise Refused(f"bad {what}: {value!r:.80}")
    return value


def _optional(value: object, what: str) -> str | None:
    return None if value is None else name(value, what)


@dataclass(frozen=True)
class Envelope:
    """Where a request's answer goes (``reply``, 32 hex characters) and until when (epoch s)."""

    reply: str
    exp: float

    @classmethod
    def new(cls, wait_s: float, now: float) -> Envelope:
        return cls(secrets.token_hex(16), now + wait_s)


@dataclass(frozen=True)
class Request:
    """A request: its wire name is :attr:`op`; its fields are its arguments."""

    op: ClassVar[str]

    @classmethod
    def parse(cls, d: dict[str, Any]) -> Request:
        raise NotImplementedError

    def args(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


# -- about a compactor or its group -----------------------------------------------------------------
@dataclass(frozen=True)
class Reserve(Request):
    op: ClassVar[str] = "reserve"
    group: str
    compactor: str
    token: str | None = None

    @classmethod
    def parse(cls, d: dict[str, Any]) -> Reserve:
        return cls(*_compactor(d), _token(d))


@dataclass(frozen=True)
class Register(Request):
    op: ClassVar[str] = "register"
    group: str
    compactor: str
    state: str
    ecid: str | None
    token: str | None = None

    @classmethod
    def parse(cls, d: dict[str, Any]) -> Register:
        state = d.get("state")
        if state not in STATES:
            raise Refused(f"bad compactor state {state!r:.40}")
        return cls(*_compactor(d), str(state), _optional(d.get("ecid"), "ECID"), _token(d))


@dataclass(frozen=True)
class Unregister(Request):
    op: ClassVar[str] = "unregister"
    group: str
    compactor: str
    keep: bool
    token: str | None = None

    @classmethod
    def parse(cls, d: dict[str, Any]) -> Unregister:
        return cls(*_compactor(d), bool(d.get("keep")), _token(d))


@dataclass(frozen=True)
class MarkDrained(Request):
    op: ClassVar[str] = "mark_drained"
    group: str
    compactor: str
    token: str | None = None

    @classmethod
    def parse(cls, d: dict[str, Any]) -> MarkDrained:
        return cls(*_compactor(d), _token(d))


@dataclass(frozen=True)
class CountWritten(Request):
    op: ClassVar[str] = "count_written"
    n: int

    @classmethod
    def parse(cls, d: dict[str, Any]) -> CountWritten:
        n = d.get("n")
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise Refused(f"bad byte count {n!r:.40}")
        return cls(n)


def _compactor(d: dict[str, Any]) -> tuple[str, str]:
    """The group and the compactor id a request about a compactor names."""
    return name(d.get("group"), "group"), name(d.get("compactor"), "compactor id")


def _token(d: dict[str, Any]) -> str | None:
    token = d.get("token")
    return token if isinstance(token, str) else None


# -- a job's figures, as its compactor measured them ------------------------------------------------
#: the outcomes a compactor reports of its jobs (``killed`` is the coordinator's finding)
REPORTED = tuple(o for o in OUTCOMES if o != KILLED)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _seconds(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < float("inf")


@dataclass(frozen=True)
class Figures:
    """What a job read, wrote and took, as its compactor measured it (None: not known for its
    outcome; the fields of :class:`kompaktor.metadata.history.Record` of the same names)."""

    input_entries: int | None = None
    output_bytes: int | None = None
    output_entries: int | None = None
    deletes_dropped: int | None = None
    queued_s: float | None = None
    merge_s: float | None = None
    commit_s: float | None = None
    resumed_parts: int = 0

    @classmethod
    def parse(cls, d: object) -> Figures:
        """The figures of a request; a field of the wrong type or sign is refused."""
        if not isinstance(d, dict) or not set(d) <= {f.name for f in fields(cls)}:
            raise Refused("bad figures in a history record")
        out: dict[str, Any] = {}
        for k, v in d.items():
            seconds = k.endswith("_s")
            if v is None and k != "resumed_parts":
                out[k] = None
            elif seconds and _seconds(v):
                out[k] = float(v)
            elif not seconds and _count(v):
                out[k] = int(v)
            else:
                raise Refused(f"bad {k} in a history record: {v!r:.40}")
        return cls(**out)


# -- about a compaction its sender holds ------------------------------------------------------------
@dataclass(frozen=True)
class Held(Request):
    """A request about a compaction: its ECID and the secret its holder was given."""

    ecid: str
    cap: str

    @staticmethod
    def holder(d: dict[str, Any]) -> tuple[str, str]:
        ecid, cap = d.get("ecid"), d.get("cap")
        if not isinstance(ecid, str) or not isinstance(cap, str) or not cap:
            raise Refused("a request about a compaction needs its ECID and its holder's secret")
        return ecid, cap

    #: whether the compaction ends with this request (its reservation's record then goes soon)
    ends: ClassVar[bool] = False


@dataclass(frozen=True)
class Heartbeat(Held):
    op: ClassVar[str] = "heartbeat"
    progress: dict[str, str]

    @classmethod
    def parse(cls, d: dict[str, Any]) -> Heartbeat:
        progress = d.get("progress")
        if not isinstance(progress, dict) or len(progress) > PROGRESS_MAX:
            raise Refused("bad progress")
        kept = {
            str(k)[:PROGRESS_KEY_MAX]: str(v)[:PROGRESS_VALUE_MAX]
            for k, v in progress.items()
            if k not in ("compactor", "updated")
        }
        return cls(*cls.holder(d), kept)


@dataclass(frozen=True)
class Commit(Held):
    """The output is the reservation's; the compactor describes what it wrote there."""

    op: ClassVar[str] = "commit"
    ends: ClassVar[bool] = True
    meta: FileMeta

    @classmethod
    def parse(cls, d: dict[str, Any]) -> Commit:
        holder = cls.holder(d)
        try:
            meta = FileMeta.from_json(d["meta"])
        except (KeyError, TypeError, ValueError, AttributeError):
            raise Refused("bad file description in a commit") from None
        return cls(*holder, meta)

    def args(self) -> dict[str, Any]:
        return {"ecid": self.ecid, "cap": self.cap, "meta": self.meta.to_json()}


@dataclass(frozen=True)
class Release(Held):
    op: ClassVar[str] = "release"
    ends: ClassVar[bool] = True

    @classmethod
    def parse(cls, d: dict[str, Any]) -> Release:
        return cls(*cls.holder(d))


@dataclass(frozen=True)
class Failure(Held):
    op: ClassVar[str] = "failure"
    reason: str

    @classmethod
    def parse(cls, d: dict[str, Any]) -> Failure:
        return cls(*cls.holder(d), str(d.get("reason", ""))[:REASON_MAX])


@dataclass(frozen=True)
class History(Held):
    """The job's record in its group's compaction history (:mod:`kompaktor.metadata.history`), the
    holder's last request about it: what only the compactor knows — the outcome, the reason, the
    engine and the figures of its merge and commit — and the group's bounds it runs with. The
    broker writes the record's other fields (group, table, tablet, kind, compactor, inputs) from
    the reservation it made, into that group's stream, once."""

    op: ClassVar[str] = "history"
    ends: ClassVar[bool] = True
    outcome: str
    reason: str
    engine: str | None
    figures: Figures
    max_records: int
    max_age_s: float

    @classmethod
    def parse(cls, d: dict[str, Any]) -> History:
        holder = cls.holder(d)
        outcome = d.get("outcome")
        if outcome not in REPORTED:
            raise Refused(f"bad outcome {outcome!r:.40}: a compactor reports one of {', '.join(REPORTED)}")
        max_records, max_age_s = d.get("max_records"), d.get("max_age_s")
        if not _count(max_records) or not max_records or not _seconds(max_age_s) or not max_age_s:
            raise Refused("bad history bounds: at least 1 record and an age above 0 seconds")
        reason = str(d.get("reason", ""))[:REASON_MAX]
        return cls(
            *holder,
            str(outcome),
            reason,
            _optional(d.get("engine"), "engine"),
            Figures.parse(d.get("figures")),
            int(max_records),
            float(max_age_s),
        )

    def args(self) -> dict[str, Any]:
        return {**super().args(), "figures": dataclasses.asdict(self.figures)}


@dataclass(frozen=True)
class DropHeartbeat(Held):
    op: ClassVar[str] = "drop_heartbeat"

    @classmethod
    def parse(cls, d: dict[str, Any]) -> DropHeartbeat:
        return cls(*cls.holder(d))


@dataclass(frozen=True)
class Progress(Held):
    """A request about a merge's progress record: ``fp`` must be the reservation's fingerprint."""

    fp: str

    @staticmethod
    def fingerprint(d: dict[str, Any]) -> str:
        fp = d.get("fp")
        if not isinstance(fp, str):
            raise Refused("a progress request needs the record's fingerprint")
        return fp


@dataclass(frozen=True)
class ProgressStart(Progress):
    op: ClassVar[str] = "progress_start"
    cuts: tuple[tuple[Bound, Bound], ...]
    now_ms: int

    @classmethod
    def parse(cls, d: dict[str, Any]) -> ProgressStart:
        holder, fp = cls.holder(d), cls.fingerprint(d)
        try:
            cuts, now_ms = decode_cuts(d["cuts"]), int(d["now_ms"])
        except (KeyError, TypeError, ValueError):
            raise Refused("bad cuts or clock in a progress record") from None
        return cls(*holder, fp, cuts, now_ms)

    def args(self) -> dict[str, Any]:
        return {
            "ecid": self.ecid,
            "cap": self.cap,
            "fp": self.fp,
            "cuts": encode_cuts(self.cuts),
            "now_ms": self.now_ms,
        }


@dataclass(frozen=True)
class ProgressPart(Progress):
    op: ClassVar[str] = "progress_part"
    part: PartRecord

    @classmethod
    def parse(cls, d: dict[str, Any]) -> ProgressPart:
        holder, fp = cls.holder(d), cls.fingerprint(d)
        try:
            part = PartRecord.from_json(d["part"])
        except (KeyError, TypeError, ValueError):
            raise Refused("bad part in a progress record") from None
        return cls(*holder, fp, part)

    def args(self) -> dict[str, Any]:
        return {"ecid": self.ecid, "cap": self.cap, "fp": self.fp, "part": self.part.to_json()}


@dataclass(frozen=True)
class ProgressDrop(Progress):
    op: ClassVar[str] = "progress_drop"
    index: int

    @classmethod
    def parse(cls, d: dict[str, Any]) -> ProgressDrop:
        index = d.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            raise Refused(f"bad part index {index!r:.40}")
        return cls(*cls.holder(d), cls.fingerprint(d), index)


@dataclass(frozen=True)
class ProgressForget(Progress):
    op: ClassVar[str] = "progress_forget"

    @classmethod
    def parse(cls, d: dict[str, Any]) -> ProgressForget:
        return cls(*cls.holder(d), cls.fingerprint(d))


R = TypeVar("R", bound=Request)
#: every request type by its wire name
REQUESTS: dict[str, type[Request]] = {
    c.op: c
    for c in (
        Reserve,
        Register,
        Unregister,
        MarkDrained,
        CountWritten,
        Heartbeat,
        Commit,
        Release,
        Failure,
        History,
        DropHeartbeat,
        ProgressStart,
        ProgressPart,
        ProgressDrop,
        ProgressForget,
    )
}


def encode(req: Request, env: Envelope) -> str:
    """The request on the wire."""
    return json.dumps({"op": req.op, "reply": env.reply, "exp": env.exp, **req.args()}, separators=(",", ":"))


def envelope(raw: bytes | str) -> tuple[Envelope, dict[str, Any]] | None:
    """Where to answer a request and its document, or None when it is malformed (nobody can be
    told: no valid reply address)."""
    try:
        d = json.loads(raw)
        reply, exp = d["reply"], float(d["exp"])
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(reply, str) or len(reply) != 32:
        return None
    return Envelope(reply, exp), d


def decode(d: dict[str, Any]) -> Request:
    """The typed request of a document; an unknown operation or a bad argument is refused."""
    op = d.get("op")
    kind = REQUESTS.get(op) if isinstance(op, str) else None
    if kind is None:
        raise Refused(f"unknown request {d.get('op')!r:.40}")
    return kind.parse(d)
