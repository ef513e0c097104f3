"""The operator's own settings, read once from the environment the Helm chart sets.

Owns: defaults the CompactorGroups leave out (image, Redis Secret, ServiceAccount), what a group
may name instead (allow-lists, see ``admission``), the drain-token Secret compactor pods read, and
cluster facts (the Prometheus address KEDA queries). Here, beside the models, because local mode
(``kompaktor up``) applies the same allow-lists to its groups as the operator does. Must not
import: kopf, redis, kube, ``kompaktor_operator``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from kompaktor import __version__
from kompaktor.resources.patterns import storage_problem, wildcard_problem

#: the chart's default ``compactor.maxResources``
DEFAULT_MAX_RESOURCES: dict[str, int | str] = {"cpu": "64", "memory": "256Gi", "ephemeral-storage": "1Ti"}


class OperatorConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    compactor_image: str = Field(f"ghcr.io/kompaktor/kompaktor-compactor:{__version__}")
    image_pull_policy: str = "IfNotPresent"
    redis_secret: str = Field("kompaktor-redis", description="Secret with the Redis URL, in the group's namespace")
    redis_secret_key: str = "url"
    storage_uri: str | None = None
    storage_secret: str | None = None
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    #: The ServiceAccount compactor pods run as (the chart's, no API rights, no token mounted).
    compactor_service_account: str = "kompaktor-compactor"
    #: What a CompactorGroup may name besides the defaults above (``admission``).
    allowed_images: tuple[str, ...] = ()
    allowed_service_accounts: tuple[str, ...] = ()
    allowed_secrets: tuple[str, ...] = ()
    allowed_spark_conf: tuple[str, ...] = ()
    allowed_spark_masters: tuple[str, ...] = ()
    allowed_storage: tuple[str, ...] = ()
    max_replicas_limit: int = Field(1000, ge=1)
    #: where and how big a group's pods may be (``admission.check_scheduling``): nodeSelector
    #: pairs ``key=value``, whole tolerations, whole affinities, priority classes; the most of
    #: each resource a request or limit may ask for (a resource not named here is refused)
    allowed_node_selectors: tuple[str, ...] = ()
    allowed_tolerations: tuple[dict[str, Any], ...] = ()
    allowed_affinities: tuple[dict[str, Any], ...] = ()
    allowed_priority_classes: tuple[str, ...] = ()
    max_resources: dict[str, int | str] = Field(default_factory=lambda: dict(DEFAULT_MAX_RESOURCES))
    #: the key compactor groups' tokens are derived from (:mod:`kompaktor.model.grouptoken`): each
    #: group's pods get their group's token; the coordinator's broker, holding the same key, acts
    #: for a compactor of that group only
    group_key: SecretStr | None = None
    #: Secret (in the group's namespace) whose key becomes KOMPAKTOR_DRAIN_TOKEN in compactor pods.
    drain_token_secret: str | None = None
    drain_token_secret_key: str = "token"
    #: ConfigMap (key ca.crt, in the group's namespace) that compactor pods mount for rediss://.
    redis_ca_configmap: str | None = None
    #: A NetworkPolicy per group: the compactors' HTTP port only from the operator pod
    #: (``operator_pod_labels`` in ``operator_namespace``) and ``metrics_peers`` (Prometheus).
    network_policy: bool = False
    operator_namespace: str | None = None
    operator_pod_labels: dict[str, str] = Field(default_factory=dict)
    metrics_peers: tuple[dict[str, Any], ...] = ()
    #: How often the scaler and status timers run, seconds.
    scale_interval: float = 5.0
    status_interval: float = 15.0

    @field_validator("allowed_images", "allowed_spark_conf", "allowed_spark_masters")
    @classmethod
    def _wildcards_on_boundaries(cls, entries: tuple[str, ...]) -> tuple[str, ...]:
        for entry in entries:
            if problem := wildcard_problem(entry):
                raise ValueError(problem)
        return entries

    @field_validator("max_resources")
    @classmethod
    def _quantities(cls, caps: dict[str, int | str]) -> dict[str, int | str]:
        from kompaktor.policy.sizes import parse_quantity_decimal

        for cap in caps.values():
            parse_quantity_decimal(cap)  # a ValueError names it
        return caps

    @field_validator("allowed_node_selectors")
    @classmethod
    def _pairs(cls, entries: tuple[str, ...]) -> tuple[str, ...]:
        for entry in entries:
            if "=" not in entry or not entry.partition("=")[0]:
                raise ValueError(f"allowed nodeSelector entry {entry!r} is not key=value")
        return entries

    @field_validator("allowed_storage")
    @classmethod
    def _storage_prefixes_in_normal_form(cls, entries: tuple[str, ...]) -> tuple[str, ...]:
        for entry in entries:
            if problem := storage_problem(entry):
                raise ValueError(f"allowed storage prefix {entry!r} {problem}")
        return entries

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorConfig:
        env = os.environ if env is None else env
        names = {
            "compactor_image": "KOMPAKTOR_COMPACTOR_IMAGE",
            "image_pull_policy": "KOMPAKTOR_IMAGE_PULL_POLICY",
            "redis_secret": "KOMPAKTOR_REDIS_SECRET",
            "redis_secret_key": "KOMPAKTOR_REDIS_SECRET_KEY",
            "storage_uri": "KOMPAKTOR_STORAGE",
            "storage_secret": "KOMPAKTOR_STORAGE_SECRET",
            "prometheus_url": "KOMPAKTOR_PROMETHEUS_URL",
            "scale_interval": "KOMPAKTOR_SCALE_INTERVAL",
            "status_interval": "KOMPAKTOR_STATUS_INTERVAL",
            "compactor_service_account": "KOMPAKTOR_COMPACTOR_SERVICE_ACCOUNT",
            "drain_token_secret": "KOMPAKTOR_DRAIN_TOKEN_SECRET",
            "group_key": "KOMPAKTOR_GROUP_KEY",
            "drain_token_secret_key": "KOMPAKTOR_DRAIN_TOKEN_SECRET_KEY",
            "redis_ca_configmap": "KOMPAKTOR_REDIS_CA_CONFIGMAP",
            "network_policy": "KOMPAKTOR_NETWORK_POLICY",
            "operator_namespace": "KOMPAKTOR_OPERATOR_NAMESPACE",
            "max_replicas_limit": "KOMPAKTOR_MAX_REPLICAS_LIMIT",
        }
        as_json = {  # JSON documents
            "operator_pod_labels": "KOMPAKTOR_OPERATOR_POD_LABELS",
            "metrics_peers": "KOMPAKTOR_METRICS_PEERS",
            "allowed_tolerations": "KOMPAKTOR_ALLOWED_TOLERATIONS",
            "allowed_affinities": "KOMPAKTOR_ALLOWED_AFFINITIES",
            "max_resources": "KOMPAKTOR_MAX_RESOURCES",
        }
        lists = {  # comma-separated
            "allowed_images": "KOMPAKTOR_ALLOWED_IMAGES",
            "allowed_service_accounts": "KOMPAKTOR_ALLOWED_SERVICE_ACCOUNTS",
            "allowed_secrets": "KOMPAKTOR_ALLOWED_SECRETS",
            "allowed_spark_conf": "KOMPAKTOR_ALLOWED_SPARK_CONF",
            "allowed_spark_masters": "KOMPAKTOR_ALLOWED_SPARK_MASTERS",
            "allowed_storage": "KOMPAKTOR_ALLOWED_STORAGE",
            "allowed_node_selectors": "KOMPAKTOR_ALLOWED_NODE_SELECTORS",
            "allowed_priority_classes": "KOMPAKTOR_ALLOWED_PRIORITY_CLASSES",
        }
        values: dict[str, object] = {field: env[var] for field, var in names.items() if env.get(var)}
        for field, var in lists.items():
            values[field] = tuple(item.strip() for item in env.get(var, "").split(",") if item.strip())
        for field, var in as_json.items():
            if env.get(var):
                values[field] = json.loads(env[var])
        return cls.model_validate(values)
