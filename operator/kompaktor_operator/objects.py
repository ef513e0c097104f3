"""The shapes of the Kubernetes objects the operator writes and reads, as types.

Owns: a TypedDict per object the operator renders (:data:`Child`: its NetworkPolicy, Deployment,
Service, HorizontalPodAutoscaler, KEDA ScaledObject) and per part of an object it reads back
(pods for their health, a Deployment's replicas, an HPA's conditions, the managed fields of an
object an older operator wrote). They are plain dicts at run time, so what server-side apply sends
and what ``kopf.adopt`` amends is the JSON the builders wrote, key for key and in the same order;
the types only let mypy check every key and value the operator writes or reads. Read types are
``total=False``: the API server leaves out what is unset. Free-form parts a user gives
(tolerations, affinity, metrics peers) stay :data:`~kompaktor.resources.models.FreeForm`.
Must not import: kopf, redis, kube.
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

from kompaktor.resources.models import FreeForm

Labels = dict[str, str]

# --- what the operator renders -------------------------------------------------------------------


class ObjectMeta(TypedDict):
    name: str
    labels: Labels
    #: set by kube.apply and kopf.adopt on the way out, never by the builders
    namespace: NotRequired[str]


class LabelSelector(TypedDict):
    matchLabels: Labels


class FieldRef(TypedDict):
    fieldPath: str


class SecretKeyRef(TypedDict):
    name: str
    key: str
    optional: NotRequired[bool]


class EnvVarSource(TypedDict, total=False):
    fieldRef: FieldRef
    secretKeyRef: SecretKeyRef


class EnvVar(TypedDict):
    name: str
    value: NotRequired[str]
    valueFrom: NotRequired[EnvVarSource]


class SecretRef(TypedDict):
    name: str


class EnvFromSource(TypedDict):
    secretRef: SecretRef


class ContainerPort(TypedDict):
    name: str
    containerPort: int
    protocol: str


class HTTPGetAction(TypedDict):
    path: str
    port: str


class Probe(TypedDict):
    httpGet: HTTPGetAction
    initialDelaySeconds: NotRequired[int]
    periodSeconds: int
    timeoutSeconds: int
    failureThreshold: int


class ExecAction(TypedDict):
    command: list[str]


class LifecycleHandler(TypedDict):
    exec: ExecAction


class Lifecycle(TypedDict):
    preStop: LifecycleHandler


class Capabilities(TypedDict):
    drop: list[str]


class SecurityContext(TypedDict):
    allowPrivilegeEscalation: bool
    readOnlyRootFilesystem: bool
    runAsNonRoot: bool
    capabilities: Capabilities


class VolumeMount(TypedDict):
    name: str
    mountPath: str
    readOnly: NotRequired[bool]


class ResourceRequirements(TypedDict, total=False):
    requests: dict[str, str]
    limits: dict[str, str]


class Container(TypedDict):
    name: str
    image: str
    imagePullPolicy: str
    command: list[str]
    args: list[str]
    env: list[EnvVar]
    ports: list[ContainerPort]
    terminationMessagePolicy: str
    livenessProbe: Probe
    readinessProbe: Probe
    lifecycle: Lifecycle
    securityContext: SecurityContext
    volumeMounts: list[VolumeMount]
    envFrom: NotRequired[list[EnvFromSource]]
    resources: NotRequired[ResourceRequirements]


class EmptyDirVolumeSource(TypedDict, total=False):
    medium: str
    sizeLimit: str


class ConfigMapVolumeSource(TypedDict):
    name: str


class Volume(TypedDict):
    name: str
    emptyDir: NotRequired[EmptyDirVolumeSource]
    configMap: NotRequired[ConfigMapVolumeSource]


class SeccompProfile(TypedDict):
    type: str


class PodSecurityContext(TypedDict):
    runAsNonRoot: bool
    runAsUser: int
    runAsGroup: int
    fsGroup: int
    seccompProfile: SeccompProfile


class PodSpec(TypedDict):
    serviceAccountName: str
    automountServiceAccountToken: bool
    terminationGracePeriodSeconds: int
    securityContext: PodSecurityContext
    containers: list[Container]
    volumes: list[Volume]
    nodeSelector: NotRequired[dict[str, str]]
    tolerations: NotRequired[list[FreeForm]]
    affinity: NotRequired[FreeForm]
    priorityClassName: NotRequired[str]


class TemplateMeta(TypedDict):
    labels: Labels
    annotations: dict[str, str]


class PodTemplate(TypedDict):
    metadata: TemplateMeta
    spec: PodSpec


class RollingUpdate(TypedDict):
    maxSurge: str
    maxUnavailable: int


class DeploymentStrategy(TypedDict):
    type: str
    rollingUpdate: RollingUpdate


class DeploymentSpec(TypedDict):
    selector: LabelSelector
    revisionHistoryLimit: int
    strategy: DeploymentStrategy
    template: PodTemplate
    #: only when the operator creates the Deployment; the scaler owns it after
    replicas: NotRequired[int]


class Deployment(TypedDict):
    apiVersion: str
    kind: Literal["Deployment"]
    metadata: ObjectMeta
    spec: DeploymentSpec


class ServicePort(TypedDict):
    name: str
    port: int
    targetPort: str
    protocol: str


class ServiceSpec(TypedDict):
    type: str
    selector: Labels
    ports: list[ServicePort]


class Service(TypedDict):
    apiVersion: str
    kind: Literal["Service"]
    metadata: ObjectMeta
    spec: ServiceSpec


class NamespacedPeer(TypedDict):
    """A NetworkPolicy peer: pods of a selector, in namespaces of a selector (or the policy's own)."""

    podSelector: LabelSelector
    namespaceSelector: NotRequired[LabelSelector]


class NetworkPolicyPort(TypedDict):
    port: int
    protocol: str


#: "from" is a Python keyword: the functional form
NetworkPolicyIngressRule = TypedDict(
    "NetworkPolicyIngressRule", {"from": list[NamespacedPeer | FreeForm], "ports": list[NetworkPolicyPort]}
)


class NetworkPolicySpec(TypedDict):
    podSelector: LabelSelector
    policyTypes: list[str]
    ingress: list[NetworkPolicyIngressRule]


class NetworkPolicy(TypedDict):
    apiVersion: str
    kind: Literal["NetworkPolicy"]
    metadata: ObjectMeta
    spec: NetworkPolicySpec


class ScaleTarget(TypedDict):
    apiVersion: str
    kind: str
    name: str


class ScalingPolicy(TypedDict):
    type: str
    value: int
    periodSeconds: int


class ScalingRules(TypedDict):
    stabilizationWindowSeconds: int
    selectPolicy: str
    policies: list[ScalingPolicy]


class HPABehavior(TypedDict):
    scaleUp: ScalingRules
    scaleDown: ScalingRules


class MetricIdentifier(TypedDict):
    name: str
    selector: LabelSelector


class MetricTarget(TypedDict):
    type: str
    averageValue: str


class ExternalMetricSource(TypedDict):
    metric: MetricIdentifier
    target: MetricTarget


class MetricSpec(TypedDict):
    type: str
    external: ExternalMetricSource


class HPASpec(TypedDict):
    scaleTargetRef: ScaleTarget
    minReplicas: int
    maxReplicas: int
    metrics: list[MetricSpec]
    behavior: HPABehavior


class HorizontalPodAutoscaler(TypedDict):
    apiVersion: str
    kind: Literal["HorizontalPodAutoscaler"]
    metadata: ObjectMeta
    spec: HPASpec


class HPAConfig(TypedDict):
    behavior: HPABehavior


class ScaledObjectAdvanced(TypedDict):
    horizontalPodAutoscalerConfig: HPAConfig


class PrometheusTriggerMetadata(TypedDict):
    serverAddress: str
    query: str
    threshold: str
    activationThreshold: str


class ScaleTrigger(TypedDict):
    type: str
    metricType: str
    metadata: PrometheusTriggerMetadata


class ScaledObjectSpec(TypedDict):
    scaleTargetRef: ScaleTarget
    minReplicaCount: int
    maxReplicaCount: int
    pollingInterval: int
    cooldownPeriod: int
    advanced: ScaledObjectAdvanced
    triggers: list[ScaleTrigger]


class ScaledObject(TypedDict):
    apiVersion: str
    kind: Literal["ScaledObject"]
    metadata: ObjectMeta
    spec: ScaledObjectSpec


#: an object a CompactorGroup owns (what the builders render and kube.apply sends); ``kind`` tells them apart
Child = NetworkPolicy | Deployment | Service | HorizontalPodAutoscaler | ScaledObject
AutoscalerObject = HorizontalPodAutoscaler | ScaledObject

# --- what the operator reads back ----------------------------------------------------------------

#: a managedFields entry's ``fieldsV1``: a trie of ``f:``/``k:`` keys whose shape no one fixes
FieldsV1 = dict[str, object]


class ManagedFieldsEntry(TypedDict, total=False):
    manager: str
    operation: str
    subresource: str
    apiVersion: str
    time: str
    fieldsType: str
    fieldsV1: FieldsV1


class ReadMeta(TypedDict, total=False):
    name: str
    namespace: str
    resourceVersion: str
    generation: int
    labels: Labels
    annotations: dict[str, str]
    deletionTimestamp: str
    managedFields: list[ManagedFieldsEntry]


class KubeObject(TypedDict, total=False):
    """Any object as the API server returns it: only the head the operator reads of every kind."""

    apiVersion: str
    kind: str
    metadata: ReadMeta


class StatusCondition(TypedDict):
    """A condition the operator writes into a resource's ``status.conditions`` (metav1.Condition)."""

    type: str
    status: str
    reason: str
    lastTransitionTime: str
    #: left out when empty (a 1.20 apiserver refused "" stored as null)
    message: NotRequired[str]
    observedGeneration: NotRequired[int]


class Condition(TypedDict, total=False):
    type: str
    status: str
    reason: str
    message: str


class ContainerStateWaiting(TypedDict, total=False):
    reason: str
    message: str


class ContainerStateTerminated(TypedDict, total=False):
    reason: str
    message: str
    exitCode: int


class ContainerState(TypedDict, total=False):
    waiting: ContainerStateWaiting
    terminated: ContainerStateTerminated
    running: dict[str, str]


class ContainerStatus(TypedDict, total=False):
    name: str
    image: str
    restartCount: int
    state: ContainerState
    lastState: ContainerState


class PodStatus(TypedDict, total=False):
    conditions: list[Condition]
    containerStatuses: list[ContainerStatus]


class PodContainer(TypedDict, total=False):
    name: str
    image: str
    resources: ResourceRequirements


class PodSpecRead(TypedDict, total=False):
    containers: list[PodContainer]


class Pod(TypedDict, total=False):
    metadata: ReadMeta
    spec: PodSpecRead
    status: PodStatus


class DeploymentSpecRead(TypedDict, total=False):
    replicas: int


class DeploymentStatus(TypedDict, total=False):
    readyReplicas: int


class DeploymentState(TypedDict, total=False):
    """A Deployment as read: the replicas the scaler set and how many are ready."""

    metadata: ReadMeta
    spec: DeploymentSpecRead
    status: DeploymentStatus


class HPAStatus(TypedDict, total=False):
    conditions: list[Condition]


class HPAState(TypedDict, total=False):
    """An HPA as read: its conditions (ScalingActive says whether it can read its metric)."""

    metadata: ReadMeta
    status: HPAStatus
