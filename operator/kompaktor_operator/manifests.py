"""Pure builders: a CompactorGroup spec -> the Kubernetes objects it owns.

Owns: the compactor Deployment (no ``spec.replicas``: only the scaler sets it), the metrics
Service, the autoscaling/v2 HorizontalPodAutoscaler and the KEDA ScaledObject, each as its
TypedDict (:mod:`kompaktor_operator.objects`). Same inputs, same object; no I/O, no clock, no
random names; caller data is deep-copied.
Must not import: kopf, redis, kube.
"""

from __future__ import annotations

import copy

from kompaktor.model import grouptoken
from kompaktor.resources import api
from kompaktor.resources.models import Autoscaler, CompactorGroupSpec, FreeForm, to_group_config
from kompaktor.resources.operator_config import OperatorConfig
from kompaktor_operator import naming
from kompaktor_operator.objects import (
    AutoscalerObject,
    Child,
    Container,
    Deployment,
    EnvFromSource,
    EnvVar,
    HorizontalPodAutoscaler,
    HPABehavior,
    NamespacedPeer,
    NetworkPolicy,
    PodSpec,
    PodTemplate,
    Probe,
    ResourceRequirements,
    ScaledObject,
    ScaleTarget,
    Service,
    Volume,
)

SCRATCH_DIR = "/scratch"
#: Where compactor pods find the Redis CA (the chart's rediss:// URL names <this>/ca.crt).
REDIS_CA_DIR = "/etc/kompaktor/redis-tls"
#: Extra seconds after the drain grace for the compactor to release its job and exit.
EXIT_MARGIN_SECONDS = 30
#: Kubernetes scales up in 15 s periods; down policies use 60 s periods.
SCALE_UP_PERIOD = 15
SCALE_DOWN_PERIOD = 60


def compactor_args(group: str) -> list[str]:
    """Arguments of ``kompaktor`` in a compactor pod: only what names the pod's group and port.

    The group's settings (engine, Spark master and conf, driver memory, drain grace) are not
    arguments: the compactor reads them from the GroupConfig the operator stores in Redis before
    it applies the Deployment, so they have one source (docs/kubernetes.md). ``--stay-drained``:
    a drained compactor takes no job until its pod is gone (the kubelet would restart it).
    ``--broker``: its writes are asked of the coordinator (its Redis user may only read and ask)."""
    return ["compactor", "--group", group, "--http-port", str(naming.HTTP_PORT), "--stay-drained", "--broker"]


#: The compactor's environment variable that carries the settings digest (the pod template's
#: ``naming.SETTINGS_ANNOTATION``; `kompaktor compactor`)
SETTINGS_DIGEST_ENV = "KOMPAKTOR_SETTINGS_DIGEST"
#: the allow-lists a compactor checks its settings against (``OperatorConfig.from_env`` reads them)
ALLOWED_SPARK_CONF_ENV = "KOMPAKTOR_ALLOWED_SPARK_CONF"
ALLOWED_MASTERS_ENV = "KOMPAKTOR_ALLOWED_SPARK_MASTERS"


def settings_digest(group: str, spec: CompactorGroupSpec) -> str:
    return str(to_group_config(group, spec).settings_digest())


def _env(group: str, spec: CompactorGroupSpec, config: OperatorConfig) -> list[EnvVar]:
    secret = spec.redis.secret_name if spec.redis else config.redis_secret
    key = spec.redis.key if spec.redis else config.redis_secret_key
    env: list[EnvVar] = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        # the digest of the settings this pod was made for: its compactor refuses to start with
        # none stored or others (docs/kubernetes.md "How a group's settings reach its compactors";
        # a rollout replaces a pod made for older ones)
        {
            "name": SETTINGS_DIGEST_ENV,
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{naming.SETTINGS_ANNOTATION}']"}},
        },
        {"name": "KOMPAKTOR_REDIS_URL", "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}},
        {"name": "SPARK_LOCAL_DIRS", "value": SCRATCH_DIR},
        {"name": "TMPDIR", "value": "/tmp"},
        {"name": "HOME", "value": "/tmp"},
    ]
    # the rules the operator admitted the group by: its compactors check the settings they read
    # from Redis against them before they start Spark (the pod's spec: no compactor can change it)
    for var, entries in (
        (ALLOWED_SPARK_CONF_ENV, config.allowed_spark_conf),
        (ALLOWED_MASTERS_ENV, config.allowed_spark_masters),
    ):
        if entries:
            env.append({"name": var, "value": ",".join(entries)})
    storage_uri = spec.storage.uri if spec.storage and spec.storage.uri else config.storage_uri
    if storage_uri:
        env.append({"name": "KOMPAKTOR_STORAGE", "value": storage_uri})
    if config.group_key is not None:
        # proves to the coordinator's broker that the pod's requests are its group's
        # (docs/kubernetes.md "A compactor holds no power beyond its own job")
        env.append(
            {"name": grouptoken.TOKEN_ENV, "value": grouptoken.group_token(config.group_key.get_secret_value(), group)}
        )
    if config.drain_token_secret:
        # POST /drain from outside the pod needs this token (the operator holds the same Secret);
        # optional: without the Secret in this namespace, only the pod's own preStop (loopback) drains.
        env.append(
            {
                "name": "KOMPAKTOR_DRAIN_TOKEN",
                "valueFrom": {
                    "secretKeyRef": {
                        "name": config.drain_token_secret,
                        "key": config.drain_token_secret_key,
                        "optional": True,
                    }
                },
            }
        )
    return env


