"""A Helm release of the chart on the real control plane (tests/k8s), shared by the modules
that install one (test_user_path.py, test_watched_namespaces.py), so that each runs alone, in
either order, or after the other:

- the chart's CRDs are kept on uninstall (``helm.sh/resource-policy: keep``) and owned by the
  release that installed them, so a release installs them only when they are not there yet
  (:func:`install_values`);
- a release is uninstalled when its module ends (:func:`helm_release`), so the next module's
  release does not meet its cluster-scoped objects (the external-metrics APIService);
- the operator runs as a local process in its own session, stopped by its PID
  (:func:`start_local`, :func:`kompaktor.local.procs.stop_popen`)."""

from __future__ import annotations

import base64
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import helm_python as helm

from kompaktor.resources import api
from tests.k8s.controlplane import ControlPlane

ROOT = Path(__file__).resolve().parents[2]

#: figures a test of the tier measured (the upgrade test's seconds without a commit, jobs redone,
#: ...), printed in the terminal summary (tests/k8s/conftest.py) whether the test passed or not:
#: a passing test's own output is captured, and make test's log is where they are read
FIGURES: list[str] = []
CHART = ROOT / "helm" / "kompaktor"


class Namespaced:
    """kubectl in one namespace (``namespace``) of the control plane ``cp``: the base of the
    modules' release fixtures."""

    cp: ControlPlane
    namespace: ClassVar[str]

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        return self.cp.kubectl("-n", self.namespace, *args, check=check, input=input)

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        """The object as JSON, None when it does not exist."""
        out = self.kubectl("get", kind, name, "-o", "json", check=False)
        return json.loads(out.stdout) if out.returncode == 0 else None

    def condition(self, kind: str, name: str, ctype: str) -> dict[str, Any] | None:
        obj = self.get(kind, name) or {}
        return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == ctype), None)


def crds_installed(cp: ControlPlane) -> bool:
    return cp.kubectl("get", "crd", f"compactorgroups.{api.GROUP}", check=False).returncode == 0


def install_values(cp: ControlPlane, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with ``crds.install`` set to whether the CRDs are missing (another release,
    even an uninstalled one, may own them)."""
    return {**values, "crds": {**values.get("crds", {}), "install": not crds_installed(cp)}}


@contextmanager
def helm_release(
    cp: ControlPlane, name: str, namespace: str, values: dict[str, Any]
) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """``helm install`` the chart with :func:`install_values`; yield the release and those values
    (an upgrade passes them again); uninstall on exit (a test may have uninstalled it already)."""
    installed = install_values(cp, values)
    with helm.Config(kubeconfig_path=str(cp.kubeconfig), namespace=namespace) as cfg:
        rel = cfg.install(str(CHART), name, installed, namespace=namespace, timeout=120)
        try:
            yield rel, installed
        finally:
            cfg.uninstall(name, timeout=60, ignore_not_found=True)


def container_env(cp: ControlPlane, core: Any, namespace: str, deployment: str, container: str) -> dict[str, str]:
    """The environment the chart gives one container of a Deployment, Secret references resolved."""
    dep = json.loads(cp.kubectl("-n", namespace, "get", "deployment", deployment, "-o", "json").stdout)
    c = next(c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == container)
    env: dict[str, str] = {}
    for e in c.get("env") or []:
        if "value" in e:
            env[e["name"]] = e["value"]
        elif "secretKeyRef" in (e.get("valueFrom") or {}):
            ref = e["valueFrom"]["secretKeyRef"]
            env[e["name"]] = base64.b64decode(
                core.read_namespaced_secret(ref["name"], namespace).data[ref["key"]]
            ).decode()
    return env


def start_local(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """A chart component (``kompaktor operator``, ``kompaktor coordinator``) as a local process in
    its own session, output to ``log``."""
    with open(log, "wb") as out:
        return subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


class JobWatch:
    """Samples a group's compactors and queue every 0.1 s in a thread: how long each job (ECID)
    ran, and the queue depths seen while ``window`` is open (issue 33's scale-down under load)."""

    def __init__(self, store: Any, group: str) -> None:
        self.store, self.group = store, group
        self.jobs: dict[str, list[float]] = {}  # ecid -> [first seen, last seen]
        self.window = False
        self.queued_in_window: list[int] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        import redis

        from kompaktor.model.errors import StoreUnavailable

        while not self.stop.wait(0.1):
            now = time.monotonic()
            try:
                for c in self.store.fleet.compactors(self.group):
                    if c.ecid:
                        self.jobs.setdefault(c.ecid, [now, now])[1] = now
                if self.window:
                    self.queued_in_window.append(self.store.queues.stats(self.group).queued)
            except (StoreUnavailable, ConnectionError, redis.RedisError):
                continue  # a sample missed (Redis through a Service); the next one is 0.1 s away

    def longest_job_s(self) -> float:
        return max(last - first for first, last in self.jobs.values()) + 0.2  # the sampling period

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
