"""Compaction services, compactor groups and the dispatcher. Pure data + pure choice.

A compaction service = planner settings + ordered size tiers, each naming the compactor group
that runs jobs of that size. Tables choose a service per compaction kind with table properties,
as Accumulo's SimpleCompactionDispatcher does: ``table.compaction.dispatcher.opts.service``
(all kinds) and ``table.compaction.dispatcher.opts.service.<kind>`` (``system``, ``user``,
``selector``); otherwise the first service (by name) whose table patterns match the table name
for that kind; otherwise the service named ``default``.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields

from kompaktor.model.engines import ENGINES
from kompaktor.model.job import Kind
from kompaktor.policy.planner import DEFAULTS, PlannerSettings, SizeTier
from kompaktor.policy.tableprops import DISPATCH_PREFIX

DEFAULT_SERVICE = "default"
#: every kind a service may plan for (its ``kinds``), in the order of :class:`Kind`
KINDS: tuple[str, ...] = tuple(k.value for k in Kind)


@dataclass(frozen=True)
class Tier:
    name: str
    max_size: int | None  # bytes; None = unbounded
    group: str  # compactor group running this tier's jobs


@dataclass(frozen=True)
class ServiceConfig:
    name: str
    tiers: tuple[Tier, ...] = (Tier("default", None, "default"),)
    ratio: float = DEFAULTS.ratio
    max_open: int = DEFAULTS.max_open
    max_files_per_tablet: int = DEFAULTS.max_files_per_tablet
    lowest_ratio: float = DEFAULTS.lowest_ratio
    tables: tuple[str, ...] = ("*",)  # glob patterns of table names this service serves
    kinds: tuple[str, ...] = KINDS

    def __post_init__(self) -> None:
        # Validation lives in PlannerSettings; building one here makes a bad service fail early.
        self.planner_settings()
        bad = [k for k in self.kinds if k not in KINDS]
        if bad:
            raise ValueError(f"service {self.name!r}: unknown compaction kinds {bad}; use {list(KINDS)}")

    def planner_settings(self) -> PlannerSettings:
        return PlannerSettings(
            ratio=self.ratio,
            max_open=self.max_open,
            max_files_per_tablet=self.max_files_per_tablet,
            lowest_ratio=self.lowest_ratio,
            groups=tuple(SizeTier(t.name, t.max_size) for t in self.tiers),
        )

    def group_of_tier(self, tier_name: str) -> str:
        for t in self.tiers:
            if t.name == tier_name:
                return t.group
        raise KeyError(tier_name)

    def serves(self, table: str, kind: str) -> bool:
        return kind in self.kinds and any(fnmatch.fnmatchcase(table, p) for p in self.tables)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> ServiceConfig:
        d = json.loads(text)
        d["tiers"] = tuple(Tier(**t) for t in d["tiers"])
        d["tables"] = tuple(d.get("tables", ("*",)))
        d["kinds"] = tuple(d.get("kinds", KINDS))
        return cls(**d)


DEFAULT = ServiceConfig(DEFAULT_SERVICE)


#: A compactor group's defaults, in one home: the CompactorGroup CRD (operator models), GroupConfig,
#: the compactor's command line and WorkerSettings all read them from here.
DEFAULT_MIN_REPLICAS = 1
DEFAULT_MAX_REPLICAS = 10
DEFAULT_JOBS_PER_REPLICA = 1
DEFAULT_SPARK_MASTER = "local[*]"
DEFAULT_ENGINE = "spark"
DEFAULT_DRAIN_GRACE_S = 300
#: merges record their finished key ranges so that a retry of the same job resumes
#: (docs/kubernetes.md "Resuming long merges"; CompactorGroup ``spec.resume.enabled``)
DEFAULT_RESUME = True
#: input bytes from which a merge given a resume log is resumable (``spec.resume.minInputSize``,
#: 1Gi; a compactor gives its group's to its engine as ``resume_min_bytes``). The resumable path
#: writes every range as a part, takes its SHA-256, records it and keeps the parts until the
#: commit (Arrow: instead of streaming ranges straight into the output). Measured with ``python -m
#: bench.merge_bench --engines arrow,arrow-resumable,spark,spark-resumable`` (2 shared cores):
#: Arrow 0.91-1.11x the CPU of the plain path (wall time within the noise), Spark 1.13x the CPU
#: and 1.04-1.16x the time (the driver hashes each part as it appends it), and the output's bytes
#: twice on disk until the commit. Below 1 GiB a merge is about 13 s of work here: restarting it
#: costs less than making every such merge pay (docs/architecture.md, "Long merges resume").
DEFAULT_RESUME_MIN_BYTES = 1 << 30
#: how much of a group's compaction history Redis keeps (``spec.history``; docs/kubernetes.md "How
#: much compaction history a group keeps"): about this many records, none older than about this many seconds (7 days)
DEFAULT_HISTORY_RECORDS = 10_000
DEFAULT_HISTORY_AGE_S = 7 * 86_400
#: the most a CompactorGroup may ask to keep (a record is about 0.5 KB of Redis memory)
MAX_HISTORY_RECORDS = 1_000_000
MAX_HISTORY_AGE_S = 366 * 86_400

#: The settings a compactor of the group runs with (the rest of GroupConfig is for the scaler).
COMPACTOR_SETTINGS = (
    "engine",
    "spark_master",
    "spark_conf",
    "driver_memory",
    "drain_grace_seconds",
    "resume",
    "resume_min_bytes",
    "history_records",
    "history_age_seconds",
)


@dataclass(frozen=True)
class GroupConfig:
    """A compactor resource group: how many compactors, and how they run merges.

    The one channel of a group's settings to its compactors: the operator (and ``kompaktor up``)
    stores it in Redis (``kz:groups``) and ``kompaktor compactor --group G`` reads it there at
    start; the pod's arguments name only the group (docs/kubernetes.md, "How a group's settings
    reach its compactors")."""

    name: str
    min_replicas: int = DEFAULT_MIN_REPLICAS
    max_replicas: int = DEFAULT_MAX_REPLICAS
    jobs_per_replica: int = DEFAULT_JOBS_PER_REPLICA
    spark_master: str = DEFAULT_SPARK_MASTER
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    driver_memory: str | None = None
    drain_grace_seconds: int = DEFAULT_DRAIN_GRACE_S
    engine: str = DEFAULT_ENGINE  # "spark", or "arrow" for groups that only hold small jobs
    resume: bool = DEFAULT_RESUME  # merges record their finished key ranges (docs/kubernetes.md "Resuming long merges")
    resume_min_bytes: int = DEFAULT_RESUME_MIN_BYTES  # ... from this many input bytes
    history_records: int = DEFAULT_HISTORY_RECORDS  # the group's history keeps about this many
    history_age_seconds: int = DEFAULT_HISTORY_AGE_S  # ... none older than this

    def __post_init__(self) -> None:
        if self.min_replicas < 0 or self.max_replicas < max(1, self.min_replicas):
            raise ValueError(f"group {self.name!r}: need 0 <= minReplicas <= maxReplicas and maxReplicas >= 1")
        if self.jobs_per_replica < 1:
            raise ValueError(f"group {self.name!r}: jobsPerReplica must be >= 1")
        if self.engine not in ENGINES:
            raise ValueError(f"group {self.name!r}: engine {self.engine!r} is not one of {', '.join(ENGINES)}")
        if self.drain_grace_seconds < 0:
            raise ValueError(f"group {self.name!r}: drainGraceSeconds must be >= 0")
        if isinstance(self.resume_min_bytes, bool) or not isinstance(self.resume_min_bytes, int):
            raise ValueError(f"group {self.name!r}: resume.minInputSize must be a whole number of bytes")
        if self.resume_min_bytes < 0:
            raise ValueError(f"group {self.name!r}: resume.minInputSize must be >= 0")
        for value, what, top in (
            (self.history_records, "history.maxRecords", MAX_HISTORY_RECORDS),
            (self.history_age_seconds, "history.maxAgeSeconds", MAX_HISTORY_AGE_S),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
                raise ValueError(f"group {self.name!r}: {what} must be a whole number from 1 to {top}")

    def compactor_settings(self) -> dict[str, object]:
        """What a compactor of the group runs with: engine, Spark master, conf, driver memory, grace,
        resume (on/off and from which input size), the history's bounds."""
        d = {k: getattr(self, k) for k in COMPACTOR_SETTINGS}
        d["spark_conf"] = dict(self.spark_conf)
        return d

    def settings_digest(self) -> str:
        """A short digest of :meth:`compactor_settings`: the operator puts it on the pod template,
        so that a change of any of them rolls the group's pods (which read the new ones at start)."""
        text = json.dumps(self.compactor_settings(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_json(self) -> str:
        d = asdict(self)
        d["spark_conf"] = dict(self.spark_conf)
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> GroupConfig:
        """A stored config. Keys this version does not know — written by a newer operator while
        a rolling upgrade is under way — are left out, so an older compactor that restarts
        meanwhile still starts, with the settings it knows."""
        d = json.loads(text)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


def dispatch(table: str, props: Mapping[str, str], kind: str, services: Iterable[ServiceConfig]) -> str:
    """Name of the service that runs ``kind`` compactions of ``table``."""
    explicit = props.get(f"{DISPATCH_PREFIX}.{kind.lower()}") or props.get(DISPATCH_PREFIX)
    if explicit:
        return explicit
    for svc in sorted(services, key=lambda s: s.name):
        if svc.name != DEFAULT_SERVICE and svc.serves(table, kind):
            return svc.name
    return DEFAULT_SERVICE