def _env_from(spec: CompactorGroupSpec, config: OperatorConfig) -> list[EnvFromSource]:
    secret = spec.storage.credentials_secret if spec.storage and spec.storage.credentials_secret else None
    secret = secret or config.storage_secret
    return [{"secretRef": {"name": secret}}] if secret else []


def build_pod_template(group: str, spec: CompactorGroupSpec, config: OperatorConfig) -> PodTemplate:
    """The compactor pods' template: its metadata, the one compactor container, and the pod's
    spec around it (identity, security, scheduling)."""
    labels = {**spec.pod_labels, **naming.labels(group)}
    annotations = {
        **spec.pod_annotations,
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(naming.HTTP_PORT),
        "prometheus.io/path": "/metrics",
        naming.SETTINGS_ANNOTATION: settings_digest(group, spec),
    }
    container, volumes = _compactor_container(group, spec, config)
    return {
        "metadata": {"labels": labels, "annotations": annotations},
        "spec": _pod_spec(spec, config, container, volumes),
    }


def _liveness_probe() -> Probe:
    """How the kubelet sees a compactor alive: its loop turns."""
    return {
        "httpGet": {"path": "/healthz", "port": naming.HTTP_PORT_NAME},
        "initialDelaySeconds": 10,
        "periodSeconds": 10,
        "timeoutSeconds": 5,
        "failureThreshold": 6,
    }


def _readiness_probe() -> Probe:
    """How the kubelet sees a compactor ready: it takes jobs."""
    return {
        "httpGet": {"path": "/readyz", "port": naming.HTTP_PORT_NAME},
        "periodSeconds": 5,
        "timeoutSeconds": 3,
        "failureThreshold": 3,
    }


def _compactor_container(
    group: str, spec: CompactorGroupSpec, config: OperatorConfig
) -> tuple[Container, list[Volume]]:
    """The compactor container, and the volumes it mounts."""
    http = naming.HTTP_PORT_NAME
    container: Container = {
        "name": naming.CONTAINER,
        "image": spec.image or config.compactor_image,
        "imagePullPolicy": spec.image_pull_policy or config.image_pull_policy,
        "command": ["kompaktor"],
        "args": compactor_args(group),
        "env": _env(group, spec, config),
        "ports": [{"name": http, "containerPort": naming.HTTP_PORT, "protocol": "TCP"}],
        # a container that exits with an error leaves its log's tail as its termination message:
        # the CompactorGroup's PodsHealthy condition quotes it (podhealth)
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "livenessProbe": _liveness_probe(),
        "readinessProbe": _readiness_probe(),
        # Ask the compactor to drain before SIGTERM: it takes no new job and finishes (or
        # releases) the one it holds within drainGraceSeconds. Drain is a POST, which an httpGet
        # hook cannot send: the hook runs `kompaktor drain` against the pod's own loopback.
        "lifecycle": {"preStop": {"exec": {"command": ["kompaktor", "drain", "--port", str(naming.HTTP_PORT)]}}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "scratch", "mountPath": SCRATCH_DIR},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    volumes: list[Volume] = [
        {"name": "scratch", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "256Mi"}},
    ]
    if config.redis_ca_configmap:
        container["volumeMounts"].append({"name": "redis-ca", "mountPath": REDIS_CA_DIR, "readOnly": True})
        volumes.append({"name": "redis-ca", "configMap": {"name": config.redis_ca_configmap}})
    env_from = _env_from(spec, config)
    if env_from:
        container["envFrom"] = env_from
    if spec.resources is not None:
        resources: ResourceRequirements = {}
        if spec.resources.requests:
            resources["requests"] = {name: str(q) for name, q in spec.resources.requests.items()}
        if spec.resources.limits:
            resources["limits"] = {name: str(q) for name, q in spec.resources.limits.items()}
        container["resources"] = resources
    return container, volumes


