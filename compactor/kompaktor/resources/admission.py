"""What a CompactorGroup may use (docs/kubernetes.md "Security settings"): the operator, not the
group's author, decides.

Anyone allowed to create a CompactorGroup must not be able to run an arbitrary image, or a pod
with another ServiceAccount or Secret of the namespace, through the operator's rights. A group
may name only:

- an image from the allow-list (``KOMPAKTOR_ALLOWED_IMAGES``; chart value
  ``compactor.allowedImages``) — the operator's default compactor image is always allowed; an
  entry ending in ``*`` allows every image that starts with what comes before it;
- the chart's compactor ServiceAccount (the default) or one from ``KOMPAKTOR_ALLOWED_SERVICE_ACCOUNTS``
  (``compactor.allowedServiceAccounts``);
- Secrets (``spec.redis.secretName``, ``spec.storage.credentialsSecret``) that are the operator's
  own defaults or in ``KOMPAKTOR_ALLOWED_SECRETS`` (``compactor.allowedSecrets``).

- Spark settings (``spec.spark.conf``) whose keys are in :data:`SPARK_CONF_ALLOWED` or
  ``KOMPAKTOR_ALLOWED_SPARK_CONF`` (``compactor.allowedSparkConf``): several Spark settings load or
  run code (``spark.jars*``, ``spark.*.extraJavaOptions``, ``spark.python.daemon.module``,
  ``spark.plugins``), move files (``spark.local.dir``, ``spark.eventLog.dir``) or unmask secrets
  (``spark.redaction.regex``) in a pod that holds the Redis password and storage credentials;
- a Spark master ``local``, ``local[N]`` or ``local[*]``, or one listed in
  ``KOMPAKTOR_ALLOWED_SPARK_MASTERS`` (``compactor.allowedSparkMasters``): a master elsewhere
  receives the table's rows and, in the settings, the storage access;
- a storage URI equal to the operator's default storage or, in normal form
  (:func:`storage_problem`: no percent-encoding, backslash, user part, query, fragment, empty,
  ``.`` or ``..`` segment or non-ASCII character — pyarrow decodes a URI before it opens it, and
  reads ``?endpoint_override=`` from it), under a prefix in ``KOMPAKTOR_ALLOWED_STORAGE``
  (``compactor.allowedStorage``), segment by segment;
- ``maxReplicas`` at most ``KOMPAKTOR_MAX_REPLICAS_LIMIT`` (``compactor.maxReplicasLimit``);
- ``nodeSelector`` pairs, tolerations, an affinity and a priority class only as the chart lists
  them (``compactor.allowedNodeSelectors``, ``.allowedTolerations``, ``.allowedAffinities``,
  ``.allowedPriorityClasses``), and resource requests and limits at most ``compactor.maxResources``
  (:func:`check_scheduling`, :func:`check_resources`);
- pod labels and annotations outside the keys the operator, the Deployment's selector, the
  scale-down and other controllers act on (:data:`RESERVED_KEY_PREFIXES`).

In the list-valued settings (images, Spark settings, masters) an entry may end in ``*`` right
after ``/``, ``:`` or ``.``; it allows one more segment (:func:`listed`); ``OperatorConfig``
refuses a ``*`` anywhere else, so ``spark://trusted*`` never allows
``spark://trusted.evil.example``. Anything else is a :class:`Refusal` naming the rule; the
handler reports it as a condition and creates nothing (an edited group's Deployment keeps its last allowed spec); local
mode (``kompaktor up``) refuses such a group the same way. Pure: no I/O. Must not import: kopf,
redis, kube, ``kompaktor_operator``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

from kompaktor.policy.sizes import parse_quantity_decimal
from kompaktor.resources import api
from kompaktor.resources.models import CompactorGroupSpec
from kompaktor.resources.operator_config import OperatorConfig
from kompaktor.resources.patterns import IMAGE_SEGMENT, listed, storage_key, storage_problem

IMAGE_NOT_ALLOWED = "ImageNotAllowed"
SERVICE_ACCOUNT_NOT_ALLOWED = "ServiceAccountNotAllowed"
SECRET_NOT_ALLOWED = "SecretNotAllowed"
SPARK_CONF_NOT_ALLOWED = "SparkConfNotAllowed"
SPARK_MASTER_NOT_ALLOWED = "SparkMasterNotAllowed"
STORAGE_NOT_ALLOWED = "StorageNotAllowed"
MAX_REPLICAS_NOT_ALLOWED = "MaxReplicasNotAllowed"
LABEL_NOT_ALLOWED = "LabelNotAllowed"
NODE_SELECTOR_NOT_ALLOWED = "NodeSelectorNotAllowed"
TOLERATION_NOT_ALLOWED = "TolerationNotAllowed"
AFFINITY_NOT_ALLOWED = "AffinityNotAllowed"
PRIORITY_CLASS_NOT_ALLOWED = "PriorityClassNotAllowed"
RESOURCES_NOT_ALLOWED = "ResourcesNotAllowed"

#: Spark settings that size or tune a merge and cannot load code, move files or reveal secrets
SPARK_CONF_ALLOWED: frozenset[str] = frozenset(
    {
        "spark.cores.max",
        "spark.default.parallelism",
        "spark.driver.cores",
        "spark.driver.maxResultSize",
        "spark.driver.memoryOverhead",
        "spark.dynamicAllocation.enabled",
        "spark.dynamicAllocation.executorIdleTimeout",
        "spark.dynamicAllocation.initialExecutors",
        "spark.dynamicAllocation.maxExecutors",
        "spark.dynamicAllocation.minExecutors",
        "spark.executor.cores",
        "spark.executor.heartbeatInterval",
        "spark.executor.instances",
        "spark.executor.memory",
        "spark.executor.memoryOverhead",
        "spark.io.compression.codec",
        "spark.locality.wait",
        "spark.memory.fraction",
        "spark.memory.offHeap.enabled",
        "spark.memory.offHeap.size",
        "spark.memory.storageFraction",
        "spark.network.timeout",
        "spark.python.worker.memory",
        "spark.python.worker.reuse",
        "spark.rdd.compress",
        "spark.reducer.maxSizeInFlight",
        "spark.scheduler.mode",
        "spark.shuffle.compress",
        "spark.shuffle.file.buffer",
        "spark.speculation",
        "spark.sql.execution.arrow.maxRecordsPerBatch",
        "spark.sql.execution.arrow.pyspark.enabled",
        "spark.sql.files.maxPartitionBytes",
        "spark.sql.shuffle.partitions",
        "spark.task.cpus",
        "spark.task.maxFailures",
    }
)
#: label and annotation keys a group may not put on its pods: the operator's own and its
#: selectors' (app.kubernetes.io/*, kompaktor.io/*), kopf's, the scale-down's
#: (controller.kubernetes.io/pod-deletion-cost) and the ReplicaSet's (pod-template-hash)
RESERVED_KEY_PREFIXES = (
    "app.kubernetes.io/",
    api.KEY_PREFIX,
    "kopf.zalando.org/",
    "controller.kubernetes.io/",
    "kubernetes.io/",
    "k8s.io/",
)
RESERVED_KEYS = frozenset({"pod-template-hash"})
_LOCAL_MASTER = re.compile(r"^local(\[(\*|[1-9][0-9]{0,3})(,[1-9][0-9]{0,2})?\])?$")


@dataclass(frozen=True)
class Refusal:
    rule: str  # the condition's reason
    message: str


def image_allowed(image: str, config: OperatorConfig) -> bool:
    return image == config.compactor_image or listed(image, config.allowed_images, IMAGE_SEGMENT)


def storage_allowed(uri: str, config: OperatorConfig) -> bool:
    """``uri`` is the chart's storage, or in normal form (:func:`storage_problem`) under an
    allowed prefix: the same scheme and location, and the prefix's path segments first."""
    if config.storage_uri and uri == config.storage_uri:
        return True
    if storage_problem(uri) is not None:
        return False
    scheme, location, path = storage_key(uri)
    for prefix in config.allowed_storage:
        if storage_problem(prefix) is not None:
            continue
        p_scheme, p_location, p_path = storage_key(prefix)
        if (scheme, location, path[: len(p_path)]) == (p_scheme, p_location, p_path):
            return True
    return False


