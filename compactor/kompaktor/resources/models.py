"""Pydantic models of Kompaktor's custom resources: the only definition of their schemas.

Owns: the spec/status models of CompactionService, CompactorGroup and Compaction (API names in
``kompaktor.resources.api``), their cross-field validation, the conversion of a validated spec to
the core's ``ServiceConfig`` / ``GroupConfig``, and ``load_documents`` for the local YAML that
``kompaktor up`` shares with the cluster. The operator (``kompaktor_operator``) and local mode
(``kompaktor.local.config``) both import them from here.

Must not import: kopf, redis, kubernetes clients (only the pure ``kubernetes.utils`` helpers via
``kompaktor.policy.sizes``), ``kompaktor_operator``. ``crdgen.py`` turns these models into
``crds/*.yaml``.
"""

from __future__ import annotations

import enum
import fnmatch
import re
from collections.abc import Iterable
from typing import Annotated, Any, ClassVar, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from kompaktor.model.engines import ENGINES
from kompaktor.model.iterators import IteratorOptions
from kompaktor.model.job import Kind
from kompaktor.policy import services as group_defaults
from kompaktor.policy.planner import DEFAULTS as PLANNER_DEFAULTS
from kompaktor.policy.services import GroupConfig, ServiceConfig
from kompaktor.policy.services import Tier as CoreTier
from kompaktor.policy.sizes import format_quantity
from kompaktor.resources import api

#: The grammar of a Kubernetes quantity (apimachinery's resource.Quantity), as CRDs spell it.
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_QUANTITY_RE = re.compile(QUANTITY_PATTERN)
_K8S_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _check_quantity(value: int | str) -> int | str:
    if isinstance(value, bool):
        raise ValueError("a quantity is an integer or a string such as '128Mi'")
    if isinstance(value, str) and not _QUANTITY_RE.match(value):
        raise ValueError(f"{value!r} is not a Kubernetes quantity (examples: 128Mi, 1G, 500000)")
    return value


#: A Kubernetes quantity: an integer, or a string such as "32Mi" (binary) or "32M" (decimal).
Quantity = Annotated[
    int | str,
    AfterValidator(_check_quantity),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": True,
        }
    ),
]

#: A quantity that cannot be negative: the schema's pattern refuses a sign in a string (a
#: negative integer is refused by the model's validator: the operator marks the spec invalid).
SIZE_PATTERN = "^" + QUANTITY_PATTERN.removeprefix(r"^(\+|-)?")
NonNegativeQuantity = Annotated[
    int | str,
    AfterValidator(_check_quantity),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": SIZE_PATTERN,
            "x-kubernetes-int-or-string": True,
        }
    ),
]

#: A free-form object Kubernetes keeps as given (tolerations, affinity).
FreeForm = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]


def check_group_name(value: str) -> str:
    """A compactor group's name, the one check (the CRD models, local configuration and the
    operator's handler): a DNS-1123 label of at most 40 characters, ASCII only — it names
    Deployments, Services and HPAs and is part of Redis keys. ``ValueError`` otherwise."""
    if len(value) > 40 or not _K8S_NAME_RE.fullmatch(value):
        raise ValueError(
            f"{value!r} must be a lowercase DNS label of at most 40 characters (a-z, 0-9, '-'), "
            "because it names Deployments, Services and HPAs"
        )
    return value


#: The name of a compactor group (also a Kubernetes object name and a Redis key part).
GroupName = Annotated[
    str,
    AfterValidator(check_group_name),
    Field(min_length=1, max_length=40, pattern=_K8S_NAME_RE.pattern),
]


def quantity_bytes(value: int | str) -> int:
    """Whole bytes of a Kubernetes quantity (a fraction rounds up). Delegates to the core."""
    from kompaktor.policy.sizes import parse_quantity_bytes

    return parse_quantity_bytes(value)


class CRDModel(BaseModel):
    """Base of every model that appears in a custom resource: camelCase, frozen, strict keys."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        frozen=True,
        extra="forbid",
    )

    def to_wire(self) -> dict[str, Any]:
        """The camelCase dict Kubernetes stores, without unset optional fields."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