def _pod_spec(spec: CompactorGroupSpec, config: OperatorConfig, container: Container, volumes: list[Volume]) -> PodSpec:
    """The pod's spec around its container: its identity (no API token), its security context,
    its grace period (the drain's plus a margin) and where it may be scheduled."""
    pod_spec: PodSpec = {
        # The compactor needs no Kubernetes API: its own ServiceAccount, and no token in the pod
        # whatever the account says (admission decides which accounts a group may name).
        "serviceAccountName": spec.service_account_name or config.compactor_service_account,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": spec.drain_grace_seconds + EXIT_MARGIN_SECONDS,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 10001,
            "runAsGroup": 10001,
            "fsGroup": 10001,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
    }
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod_spec["tolerations"] = copy.deepcopy(spec.tolerations)
    if spec.affinity:
        pod_spec["affinity"] = copy.deepcopy(spec.affinity)
    if spec.priority_class_name:
        pod_spec["priorityClassName"] = spec.priority_class_name
    return pod_spec


def build_compactor_deployment(group: str, spec: CompactorGroupSpec, config: OperatorConfig) -> Deployment:
    """Desired Deployment for one group. No ``spec.replicas``: the operator's scaler owns it."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": naming.deployment_name(group), "labels": naming.labels(group)},
        "spec": {
            "selector": {"matchLabels": naming.selector_labels(group)},
            "revisionHistoryLimit": 3,
            # A new pod comes up before an old one drains: no capacity lost during a rollout.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0}},
            "template": build_pod_template(group, spec, config),
        },
    }


def build_metrics_service(group: str) -> Service:
    """A ClusterIP Service over the group's pods, for Prometheus to scrape /metrics."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": naming.metrics_service_name(group),
            "labels": {**naming.labels(group), naming.METRICS_LABEL: "true"},
        },
        "spec": {
            "type": "ClusterIP",
            "selector": naming.selector_labels(group),
            "ports": [
                {
                    "name": "http-metrics",
                    "port": naming.HTTP_PORT,
                    "targetPort": naming.HTTP_PORT_NAME,
                    "protocol": "TCP",
                }
            ],
        },
    }


def build_network_policy(group: str, namespace: str | None, config: OperatorConfig) -> NetworkPolicy:
    """Ingress to the group's pods: their HTTP port (drain, health, metrics) from the operator pod
    and the metrics peers (Prometheus) only; nothing else reaches them."""
    operator: NamespacedPeer = {"podSelector": {"matchLabels": dict(config.operator_pod_labels)}}
    if config.operator_namespace and namespace != config.operator_namespace:
        # namespaces carry this label from Kubernetes 1.21 on (label it yourself on older servers)
        operator["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": config.operator_namespace}}
    peers: list[NamespacedPeer | FreeForm] = [operator] if config.operator_pod_labels else []
    peers += copy.deepcopy(list(config.metrics_peers))
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": naming.network_policy_name(group), "labels": naming.labels(group)},
        "spec": {
            "podSelector": {"matchLabels": naming.selector_labels(group)},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": peers, "ports": [{"port": naming.HTTP_PORT, "protocol": "TCP"}]}] if peers else [],
        },
    }


def _scale_target(group: str) -> ScaleTarget:
    # The autoscaler scales the CompactorGroup (its scale subresource), never the Deployment:
    # the operator turns spec.replicas into a drain-first change of the Deployment.
    return {"apiVersion": api.GROUP_VERSION, "kind": api.GROUP_KIND, "name": group}


def build_hpa_behavior(spec: CompactorGroupSpec) -> HPABehavior:
    b = spec.behavior
    return {
        "scaleUp": {
            "stabilizationWindowSeconds": 0,
            "selectPolicy": "Max",
            "policies": [
                {"type": "Percent", "value": b.scale_up_percent, "periodSeconds": SCALE_UP_PERIOD},
                {"type": "Pods", "value": b.scale_up_pods, "periodSeconds": SCALE_UP_PERIOD},
            ],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": b.scale_down_stabilization_seconds,
            "selectPolicy": "Min",
            "policies": [{"type": "Percent", "value": b.scale_down_percent, "periodSeconds": SCALE_DOWN_PERIOD}],
        },
    }