def reserved_key(key: str) -> bool:
    """A label/annotation key the operator or a controller acts on (with or without a subdomain)."""
    prefix, _, name = key.rpartition("/")
    domain = prefix + "/" if prefix else ""
    return (
        key in RESERVED_KEYS
        or any(domain == p or domain.endswith("." + p) for p in RESERVED_KEY_PREFIXES)
        or (not domain and name in RESERVED_KEYS)
    )


def allowed_secrets(config: OperatorConfig) -> set[str]:
    own = {config.redis_secret, config.storage_secret, config.drain_token_secret}
    return {s for s in own if s} | set(config.allowed_secrets)


def check_group(spec: CompactorGroupSpec, config: OperatorConfig) -> Refusal | None:
    """The first rule ``spec`` breaks, or None when the operator may build its pods."""
    image = spec.image or config.compactor_image
    if not image_allowed(image, config):
        return Refusal(
            IMAGE_NOT_ALLOWED,
            f"image {image!r} is not allowed: the operator runs only {config.compactor_image!r}"
            f"{_and(config.allowed_images)} (chart value compactor.allowedImages)",
        )
    account = spec.service_account_name
    if account and account != config.compactor_service_account and account not in config.allowed_service_accounts:
        return Refusal(
            SERVICE_ACCOUNT_NOT_ALLOWED,
            f"serviceAccountName {account!r} is not allowed: compactors run as "
            f"{config.compactor_service_account!r}{_and(config.allowed_service_accounts)} "
            f"(chart value compactor.allowedServiceAccounts)",
        )
    allowed = allowed_secrets(config)
    named = [
        ("spec.redis.secretName", spec.redis.secret_name if spec.redis else None),
        ("spec.storage.credentialsSecret", spec.storage.credentials_secret if spec.storage else None),
    ]
    for field, secret in named:
        if secret and secret not in allowed:
            return Refusal(
                SECRET_NOT_ALLOWED,
                f"{field} {secret!r} is not allowed: a group may use only the Secrets "
                f"{', '.join(repr(s) for s in sorted(allowed)) or '(none)'} "
                f"(chart value compactor.allowedSecrets)",
            )
    refusal = check_spark(spec.spark.conf, spec.spark.master, config)
    if refusal is not None:
        return refusal
    uri = spec.storage.uri if spec.storage else None
    if uri and not storage_allowed(uri, config):
        why = storage_problem(uri)
        allowed_uris = ([config.storage_uri] if config.storage_uri else []) + [f"{p}…" for p in config.allowed_storage]
        return Refusal(
            STORAGE_NOT_ALLOWED,
            f"spec.storage.uri {uri!r} is not allowed: a group may use "
            f"{', '.join(repr(a) for a in allowed_uris) or 'only the default storage'} "
            f"(chart value compactor.allowedStorage)" + (f"; it {why}" if why else ""),
        )
    refusal = check_scheduling(spec, config) or check_resources(spec, config)
    if refusal is not None:
        return refusal
    if spec.max_replicas > config.max_replicas_limit:
        return Refusal(
            MAX_REPLICAS_NOT_ALLOWED,
            f"spec.maxReplicas {spec.max_replicas} is more than {config.max_replicas_limit} "
            f"(chart value compactor.maxReplicasLimit)",
        )
    for field, keys in (("spec.podLabels", spec.pod_labels), ("spec.podAnnotations", spec.pod_annotations)):
        for key in sorted(keys):
            if reserved_key(key):
                return Refusal(
                    LABEL_NOT_ALLOWED,
                    f"{field} key {key!r} is not allowed: the operator, the Deployment's selector or "
                    f"another controller acts on it (reserved: "
                    f"{', '.join(p + '*' for p in RESERVED_KEY_PREFIXES)}, pod-template-hash)",
                )
    return None


