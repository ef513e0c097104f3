"""The compaction history (docs/ui.md "The compaction history"): a record of every finished job, kept per group.

Every job a compactor reserved ends in one record — committed, failed (counted against the job,
retried after a backoff), dead-lettered (failed too often), cancelled (drained, table offline,
user compaction cancelled), retried (released without counting a failure: the storage was down,
or the tablet changed under it) or killed (its compactor died; found by the coordinator) — with
what it read and wrote, how long it took and why it failed.

Stored as one Redis stream per group, ``kz:history:<group>`` (:func:`kompaktor.keyspace.history_key`),
one field ``r`` holding the record as JSON; the entry's id is the time it was written. The writer
appends with ``XADD … MAXLEN ~ N`` and trims by age with ``XTRIM … MINID ~`` in the same round trip
(a pipeline, :func:`append`), once the job's outcome is settled: never inside the reserve or
commit functions, and a history that cannot be written never fails a job. The bounds are each
group's (its CompactorGroup's ``spec.history``, in the group's configuration: :meth:`HistoryLimits.of_group`)
and approximate (Redis trims whole stream nodes), so a reader may see a few records past them.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, fields
from typing import Any, cast

from kompaktor import keyspace as C
from kompaktor.connection import text
from kompaktor.metadata.store import MetadataStore
from kompaktor.model.redact import redact_text
from kompaktor.policy.services import DEFAULT_HISTORY_AGE_S, DEFAULT_HISTORY_RECORDS, GroupConfig

log = logging.getLogger(__name__)

COMMITTED = "committed"
FAILED = "failed"
DEAD_LETTERED = "dead-lettered"
CANCELLED = "cancelled"
RETRIED = "retried"
KILLED = "killed"
OUTCOMES = (COMMITTED, FAILED, DEAD_LETTERED, CANCELLED, RETRIED, KILLED)
#: the outcomes `kompaktor history --failed` and the status page's failures list
FAILURES = frozenset({FAILED, DEAD_LETTERED, RETRIED, KILLED})

DEFAULT_MAX_RECORDS = DEFAULT_HISTORY_RECORDS
DEFAULT_MAX_AGE_S = float(DEFAULT_HISTORY_AGE_S)
#: the longest reason kept (a merge's exception text can be long)
REASON_MAX = 500
#: entries one read of a stream returns at most
READ_CHUNK = 500


@dataclass(frozen=True)
class HistoryLimits:
    """How much history each group keeps: at most ``max_records`` records, none older than
    ``max_age_s`` (both approximate)."""

    max_records: int = DEFAULT_MAX_RECORDS
    max_age_s: float = DEFAULT_MAX_AGE_S

    def __post_init__(self) -> None:
        if self.max_records < 1 or self.max_age_s <= 0:
            raise ValueError("history: need at least 1 record and an age above 0 seconds")

    @classmethod
    def of_group(cls, cfg: GroupConfig) -> HistoryLimits:
        """A group's bounds, as its configuration (the CompactorGroup's ``spec.history``) says."""
        return cls(cfg.history_records, float(cfg.history_age_seconds))


@dataclass(frozen=True)
class Record:
    """One finished compaction. Figures not known for an outcome are None (a killed job's output
    and queued time, the delete markers a merge that did not finish dropped). ``queued_s``: the
    time the job waited in its queue, from its tablet's first queuing (a re-plan keeps it) to the
    reservation; ``deletes_dropped``: the delete markers of the inputs (within the tablet's range)
    the output does not hold — all of them for a full compaction."""

    ecid: str
    outcome: str
    group: str
    table: str  # table id (readers show its name while the table exists)
    tablet: str
    kind: str
    compactor: str
    finished: float  # epoch seconds
    reason: str = ""
    engine: str | None = None
    input_files: int = 0
    input_bytes: int | None = None
    input_entries: int | None = None
    output_bytes: int | None = None
    output_entries: int | None = None
    deletes_dropped: int | None = None
    queued_s: float | None = None
    merge_s: float | None = None
    commit_s: float | None = None
    resumed_parts: int = 0

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {self.outcome!r}: one of {', '.join(OUTCOMES)}")

    @property
    def failed(self) -> bool:
        return self.outcome in FAILURES

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Record:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


def clean_reason(reason: str) -> str:
    """A reason as it is kept: on one line, secrets redacted, at most :data:`REASON_MAX` characters."""
    return redact_text(" ".join(reason.split()))[:REASON_MAX]


def append(store: MetadataStore, rec: Record, limits: HistoryLimits = HistoryLimits()) -> bool:
    """Add ``rec`` to its group's history and trim it, in one round trip. Never raises: a history
    that cannot be written (Redis away, an ACL without the history's rights) is logged and the
    job goes on; returns whether the record was written."""
    key = C.history_key(rec.group)
    doc = json.dumps({**rec.to_json(), "reason": clean_reason(rec.reason)}, separators=(",", ":"))
    min_id = max(0, int((time.time() - limits.max_age_s) * 1000))
    try:
        p = store._r.pipeline(transaction=False)
        p.xadd(key, {"r": doc}, maxlen=limits.max_records, approximate=True)
        p.xtrim(key, minid=str(min_id), approximate=True)
        store.call(p.execute)
        return True
    except Exception as exc:  # the history is a record of the job, never a reason to fail it
        log.warning("%s: not recorded in the history of %s: %s", rec.ecid, rec.group, redact_text(str(exc)))
        return False


def read(
    store: MetadataStore,
    groups: Iterable[str],
    *,
    since: float | None = None,
    table: str | None = None,
    failed: bool = False,
    limit: int = 100,
) -> list[Record]:
    """The newest records first, at most ``limit``, of ``groups``; only those finished at or after
    ``since`` (epoch seconds), of table id ``table``, or failed, when asked."""
    out: list[Record] = []
    for g in sorted(set(groups)):
        out += _read_group(
            store, g, since, lambda r: (table is None or r.table == table) and (not failed or r.failed), limit
        )
    out.sort(key=lambda r: r.finished, reverse=True)
    return out[:limit]


def _read_group(
    store: MetadataStore, group: str, since: float | None, keep: Callable[[Record], bool], limit: int
) -> list[Record]:
    """A group's newest records that ``keep`` keeps, at most ``limit``: read newest first in calls of
    :data:`READ_CHUNK` entries (Redis runs one command at a time), until enough are found."""
    lo = "-" if since is None else str(max(0, int(since * 1000)))
    hi = "+"
    out: list[Record] = []
    while len(out) < limit:
        chunk = cast(
            "list[tuple[bytes, dict[bytes, bytes]]]",
            store.call(store._r.xrevrange, C.history_key(group), hi, lo, READ_CHUNK),
        )
        for _id, entry in chunk:
            rec = Record.from_json(json.loads(entry[b"r"]))
            if keep(rec):
                out.append(rec)
        if len(chunk) < READ_CHUNK:
            break
        hi = "(" + text(chunk[-1][0])  # exclusive: after the last entry read
    return out[:limit]


def last_failures(store: MetadataStore, groups: Iterable[str], per_group: int = 3) -> dict[str, list[Record]]:
    """Each group's newest failed records (at most ``per_group``); groups without any left out."""
    out = {}
    for g in sorted(set(groups)):
        recs = read(store, [g], failed=True, limit=per_group)
        if recs:
            out[g] = recs
    return out


def known_groups(store: MetadataStore) -> set[str]:
    """The groups whose history there may be: configured, or with a queue."""
    return set(store.fleet.groups()) | set(store.queues.groups())


def parse_since(text: str, now: float | None = None) -> float:
    """``--since``: a duration back from now (``90s``, ``15m``, ``2h``, ``7d``) or an ISO 8601
    time (``2026-11-27T05:00:00``, UTC unless it names a zone); epoch seconds."""
    from datetime import UTC, datetime

    now = time.time() if now is None else now
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    t = text.strip()
    if t[-1:] in units and t[:-1].replace(".", "", 1).isdigit():
        return now - float(t[:-1]) * units[t[-1]]
    try:
        when = datetime.fromisoformat(t)
    except ValueError:
        raise ValueError(f"--since {text!r}: give a duration (90s, 15m, 2h, 7d) or an ISO time") from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