# --------------------------------------------------------------------------------------------
# Conditions (shared by all three kinds)


class ConditionStatus(enum.StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(CRDModel):
    """A standard Kubernetes condition (metav1.Condition shape)."""

    type: str = Field(description="Ready, Degraded, ...")
    status: ConditionStatus
    reason: str = Field("", description="CamelCase machine-readable reason")
    message: str = Field("", description="what a person can do about it")
    last_transition_time: str | None = Field(None, description="RFC 3339")
    observed_generation: int | None = Field(None, ge=0)


# --------------------------------------------------------------------------------------------
# CompactionService


class Tier(CRDModel):
    """One size tier: compactions whose input is smaller than maxSize go to compactorGroup."""

    name: str = Field(min_length=1, max_length=63, description="tier name, unique within the service")
    max_size: Quantity | None = Field(
        None,
        description="exclusive upper bound of a job's total input size (Kubernetes quantity: "
        "32Mi = 33554432, 32M = 32000000); leave out on the last, unbounded tier",
    )
    compactor_group: GroupName = Field(description="name of the CompactorGroup that runs this tier")

    def max_size_bytes(self) -> int | None:
        return None if self.max_size is None else quantity_bytes(self.max_size)


def _default_tiers() -> list[Tier]:
    return [Tier(name="default", compactor_group="default")]


class CompactionServiceSpec(CRDModel):
    """Planner settings, size tiers and the tables a compaction service serves."""

    ratio: float = Field(
        PLANNER_DEFAULTS.ratio, ge=1.0, description="compaction ratio (Accumulo table.compaction.major.ratio)"
    )
    max_open: int = Field(
        PLANNER_DEFAULTS.max_open, ge=2, description="most files one compaction may merge (planner maxOpen)"
    )
    max_files_per_tablet: int = Field(
        PLANNER_DEFAULTS.max_files_per_tablet,
        ge=0,
        description="file count above which a tablet is over size (table.file.max); 0 means 99",
    )
    lowest_ratio: float = Field(PLANNER_DEFAULTS.lowest_ratio, ge=1.0, description="floor of the lower-ratio search")
    tiers: list[Tier] = Field(
        default_factory=_default_tiers,
        min_length=1,
        max_length=32,
        description="size tiers in ascending maxSize order; at most one unbounded tier, last",
    )
    tables: list[str] = Field(
        default_factory=lambda: ["*"],
        min_length=1,
        description="table names or glob patterns (fnmatch) this service serves",
    )
    kinds: list[Kind] = Field(
        default_factory=lambda: list(Kind),
        min_length=1,
        description="compaction kinds this service plans for the matching tables",
    )

    @field_validator("tables")
    @classmethod
    def _tables(cls, value: list[str]) -> list[str]:
        for pattern in value:
            if not pattern or pattern != pattern.strip():
                raise ValueError(f"table pattern {pattern!r} is empty or has surrounding spaces")
        return value

    @field_validator("kinds")
    @classmethod
    def _kinds(cls, value: list[Kind]) -> list[Kind]:
        if len(set(value)) != len(value):
            raise ValueError("kinds lists a kind twice")
        return value

    @field_validator("tiers")
    @classmethod
    def _tiers(cls, tiers: list[Tier]) -> list[Tier]:
        names = [t.name for t in tiers]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"tier names must be unique; repeated: {', '.join(dupes)}")
        previous: int | None = None
        for index, tier in enumerate(tiers):
            if tier.max_size is None:
                if index != len(tiers) - 1:
                    raise ValueError(
                        f"tier {tier.name!r} has no maxSize (unbounded) but is not the last tier; "
                        "only the last tier may be unbounded"
                    )
                continue
            try:
                size = tier.max_size_bytes()
            except (ValueError, ArithmeticError) as exc:
                raise ValueError(f"tier {tier.name!r}: maxSize {tier.max_size!r}: {exc}") from None
            if size is None or size <= 0:
                raise ValueError(f"tier {tier.name!r}: maxSize must be greater than zero")
            if previous is not None and size <= previous:
                raise ValueError(
                    f"tier {tier.name!r}: maxSize {tier.max_size} must be larger than the previous "
                    "tier's; list tiers from smallest to largest"
                )
            previous = size
        return tiers

    def serves(self, table: str) -> bool:
        return any(fnmatch.fnmatchcase(table, p) for p in self.tables)

    def groups(self) -> list[str]:
        """The compactor groups this service sends work to, in tier order, without repeats."""
        return list(dict.fromkeys(t.compactor_group for t in self.tiers))


