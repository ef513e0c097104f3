"""The control plane and the node agent themselves: what the other k8s tests rely on."""

from __future__ import annotations

import json
import os
import sys
import textwrap

import kubernetes
import pytest

from tests.k8s.controlplane import ControlPlane, free_port, wait_until
from tests.k8s.nodeagent import NodeAgent


@pytest.fixture
def namespace(control_plane: ControlPlane, request: pytest.FixtureRequest):
    core = kubernetes.client.CoreV1Api(control_plane.api())
    name = f"t-{abs(hash(request.node.name)) % 10**8}"
    core.create_namespace({"metadata": {"name": name}})
    wait_until(lambda: core.read_namespaced_service_account("default", name), "the default ServiceAccount")
    yield name
    core.delete_namespace(name)


def test_a_real_1_20_apiserver_is_ready_on_loopback(control_plane: ControlPlane) -> None:
    assert control_plane.version.startswith("v1.20.2")
    assert control_plane.server.startswith("https://127.0.0.1:")
    assert control_plane.started_in_s < 60
    out = control_plane.kubectl("get", "--raw", "/readyz")
    assert out.stdout.strip() == "ok"


def test_rbac_is_enforced_for_a_service_account(control_plane: ControlPlane, namespace: str) -> None:
    kubeconfig = control_plane.service_account_kubeconfig(namespace, "default")
    out = control_plane.kubectl("get", "pods", "-n", namespace, kubeconfig=kubeconfig, check=False)
    assert out.returncode != 0 and "forbidden" in out.stderr.lower()


def test_deployment_reaches_available_through_the_node_agent(control_plane: ControlPlane, namespace: str) -> None:
    api = control_plane.api()
    agent = NodeAgent(api).start()
    try:
        apps = kubernetes.client.AppsV1Api(api)
        labels = {"app": "web"}
        apps.create_namespaced_deployment(
            namespace,
            {
                "metadata": {"name": "web"},
                "spec": {
                    "replicas": 3,
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {"containers": [{"name": "c", "image": "none"}]},
                    },
                },
            },
        )
        wait_until(
            lambda: (apps.read_namespaced_deployment("web", namespace).status.available_replicas or 0) == 3,
            "3/3 available",
            timeout=60,
        )
    finally:
        agent.stop()


def test_run_pod_lifecycle_is_a_kubelets(control_plane: ControlPlane, namespace: str, tmp_path) -> None:
    """A run pod starts a real process, turns Ready when its probe answers; deleting it runs the
    preStop hook, then SIGTERM, and the deletion completes once the process is gone."""
    port = free_port()
    marker = tmp_path / "prestop"
    server = textwrap.dedent(f"""
        import http.server, os, signal, sys
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
        http.server.ThreadingHTTPServer((os.environ["KOMPAKTOR_HTTP_HOST"], {port}),
                                        http.server.SimpleHTTPRequestHandler).serve_forever()
    """)
    api = control_plane.api()
    agent = NodeAgent(api, mode=lambda pod: "run").start()
    core = kubernetes.client.CoreV1Api(api)
    try:
        core.create_namespaced_pod(
            namespace,
            {
                "metadata": {"name": "p"},
                "spec": {
                    "terminationGracePeriodSeconds": 10,
                    "containers": [
                        {
                            "name": "c",
                            "image": "none",
                            "command": [sys.executable, "-c", server],
                            "readinessProbe": {"httpGet": {"path": "/", "port": port}, "periodSeconds": 1},
                            "lifecycle": {"preStop": {"exec": {"command": ["touch", str(marker)]}}},
                        }
                    ],
                },
            },
        )
        wait_until(
            lambda: any(
                c.type == "Ready" and c.status == "True"
                for c in core.read_namespaced_pod("p", namespace).status.conditions or []
            ),
            "the pod to turn Ready",
            timeout=30,
        )
        rec = next(r for r in agent.records if r.pod == "p")
        core.delete_namespaced_pod("p", namespace)

        def gone() -> bool:
            try:
                core.read_namespaced_pod("p", namespace)
                return False
            except kubernetes.client.ApiException as exc:
                return exc.status == 404

        wait_until(gone, "the deletion to complete", timeout=30)
        assert marker.exists() and rec.prestop_ran
        assert rec.exit_code == 0 and not rec.sigkilled  # it stopped on SIGTERM, within the grace period
        with pytest.raises(ProcessLookupError):
            os.kill(rec.pid, 0)
    finally:
        agent.stop()


def test_hpa_controller_processes_an_hpa(control_plane: ControlPlane, namespace: str) -> None:
    api = control_plane.api()
    agent = NodeAgent(api).start()
    try:
        apps = kubernetes.client.AppsV1Api(api)
        labels = {"app": "h"}
        apps.create_namespaced_deployment(
            namespace,
            {
                "metadata": {"name": "h"},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {"containers": [{"name": "c", "image": "none"}]},
                    },
                },
            },
        )
        body = {
            "apiVersion": "autoscaling/v2beta2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "h"},
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "h"},
                "minReplicas": 2,
                "maxReplicas": 4,
                "metrics": [
                    {
                        "type": "External",
                        "external": {
                            "metric": {"name": "kompaktor_queue_depth", "selector": {"matchLabels": {"group": "h"}}},
                            "target": {"type": "AverageValue", "averageValue": "2"},
                        },
                    }
                ],
            },
        }
        control_plane.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(body))

        def conditions() -> dict[str, str]:
            out = control_plane.kubectl(
                "get", "--raw", f"/apis/autoscaling/v2beta2/namespaces/{namespace}/horizontalpodautoscalers/h"
            )
            return {c["type"]: c["status"] for c in json.loads(out.stdout).get("status", {}).get("conditions", [])}

        got = wait_until(
            lambda: (c := conditions()) and {"AbleToScale", "ScalingActive"} <= c.keys() and c,
            "HPA conditions",
            timeout=60,
        )
        assert got["AbleToScale"] == "True"
        assert got["ScalingActive"] == "False"  # no external metrics API yet: the HPA says so
        # the controller applies the bounds: the Deployment goes from 1 to minReplicas 2
        wait_until(
            lambda: apps.read_namespaced_deployment("h", namespace).spec.replicas == 2,
            "the HPA to apply minReplicas",
            timeout=60,
        )
    finally:
        agent.stop()
