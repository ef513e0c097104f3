"""A node agent standing in for the kubelet on the test control plane.

It registers Ready Nodes (110 pods each) and keeps their heartbeat fresh, binds Pending pods (there
is no scheduler), and runs pods in one of two ways chosen by the test:

- ``run``: the pod's first container command runs as a real local process with the pod's
  environment. Each such pod gets its own loopback address (127.1.x.y) as its pod IP, passed to
  the process as ``KOMPAKTOR_HTTP_HOST``; the pod turns Ready only when its readinessProbe answers
  there. On deletion it does what a kubelet does: the preStop hook, SIGTERM, up to the grace
  period, SIGKILL, then it finishes the deletion. A process that exits is restarted (restartPolicy
  Always) and counted.
- ``fake``: the pod is marked Running and Ready without a process (scale tests).

Every process it starts is stopped by its PID in :meth:`NodeAgent.stop`.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("nodeagent")
PODS_PER_NODE = 110


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class RunRecord:
    """One process the agent started for a pod."""

    pod: str
    pid: int
    ip: str
    started: float
    argv: list[str]
    stopped: float | None = None
    exit_code: int | None = None
    prestop_ran: bool = False
    sigkilled: bool = False


@dataclass
class _PodProc:
    uid: str
    namespace: str
    name: str
    ip: str
    spec: Any
    popen: subprocess.Popen | None = None
    record: RunRecord | None = None
    ready: bool = False
    terminating: bool = False
    restarts: int = 0


@dataclass
class NodeAgent:
    api: Any  # kubernetes.client.ApiClient (admin)
    mode: Callable[[Any], str] = lambda pod: "fake"  # pod -> "run" | "fake"
    nodes: int = 1
    env: dict[str, str] = field(default_factory=dict)  # added to every run pod's environment
    log_dir: Path | None = None
    records: list[RunRecord] = field(default_factory=list)

    def __post_init__(self) -> None:
        import kubernetes

        self._k = kubernetes
        self.core = kubernetes.client.CoreV1Api(self.api)
        self.coord = kubernetes.client.CoordinationV1Api(self.api)
        self._stop = threading.Event()
        self._lock = threading.RLock()
        self._procs: dict[str, _PodProc] = {}
        self._faked: set[str] = set()
        self._bound: dict[str, int] = {}
        self._pod_node: dict[str, str] = {}
        self._next_ip = 0
        self._threads: list[threading.Thread] = []
        self.node_names = [f"node-{i}" for i in range(self.nodes)]

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> NodeAgent:
        for n in self.node_names:
            self._register(n)
        for target in (self._heartbeat_loop, self._watch_loop, self._process_loop):
            th = threading.Thread(target=target, name=f"nodeagent-{target.__name__}", daemon=True)
            th.start()
            self._threads.append(th)
        return self

    def add_nodes(self, count: int) -> None:
        with self._lock:
            start = len(self.node_names)
            new = [f"node-{i}" for i in range(start, start + count)]
            self.node_names.extend(new)
        for n in new:
            self._register(n)

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            procs = list(self._procs.values())
        for p in procs:
            self._terminate(p, grace=5.0, prestop=False)
        for th in self._threads:
            th.join(timeout=10)

    # -- nodes -----------------------------------------------------------------------------------
    def _node_status(self) -> dict[str, Any]:
        now = _now()
        return {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "node agent",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                },
                *(
                    {
                        "type": t,
                        "status": "False",
                        "reason": "NoPressure",
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": now,
                    }
                    for t in ("MemoryPressure", "DiskPressure", "PIDPressure")
                ),
            ],
            "capacity": {"cpu": "64", "memory": "256Gi", "pods": str(PODS_PER_NODE)},
            "allocatable": {"cpu": "64", "memory": "256Gi", "pods": str(PODS_PER_NODE)},
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "nodeInfo": {
                "kubeletVersion": "v1.20.2-nodeagent",
                "kubeProxyVersion": "",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kernelVersion": "",
                "osImage": "",
                "architecture": "amd64",
                "operatingSystem": "linux",
                "containerRuntimeVersion": "nodeagent://1",
            },
        }

    def _register(self, name: str) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
        }
        try:
            self.core.create_node(body)
        except self._k.client.ApiException as exc:
            if exc.status != 409:
                raise
        self.core.patch_node_status(name, {"status": self._node_status()})
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": "kube-node-lease"},
            "spec": {
                "holderIdentity": name,
                "leaseDurationSeconds": 40,
                "renewTime": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            },
        }
        try:
            self.coord.create_namespaced_lease("kube-node-lease", lease)
        except self._k.client.ApiException as exc:
            if exc.status != 409:
                raise

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(10.0):
            for n in list(self.node_names):
                try:
                    self.core.patch_node_status(n, {"status": {"conditions": self._node_status()["conditions"]}})
                    self.coord.patch_namespaced_lease(
                        n,
                        "kube-node-lease",
                        {"spec": {"renewTime": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")}},
                    )
                except Exception as exc:  # the control plane may be stopping
                    log.debug("heartbeat of %s failed: %s", n, exc)

    # -- pods ------------------------------------------------------------------------------------
    def _watch_loop(self) -> None:
        w = self._k.watch.Watch()
        while not self._stop.is_set():
            try:
                for ev in w.stream(self.core.list_pod_for_all_namespaces, timeout_seconds=5):
                    if self._stop.is_set():
                        break
                    self._on_pod(ev["type"], ev["object"])
            except Exception as exc:
                if not self._stop.is_set():
                    log.debug("pod watch restarted: %s", exc)
                    time.sleep(0.2)

    def _on_pod(self, kind: str, pod: Any) -> None:
        uid = pod.metadata.uid
        if kind == "DELETED":
            with self._lock:
                p = self._procs.pop(uid, None)
                self._faked.discard(uid)
                node = self._pod_node.pop(uid, None)
                if node is not None:
                    self._bound[node] -= 1
            if p is not None:
                threading.Thread(target=self._terminate, args=(p, 2.0, False), daemon=True).start()
            return
        if pod.spec.node_name is None:
            self._bind(pod)
            return
        if pod.spec.node_name not in self.node_names:
            return
        if pod.metadata.deletion_timestamp is not None:
            with self._lock:
                p = self._procs.get(uid)
                if p is not None and p.terminating:
                    return
                if p is not None:
                    p.terminating = True
            grace = pod.metadata.deletion_grace_period_seconds
            if p is None:
                self._finish_delete(pod.metadata.namespace, pod.metadata.name, uid)
            else:
                threading.Thread(target=self._delete_run_pod, args=(p, grace), daemon=True).start()
            return
        with self._lock:
            known = uid in self._procs or uid in self._faked
        if known:
            return
        if self.mode(pod) == "run":
            self._start_run_pod(pod)
        else:
            with self._lock:
                self._faked.add(uid)
            self._set_status(pod.metadata.namespace, pod.metadata.name, "127.0.0.1", ready=True, pod=pod)

    def _bind(self, pod: Any) -> None:
        with self._lock:
            node = next((n for n in self.node_names if self._bound.get(n, 0) < PODS_PER_NODE), None)
            if node is None:
                return  # no room: stays Pending, as without capacity
            self._bound[node] = self._bound.get(node, 0) + 1
            self._pod_node[pod.metadata.uid] = node
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": pod.metadata.name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            self.core.create_namespaced_binding(pod.metadata.namespace, body, _preload_content=False)
        except self._k.client.ApiException as exc:
            with self._lock:
                self._bound[node] -= 1
                self._pod_node.pop(pod.metadata.uid, None)
            if exc.status not in (404, 409):
                log.warning("binding %s failed: %s", pod.metadata.name, exc)

    def _set_status(self, ns: str, name: str, ip: str, *, ready: bool, pod: Any, restarts: int = 0) -> None:
        now = _now()
        containers = [
            {
                "name": c.name,
                "ready": ready,
                "restartCount": restarts,
                "image": c.image or "",
                "imageID": "",
                "started": True,
                "state": {"running": {"startedAt": now}},
            }
            for c in pod.spec.containers
        ]
        status = {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "hostIP": "127.0.0.1",
            "startTime": now,
            "containerStatuses": containers,
            "conditions": [
                {
                    "type": t,
                    "status": "True" if (ready or t in ("PodScheduled", "Initialized")) else "False",
                    "lastTransitionTime": now,
                }
                for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
            ],
        }
        try:
            self.core.patch_namespaced_pod_status(name, ns, {"status": status})
        except self._k.client.ApiException as exc:
            if exc.status != 404:
                log.warning("status of %s failed: %s", name, exc)

    # -- run pods ----------------------------------------------------------------------------------
    def _env_of(self, pod: Any, container: Any, ip: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "PYTHONPATH", "JAVA_HOME")}
        for src in container.env_from or []:
            if src.secret_ref is not None:
                sec = self.core.read_namespaced_secret(src.secret_ref.name, pod.metadata.namespace)
                env.update({k: _b64(v) for k, v in (sec.data or {}).items()})
        for e in container.env or []:
            if e.value is not None:
                env[e.name] = e.value
            elif e.value_from is not None and e.value_from.field_ref is not None:
                path = e.value_from.field_ref.field_path
                env[e.name] = {
                    "metadata.name": pod.metadata.name,
                    "metadata.namespace": pod.metadata.namespace,
                    "status.podIP": ip,
                }.get(path, "")
            elif e.value_from is not None and e.value_from.secret_key_ref is not None:
                ref = e.value_from.secret_key_ref
                sec = self.core.read_namespaced_secret(ref.name, pod.metadata.namespace)
                env[e.name] = _b64((sec.data or {}).get(ref.key, ""))
        env.update(self.env)
        env["KOMPAKTOR_HTTP_HOST"] = ip
        return env

    def _start_run_pod(self, pod: Any) -> None:
        with self._lock:
            self._next_ip += 1
            ip = f"127.1.{self._next_ip // 250}.{self._next_ip % 250 + 1}"
            p = _PodProc(pod.metadata.uid, pod.metadata.namespace, pod.metadata.name, ip, pod)
            self._procs[p.uid] = p
        self._spawn(p)
        self._set_status(p.namespace, p.name, ip, ready=False, pod=pod)

    def _spawn(self, p: _PodProc) -> None:
        c = p.spec.spec.containers[0]
        argv = [*(c.command or []), *(c.args or [])]
        env = self._env_of(p.spec, c, p.ip)
        out = subprocess.DEVNULL
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            out = open(self.log_dir / f"{p.name}.{p.restarts}.log", "wb")  # noqa: SIM115
        # Checked and started under the lock the deletion path takes to mark the pod terminating:
        # a restart racing a deletion either happens before it (and is then terminated) or not
        # at all — never after it, which left a compactor running with no pod (found when a
        # drained compactor's restart and its pod's deletion came together).
        with self._lock:
            if p.terminating:
                if out is not subprocess.DEVNULL:
                    out.close()
                return
            popen = subprocess.Popen(
                argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
            rec = RunRecord(p.name, popen.pid, p.ip, time.time(), argv)
            p.popen, p.record, p.ready = popen, rec, False
            self.records.append(rec)
        if out is not subprocess.DEVNULL:
            out.close()

    def _probe(self, p: _PodProc) -> bool:
        probe = p.spec.spec.containers[0].readiness_probe
        if probe is None or probe.http_get is None:
            return True
        port = _port(p.spec.spec.containers[0], probe.http_get.port)
        try:
            with urllib.request.urlopen(f"http://{p.ip}:{port}{probe.http_get.path or '/'}", timeout=1) as r:
                return 200 <= r.status < 400
        except Exception:
            return False

    def _process_loop(self) -> None:
        """Readiness probes and restarts of exited processes, every 0.25 s."""
        while not self._stop.wait(0.25):
            with self._lock:
                procs = [p for p in self._procs.values() if not p.terminating]
            for p in procs:
                if p.popen is not None and p.popen.poll() is not None:
                    self._exited(p)
                    if p.terminating:
                        continue
                    p.restarts += 1
                    self._spawn(p)
                    self._set_status(p.namespace, p.name, p.ip, ready=False, pod=p.spec, restarts=p.restarts)
                    continue
                ready = self._probe(p)
                if ready != p.ready:
                    p.ready = ready
                    self._set_status(p.namespace, p.name, p.ip, ready=ready, pod=p.spec, restarts=p.restarts)

    def _exited(self, p: _PodProc) -> None:
        if p.record is not None and p.popen is not None and p.record.stopped is None:
            p.record.stopped = time.time()
            p.record.exit_code = p.popen.returncode

    def _prestop(self, p: _PodProc) -> None:
        c = p.spec.spec.containers[0]
        hook = c.lifecycle.pre_stop if c.lifecycle is not None else None
        if hook is None:
            return
        try:
            if hook._exec is not None:
                subprocess.run(hook._exec.command, env=self._env_of(p.spec, c, p.ip), timeout=30, capture_output=True)
            elif hook.http_get is not None:
                port = _port(c, hook.http_get.port)
                urllib.request.urlopen(f"http://{p.ip}:{port}{hook.http_get.path or '/'}", timeout=5).close()
        except Exception as exc:
            log.info("preStop of %s failed: %s", p.name, exc)
        if p.record is not None:
            p.record.prestop_ran = True

    def _terminate(self, p: _PodProc, grace: float, prestop: bool = True) -> None:
        if p.popen is None:
            return
        if prestop and p.popen.poll() is None:
            self._prestop(p)
        if p.popen.poll() is None:
            try:
                os.kill(p.popen.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.popen.wait(grace)
            except subprocess.TimeoutExpired:
                os.kill(p.popen.pid, signal.SIGKILL)
                p.popen.wait(10)
                if p.record is not None:
                    p.record.sigkilled = True
        self._exited(p)

    def _delete_run_pod(self, p: _PodProc, grace: int | None) -> None:
        self._terminate(p, float(grace if grace is not None else 30), prestop=True)
        self._finish_delete(p.namespace, p.name, p.uid)

    def _finish_delete(self, ns: str, name: str, uid: str) -> None:
        body = self._k.client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=self._k.client.V1Preconditions(uid=uid)
        )
        try:
            self.core.delete_namespaced_pod(name, ns, body=body)
        except self._k.client.ApiException as exc:
            if exc.status not in (404, 409):
                log.warning("finishing the deletion of %s failed: %s", name, exc)


def _b64(v: str) -> str:
    import base64

    return base64.b64decode(v).decode()


def _port(container: Any, port: Any) -> int:
    if isinstance(port, int) or (isinstance(port, str) and port.isdigit()):
        return int(port)
    for cp in container.ports or []:
        if cp.name == port:
            return int(cp.container_port)
    raise ValueError(f"no container port named {port!r}")
