"""Every name, label and annotation key the operator writes; one function each.

Owns: deterministic names of the children of a CompactorGroup (so a replayed handler finds
what the first run made), label sets and selectors. Names stay within 63 characters because
CompactorGroup names are DNS labels of at most 40. The API group, version, kinds and plurals are
in ``kompaktor.resources.api``. Must not import: kopf, redis, kube.
"""

from __future__ import annotations

from kompaktor.resources import api

PART_OF = "kompaktor"
MANAGED_BY = "kompaktor-operator"
FINALIZER = f"{api.KEY_PREFIX}operator"
CONTAINER = "compactor"
HTTP_PORT = 8080
HTTP_PORT_NAME = "http"

GROUP_LABEL = f"{api.KEY_PREFIX}group"
SERVICE_LABEL = f"{api.KEY_PREFIX}service"
#: Set on a pod the operator asked to drain before a scale-down (value: "true").
DRAINING_ANNOTATION = f"{api.KEY_PREFIX}draining"
#: Pod template annotation: digest of the settings the group's compactors read from Redis at
#: start. A change of any of them changes the template, so the Deployment rolls the pods (drain
#: first), as a change of the pod's arguments did when the settings were arguments.
SETTINGS_ANNOTATION = f"{api.KEY_PREFIX}settings-digest"
#: On a group's metrics Service (what the chart's ServiceMonitor selects).
METRICS_LABEL = f"{api.KEY_PREFIX}metrics"
#: The ReplicaSet controller removes pods with the lowest cost first (Kubernetes >= 1.22).
POD_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
#: The cost given to drained victims: below every unannotated pod (0).
VICTIM_DELETION_COST = "-1000"
#: The queue-depth metric the coordinator exports and the autoscalers read.
QUEUE_DEPTH_METRIC = "kompaktor_queue_depth"
#: KEDA's API (``autoscaler: keda``): the ScaledObject's group and version, looked up, never assumed
KEDA_GROUP = "keda.sh"
KEDA_VERSION = "v1alpha1"
KEDA_API_VERSION = f"{KEDA_GROUP}/{KEDA_VERSION}"


def deployment_name(group: str) -> str:
    return f"kompaktor-{group}"


def metrics_service_name(group: str) -> str:
    return f"kompaktor-{group}-metrics"


def hpa_name(group: str) -> str:
    return f"kompaktor-{group}"


def network_policy_name(group: str) -> str:
    return f"kompaktor-{group}"


def scaled_object_name(group: str) -> str:
    return f"kompaktor-{group}"


def selector_labels(group: str) -> dict[str, str]:
    """The labels that select a group's compactor pods (immutable in a Deployment: keep stable)."""
    return {
        "app.kubernetes.io/name": PART_OF,
        "app.kubernetes.io/component": "compactor",
        GROUP_LABEL: group,
    }


def labels(group: str) -> dict[str, str]:
    """Labels of every object made for a group."""
    return {
        **selector_labels(group),
        "app.kubernetes.io/instance": group,
        "app.kubernetes.io/part-of": PART_OF,
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


def selector(group: str) -> str:
    """The label selector string of a group's pods (the scale subresource's status.selector)."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(group).items()))