class TierStatus(CRDModel):
    name: str
    compactor_group: str
    queued: int = Field(0, ge=0)
    running: int = Field(0, ge=0)


class CompactionServiceStatus(CRDModel):
    observed_generation: int | None = Field(None, ge=0)
    tiers: list[TierStatus] = Field(default_factory=list)
    queued: int | None = Field(None, ge=0, description="jobs queued over all tiers")
    running: int | None = Field(None, ge=0, description="compactions running over all tiers")
    conditions: list[Condition] = Field(default_factory=list)


# --------------------------------------------------------------------------------------------
# CompactorGroup


class Autoscaler(enum.StrEnum):
    HPA = "hpa"
    KEDA = "keda"
    NONE = "none"


class SparkSettings(CRDModel):
    """How the compactor runs its merge: a local Spark, a Spark cluster or Spark on Kubernetes."""

    engine: Literal[ENGINES] = Field(  # type: ignore[valid-type]
        group_defaults.DEFAULT_ENGINE,
        description="merge engine: spark, or arrow (in-process, for groups that only hold small jobs)",
    )
    master: str = Field(
        group_defaults.DEFAULT_SPARK_MASTER, min_length=1, description="Spark master URL (spark.master)"
    )
    conf: dict[str, str] = Field(default_factory=dict, description="extra Spark settings (--spark-conf k=v)")
    driver_memory: str | None = Field(
        None, pattern=r"^[0-9]+([kKmMgGtTpP][bB]?)?$", description="spark.driver.memory in Spark's units, e.g. 2g"
    )
    executor_memory: str | None = Field(
        None,
        pattern=r"^[0-9]+([kKmMgGtTpP][bB]?)?$",
        description="spark.executor.memory of each executor on a Spark cluster, in Spark's units, e.g. 4g",
    )
    executor_cores: int | None = Field(
        None, ge=1, le=1024, description="spark.executor.cores: cores (concurrent merge tasks) per executor"
    )

    @model_validator(mode="after")
    def _one_source_per_setting(self) -> SparkSettings:
        for field_name, key in (
            ("executor_memory", "spark.executor.memory"),
            ("executor_cores", "spark.executor.cores"),
            ("driver_memory", "spark.driver.memory"),
            ("master", "spark.master"),
        ):
            if key in self.conf and (field_name == "master" or getattr(self, field_name) is not None):
                raise ValueError(f"spark.conf sets {key}; use spark.{to_camel(field_name)} instead")
        return self

    def session_conf(self) -> dict[str, str]:
        """The Spark conf a compactor's session gets: ``conf`` plus the executor settings."""
        out = dict(self.conf)
        if self.executor_memory is not None:
            out["spark.executor.memory"] = self.executor_memory
        if self.executor_cores is not None:
            out["spark.executor.cores"] = str(self.executor_cores)
        return out


class ResourceRequirements(CRDModel):
    """Pod resources of the compactor container (the core/v1 shape)."""

    requests: dict[str, Quantity] = Field(default_factory=dict)
    limits: dict[str, Quantity] = Field(default_factory=dict)


class RedisRef(CRDModel):
    """A Secret key holding the Redis URL (redis://[:password@]host:port/db or rediss://...)."""

    secret_name: str = Field(min_length=1, max_length=253)
    key: str = Field("url", min_length=1, max_length=253)


class StorageSettings(CRDModel):
    """Where data files live (pyarrow.fs URI) and the Secret with its credentials, as env vars."""

    uri: str | None = Field(None, description="KOMPAKTOR_STORAGE, e.g. s3://bucket/kompaktor")
    credentials_secret: str | None = Field(
        None, description="Secret whose keys become environment variables (AWS_ACCESS_KEY_ID, ...)"
    )


