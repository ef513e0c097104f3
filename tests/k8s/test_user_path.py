"""The user's path, literally, on a real Kubernetes 1.20 control plane.

`helm install` through the Helm SDK (external Redis = the test's redis-server, by Secret, as the
README describes); the operator and coordinator run as local processes authenticated as the
chart's operator ServiceAccount (never admin: a verb the chart's RBAC lacks fails here); `kubectl
apply -f examples/`, `kubectl get`, `kubectl scale`, `kubectl delete` with the real kubectl; the
compactor pods of the end-to-end group run as real `kompaktor compactor` processes through the
node agent. The operator serves its own /metrics on loopback (``--metrics-port``), scraped and
checked with promtool after the user's path.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import helm_python as helm
import kubernetes
import pytest

from kompaktor import __version__
from kompaktor import keyspace as C
from kompaktor.files.sortedfile import write_sorted
from kompaktor.files.storage import Storage
from kompaktor.local.procs import stop_popen
from kompaktor.metadata.store import MetadataStore
from kompaktor.resources import api
from kompaktor_operator import naming
from tests.k8s.controlplane import ControlPlane, free_port, wait_until
from tests.k8s.nodeagent import NodeAgent
from tests.promcheck import check, samples
from tests.support.entries import entries
from tests.support.k8s import JobWatch, Namespaced, container_env, helm_release, start_local
from tests.support.rawredis import raw_redis

ROOT = Path(__file__).resolve().parents[2]

NS = "kompaktor"
RELEASE = "kompaktor"
REDIS_SECRET = "kompaktor-redis-url"
BIN = Path(sys.executable).parent


@dataclass
class Release(Namespaced):
    namespace: ClassVar[str] = NS
    cp: ControlPlane
    agent: NodeAgent
    store: MetadataStore
    storage_dir: Path
    redis_url: str
    env: dict[str, str]  # the operator's and coordinator's environment, as the chart sets it
    procs: dict[str, subprocess.Popen]
    manifest: list[dict[str, Any]]
    operator_metrics_port: int

    def kompaktor(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        out = subprocess.run([str(BIN / "kompaktor"), *args], env=self.env, capture_output=True, text=True, timeout=120)
        if check and out.returncode != 0:
            raise AssertionError(f"kompaktor {' '.join(args)}: {out.stderr}")
        return out


def _metrics_api_env(cp: ControlPlane, core: Any, d: Path) -> dict[str, str]:
    """Where the operator serves external.metrics.k8s.io: the chart's Service ClusterIP, port 443,
    with the chart's serving certificate."""
    svc = core.read_namespaced_service(f"{RELEASE}-metrics-api", NS)
    secret = core.read_namespaced_secret(f"{RELEASE}-metrics-api-tls", NS)
    for key in ("tls.crt", "tls.key", "ca.crt"):
        (d / key).write_bytes(base64.b64decode(secret.data[key]))
    return {
        "KOMPAKTOR_METRICS_API": f"{svc.spec.cluster_ip}:443",
        "KOMPAKTOR_METRICS_API_CERT": str(d / "tls.crt"),
        "KOMPAKTOR_METRICS_API_KEY": str(d / "tls.key"),
        "KOMPAKTOR_METRICS_API_CA": str(d / "ca.crt"),
    }


#: the groups whose pods run as real compactor processes (the others' pods are fakes)
RUN_GROUPS = ("e2e", "load")


def _is_e2e_compactor(pod: Any) -> bool:
    return (pod.metadata.labels or {}).get(naming.GROUP_LABEL) in RUN_GROUPS


TOLERATION = {"key": "dedicated", "operator": "Equal", "value": "compaction", "effect": "NoSchedule"}
AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}]
        }
    }
}