def check_spark(conf: Iterable[str], master: str, config: OperatorConfig) -> Refusal | None:
    """The first Spark setting key in ``conf`` or the ``master`` that a group may not use."""
    for key in sorted(conf):
        if key not in SPARK_CONF_ALLOWED and not listed(key, config.allowed_spark_conf):
            return Refusal(
                SPARK_CONF_NOT_ALLOWED,
                f"spec.spark.conf key {key!r} is not allowed: a group may set only Spark settings that "
                f"size or tune a merge (chart value compactor.allowedSparkConf adds keys)",
            )
    if not _LOCAL_MASTER.match(master) and not listed(master, config.allowed_spark_masters):
        return Refusal(
            SPARK_MASTER_NOT_ALLOWED,
            f"spec.spark.master {master!r} is not allowed: local, local[N] or local[*]"
            f"{_and(config.allowed_spark_masters)} (chart value compactor.allowedSparkMasters)",
        )
    return None


def _compact(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def check_scheduling(spec: CompactorGroupSpec, config: OperatorConfig) -> Refusal | None:
    """nodeSelector pairs, tolerations, the affinity and the priority class, each as the chart
    lists it: a group's author must not place compactors on nodes (or above pods) of others."""
    for key, value in sorted(spec.node_selector.items()):
        if f"{key}={value}" not in config.allowed_node_selectors:
            return Refusal(
                NODE_SELECTOR_NOT_ALLOWED,
                f"spec.nodeSelector {key}={value} is not allowed: only {_listed(config.allowed_node_selectors)} "
                f"(chart value compactor.allowedNodeSelectors)",
            )
    for toleration in spec.tolerations:
        if toleration not in config.allowed_tolerations:
            return Refusal(
                TOLERATION_NOT_ALLOWED,
                f"spec.tolerations entry {_compact(toleration)} is not allowed: only "
                f"{_listed(_compact(t) for t in config.allowed_tolerations)} "
                f"(chart value compactor.allowedTolerations)",
            )
    if spec.affinity and spec.affinity not in config.allowed_affinities:
        return Refusal(
            AFFINITY_NOT_ALLOWED,
            f"spec.affinity {_compact(spec.affinity)} is not allowed: only one of "
            f"{len(config.allowed_affinities)} listed in chart value compactor.allowedAffinities",
        )
    pc = spec.priority_class_name
    if pc and pc not in config.allowed_priority_classes:
        return Refusal(
            PRIORITY_CLASS_NOT_ALLOWED,
            f"spec.priorityClassName {pc!r} is not allowed: only {_listed(config.allowed_priority_classes)} "
            f"(chart value compactor.allowedPriorityClasses)",
        )
    return None


def check_resources(spec: CompactorGroupSpec, config: OperatorConfig) -> Refusal | None:
    """Every request and limit at most the chart's cap for its resource (``compactor.maxResources``)."""
    if spec.resources is None:
        return None
    caps = config.max_resources
    for kind, amounts in (("requests", spec.resources.requests), ("limits", spec.resources.limits)):
        for name, amount in sorted(amounts.items()):
            cap = caps.get(name)
            if cap is None or parse_quantity_decimal(amount) > parse_quantity_decimal(cap):
                most = f"at most {cap}" if cap is not None else "not a resource the chart lists"
                return Refusal(
                    RESOURCES_NOT_ALLOWED,
                    f"spec.resources.{kind}.{name} {amount} is not allowed: {most} "
                    f"(chart value compactor.maxResources: {_compact(caps)})",
                )
    return None


def _listed(entries: Iterable[str]) -> str:
    return ", ".join(entries) or "none"


def _and(extra: tuple[str, ...]) -> str:
    return f" and {', '.join(repr(e) for e in extra)}" if extra else ""