class ScalingBehavior(CRDModel):
    """How fast the autoscaler moves: up at once, down only after a quiet window."""

    # Fast: from 1 pod to hundreds in two or three HPA periods (queue depth is a direct signal,
    # unlike CPU); the larger of the two policies applies.
    scale_up_percent: int = Field(900, ge=1, description="most replicas added per 15 s, in percent")
    scale_up_pods: int = Field(100, ge=1, description="most replicas added per 15 s, in pods")
    scale_down_stabilization_seconds: int = Field(
        300, ge=0, le=3600, description="look-back window before scaling down"
    )
    scale_down_percent: int = Field(25, ge=1, le=100, description="most replicas removed per minute")


#: the largest size a setting may hold (a signed 64-bit integer, as Kubernetes quantities)
_MAX_BYTES = (1 << 63) - 1


class ResumeSettings(CRDModel):
    """Whether a long merge records its finished key ranges, so that a retry of the same job (on
    any compactor, after a drain, a kill or an OOM) reuses them instead of starting over."""

    enabled: bool = Field(
        group_defaults.DEFAULT_RESUME,
        description="record finished key ranges of merges from minInputSize on; false: every retry starts over",
    )
    min_input_size: NonNegativeQuantity = Field(
        format_quantity(group_defaults.DEFAULT_RESUME_MIN_BYTES),
        description="total input size from which a merge is resumable (Kubernetes quantity: 1Gi = 1073741824, "
        "1G = 1000000000; 0: every merge); below it a merge costs nothing extra and restarts from zero",
    )

    @field_validator("min_input_size", mode="before")
    @classmethod
    def _not_a_flag(cls, value: Any) -> Any:
        if isinstance(value, bool):  # int | str would take true as 1 byte
            raise ValueError("a quantity is an integer or a string such as '1Gi', not true or false")
        return value

    @field_validator("min_input_size")
    @classmethod
    def _min_input_size(cls, value: int | str) -> int | str:
        try:
            size = quantity_bytes(value)
        except (ValueError, ArithmeticError) as exc:
            raise ValueError(str(exc)) from None
        if size < 0:
            raise ValueError(f"{value!r} is negative; 0 makes every merge resumable")
        if size > _MAX_BYTES:
            raise ValueError(f"{value!r} is more than 2^63 - 1 bytes")
        return value

    def min_input_bytes(self) -> int:
        return quantity_bytes(self.min_input_size)


class HistorySettings(CRDModel):
    """How much of the group's compaction history (a record of every finished job: `kompaktor
    history`, the status page) Redis keeps; both bounds are approximate (Redis trims whole stream
    nodes of 100 records)."""

    max_records: int = Field(
        group_defaults.DEFAULT_HISTORY_RECORDS,
        ge=1,
        le=group_defaults.MAX_HISTORY_RECORDS,
        strict=True,  # a whole number: not true, not "100", not 1.5
        description="records kept, about (the oldest go first); a record takes about 0.5 KB of Redis memory",
    )
    max_age_seconds: int = Field(
        group_defaults.DEFAULT_HISTORY_AGE_S,
        ge=1,
        le=group_defaults.MAX_HISTORY_AGE_S,
        strict=True,  # a whole number: not true, not "100", not 1.5
        description="seconds a record is kept, about (604800: 7 days)",
    )


