"""The chart as shipped on the real node (tests/k8s/node.py): what the modules that `helm install`
it there share — the release's handle (:class:`Shipped`: kubectl in its namespace, the host's
`kompaktor` CLI through the Redis Service), the README's values, the Redis volume an admin makes,
waiting for the pods and saying why they are not Ready (test_real_node.py, test_upgrade.py)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.k8s.controlplane import ControlPlane, wait_until
from tests.k8s.node import RealNode

NS = "kompaktor"
RELEASE = "kompaktor"
BIN = Path(sys.executable).parent
BUCKET = "kompaktor-data"


@dataclass
class Shipped:
    cp: ControlPlane
    node: RealNode
    env: dict[str, str]  # the `kompaktor` CLI's environment on the host: Redis through its Service, S3
    s3: Any
    replicas_seen: list[int] = field(default_factory=list)
    ns: str = NS  # the release's namespace (its name is RELEASE)

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        return self.cp.kubectl("-n", self.ns, *args, check=check, input=input)

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        out = self.kubectl("get", kind, name, "-o", "json", check=False)
        return json.loads(out.stdout) if out.returncode == 0 else None

    def pods(self, selector: str) -> list[dict[str, Any]]:
        return json.loads(self.kubectl("get", "pods", "-l", selector, "-o", "json").stdout)["items"]

    def condition(self, kind: str, name: str, ctype: str) -> dict[str, Any] | None:
        obj = self.get(kind, name) or {}
        return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == ctype), None)

    def kompaktor(self, *args: str, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess:
        out = subprocess.run(
            [str(BIN / "kompaktor"), *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check and out.returncode != 0:
            raise AssertionError(f"kompaktor {' '.join(args)} ({out.returncode}): {out.stderr}")
        return out


def ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))


def diagnose(s: Shipped) -> str:
    out = s.cp.kubectl("get", "pods", "-A", "-o", "wide", check=False).stdout
    events = s.cp.kubectl("get", "events", "-A", "--sort-by=.lastTimestamp", check=False).stdout[-4000:]
    logs = []
    for pod in s.pods(f"app.kubernetes.io/instance={RELEASE}"):
        component = pod["metadata"]["labels"].get("app.kubernetes.io/component")
        if ready(pod) and component != "operator":  # the operator pod's (operator, coordinator) always
            continue
        name = pod["metadata"]["name"]
        for c in pod["spec"]["containers"]:
            for prev in ("--previous", None):
                got = s.cp.kubectl(
                    "logs", "-n", s.ns, name, "-c", c["name"], "--tail", "30", *([prev] if prev else []), check=False
                )
                logs.append(f"--- logs {name}/{c['name']} {prev or ''} ---\n{got.stdout[-2500:]}{got.stderr[-300:]}")
    status = subprocess.run([str(BIN / "kompaktor"), "status"], env=s.env, capture_output=True, text=True, timeout=60)
    hpa = s.kubectl("get", "hpa", "-o", "wide", check=False).stdout
    logs.append(f"--- kompaktor status ---\n{status.stdout[-3000:]}{status.stderr[-500:]}\n--- hpa ---\n{hpa}")
    dns = s.node.dns
    dns_state = "running" if dns and dns.proc and dns.proc.popen.poll() is None else "NOT RUNNING"
    logs.append(f"--- cluster DNS (dnsmasq): {dns_state} ---")
    return f"{out}\n--- events ---\n{events}\n" + "\n".join(logs) + f"\n--- kubelet ---\n{s.node.log('kubelet', 3000)}"


def redis_volume(core: Any, data: Path, name: str = "kompaktor-redis-data", ns: str | None = None) -> None:
    """The bundled Redis' volume: this node has no provisioner, so a local volume an admin made
    (``ns``: kept for that namespace's Redis claim, as a volume left by another release would be
    taken otherwise)."""
    spec: dict[str, Any] = {
        "capacity": {"storage": "8Gi"},
        "accessModes": ["ReadWriteOnce"],
        "persistentVolumeReclaimPolicy": "Retain",
        "hostPath": {"path": str(data), "type": "Directory"},
    }
    if ns is not None:
        spec["claimRef"] = {"namespace": ns, "name": f"data-{RELEASE}-redis-0"}
    core.create_persistent_volume({"metadata": {"name": name}, "spec": spec})


def readme_values() -> dict[str, Any]:
    """The README's values, and what these tests need besides."""
    return {
        "storage": {"uri": f"s3://{BUCKET}/tables", "existingSecret": "s3-credentials"},
        # a Spark cluster the admin allowed, which is down (the crash-loop case below)
        # ... and examples/'s large group's toleration (issue 34 §3)
        "compactor": {
            "allowedSparkMasters": ["spark://nowhere.invalid:7077"],
            "allowedTolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "compaction", "effect": "NoSchedule"}
            ],
        },
    }


def wait_ready(s: Shipped) -> None:
    try:
        wait_until(
            lambda: (p := s.pods("app.kubernetes.io/component=operator")) and all(map(ready, p)),
            "the operator pod (operator + coordinator) Ready",
            timeout=240,
            every=1,
        )
        wait_until(
            lambda: (p := s.pods("app.kubernetes.io/component=redis")) and all(map(ready, p)),
            "the bundled Redis pod Ready",
            timeout=120,
            every=1,
        )
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{diagnose(s)}") from None


def admin_url(core: Any, ns: str = NS) -> str:
    """The host reaches Redis through its Service (kube-proxy), as a client in the cluster would,
    with the CLI of the people running it: the admin user (docs/kubernetes.md)."""
    svc = core.read_namespaced_service(f"{RELEASE}-redis", ns)
    password = base64.b64decode(core.read_namespaced_secret(f"{RELEASE}-redis-admin", ns).data["password"]).decode()
    return f"redis://admin:{password}@{svc.spec.cluster_ip}:6379/0"