@pytest.fixture(scope="module")
def release(
    control_plane: ControlPlane, redis_server: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Release]:
    cp = control_plane
    kapi = cp.api()
    core = kubernetes.client.CoreV1Api(kapi)
    import redis as redis_lib

    raw = redis_lib.Redis.from_url(redis_server.url)
    raw.flushall()
    raw.close()
    core.create_namespace({"metadata": {"name": NS}})
    core.create_namespaced_secret(NS, {"metadata": {"name": REDIS_SECRET}, "stringData": {"url": redis_server.url}})
    storage_dir = tmp_path_factory.mktemp("storage")
    logs = tmp_path_factory.mktemp("logs")
    agent = NodeAgent(
        kapi,
        mode=lambda pod: "run" if _is_e2e_compactor(pod) else "fake",
        env={"PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "KOMPAKTOR_LOG": "INFO"},
        log_dir=logs,
    ).start()
    procs: dict[str, subprocess.Popen] = {}
    store = MetadataStore.from_url(redis_server.url)
    values = {
        "redis": {"bundled": False, "external": {"existingSecret": REDIS_SECRET}},
        "storage": {"uri": str(storage_dir)},
        # Endpoints cannot hold loopback addresses: a NodePort Service makes the aggregator
        # dial the Service's ClusterIP (127.100.x.y), where the operator below listens
        "metricsApi": {"serviceType": "NodePort"},
        # where groups may run (issue 34 §3): examples/'s large group and the trimmed one below
        "compactor": {"allowedTolerations": [TOLERATION], "allowedAffinities": [AFFINITY]},
    }
    try:
        with helm_release(cp, RELEASE, NS, values) as (rel, _):
            try:
                manifest = [d for d in _yaml_docs(rel["manifest"]) if d]
                env = {
                    **os.environ,
                    **container_env(cp, core, NS, f"{RELEASE}-operator", "operator"),
                    "KUBECONFIG": str(cp.service_account_kubeconfig(NS, f"{RELEASE}-operator")),
                    "KOMPAKTOR_SCALE_INTERVAL": "1",
                    "KOMPAKTOR_STATUS_INTERVAL": "2",
                    **_metrics_api_env(cp, core, tmp_path_factory.mktemp("metrics-api")),
                    "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                }
                # the operator's own /metrics, on loopback here (the chart listens on 0.0.0.0:9091)
                metrics_port = free_port()
                procs["operator"] = start_local(
                    [str(BIN / "kompaktor"), "operator", "--liveness", "", "--metrics-port", str(metrics_port)],
                    {**env, "KOMPAKTOR_OPERATOR_METRICS_HOST": "127.0.0.1"},
                    logs / "operator.log",
                )
                procs["coordinator"] = start_local(
                    [
                        str(BIN / "kompaktor"),
                        "coordinator",
                        "--metrics-port",
                        str(free_port()),
                        "--full-scan-interval",
                        "5",
                    ],
                    env,
                    logs / "coordinator.log",
                )
                yield Release(cp, agent, store, storage_dir, redis_server.url, env, procs, manifest, metrics_port)
            finally:
                for p in procs.values():
                    stop_popen(p, 15)
    finally:
        agent.stop()
        store.close()


def _yaml_docs(text: str) -> list[Any]:
    import yaml

    return list(yaml.safe_load_all(text))


# -- 1. helm install ------------------------------------------------------------------------------
def test_helm_install_is_accepted_by_the_apiserver(release: Release) -> None:
    kinds = {(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace", NS)) for d in release.manifest}
    assert ("Deployment", f"{RELEASE}-operator", NS) in kinds
    for kind, name, namespace in kinds:
        if kind == "CustomResourceDefinition":
            crd = json.loads(release.cp.kubectl("get", "crd", name, "-o", "json").stdout)
            established = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
            assert established.get("Established") == "True", name
        elif kind in ("ClusterRole", "ClusterRoleBinding", "APIService"):
            release.cp.kubectl("get", kind.lower(), name)
        else:
            release.cp.kubectl("get", kind.lower(), name, "-n", namespace)
    assert release.procs["operator"].poll() is None, "the operator exited"


# -- 2. kubectl apply -f examples/ ---------------------------------------------------------------------
def test_examples_apply_and_show_their_columns(release: Release) -> None:
    release.kubectl("apply", "-f", str(ROOT / "examples"))
    ready = wait_until(
        lambda: (c := release.condition("compactorgroup", "small", "Ready")) and c, "small Ready", timeout=60
    )
    assert ready["status"] == "True", ready
    dep = wait_until(lambda: release.get("deployment", naming.deployment_name("small")), "small's Deployment")
    assert dep["spec"]["replicas"] == 2  # minReplicas
    hpa = json.loads(
        release.cp.kubectl(
            "get",
            "--raw",
            f"/apis/autoscaling/v2beta2/namespaces/{NS}/horizontalpodautoscalers/{naming.hpa_name('small')}",
        ).stdout
    )
    assert hpa["spec"]["minReplicas"] == 2 and hpa["spec"]["maxReplicas"] == 20
    # the HPA controller processes it (it applies the bounds; the metric comes with the metrics API)
    wait_until(
        lambda: (
            json.loads(
                release.cp.kubectl(
                    "get",
                    "--raw",
                    f"/apis/autoscaling/v2beta2/namespaces/{NS}/horizontalpodautoscalers/{naming.hpa_name('small')}",
                ).stdout
            )
            .get("status", {})
            .get("conditions")
        ),
        "HPA conditions",
        timeout=60,
    )
    # KEDA is not installed: the large group says so instead of failing in a loop
    large = wait_until(lambda: (c := release.condition("compactorgroup", "large", "Ready")) and c, "large", timeout=60)
    assert large["status"] == "False" and large["reason"] == "AutoscalerUnavailable", large
    assert "KEDA" in large["message"]
    assert release.get("deployment", naming.deployment_name("large")) is not None
    # printer columns with real values
    wait_until(
        lambda: (release.get("compactorgroup", "small") or {}).get("status", {}).get("replicas") == 2,
        "small's status.replicas",
    )
    table = release.kubectl("get", "compactorgroups").stdout.splitlines()
    header = table[0].split()
    assert header[:6] == ["NAME", "DESIRED", "REPLICAS", "READY", "QUEUED", "RUNNING"], header
    row = next(line.split() for line in table[1:] if line.startswith("small "))
    assert row[1:3] == ["2", "2"], table
    svc = wait_until(lambda: (c := release.condition("compactionservice", "cs1", "Ready")) and c, "cs1", timeout=60)
    assert svc["status"] == "True", svc


def test_a_field_removed_from_a_group_leaves_its_deployment(release: Release) -> None:
    """The operator reconciles with server-side apply: an affinity, a toleration and a pod label
    dropped from a CompactorGroup disappear from its Deployment (a merge patch kept them)."""
    extras = {"tolerations": [TOLERATION], "affinity": AFFINITY, "podLabels": {"team": "storage"}}
    group = {
        "apiVersion": api.GROUP_VERSION,
        "kind": "CompactorGroup",
        "metadata": {"name": "trimmed"},
        "spec": {"minReplicas": 0, "replicas": 0, "autoscaler": "none", **extras},
    }
    release.kubectl("apply", "-f", "-", input=json.dumps(group))

    def template() -> dict[str, Any] | None:
        dep = release.get("deployment", naming.deployment_name("trimmed"))
        return dep["spec"]["template"] if dep else None

    wait_until(
        lambda: (t := template()) and t["spec"].get("tolerations") and t["spec"].get("affinity"),
        "the Deployment with the extras",
        timeout=60,
    )
    release.kubectl(
        "patch",
        "compactorgroup",
        "trimmed",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"tolerations": None, "affinity": None, "podLabels": None}}),
    )
    t = wait_until(
        lambda: (t := template()) and not t["spec"].get("tolerations") and "team" not in t["metadata"]["labels"] and t,
        "the extras gone from the Deployment",
        timeout=60,
    )
    assert (
        not (t["spec"].get("affinity") or {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution")
    )
    release.kubectl("delete", "compactorgroup", "trimmed")


def test_kubectl_scale_reaches_the_deployment(release: Release) -> None:
    release.kubectl("scale", "compactorgroup", "small", "--replicas=3")
    wait_until(
        lambda: release.get("deployment", naming.deployment_name("small"))["spec"]["replicas"] == 3,
        "the Deployment at 3 replicas",
        timeout=30,
    )


@pytest.mark.parametrize(
    "name, spec, refused_by, words",
    [
        ("bad-quantity", {"resources": {"requests": {"memory": "lots"}}}, "schema", "memory"),
        ("min-over-max", {"minReplicas": 5, "maxReplicas": 2}, "operator", "maxReplicas"),
        # issue 36: a group's history bounds, refused at admission in one line
        ("no-history", {"history": {"maxRecords": 0}}, "schema", "spec.history.maxRecords"),
        ("long-history", {"history": {"maxAgeSeconds": 10**9}}, "schema", "spec.history.maxAgeSeconds"),
    ],
)
def test_invalid_groups_are_refused_and_nothing_is_created(
    release: Release, name: str, spec: dict[str, Any], refused_by: str, words: str
) -> None:
    body = {"apiVersion": api.GROUP_VERSION, "kind": "CompactorGroup", "metadata": {"name": name}, "spec": spec}
    out = release.kubectl("apply", "-f", "-", input=json.dumps(body), check=False)
    if refused_by == "schema":
        assert out.returncode != 0 and words in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert release.get("compactorgroup", name) is None
    else:
        assert out.returncode == 0, out.stderr  # no CEL on 1.20: the operator enforces the rule
        cond = wait_until(
            lambda: (c := release.condition("compactorgroup", name, "Ready")) and c, "a condition", timeout=30
        )
        assert cond["status"] == "False" and words in cond["message"], cond
        release.kubectl("delete", "compactorgroup", name, "--wait=false")
    assert release.get("deployment", naming.deployment_name(name)) is None


def test_a_service_naming_an_unknown_group_is_degraded(release: Release) -> None:
    body = {
        "apiVersion": api.GROUP_VERSION,
        "kind": "CompactionService",
        "metadata": {"name": "ghostly"},
        "spec": {"tiers": [{"name": "all", "compactorGroup": "ghost"}], "tables": ["nothing-here"]},
    }
    release.kubectl("apply", "-f", "-", input=json.dumps(body))
    cond = wait_until(
        lambda: (
            (c := release.condition("compactionservice", "ghostly", "Degraded")) and c and c["status"] == "True" and c
        ),
        "Degraded",
        timeout=60,
    )
    assert "ghost" in cond["message"]
    release.kubectl("delete", "compactionservice", "ghostly")


# -- 3. end to end ----------------------------------------------------------------------------------
def _service_and_group(name: str, **spec: Any) -> list[dict[str, Any]]:
    """A CompactionService for table ``name`` and its CompactorGroup ``name`` (Arrow merges, up to
    3 replicas, no autoscaler), ``spec`` added to the group's."""
    return [
        {
            "apiVersion": api.GROUP_VERSION,
            "kind": "CompactionService",
            "metadata": {"name": f"svc-{name}"},
            "spec": {"ratio": 2.0, "tiers": [{"name": "all", "compactorGroup": name}], "tables": [name]},
        },
        {
            "apiVersion": api.GROUP_VERSION,
            "kind": "CompactorGroup",
            "metadata": {"name": name},
            "spec": {
                "maxReplicas": 3,
                "autoscaler": "none",
                "drainGraceSeconds": 20,
                "spark": {"engine": "arrow", "master": "local[1]"},
                **spec,
            },
        },
    ]


def test_burst_scale_up_drain_and_scale_down(release: Release, tmp_path: Path) -> None:
    e2e = _service_and_group("e2e", minReplicas=0)
    release.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": e2e}))
    wait_until(
        lambda: (c := release.condition("compactorgroup", "e2e", "Ready")) and c["status"] == "True",
        "e2e Ready",
        timeout=60,
    )
    # a burst: 20 tablets, 3 imported files each
    splits = ",".join(f"row{r:05d}" for r in range(50, 1000, 50))
    release.kompaktor("table", "create", "e2e", "--splits", splits)
    local = Storage.from_uri(str(tmp_path))
    files = []
    for version in range(3):
        path = f"import-{version}.parquet"
        write_sorted(local, path, entries(range(1000), version))
        files.append(str(tmp_path / path))
    release.kompaktor("import", "e2e", *files)
    wait_until(lambda: release.store.queues.stats("e2e").queued >= 10, "a burst of queued jobs", timeout=60)
    # raise the replicas through the scale subresource, as the HPA would
    release.kubectl("scale", "compactorgroup", "e2e", "--replicas=3")
    wait_until(
        lambda: len([r for r in release.agent.records if r.pod.startswith("kompaktor-e2e-")]) >= 3,
        "3 compactor processes",
        timeout=60,
    )
    tablets = release.store.tables.tablets(release.store.tables.table_id("e2e"))
    wait_until(
        lambda: all(len(t.files) == 1 for t in release.store.tables.tablets(release.store.tables.table_id("e2e"))),
        "every tablet compacted to one file",
        timeout=180,
    )
    wait_until(lambda: (s := release.store.queues.stats("e2e")).queued == 0 and s.running == 0, "the queue drained")
    assert len(tablets) == 20
    # exactly what was imported: the newest version of every row
    out_file = tmp_path / "scan.parquet"
    release.kompaktor("scan", "e2e", "-o", str(out_file))
    import pyarrow.parquet as pq

    scanned = pq.read_table(out_file).to_pylist()
    assert [(r["row"], r["value"]) for r in scanned] == [(e.row, e.value) for e in entries(range(1000), 2)]
    # lower the replicas: the operator drains idle compactors, the ReplicaSet removes exactly those
    before = {r.pod for r in release.agent.records if r.pod.startswith("kompaktor-e2e-") and r.stopped is None}
    assert len(before) == 3
    release.kubectl("scale", "compactorgroup", "e2e", "--replicas=1")

    def settled() -> bool:
        pods = json.loads(release.kubectl("get", "pods", "-l", naming.selector("e2e"), "-o", "json").stdout)["items"]
        return len(pods) == 1 and not pods[0]["metadata"].get("deletionTimestamp")

    wait_until(settled, "one compactor pod left", timeout=120)
    removed = {r.pod for r in release.agent.records if r.pod in before and r.stopped is not None}
    kept = before - removed
    assert len(removed) == 2 and len(kept) == 1
    for pod in removed:
        runs = [r for r in release.agent.records if r.pod == pod]
        # drained, then stopped cleanly; a restart the kubelet made between the drain and the
        # pod's deletion (restartPolicy Always) is stopped by SIGTERM, never SIGKILLed
        assert runs[0].exit_code == 0 and not runs[0].sigkilled, runs
        assert all(r.stopped is not None and not r.sigkilled for r in runs), runs
    counters = release.store.bookkeeping.counters()
    assert counters.get("dead_compactions", 0) == 0
    assert not release.store.running.failures()  # no busy compactor was terminated: nothing failed or was released
    assert [c.id for c in release.store.fleet.compactors("e2e")] == sorted(kept)


@pytest.fixture
def paced(release: Release, tmp_path: Path) -> Iterator[None]:
    """Compactor pods started meanwhile run ``kompaktor`` through tests/integration/gated_engine.py
    with every merge paced to 1.5 s: jobs as long as real ones, so that three compactors cannot
    empty a queue that a feeder keeps filling."""
    wrap = tmp_path / "bin"
    wrap.mkdir()
    script = wrap / "kompaktor"
    script.write_text(f'#!/bin/sh\nexec {sys.executable} {ROOT}/tests/integration/gated_engine.py "$@"\n')
    script.chmod(0o755)
    saved = dict(release.agent.env)
    release.agent.env.update({"PATH": f"{wrap}{os.pathsep}{saved['PATH']}", "KOMPAKTOR_TEST_MERGE_SECONDS": "1.5"})
    try:
        yield
    finally:
        release.agent.env.clear()
        release.agent.env.update(saved)


def test_a_lowered_cap_is_obeyed_under_steady_load(release: Release, paced: None) -> None:
    """Issue 33 §2 and §3 on the control plane: three real compactors with the queue never empty
    (a feeder flushes into every tablet all along), then maxReplicas 3 -> 1. The group is at one
    pod within the longest job + 30 s while jobs are still queued; no job is interrupted, every
    job commits once, the scan is exact; the drained compactors stay up, inert, until their pods
    are deleted (no container restart, no job taken after the drain)."""
    from kompaktor.client import Client

    load = _service_and_group("load", minReplicas=1, replicas=3)
    release.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": load}))
    rows = 4000
    release.kompaktor("table", "create", "load", "--splits", ",".join(f"row{r:05d}" for r in range(200, rows, 200)))
    client = Client(release.store, Storage.from_uri(str(release.storage_dir)))
    committed_before = release.store.bookkeeping.counters().get("compactions_committed", 0)
    version = 0
    feeding = threading.Event()
    feeding.set()

    def feed() -> None:  # a flush into each of the 20 tablets every 0.5 s: more than 3 compactors do
        nonlocal version
        while feeding.is_set():
            client.flush("load", entries(range(rows), version + 1))
            version += 1
            time.sleep(0.5)  # the load's pace, not a synchronisation

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    watch = JobWatch(release.store, "load")
    try:
        try:
            wait_until(lambda: len(_live_pids(release, "load")) == 3, "3 compactor processes", timeout=120)
            wait_until(
                lambda: (
                    sum(1 for c in release.store.fleet.compactors("load") if c.ecid) == 3
                    and release.store.queues.stats("load").queued > 0
                ),
                "3 busy compactors and jobs queued",
                timeout=120,
            )
            before = _live_pids(release, "load")
            watch.window = True
            lowered = time.monotonic()
            release.kubectl("patch", "compactorgroup", "load", "--type=merge", "-p", '{"spec": {"maxReplicas": 1}}')
            wait_until(lambda: _pod_count(release, "load") == 1, "one compactor pod left", timeout=120)
            reached_s = time.monotonic() - lowered
            watch.window = False
            longest = watch.longest_job_s()
            print(f"\nlowered cap 3 -> 1 under load: 1 pod after {reached_s:.1f} s (longest job {longest:.1f} s)")
            assert min(watch.queued_in_window) > 0, "the queue emptied: not a test under load"
            assert reached_s <= longest + 30
        finally:
            feeding.clear()
            feeder.join(30)
        wait_until(
            lambda: (
                (s := release.store.queues.stats("load")).queued == 0
                and s.running == 0
                and raw_redis(release.store).scard(C.DIRTY) == 0
                and not any(t.running for t in release.store.tables.tablets(release.store.tables.table_id("load")))
            ),
            "the remaining work done by the one compactor",
            timeout=300,
        )
    finally:
        watch.close()
    got = [(e.row, e.value) for e in client.scan("load")]
    assert got == [(e.row, e.value) for e in entries(range(rows), version)]  # the newest of every row
    outcomes = [m.groups() for pod in before.values() for m in OUTCOME.finditer(_pod_logs(release, pod))]
    assert outcomes and all(status == "committed" for _, status in outcomes), outcomes  # 0 interrupted
    ecids = [ecid for ecid, _ in outcomes]
    assert len(ecids) == len(set(ecids)), "a job committed twice"
    assert release.store.bookkeeping.counters().get("compactions_committed", 0) - committed_before == len(ecids)
    assert not release.store.running.failures() and release.store.bookkeeping.counters().get("dead_compactions", 0) == 0
    kept = _live_pids(release, "load")
    for pod in set(before.values()) - set(kept.values()):
        runs = [r for r in release.agent.records if r.pod == pod]
        assert len(runs) == 1, f"{pod} was restarted after its drain: {runs}"
        assert runs[0].exit_code == 0 and not runs[0].sigkilled, runs
        text = _pod_logs(release, pod)
        assert "takes no job until its pod is deleted" in text
        tail = text.split("draining (drain flag in Redis)", 1)[1]
        assert tail.count(": committed") <= 1  # at most the job it held when asked
    release.kubectl("delete", "compactorgroup", "load")
    release.kubectl("delete", "compactionservice", "svc-load")
    wait_until(lambda: _pod_count(release, "load") == 0, "load's pods gone", timeout=120)


#: a compactor's line for a job's outcome: "<ecid> <kind> on <tablet>: <status> <reason>"
OUTCOME = re.compile(r"kompaktor\.compactor: (\S+) \w+ on \S+: (committed|failed|cancelled)\b")


def _pod_count(release: Release, group: str) -> int:
    pods = json.loads(release.kubectl("get", "pods", "-l", naming.selector(group), "-o", "json").stdout)["items"]
    return len([p for p in pods if not p["metadata"].get("deletionTimestamp")])


def _live_pids(release: Release, group: str) -> dict[int, str]:
    """The running compactor processes of ``group``: pid -> pod."""
    prefix = f"kompaktor-{group}-"
    return {r.pid: r.pod for r in release.agent.records if r.pod.startswith(prefix) and r.stopped is None}


def _pod_logs(release: Release, pod: str) -> str:
    assert release.agent.log_dir is not None
    return "".join(p.read_text(errors="replace") for p in sorted(release.agent.log_dir.glob(f"{pod}.*.log")))


def test_kubectl_delete_compaction_cancels_it(release: Release) -> None:
    # no compactor: a user compaction of e2e cannot finish while we look
    release.kubectl("scale", "compactorgroup", "e2e", "--replicas=0")
    wait_until(lambda: not release.store.fleet.compactors("e2e"), "no e2e compactor", timeout=120)
    body = {
        "apiVersion": api.GROUP_VERSION,
        "kind": "Compaction",
        "metadata": {"name": "uc"},
        "spec": {"table": "e2e"},
    }
    release.kubectl("apply", "-f", "-", input=json.dumps(body))
    cid = wait_until(
        lambda: (release.get("compaction", "uc") or {}).get("status", {}).get("compactionId"),
        "the compaction to start",
        timeout=30,
    )
    from kompaktor.metadata import user_compactions

    assert user_compactions.get(release.store, cid).state == user_compactions.RUNNING
    # no CEL on 1.20: the apiserver accepts a change, the operator marks it and keeps the original
    release.kubectl("patch", "compaction", "uc", "--type=merge", "-p", json.dumps({"spec": {"startRow": "x"}}))
    cond = wait_until(lambda: release.condition("compaction", "uc", "Degraded"), "SpecChanged", timeout=30)
    assert cond["status"] == "True" and cond["reason"] == "SpecChanged"
    assert user_compactions.get(release.store, cid).state == user_compactions.RUNNING
    release.kubectl("delete", "compaction", "uc")
    wait_until(
        lambda: user_compactions.get(release.store, cid).state == user_compactions.CANCELLED,
        "the user compaction cancelled",
        timeout=30,
    )


def _hpa(name: str) -> dict[str, Any]:
    return json.loads(
        subprocess.run(
            [
                "kubectl",
                f"--kubeconfig={_CP[0].kubeconfig}",
                "get",
                "--raw",
                f"/apis/autoscaling/v2beta2/namespaces/{NS}/horizontalpodautoscalers/{naming.hpa_name(name)}",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )


_CP: list[ControlPlane] = []


def _metrics_api_available(release: Release) -> dict[str, Any]:
    """The external metrics APIService, once registered (by the operator, below 1.22) and Available."""
    return wait_until(
        lambda: (
            (
                a := json.loads(
                    release.cp.kubectl("get", "apiservice", "v1beta1.external.metrics.k8s.io", "-o", "json").stdout
                )
            )
            and any(c["type"] == "Available" and c["status"] == "True" for c in a["status"].get("conditions", []))
            and a
        ),
        "the external metrics APIService Available",
        timeout=60,
    )


def test_hpa_scales_a_group_on_the_operator_served_queue_depth(release: Release) -> None:
    """autoscaler: builtin — the real HPA controller reads kompaktor_queue_depth from the operator
    (an aggregated API) and scales the CompactorGroup through its scale subresource."""
    _CP[:] = [release.cp]
    apisvc = _metrics_api_available(release)
    assert apisvc["spec"]["service"]["name"] == f"{RELEASE}-metrics-api"
    group = {
        "apiVersion": api.GROUP_VERSION,
        "kind": "CompactorGroup",
        "metadata": {"name": "auto"},
        "spec": {
            "minReplicas": 1,
            "maxReplicas": 4,
            "jobsPerReplica": 2,
            "autoscaler": "hpa",
            "behavior": {"scaleDownStabilizationSeconds": 10},
            "spark": {"engine": "arrow", "master": "local[1]"},
        },
    }
    service = {
        "apiVersion": api.GROUP_VERSION,
        "kind": "CompactionService",
        "metadata": {"name": "svc-auto"},
        "spec": {"ratio": 2.0, "tiers": [{"name": "all", "compactorGroup": "auto"}], "tables": ["auto"]},
    }
    release.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [service, group]})
    )
    wait_until(
        lambda: (c := release.condition("compactorgroup", "auto", "Ready")) and c["status"] == "True",
        "auto Ready",
        timeout=60,
    )
    # the metric, as the HPA reads it through the aggregator (admin here; the HPA controller likewise)
    raw = f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{NS}/kompaktor_queue_depth?labelSelector=group%3Dauto"
    # Available is set by the aggregator's availability check; its proxy for the group may follow
    # a moment later (a generic NotFound until then, seen when this test runs first)
    value = wait_until(
        lambda: json.loads(release.cp.kubectl("get", "--raw", raw).stdout),
        "the aggregator to serve the metric",
        timeout=60,
    )
    assert value["items"][0]["value"] == "0" and value["items"][0]["metricLabels"] == {"group": "auto"}
    unknown = release.cp.kubectl("get", "--raw", raw.replace("group%3Dauto", "group%3Dnope"), check=False)
    assert unknown.returncode != 0 and "no compactor group 'nope'" in unknown.stderr
    # a burst: 10 tablets with 3 files each; the group's pods do not run compactors, so the jobs stay
    splits = ",".join(f"row{r:05d}" for r in range(100, 1000, 100))
    release.kompaktor("table", "create", "auto", "--splits", splits)
    local = Storage.from_uri(str(release.storage_dir / "auto-src"))
    files = []
    for version in range(3):
        write_sorted(local, f"i{version}.parquet", entries(range(1000), version))
        files.append(str(release.storage_dir / "auto-src" / f"i{version}.parquet"))
    burst = time.monotonic()
    release.kompaktor("import", "auto", *files)
    wait_until(lambda: release.store.queues.stats("auto").queued == 10, "10 queued jobs", timeout=60)
    wait_until(lambda: _hpa("auto").get("status", {}).get("desiredReplicas") == 4, "the HPA to want 4", timeout=90)
    wait_until(
        lambda: release.get("deployment", naming.deployment_name("auto"))["spec"]["replicas"] == 4,
        "the Deployment at 4 (maxReplicas)",
        timeout=60,
    )
    scaled_up_s = time.monotonic() - burst
    # the queue empties: back to minReplicas after the stabilisation window, idle pods drained first
    release.kompaktor("table", "delete", "auto")
    wait_until(lambda: release.store.queues.stats("auto").queued == 0, "the queue emptied", timeout=60)
    wait_until(
        lambda: release.get("deployment", naming.deployment_name("auto"))["spec"]["replicas"] == 1,
        "the Deployment back at 1",
        timeout=180,
    )
    conditions = {c["type"]: c for c in _hpa("auto")["status"]["conditions"]}
    assert conditions["ScalingActive"]["status"] == "True", conditions
    print(f"HPA: 4 replicas {scaled_up_s:.1f} s after the burst")
    release.kubectl("delete", "compactorgroup", "auto")
    release.kubectl("delete", "compactionservice", "svc-auto")


def test_an_untrusted_metrics_api_is_a_degraded_group_not_a_silent_one(release: Release) -> None:
    """An APIService whose CA does not match the operator's serving certificate: the aggregator
    refuses to proxy to it, the HPA cannot read kompaktor_queue_depth, and the group with queued jobs says so
    in its Degraded condition (nothing else changes). The right CA puts it back."""
    _CP[:] = [release.cp]
    name = "v1beta1.external.metrics.k8s.io"
    apisvc = _metrics_api_available(release)
    good_ca = apisvc["spec"]["caBundle"]
    wrong_ca = base64.b64encode((release.cp.pki / "ca.crt").read_bytes()).decode()  # signed nothing of ours
    assert wrong_ca != good_ca

    raw = f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{NS}/kompaktor_queue_depth?labelSelector=group%3Dblind"

    def refused() -> str | None:
        """The aggregator's answer when it cannot verify the backend (a 503 that hides the x509
        error; its availability check skips verification, so the APIService stays Available)."""
        out = release.cp.kubectl("get", "--raw", raw, check=False)
        return out.stderr if out.returncode != 0 and "ServiceUnavailable" in out.stderr else None

    group = {
        "apiVersion": api.GROUP_VERSION,
        "kind": "CompactorGroup",
        "metadata": {"name": "blind"},
        "spec": {
            "minReplicas": 1,
            "maxReplicas": 3,
            "jobsPerReplica": 1,
            "autoscaler": "hpa",
            "spark": {"engine": "arrow", "master": "local[1]"},
        },
    }
    service = {
        "apiVersion": api.GROUP_VERSION,
        "kind": "CompactionService",
        "metadata": {"name": "svc-blind"},
        "spec": {"ratio": 2.0, "tiers": [{"name": "all", "compactorGroup": "blind"}], "tables": ["blind"]},
    }
    release.cp.kubectl("patch", "apiservice", name, "--type=merge", "-p", json.dumps({"spec": {"caBundle": wrong_ca}}))
    try:
        wait_until(refused, "the aggregator to refuse the metrics API's certificate", timeout=60)
        release.kubectl(
            "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [service, group]})
        )
        wait_until(
            lambda: (c := release.condition("compactorgroup", "blind", "Ready")) and c["status"] == "True",
            "blind Ready",
            timeout=60,
        )
        release.kompaktor("table", "create", "blind", "--splits", "row00500")
        local = Storage.from_uri(str(release.storage_dir / "blind-src"))
        files = []
        for version in range(3):
            write_sorted(local, f"b{version}.parquet", entries(range(1000), version))
            files.append(str(release.storage_dir / "blind-src" / f"b{version}.parquet"))
        release.kompaktor("import", "blind", *files)
        wait_until(lambda: release.store.queues.stats("blind").queued == 2, "2 queued jobs", timeout=60)
        degraded = wait_until(
            lambda: (
                (c := release.condition("compactorgroup", "blind", "Degraded"))
                and c["status"] == "True"
                and c["reason"] == "AutoscalerCannotReadMetric"
                and c
            ),
            "the group Degraded by its blind HPA",
            timeout=120,
        )
        assert "kompaktor_queue_depth" in degraded["message"] and "2 job(s) queued" in degraded["message"]
        assert release.get("deployment", naming.deployment_name("blind"))["spec"]["replicas"] == 1  # unchanged
    finally:
        release.cp.kubectl(
            "patch", "apiservice", name, "--type=merge", "-p", json.dumps({"spec": {"caBundle": good_ca}})
        )
    wait_until(
        lambda: release.cp.kubectl("get", "--raw", raw, check=False).returncode == 0,
        "the metric served again",
        timeout=60,
    )
    wait_until(
        lambda: release.get("deployment", naming.deployment_name("blind"))["spec"]["replicas"] == 2,
        "the HPA scaling the group again (2 jobs, 1 per replica)",
        timeout=120,
    )
    wait_until(
        lambda: (c := release.condition("compactorgroup", "blind", "Degraded")) and c["status"] == "False",
        "the Degraded condition cleared",
        timeout=60,
    )
    release.kompaktor("table", "delete", "blind")
    release.kubectl("delete", "compactorgroup", "blind")
    release.kubectl("delete", "compactionservice", "svc-blind")


# -- 4. the operator's own /metrics ------------------------------------------------------------------
def _operator_metrics(release: Release) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{release.operator_metrics_port}/metrics", timeout=5) as r:
        return r.read().decode()


def _value(text: str, name: str, **labels: str) -> float | None:
    return samples(text).get((name, frozenset(labels.items())))


def test_operator_metrics_count_reconciles_and_scaling_and_pass_promtool(release: Release) -> None:
    """What a platform team reads from the operator: a group applied is a reconcile counted ok, an
    invalid one refused; the scaler's replicas, drain requests and replica changes per group; the
    builtin external metrics API's answers by code; a deleted group's series gone. promtool is clean."""
    _CP[:] = [release.cp]
    operator = next(
        d for d in release.manifest if d["kind"] == "Deployment" and d["metadata"]["name"] == f"{RELEASE}-operator"
    )
    (args,) = [c["args"] for c in operator["spec"]["template"]["spec"]["containers"] if c["name"] == "operator"]
    assert "--metrics-port=9091" in args  # the chart serves it; the process here listens on loopback
    before = wait_until(lambda: _operator_metrics(release), "the operator's /metrics", timeout=60)
    ok = "kompaktor_operator_reconciles_total"
    ok0 = _value(before, ok, kind="CompactorGroup", result="ok")
    refused0 = _value(before, ok, kind="CompactorGroup", result="refused")
    assert ok0 is not None and refused0 is not None  # every kind and result exported from the start

    # a group with two (node-agent) pods, then scaled down by one: no heartbeat, so the scaler asks
    # the victim to drain, gives it the lowest deletion cost and lowers the Deployment's replicas
    group = {
        "apiVersion": api.GROUP_VERSION,
        "kind": "CompactorGroup",
        "metadata": {"name": "metered"},
        "spec": {
            "replicas": 2,
            "minReplicas": 1,
            "maxReplicas": 3,
            "autoscaler": "none",
            "spark": {"engine": "arrow", "master": "local[1]"},
        },
    }
    bad = {
        "apiVersion": api.GROUP_VERSION,
        "kind": "CompactorGroup",
        "metadata": {"name": "metered-bad"},
        "spec": {"minReplicas": 3, "maxReplicas": 1},
    }
    release.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [group, bad]}))
    wait_until(
        lambda: (c := release.condition("compactorgroup", "metered", "Ready")) and c["status"] == "True",
        "metered Ready",
        timeout=60,
    )
    wait_until(
        lambda: (c := release.condition("compactorgroup", "metered-bad", "Ready")) and c["status"] == "False",
        "metered-bad refused",
        timeout=60,
    )
    text = wait_until(
        lambda: (
            (t := _operator_metrics(release))
            and _value(t, "kompaktor_operator_group_replicas", group="metered") == 2
            and t
        ),
        "the scaler's replicas for metered",
        timeout=60,
    )
    assert _value(text, ok, kind="CompactorGroup", result="ok") >= ok0 + 1
    assert _value(text, ok, kind="CompactorGroup", result="refused") >= refused0 + 1
    assert _value(text, "kompaktor_operator_group_desired_replicas", group="metered") == 2
    wait_until(
        lambda: (
            len(
                json.loads(release.kubectl("get", "pods", "-l", naming.selector("metered"), "-o", "json").stdout)[
                    "items"
                ]
            )
            == 2
        ),
        "metered's 2 pods",
        timeout=60,
    )
    release.kubectl("scale", "compactorgroup", "metered", "--replicas=1")
    text = wait_until(
        lambda: (
            (t := _operator_metrics(release))
            and _value(t, "kompaktor_operator_group_replicas", group="metered") == 1
            and t
        ),
        "the scaler to lower metered to 1",
        timeout=60,
    )
    assert release.get("deployment", naming.deployment_name("metered"))["spec"]["replicas"] == 1
    assert _value(text, "kompaktor_operator_group_desired_replicas", group="metered") == 1
    assert _value(text, "kompaktor_operator_drain_requests_total", group="metered") >= 1
    assert _value(text, "kompaktor_operator_replica_changes_total", group="metered", direction="down") == 1

    # the builtin external metrics API, through the aggregator: a known group and an unknown one
    _metrics_api_available(release)
    raw = f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{NS}/kompaktor_queue_depth?labelSelector=group%3D"
    codes0 = {c: _value(text, "kompaktor_operator_metrics_api_requests_total", code=c) or 0 for c in ("200", "404")}
    wait_until(
        lambda: release.cp.kubectl("get", "--raw", raw + "metered", check=False).returncode == 0,
        "the metric for metered",
        timeout=60,
    )
    assert release.cp.kubectl("get", "--raw", raw + "nobody", check=False).returncode != 0
    text = wait_until(
        lambda: (
            (t := _operator_metrics(release))
            and all(
                (_value(t, "kompaktor_operator_metrics_api_requests_total", code=c) or 0) > codes0[c] for c in codes0
            )
            and t
        ),
        "the metrics API's 200 and 404 counted",
        timeout=30,
    )

    # a deleted group's series go with it
    release.kubectl("delete", "compactorgroup", "metered", "metered-bad")
    text = wait_until(
        lambda: (t := _operator_metrics(release)) and 'group="metered"' not in t and t,
        "metered's series removed",
        timeout=60,
    )
    assert _value(text, "kompaktor_operator_build_info", version=__version__) == 1
    check(text)


def test_deleting_resources_collects_children_and_uninstall_keeps_crds(release: Release) -> None:
    release.kubectl("delete", "compactorgroup", "e2e")
    wait_until(
        lambda: release.get("deployment", naming.deployment_name("e2e")) is None, "e2e's Deployment gone", timeout=60
    )
    release.kubectl("delete", "-f", str(ROOT / "examples"), "--wait=true")
    wait_until(
        lambda: release.get("deployment", naming.deployment_name("small")) is None,
        "small's Deployment gone",
        timeout=60,
    )
    with helm.Config(kubeconfig_path=str(release.cp.kubeconfig), namespace=NS) as cfg:
        cfg.uninstall(RELEASE, timeout=60)  # (the fixture's uninstall then finds nothing)
    wait_until(
        lambda: release.get("deployment", f"{RELEASE}-operator") is None, "the operator Deployment gone", timeout=60
    )
    for crd in ("compactorgroups.kompaktor.io", "compactionservices.kompaktor.io", "compactions.kompaktor.io"):
        release.cp.kubectl("get", "crd", crd)  # kept: helm.sh/resource-policy keep