class CompactorGroupSpec(CRDModel):
    """A resource group: a pool of compactor pods serving one queue, autoscaled on its depth."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.minReplicas) || !has(self.maxReplicas) || self.minReplicas <= self.maxReplicas",
                    "message": "minReplicas must not be larger than maxReplicas",
                },
            ]
        }
    )

    image: str | None = Field(None, description="compactor image; the operator's default when left out")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None
    replicas: int | None = Field(
        None, ge=0, description="desired compactors; written by the autoscaler (scale subresource)"
    )
    min_replicas: int = Field(
        group_defaults.DEFAULT_MIN_REPLICAS,
        ge=0,
        description="fewest compactors; 0: none while no job is queued or running (with an HPA the operator "
        "parks the group at 0 after the scale-down window and wakes it at the first job)",
    )
    max_replicas: int = Field(group_defaults.DEFAULT_MAX_REPLICAS, ge=1, description="most compactors")
    jobs_per_replica: int = Field(
        group_defaults.DEFAULT_JOBS_PER_REPLICA,
        ge=1,
        description="target queued plus running jobs per compactor (HPA AverageValue)",
    )
    autoscaler: Autoscaler = Field(Autoscaler.HPA, description="hpa (default), keda, or none (fixed replicas)")
    behavior: ScalingBehavior = Field(default_factory=ScalingBehavior)
    spark: SparkSettings = Field(default_factory=SparkSettings)
    resources: ResourceRequirements | None = None
    drain_grace_seconds: int = Field(
        group_defaults.DEFAULT_DRAIN_GRACE_S,
        ge=0,
        le=86400,
        description="time a draining compactor has to finish its job",
    )
    resume: ResumeSettings = Field(
        default_factory=ResumeSettings,
        description="long merges resume from their finished key ranges after an interruption",
    )
    history: HistorySettings = Field(
        default_factory=HistorySettings,
        description="how much of the group's compaction history Redis keeps",
    )
    redis: RedisRef | None = Field(None, description="Redis URL Secret; the operator's default when left out")
    storage: StorageSettings | None = None
    service_account_name: str | None = Field(None, max_length=253)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[FreeForm] = Field(default_factory=list)
    affinity: FreeForm | None = None
    priority_class_name: str | None = Field(
        None,
        max_length=253,
        description="the pods' PriorityClass; one the chart lists (compactor.allowedPriorityClasses)",
    )
    pod_annotations: dict[str, str] = Field(default_factory=dict)
    pod_labels: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _replicas(self) -> CompactorGroupSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"minReplicas ({self.min_replicas}) is larger than maxReplicas ({self.max_replicas})")
        return self

    @field_validator("pod_annotations", "pod_labels")
    @classmethod
    def _no_reserved(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if key.startswith(("kopf.zalando.org/", api.KEY_PREFIX)):
                raise ValueError(f"{key!r} is reserved for the operator")
        return value

    def desired_replicas(self) -> int:
        """The replica count the operator aims for: spec.replicas within [min, max]."""
        wanted = self.min_replicas if self.replicas is None else self.replicas
        return max(self.min_replicas, min(self.max_replicas, wanted))


class CompactorGroupStatus(CRDModel):
    observed_generation: int | None = Field(None, ge=0)
    replicas: int | None = Field(None, ge=0, description="compactor pods the Deployment runs (scale)")
    ready_replicas: int | None = Field(None, ge=0)
    desired_replicas: int | None = Field(None, ge=0)
    selector: str | None = Field(None, description="label selector of the pods (scale subresource)")
    queued: int | None = Field(None, ge=0)
    running: int | None = Field(None, ge=0)
    oldest_queued_age_seconds: float | None = Field(None, ge=0)
    dead_lettered: int | None = Field(None, ge=0)
    rejected: int | None = Field(None, ge=0)
    draining: list[str] = Field(default_factory=list, description="pods asked to drain before a scale-down")
    conditions: list[Condition] = Field(default_factory=list)


# --------------------------------------------------------------------------------------------
# Compaction (a user compaction)


class CompactionPhase(enum.StrEnum):
    PENDING = "Pending"
    SELECTING = "Selecting"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"

    @property
    def terminal(self) -> bool:
        return self in (CompactionPhase.SUCCEEDED, CompactionPhase.FAILED, CompactionPhase.CANCELLED)


class AgeOff(CRDModel):
    """Drop entries older than ttlSeconds (by key timestamp, milliseconds since the epoch)."""

    ttl_seconds: int = Field(ge=1)


class RowFilter(CRDModel):
    """Drop the rows that match a regular expression (searched in the row, as bytes)."""

    regex: str = Field(min_length=1, description="rows matching this Python regular expression are dropped")

    @field_validator("regex")
    @classmethod
    def _regex(cls, value: str) -> str:
        try:
            re.compile(value.encode())
        except re.error as exc:
            raise ValueError(f"regex {value!r} does not compile: {exc}") from None
        return value


class Iterators(CRDModel):
    age_off: AgeOff | None = None
    row_filter: RowFilter | None = None


class CompactionSpec(CRDModel):
    """A user compaction of a table or of a row range (Accumulo: start row exclusive, end inclusive)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "self == oldSelf", "message": "a Compaction cannot change; delete it and create another"}
            ]
        }
    )

    table: str = Field(min_length=1, max_length=253)
    start_row: str | None = Field(None, description="rows after this one (exclusive); UTF-8")
    end_row: str | None = Field(None, description="rows up to and including this one; UTF-8")
    iterators: Iterators = Field(default_factory=Iterators)

    @model_validator(mode="after")
    def _range(self) -> CompactionSpec:
        if self.start_row is not None and self.end_row is not None and self.start_row.encode() >= self.end_row.encode():
            raise ValueError(f"startRow {self.start_row!r} must sort before endRow {self.end_row!r}")
        return self

    def row_bytes(self) -> tuple[bytes | None, bytes | None]:
        start = None if self.start_row is None else self.start_row.encode()
        end = None if self.end_row is None else self.end_row.encode()
        return start, end

    def iterator_config(self) -> IteratorOptions:
        """The iterators as the core receives them (the keys of ``IteratorSettings.from_json``)."""
        out: IteratorOptions = {}
        if self.iterators.age_off is not None:
            out["ageoff_ttl_ms"] = self.iterators.age_off.ttl_seconds * 1000
        if self.iterators.row_filter is not None:
            out["row_regex"] = self.iterators.row_filter.regex
        return out