#: HPA API versions with External metrics and ``behavior``, newest first (v2beta2: Kubernetes < 1.23)
HPA_API_VERSIONS = ("autoscaling/v2", "autoscaling/v2beta2")


def build_hpa(group: str, spec: CompactorGroupSpec, api_version: str = HPA_API_VERSIONS[0]) -> HorizontalPodAutoscaler:
    """HPA on the External metric kompaktor_queue_depth{group} (queued + running); ``api_version`` is
    what the server offers (v2 and v2beta2 have the same shape for this object)."""
    if api_version not in HPA_API_VERSIONS:
        raise ValueError(f"unsupported HPA API version {api_version!r}")
    return {
        "apiVersion": api_version,
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": naming.hpa_name(group), "labels": naming.labels(group)},
        "spec": {
            "scaleTargetRef": _scale_target(group),
            "minReplicas": max(1, spec.min_replicas),
            "maxReplicas": spec.max_replicas,
            "metrics": [
                {
                    "type": "External",
                    "external": {
                        "metric": {
                            "name": naming.QUEUE_DEPTH_METRIC,
                            "selector": {"matchLabels": {"group": group}},
                        },
                        "target": {"type": "AverageValue", "averageValue": str(spec.jobs_per_replica)},
                    },
                }
            ],
            "behavior": build_hpa_behavior(spec),
        },
    }


def queue_depth_query(group: str) -> str:
    return f'sum({naming.QUEUE_DEPTH_METRIC}{{group="{group}"}})'


def build_scaled_object(group: str, spec: CompactorGroupSpec, config: OperatorConfig) -> ScaledObject:
    """KEDA ScaledObject on the same metric, through Prometheus; allows minReplicas 0."""
    return {
        "apiVersion": naming.KEDA_API_VERSION,
        "kind": "ScaledObject",
        "metadata": {"name": naming.scaled_object_name(group), "labels": naming.labels(group)},
        "spec": {
            "scaleTargetRef": _scale_target(group),
            "minReplicaCount": spec.min_replicas,
            "maxReplicaCount": spec.max_replicas,
            "pollingInterval": 15,
            "cooldownPeriod": spec.behavior.scale_down_stabilization_seconds,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": build_hpa_behavior(spec)}},
            "triggers": [
                {
                    "type": "prometheus",
                    "metricType": "AverageValue",
                    "metadata": {
                        "serverAddress": config.prometheus_url,
                        "query": queue_depth_query(group),
                        "threshold": str(spec.jobs_per_replica),
                        "activationThreshold": "0",
                    },
                }
            ],
        },
    }


def build_autoscaler(
    group: str, spec: CompactorGroupSpec, config: OperatorConfig, hpa_api_version: str = HPA_API_VERSIONS[0]
) -> AutoscalerObject | None:
    """The autoscaler object the spec asks for, or None for ``autoscaler: none``."""
    if spec.autoscaler == Autoscaler.HPA:
        return build_hpa(group, spec, hpa_api_version)
    if spec.autoscaler == Autoscaler.KEDA:
        return build_scaled_object(group, spec, config)
    return None


#: (apiVersion, kind) of every autoscaler kind the operator may own, to delete the unused one.
AUTOSCALER_KINDS: tuple[tuple[str, str, str], ...] = (
    ("autoscaling/v2", "HorizontalPodAutoscaler", Autoscaler.HPA.value),
    ("autoscaling/v2beta2", "HorizontalPodAutoscaler", Autoscaler.HPA.value),
    (naming.KEDA_API_VERSION, "ScaledObject", Autoscaler.KEDA.value),
)


def build_children(
    group: str,
    spec: CompactorGroupSpec,
    config: OperatorConfig,
    hpa_api_version: str = HPA_API_VERSIONS[0],
    namespace: str | None = None,
) -> list[Child]:
    """Everything a CompactorGroup owns, in apply order (the NetworkPolicy first, before any pod)."""
    children: list[Child] = [build_network_policy(group, namespace, config)] if config.network_policy else []
    children += [build_compactor_deployment(group, spec, config), build_metrics_service(group)]
    autoscaler = build_autoscaler(group, spec, config, hpa_api_version)
    if autoscaler is not None:
        children.append(autoscaler)
    return children
