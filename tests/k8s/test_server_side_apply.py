"""The operator's writes to its children, against a real kube-apiserver 1.20.

The children are reconciled with server-side apply: a field the rendering no longer holds (an
affinity, a toleration, an env var, a pod label) disappears from the object, while the replicas
the scaler set stay. An object an older operator created with create + merge-patch converges too.
Before this, `kube.apply` merge-patched: nothing dropped from a CompactorGroup ever left its
Deployment (the first test fails that way).
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterator
from typing import Any

import kopf
import kubernetes
import pytest

from kompaktor_operator import kube
from tests.k8s.controlplane import ControlPlane

NS = "ssa"


@pytest.fixture(scope="module")
def apps(control_plane: ControlPlane) -> Iterator[Any]:
    core = kubernetes.client.CoreV1Api(control_plane.api())
    core.create_namespace({"metadata": {"name": NS}})
    yield kubernetes.client.AppsV1Api(control_plane.api())


def _run(cp: ControlPlane, coro_fn: Any) -> Any:
    """Run ``coro_fn(client)`` with an operator's Kubernetes client on the control plane."""

    async def main() -> Any:
        client = kube.Client(kopf.ConnectionInfo(server=cp.server, ca_path=str(cp.ca), token=cp.token))
        try:
            return await coro_fn(client)
        finally:
            await client.close()

    return asyncio.run(main())


def _deployment(name: str, *, extra: bool) -> dict[str, Any]:
    labels = {"app": name}
    pod_labels = {**labels, "team": "storage"} if extra else labels
    container: dict[str, Any] = {"name": "c", "image": "busybox", "env": [{"name": "A", "value": "1"}]}
    if extra:
        container["env"].append({"name": "EXTRA", "value": "x"})
    spec: dict[str, Any] = {"containers": [container]}
    if extra:
        spec["tolerations"] = [{"key": "dedicated", "operator": "Equal", "value": "compaction", "effect": "NoSchedule"}]
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}]
                }
            }
        }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": pod_labels}, "spec": spec}},
    }


def _removed_fields_gone(dep: Any) -> None:
    pod = dep.spec.template
    # 1.20's apply leaves the emptied parent behind (`affinity: {nodeAffinity: {}}`, no terms:
    # no constraint); newer servers remove it too
    aff = pod.spec.affinity
    assert aff is None or (
        aff.pod_affinity is None
        and aff.pod_anti_affinity is None
        and (
            aff.node_affinity is None
            or (
                aff.node_affinity.required_during_scheduling_ignored_during_execution is None
                and not aff.node_affinity.preferred_during_scheduling_ignored_during_execution
            )
        )
    )
    assert not pod.spec.tolerations
    assert [e.name for e in pod.spec.containers[0].env] == ["A"]
    assert pod.metadata.labels == {"app": dep.metadata.name}


def test_a_field_dropped_from_the_rendering_leaves_the_child(control_plane: ControlPlane, apps: Any) -> None:
    name = "dropped"
    _run(control_plane, lambda c: c.apply(_deployment(name, extra=True), NS))
    dep = apps.read_namespaced_deployment(name, NS)
    assert dep.spec.template.spec.affinity is not None and dep.spec.template.spec.tolerations
    assert dep.spec.replicas == 1  # defaulted on create: the rendering has no replicas
    # the scaler sets the replicas; then the group loses its extras and is re-rendered
    _run(control_plane, lambda c: c.set_replicas(NS, name, 3))
    _run(control_plane, lambda c: c.apply(_deployment(name, extra=False), NS))
    dep = apps.read_namespaced_deployment(name, NS)
    _removed_fields_gone(dep)
    assert dep.spec.replicas == 3  # the scaler's value survives every apply
    _run(control_plane, lambda c: c.apply(_deployment(name, extra=False), NS))  # idempotent
    assert apps.read_namespaced_deployment(name, NS).spec.replicas == 3
    managers = {(m.manager, m.operation) for m in apps.read_namespaced_deployment(name, NS).metadata.managed_fields}
    assert (kube.FIELD_MANAGER, "Apply") in managers and (kube.SCALER_MANAGER, "Update") in managers


def test_a_child_written_by_an_older_operator_converges(control_plane: ControlPlane, apps: Any) -> None:
    """An older operator created children with POST and changed them with merge patches (manager
    OpenAPI-Generator, operation Update), its scaler too. The first apply adopts those fields,
    minus the replicas, and then removes what the rendering dropped."""
    name = "legacy"

    async def legacy(c: kube.Client) -> None:
        body = copy.deepcopy(_deployment(name, extra=True))
        body["metadata"]["namespace"] = NS
        await c.request("POST", f"/apis/apps/v1/namespaces/{NS}/deployments", json=body)
        await c.request(
            "PATCH",
            f"/apis/apps/v1/namespaces/{NS}/deployments/{name}",
            json=body,
            content_type="application/merge-patch+json",
        )
        await c.request(
            "PATCH",
            f"/apis/apps/v1/namespaces/{NS}/deployments/{name}",
            json={"spec": {"replicas": 4}},
            content_type="application/merge-patch+json",
        )

    _run(control_plane, legacy)
    before = apps.read_namespaced_deployment(name, NS)
    assert kube.LEGACY_MANAGER in {m.manager for m in before.metadata.managed_fields}
    assert kube.FIELD_MANAGER not in {m.manager for m in before.metadata.managed_fields}
    _run(control_plane, lambda c: c.apply(_deployment(name, extra=False), NS))
    dep = apps.read_namespaced_deployment(name, NS)
    _removed_fields_gone(dep)
    assert dep.spec.replicas == 4


def test_replicas_rendered_at_creation_are_handed_to_the_scaler(control_plane: ControlPlane, apps: Any) -> None:
    """The operator renders replicas once, when it creates a Deployment (minReplicas, so that no
    extra pod starts); had its apply kept owning them, the next apply — which renders none — would
    have reset them to 1."""
    name = "created"
    first = _deployment(name, extra=False)
    first["spec"]["replicas"] = 2

    async def create(c: kube.Client) -> None:
        await c.apply(first, NS)
        await c.claim_replicas(NS, name, 2)
        await c.apply(_deployment(name, extra=False), NS)

    _run(control_plane, create)
    assert apps.read_namespaced_deployment(name, NS).spec.replicas == 2