class CompactionStatus(CRDModel):
    observed_generation: int | None = Field(None, ge=0)
    compaction_id: str | None = Field(None, description="id of the user compaction in the store")
    phase: CompactionPhase | None = None
    tablets_done: int | None = Field(None, ge=0)
    tablets_total: int | None = Field(None, ge=0)
    start_time: str | None = Field(None, description="RFC 3339")
    end_time: str | None = Field(None, description="RFC 3339")
    message: str | None = None
    conditions: list[Condition] = Field(default_factory=list)


# --------------------------------------------------------------------------------------------
# Whole resources (for load_documents, examples and CRD metadata)


class ObjectMeta(BaseModel):
    """The part of metadata the models use; anything else Kubernetes adds is kept and ignored."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str = Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    namespace: str | None = None


class Resource(BaseModel):
    """A whole custom resource: apiVersion, kind, metadata, spec (status is not validated here)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    KIND: ClassVar[str]
    PLURAL: ClassVar[str]
    SHORT_NAMES: ClassVar[tuple[str, ...]]
    SPEC: ClassVar[type[CRDModel]]
    STATUS: ClassVar[type[CRDModel]]

    # a Literal is spelled literally; tests/unit/test_crds.py checks it is api.GROUP_VERSION
    api_version: Literal["kompaktor.io/v1alpha1"] = Field(api.GROUP_VERSION, alias="apiVersion")
    kind: str
    metadata: ObjectMeta
    status: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return self.metadata.name


class CompactionService(Resource):
    KIND = api.SERVICE_KIND
    PLURAL = api.SERVICES
    SHORT_NAMES = ("kcs", "csvc")
    SPEC = CompactionServiceSpec
    STATUS = CompactionServiceStatus

    kind: Literal["CompactionService"] = "CompactionService"
    spec: CompactionServiceSpec = Field(default_factory=CompactionServiceSpec)


class CompactorGroup(Resource):
    KIND = api.GROUP_KIND
    PLURAL = api.GROUPS
    SHORT_NAMES = ("kcg", "cgroup")
    SPEC = CompactorGroupSpec
    STATUS = CompactorGroupStatus

    kind: Literal["CompactorGroup"] = "CompactorGroup"
    spec: CompactorGroupSpec = Field(default_factory=CompactorGroupSpec)

    @field_validator("metadata")
    @classmethod
    def _group_name(cls, meta: ObjectMeta) -> ObjectMeta:
        check_group_name(meta.name)
        return meta


class Compaction(Resource):
    KIND = api.COMPACTION_KIND
    PLURAL = api.COMPACTIONS
    SHORT_NAMES = ("kc", "kcompaction")
    SPEC = CompactionSpec
    STATUS = CompactionStatus

    kind: Literal["Compaction"] = "Compaction"
    spec: CompactionSpec


RESOURCES: tuple[type[Resource], ...] = (CompactionService, CompactorGroup, Compaction)
_BY_KIND: dict[str, type[Resource]] = {r.KIND: r for r in RESOURCES}


class DocumentError(ValueError):
    """A YAML document that is not a valid Kompaktor resource; says which one and why."""


def load_documents(yaml_text: str) -> list[Resource]:
    """Parse a multi-document YAML stream of Kompaktor resources, validating each.

    Empty documents are skipped. Raises ``DocumentError`` naming the document (by index and
    kind/name) on an unknown apiVersion/kind or an invalid spec; nothing is returned then.
    """
    out: list[Resource] = []
    try:
        docs = list(yaml.safe_load_all(yaml_text))
    except yaml.YAMLError as exc:
        raise DocumentError(f"not valid YAML: {exc}") from None
    for index, doc in enumerate(docs):
        if doc is None:
            continue
        where = f"document {index + 1}"
        if not isinstance(doc, dict):
            raise DocumentError(f"{where}: expected a mapping with apiVersion and kind")
        if doc.get("apiVersion") != api.GROUP_VERSION:
            raise DocumentError(f"{where}: apiVersion must be {api.GROUP_VERSION}, not {doc.get('apiVersion')!r}")
        model = _BY_KIND.get(str(doc.get("kind")))
        if model is None:
            raise DocumentError(f"{where}: kind {doc.get('kind')!r} is not one of {', '.join(sorted(_BY_KIND))}")
        name = (doc.get("metadata") or {}).get("name")
        try:
            out.append(model.model_validate(doc))
        except ValidationError as exc:
            raise DocumentError(f"{where} ({model.KIND} {name}): {explain(exc)}") from None
    return out


def explain(exc: ValidationError) -> str:
    """One line a person can act on, using camelCase field paths as written in YAML."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "spec"
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts)


# --------------------------------------------------------------------------------------------
# Conversion to the core's configuration objects


def to_service_config(name: str, spec: CompactionServiceSpec) -> ServiceConfig:
    """CompactionService spec -> ``kompaktor.policy.services.ServiceConfig`` (sizes in whole bytes)."""
    return ServiceConfig(
        name=name,
        ratio=float(spec.ratio),
        max_open=spec.max_open,
        max_files_per_tablet=spec.max_files_per_tablet,
        lowest_ratio=float(spec.lowest_ratio),
        tiers=tuple(CoreTier(name=t.name, max_size=t.max_size_bytes(), group=t.compactor_group) for t in spec.tiers),
        tables=tuple(spec.tables),
        kinds=tuple(Kind(k).value for k in spec.kinds),
    )


def to_group_config(name: str, spec: CompactorGroupSpec) -> GroupConfig:
    """CompactorGroup spec -> ``kompaktor.policy.services.GroupConfig``."""
    return GroupConfig(
        name=name,
        min_replicas=spec.min_replicas,
        max_replicas=spec.max_replicas,
        jobs_per_replica=spec.jobs_per_replica,
        spark_master=spec.spark.master,
        spark_conf=spec.spark.session_conf(),
        driver_memory=None if spec.spark.driver_memory is None else str(spec.spark.driver_memory),
        drain_grace_seconds=spec.drain_grace_seconds,
        engine=spec.spark.engine,
        resume=spec.resume.enabled,
        resume_min_bytes=spec.resume.min_input_bytes(),
        history_records=spec.history.max_records,
        history_age_seconds=spec.history.max_age_seconds,
    )


def configs(resources: Iterable[Resource]) -> tuple[list[ServiceConfig], list[GroupConfig]]:
    """(ServiceConfigs, GroupConfigs) of the services and groups among ``resources``."""
    services = [to_service_config(r.name, r.spec) for r in resources if isinstance(r, CompactionService)]
    groups = [to_group_config(r.name, r.spec) for r in resources if isinstance(r, CompactorGroup)]
    return services, groups
