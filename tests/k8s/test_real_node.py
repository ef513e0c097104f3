"""The user's path, literally, on a real node: the product as shipped.

A control plane listening on the node's bridge, a kubelet with containerd + runc, CNI bridge
networking, kube-proxy, kube-scheduler and cluster DNS (tests/k8s/node.py). The project's own
images (`make images`) are imported into the node's containerd; `helm install` with the README's
values (storage on an S3 API server the pods reach on the bridge) runs the operator, the
coordinator and the bundled Redis as pods; `kubectl apply -f examples/`; a burst loaded through
the Redis Service; the real HPA raises the group; the kubelet starts compactor containers that
merge with Spark inside the container and commit; the scan is exact; the HPA lowers the group and
the kubelet runs the preStop drain; `kubectl delete` and `helm uninstall` leave no container.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes
import pytest

from kompaktor import __version__
from kompaktor.resources import api
from kompaktor_operator import naming
from tests.k8s.controlplane import ControlPlane, wait_until
from tests.k8s.node import GATEWAY, NODE_NAME, RealNode, running_containers
from tests.k8s.shipped import (
    BUCKET,
    NS,
    RELEASE,
    Shipped,
    admin_url,
    diagnose,
    readme_values,
    ready,
    redis_volume,
    wait_ready,
)
from tests.support.entries import entries

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "kompaktor"
TABLE = "ci_burst"  # served by the examples' CompactionService cs1 (tables ci, ci_*) → group small


@pytest.fixture(scope="module")
def shipped(real_cluster: tuple[ControlPlane, RealNode], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shipped]:
    from tests.support.s3server import S3Server

    cp, node = real_cluster
    core = kubernetes.client.CoreV1Api(cp.api())
    s3 = S3Server(tmp_path_factory.mktemp("s3"), host=GATEWAY)
    s3.start()
    try:
        s3.create_bucket(BUCKET)
        storage_env = {
            "AWS_ACCESS_KEY_ID": s3.access_key,
            "AWS_SECRET_ACCESS_KEY": s3.secret_key,
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": s3.endpoint,
        }
        core.create_namespace({"metadata": {"name": NS}})
        # the README's storage step: credentials as environment variables in a Secret
        core.create_namespaced_secret(NS, {"metadata": {"name": "s3-credentials"}, "stringData": storage_env})
        # the bundled Redis' volume: this node has no provisioner, so a local volume an admin made
        data = tmp_path_factory.mktemp("redis-data")
        os.chown(data, 999, 999)
        redis_volume(core, data)
        # `helm install` with the README's values
        with helm.Config(kubeconfig_path=str(cp.kubeconfig), namespace=NS) as cfg:
            cfg.install(str(CHART), RELEASE, readme_values(), namespace=NS, timeout=120)
        s = Shipped(cp, node, {}, s3)
        wait_ready(s)
        s.env = {
            **os.environ,
            **storage_env,
            "KOMPAKTOR_REDIS_URL": admin_url(core),
            "KOMPAKTOR_STORAGE": f"s3://{BUCKET}/tables",
        }
        yield s
        scanned = _back_up(s)
        _delete_and_uninstall_leave_no_container_running(s)
        _lose_theredis_volume(core, data)
        _install_from_the_backup_and_scan(s, core, scanned)
    finally:
        s3.stop()


# -- 1. what helm install started ------------------------------------------------------------------
def test_the_operator_coordinator_and_redis_run_as_pods_from_the_projects_images(shipped: Shipped) -> None:
    pods = shipped.pods(f"app.kubernetes.io/instance={RELEASE}")
    images = {c["name"]: c["image"] for p in pods for c in p["spec"]["containers"]}
    assert images == {
        "operator": f"ghcr.io/kompaktor/kompaktor-operator:{__version__}",
        "coordinator": f"ghcr.io/kompaktor/kompaktor-operator:{__version__}",
        "redis": f"ghcr.io/kompaktor/kompaktor-redis:{__version__}",
    }, images
    for p in pods:
        assert p["spec"]["nodeName"] == NODE_NAME
        for st in p["status"]["containerStatuses"]:
            assert st["ready"] and st["restartCount"] == 0, st
            assert st["imageID"], st  # from the node's containerd, not pulled: IfNotPresent found it
    # uid 10001 / 999, not root, as the runtime enforces it
    op = next(p for p in pods if p["metadata"]["labels"].get("app.kubernetes.io/component") == "operator")
    out = shipped.kubectl("exec", op["metadata"]["name"], "-c", "operator", "--", "id", "-u")
    assert out.stdout.strip() == "10001"
    ro = shipped.kubectl("exec", op["metadata"]["name"], "-c", "operator", "--", "touch", "/opt/x", check=False)
    assert ro.returncode != 0 and "Read-only file system" in ro.stderr + ro.stdout
    # the coordinator reaches Redis through the Service's DNS name (cluster DNS on the bridge)
    logs = shipped.kubectl("logs", op["metadata"]["name"], "-c", "coordinator").stdout
    assert "Traceback" not in logs, logs[-3000:]


# -- 2. the burst, scaled by the real HPA, merged by compactor containers ----------------------------
def _import_versions(s: Shipped, table: str, tmp_path: Path, rows: range) -> None:
    """Bulk-import three versions of ``rows`` into ``table`` (three files over every tablet)."""
    from kompaktor.files.sortedfile import write_sorted
    from kompaktor.files.storage import Storage

    local = Storage.from_uri(str(tmp_path))
    files = []
    for version in range(3):
        write_sorted(local, f"{table}-{version}.parquet", entries(rows, version))
        files.append(str(tmp_path / f"{table}-{version}.parquet"))
    s.kompaktor("import", table, *files)


def _watch_replicas(s: Shipped, stop: threading.Event) -> None:
    apps = kubernetes.client.AppsV1Api(s.cp.api())
    while not stop.is_set():
        try:
            dep = apps.read_namespaced_deployment(naming.deployment_name("small"), NS)
            s.replicas_seen.append(dep.spec.replicas or 0)
        except Exception:
            pass
        stop.wait(1)


#: the burst: one job per tablet
TABLETS = 100


@pytest.fixture(scope="module")
def small(shipped: Shipped) -> None:
    """`kubectl apply -f examples/`, the small group sized for this node, its 2 pods Ready: what
    every test that looks at a compactor pod needs, whichever runs first."""
    s = shipped
    s.kubectl("apply", "-f", str(ROOT / "examples"))
    # this node has 2 cores: the small group's pods ask for a quarter core each, at most 3 of them,
    # and the HPA lowers them 10 s after the queue empties (examples/ asks 1 core, 20 pods, 5 min)
    s.kubectl(
        "patch",
        "compactorgroup",
        "small",
        "--type=merge",
        "-p",
        json.dumps(
            {
                "spec": {
                    "maxReplicas": 3,
                    "behavior": {"scaleDownStabilizationSeconds": 10},
                    "drainGraceSeconds": 60,
                    "resources": {"requests": {"cpu": "250m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
                }
            }
        ),
    )
    try:
        wait_until(
            lambda: (p := s.pods(naming.selector("small"))) and len(p) == 2 and all(map(ready, p)),
            "the small group's 2 compactor pods Ready",
            timeout=240,
            every=1,
        )
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{diagnose(s)}") from None


def _compactor_pod(s: Shipped) -> dict[str, Any]:
    """A Ready compactor pod of the small group that is not being deleted (a scale-down may be
    draining another)."""
    found: list[dict[str, Any]] = []

    def any_ready() -> bool:
        pods = s.pods(naming.selector("small"))
        found[:] = [p for p in pods if ready(p) and not p["metadata"].get("deletionTimestamp")]
        return bool(found)

    wait_until(any_ready, "a Ready compactor pod of the small group", timeout=240, every=1)
    return found[0]


@pytest.mark.usefixtures("small")
def test_burst_hpa_compactor_containers_scan_and_drain(shipped: Shipped, tmp_path: Path) -> None:
    s = shipped
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_replicas, args=(s, stop), daemon=True)
    watcher.start()
    try:
        # 100 tablets, 3 imported files each: 100 jobs for the small group. Enough that the two
        # pods cannot finish them before the HPA's next sync sees the queue (20 were, once, in a
        # CI run: every job committed by two pods before the HPA looked; the status said so)
        splits = ",".join(f"row{r:05d}" for r in range(10, 1000, 10))
        s.kompaktor("table", "create", TABLE, "--splits", splits)
        _import_versions(s, TABLE, tmp_path, range(1000))
        # the real HPA reads the operator-served queue depth and raises the group to its maximum
        try:
            wait_until(lambda: max(s.replicas_seen, default=0) == 3, "the HPA raising small to 3", timeout=180)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}: seen {sorted(set(s.replicas_seen))}\n{diagnose(s)}") from None

        def compacted() -> bool:
            out = s.kompaktor("status", "--json", check=False)
            if out.returncode != 0:
                return False
            st = json.loads(out.stdout)
            table, group = st["tables"][TABLE], st["groups"].get("small", {})
            return (
                table["tablets"] == TABLETS
                and table["files_per_tablet"]["max"] == 1
                and group.get("queued") == 0
                and group.get("running") == 0
            )

        try:
            wait_until(
                compacted, "every tablet compacted to one file by the compactor containers", timeout=600, every=2
            )
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{diagnose(s)}") from None
        out_file = tmp_path / "scan.parquet"
        s.kompaktor("scan", TABLE, "-o", str(out_file))
        import pyarrow.parquet as pq

        scanned = pq.read_table(out_file).to_pylist()
        assert [(r["row"], r["value"]) for r in scanned] == [(e.row, e.value) for e in entries(range(1000), 2)]
        # the queue is empty: the HPA lowers the group to minReplicas, the operator drains idle
        # compactors first and the kubelet runs their preStop drain
        try:
            wait_until(
                lambda: (
                    len(s.pods(naming.selector("small"))) == 2
                    and s.get("deployment", naming.deployment_name("small"))["spec"]["replicas"] == 2
                ),
                "small back at 2 pods",
                timeout=180,
                every=2,
            )
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{diagnose(s)}") from None
    finally:
        stop.set()
        watcher.join(5)
    st = json.loads(s.kompaktor("status", "--json").stdout)
    # 0 busy compactors terminated: no compaction was declared dead (no heartbeat lost mid-job),
    # none failed or waits for a retry, and every job was committed by a compactor container
    assert st["groups"]["small"]["dead_compactions_recovered"] == 0, st["groups"]
    assert not st["dead_letters"] and not st["retries_pending"], st
    assert st["groups"]["small"]["compactions_committed"] >= TABLETS, st["groups"]


@pytest.mark.usefixtures("small")
def test_kubectl_logs_and_exec_on_a_compactor_pod(shipped: Shipped) -> None:
    pod = _compactor_pod(shipped)["metadata"]["name"]
    logs = shipped.kubectl("logs", pod, "-c", "compactor").stdout
    assert logs.strip(), "no log"
    out = shipped.kubectl("exec", pod, "-c", "compactor", "--", "kompaktor", "--version")
    assert __version__ in out.stdout
    # Spark's scratch is the pod's emptyDir, the root filesystem is read-only, uid 10001
    probe = shipped.kubectl(
        "exec",
        pod,
        "-c",
        "compactor",
        "--",
        "sh",
        "-c",
        "id -u; touch /scratch/x && echo scratch-ok; touch /opt/x 2>&1 || true",
    )
    assert probe.stdout.splitlines()[:2] == ["10001", "scratch-ok"], probe.stdout
    assert "Read-only file system" in probe.stdout


_AS_COMPACTOR = """
import os, redis
r = redis.Redis.from_url(os.environ["KOMPAKTOR_REDIS_URL"])
print("user", r.client_info()["user"])
for cmd in (("FLUSHALL",), ("CONFIG", "SET", "dir", "/tmp"), ("EVAL", "return 1", "0"), ("SCRIPT", "LOAD", "return 1"),
            ("FUNCTION", "LOAD", "#!lua name=x\\nredis.register_function('x', function() return 1 end)"),
            ("KEYS", "*"), ("ACL", "LIST"), ("SET", "elsewhere", "1")):
    try:
        r.execute_command(*cmd)
        print("ALLOWED", cmd[0])
    except redis.ResponseError as exc:
        print("refused", cmd[0], "permission" in str(exc))
"""


@pytest.mark.usefixtures("small")
def test_each_pod_reaches_redis_as_its_own_user(shipped: Shipped) -> None:
    """Issue 25 §2 on the real node: the bundled Redis has a user per role; a compactor pod holds
    only the compactor's URL and, as that user, is refused what would hurt everyone."""
    from kompaktor.metadata import acl

    redis_pod = shipped.pods("app.kubernetes.io/component=redis")[0]["metadata"]["name"]
    users = shipped.kubectl("exec", redis_pod, "-c", "redis", "--", "redis-cli", "ACL", "USERS").stdout.split()
    assert set(acl.ROLES) <= set(users), users
    pod = _compactor_pod(shipped)
    refs = {
        e["name"]: e.get("valueFrom", {}).get("secretKeyRef", {}).get("name")
        for c in pod["spec"]["containers"]
        for e in c.get("env", [])
    }
    assert refs["KOMPAKTOR_REDIS_URL"] == f"{RELEASE}-redis-compactor"
    assert not [n for n in refs.values() if n and n.startswith(f"{RELEASE}-redis") and not n.endswith("-compactor")]
    out = shipped.kubectl("exec", pod["metadata"]["name"], "-c", "compactor", "--", "python", "-c", _AS_COMPACTOR)
    lines = out.stdout.splitlines()
    assert lines[0] == "user compactor", out.stdout
    assert lines[1:] and all(line.startswith("refused") and line.endswith("True") for line in lines[1:]), out.stdout
    # the operator and the coordinator connect as theirs
    op = shipped.pods("app.kubernetes.io/component=operator")[0]
    for c in op["spec"]["containers"]:
        env = {e["name"]: e for e in c.get("env", [])}
        assert env["KOMPAKTOR_REDIS_URL"]["valueFrom"]["secretKeyRef"]["name"] == f"{RELEASE}-redis-{c['name']}"


@pytest.mark.usefixtures("small")
def test_the_storage_secret_key_is_nowhere_a_person_looks(shipped: Shipped) -> None:
    """The S3 secret reaches the pods only through the Secret (envFrom): not in any object a user
    reads (pods, Deployments, the groups' and services' status, events), not in any container's
    log, not in a compactor's /metrics."""
    secret = shipped.s3.secret_key
    objects = shipped.kubectl("get", "pods,deployments,compactorgroups,compactionservices,events", "-o", "json").stdout
    assert secret not in objects
    for pod in json.loads(shipped.kubectl("get", "pods", "-o", "json").stdout)["items"]:
        for c in pod["spec"]["containers"]:
            logs = shipped.kubectl("logs", pod["metadata"]["name"], "-c", c["name"], check=False).stdout
            assert secret not in logs, (pod["metadata"]["name"], c["name"])
    pod = _compactor_pod(shipped)["metadata"]["name"]
    metrics = shipped.kubectl(
        "exec",
        pod,
        "-c",
        "compactor",
        "--",
        "python",
        "-c",
        "import urllib.request; print(urllib.request.urlopen("
        "'http://127.0.0.1:8080/metrics', timeout=10).read().decode())",
    ).stdout
    assert "kompaktor_storage_requests_total" in metrics and secret not in metrics


# -- the status page through the chart's Service (issue 36 §3) -----------------------------------------
PAGE_TABLE = "ci_page"  # served by the examples' cs1 → group small


def _coordinator_service(s: Shipped) -> str:
    """The coordinator's /metrics and /status, through the chart's Service `<release>-metrics`
    (kube-proxy), as a port-forward or a Prometheus in the cluster reaches them."""
    core = kubernetes.client.CoreV1Api(s.cp.api())
    svc = core.read_namespaced_service(f"{RELEASE}-metrics", NS)
    return f"http://{svc.spec.cluster_ip}:{svc.spec.ports[0].port}"


def _http_get(url: str) -> tuple[int, str, str]:
    import urllib.request

    with urllib.request.urlopen(url, timeout=20) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read().decode()


@pytest.mark.usefixtures("small")
def test_the_status_page_through_the_charts_service_shows_what_status_json_says(
    shipped: Shipped, tmp_path: Path
) -> None:
    """The coordinator pod serves /status (and still /metrics) through the chart's Service; with a
    table compacted by the compactor containers, the page shows every group and table with the
    figures `kompaktor status --json` reports, and the committed jobs in its history."""
    from tests.integration.test_status_page import figures
    from tests.integration.test_status_page_browser import GROUP_KEYS, TABLE_KEYS, figures_of

    s = shipped
    base = _coordinator_service(s)
    s.kompaktor("table", "create", PAGE_TABLE, "--splits", "row00050")
    _import_versions(s, PAGE_TABLE, tmp_path, range(100))

    def status() -> dict[str, Any]:
        return json.loads(s.kompaktor("status", "--json").stdout)

    def compacted() -> bool:
        st = status()
        t, g = st["tables"].get(PAGE_TABLE), st["groups"].get("small", {})
        return bool(t) and t["files_per_tablet"]["max"] == 1 and g.get("queued") == 0 and g.get("running") == 0

    try:
        wait_until(compacted, f"{PAGE_TABLE}'s two tablets compacted by the compactor containers", 300, every=2)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{diagnose(s)}") from None

    def look() -> tuple[dict[str, Any], str, dict[str, Any]]:
        before = status()
        code, ctype, html = _http_get(f"{base}/status")
        assert code == 200 and ctype.startswith("text/html"), (code, ctype)
        return before, html, status()

    def agree(got: tuple[dict[str, Any], str, dict[str, Any]]) -> bool:
        before, html, after = got
        page = figures(html)
        return figures_of(before) == figures_of(after) and all(
            page.values.get((g, k)) == str(v[k]) for g, v in before["groups"].items() for k in GROUP_KEYS
        )

    # two looks at the CLI around the page's agree once nothing moves (a scale-down may drain a pod)
    before, html, _ = wait_until(lambda: (got := look()) and agree(got) and got, "the page and status agree", 120, 2)
    page = figures(html)
    assert set(before["groups"]) >= {"small", "large"} and PAGE_TABLE in before["tables"]
    for g, v in before["groups"].items():
        assert g in page.rows
        for k in GROUP_KEYS:
            assert page.values[(g, k)] == str(v[k]), (g, k)
    for name, t in before["tables"].items():
        for k in TABLE_KEYS:
            assert page.values[(name, k)] == str(t[k]), (name, k)
        assert page.values[(name, "files_max")] == str(t["files_per_tablet"]["max"])
    assert before["groups"]["small"]["compactions_committed"] >= 2
    # the history: this table's jobs, committed by compactor pods of the small group
    committed = [e for e in page.rows if e.startswith("ECID-") and page.values.get((e, "outcome")) == "committed"]
    assert committed, "no committed job in the page's history"
    assert "Traceback" not in html and "<script" not in html.lower()

    code, ctype, metrics = _http_get(f"{base}/metrics")
    assert code == 200 and ctype.startswith("text/plain"), (code, ctype)
    depth = next(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith('kompaktor_queue_depth{group="small"}')
    )
    assert depth == before["groups"]["small"]["depth"] == 0


# -- 3. a group whose pods cannot run says why ---------------------------------------------------------
def _group(name: str, **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "minReplicas": 1,
        "maxReplicas": 1,
        "jobsPerReplica": 1,
        "autoscaler": "hpa",
        "drainGraceSeconds": 10,
        "spark": {"engine": "arrow", "master": "local[1]"},
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}},
    }
    return {
        "apiVersion": "kompaktor.io/v1alpha1",
        "kind": "CompactorGroup",
        "metadata": {"name": name},
        "spec": {**base, **spec},
    }


#: each group made to fail one way, and the fix a user would apply
BROKEN: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    # an image the node does not hold and no registry here can serve
    "t-pull": ({"imagePullPolicy": "Always"}, {"imagePullPolicy": "IfNotPresent"}, "ImagePullFailed"),
    # a Spark master nobody answers: the compactor cannot start its engine and exits
    "t-crash": (
        {"spark": {"engine": "spark", "master": "spark://nowhere.invalid:7077", "driverMemory": "512m"}},
        {"spark": {"engine": "arrow", "master": "local[1]"}},
        "CrashLoop",
    ),
    # Spark's JVM in 64 MiB
    "t-oom": (
        {
            "spark": {"engine": "spark", "master": "local[1]", "driverMemory": "512m"},
            "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "64Mi"}},
        },
        {
            "spark": {"engine": "arrow", "master": "local[1]"},
            "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}},
        },
        "OOMKilled",
    ),
    # more cores than the node has
    "t-sched": (
        {"resources": {"requests": {"cpu": "64", "memory": "128Mi"}, "limits": {"memory": "1Gi"}}},
        {"resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}}},
        "Unschedulable",
    ),
}


def _untouched(s: Shipped) -> dict[str, Any]:
    """What the broken groups must not change: the other pods (and their restarts), the small
    group's Deployment and the operator's Deployment."""
    pods = json.loads(s.kubectl("get", "pods", "-o", "json").stdout)["items"]
    others = {
        p["metadata"]["uid"]: sum(c.get("restartCount", 0) for c in p["status"].get("containerStatuses") or [])
        for p in pods
        if not p["metadata"]["name"].startswith(tuple(f"kompaktor-{n}" for n in BROKEN))
        and p["metadata"]["name"].startswith(("kompaktor-small", "kompaktor-operator", "kompaktor-redis"))
    }
    deps = {
        n: s.get("deployment", n)["metadata"]["generation"]
        for n in (naming.deployment_name("small"), f"{RELEASE}-operator")
    }
    return {"pods": others, "deployments": deps}


@pytest.mark.usefixtures("small")  # the small group is among what the broken groups must leave alone
def test_a_group_whose_pods_cannot_run_says_why_and_clears_when_fixed(shipped: Shipped) -> None:
    s = shipped
    before = _untouched(s)
    for name, (broken, _, _) in BROKEN.items():
        s.kubectl("apply", "-f", "-", input=json.dumps(_group(name, **broken)))
    try:

        def reasons() -> dict[str, str | None]:
            return {n: (s.condition("compactorgroup", n, "PodsHealthy") or {}).get("reason") for n in BROKEN}

        try:
            wait_until(
                lambda: reasons() == {n: want for n, (_, _, want) in BROKEN.items()},
                "each broken group's PodsHealthy condition naming its failure",
                timeout=240,
                every=2,
            )
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{reasons()}\n{diagnose(s)}") from None
        msg = {n: s.condition("compactorgroup", n, "PodsHealthy")["message"] for n in BROKEN}
        assert "kompaktor-compactor" in msg["t-pull"], msg["t-pull"]
        assert "last exit: Error (exit code" in msg["t-crash"] and "nowhere.invalid" in msg["t-crash"], msg["t-crash"]
        assert "64Mi" in msg["t-oom"], msg["t-oom"]
        assert "Insufficient cpu" in msg["t-sched"], msg["t-sched"]
        for n in BROKEN:
            assert s.condition("compactorgroup", n, "PodsHealthy")["status"] == "False"
        # the printer column: `kubectl get compactorgroups` shows it without -o yaml
        table = s.kubectl("get", "compactorgroups").stdout
        assert "PODS" in table.splitlines()[0], table
        for n, (_, _, want) in BROKEN.items():
            assert any(line.split()[0] == n and want in line.split() for line in table.splitlines()), table
        # the fix a user applies clears it
        for name, (_, fix, _) in BROKEN.items():
            s.kubectl("patch", "compactorgroup", name, "--type=merge", "-p", json.dumps({"spec": fix}))
        try:
            wait_until(
                lambda: (
                    set(reasons().values()) == {"PodsRunning"}
                    and all(
                        (s.condition("compactorgroup", n, "PodsHealthy") or {}).get("status") == "True" for n in BROKEN
                    )
                ),
                "every fixed group's PodsHealthy back to True",
                timeout=240,
                every=2,
            )
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{reasons()}\n{diagnose(s)}") from None
        for n in BROKEN:
            pods = s.pods(naming.selector(n))
            assert pods and all(ready(p) for p in pods if not p["metadata"].get("deletionTimestamp")), n
        # nothing else in the namespace changed: no other pod restarted or replaced, no other
        # Deployment rolled
        assert _untouched(s) == before
    finally:
        s.kubectl("delete", "compactorgroup", *BROKEN, "--wait=true", check=False)
        wait_until(
            lambda: not any(s.pods(naming.selector(n)) for n in BROKEN),
            "the broken groups' pods gone",
            timeout=120,
            every=1,
        )


# -- scale to zero and back under the stock HPA -------------------------------------------------------
def test_a_group_at_zero_wakes_at_its_first_job_and_parks_again(shipped: Shipped, tmp_path: Path) -> None:
    """minReplicas 0 with autoscaler hpa: no compactor pod while there is nothing to do; the first
    job queued wakes the group (the operator sets 1, the HPA takes over); the job is merged by a
    compactor container (Spark, the image's default engine) and committed; after the scale-down
    window with no work the group is parked at 0 again, its last compactor drained."""
    s = shipped
    table, group = "zero_t", "zero"
    service = {
        "apiVersion": api.GROUP_VERSION,
        "kind": "CompactionService",
        "metadata": {"name": "cs-zero"},
        "spec": {"ratio": 2.0, "tiers": [{"name": "all", "compactorGroup": group}], "tables": [table]},
    }
    spec = {
        "minReplicas": 0,
        "maxReplicas": 1,
        "autoscaler": "hpa",
        "drainGraceSeconds": 60,
        "behavior": {"scaleDownStabilizationSeconds": 10},
        "spark": {"master": "local[1]", "driverMemory": "512m"},
        "resources": {"requests": {"cpu": "250m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
    }
    items = [service, {**_group(group), "spec": spec}]
    s.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    try:
        try:
            wait_until(
                lambda: (c := s.condition("compactorgroup", group, "Ready")) and c["status"] == "True",
                "the zero group Ready",
                timeout=60,
            )
            wait_until(
                lambda: (d := s.get("deployment", naming.deployment_name(group))) and d["spec"]["replicas"] == 0,
                "the zero group's Deployment at 0 replicas",
                timeout=60,
            )
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{diagnose(s)}") from None
        assert not s.pods(naming.selector(group))
        hpa = s.get("hpa", naming.hpa_name(group))
        assert hpa is not None and hpa["spec"]["minReplicas"] == 1, hpa  # a stock HPA: its floor is 1

        def committed() -> int:
            out = s.kompaktor("status", "--json", check=False)
            if out.returncode != 0:
                return 0
            return json.loads(out.stdout)["groups"].get(group, {}).get("compactions_committed", 0)

        s.kompaktor("table", "create", table)
        _import_versions(s, table, tmp_path, range(100))
        queued_at = time.monotonic()  # the coordinator queues the job within its next pass
        try:
            wait_until(lambda: committed() >= 1, "the first job committed by a woken compactor", timeout=300, every=1)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{diagnose(s)}") from None
        first_commit_s = time.monotonic() - queued_at
        print(f"0 -> 1: first job to first commit in {first_commit_s:.1f} s (group at 0 replicas, stock HPA)")
        # no work for the scale-down window: parked again, the last compactor drained, not killed
        try:
            wait_until(
                lambda: (g := s.get("compactorgroup", group)) and g["spec"].get("replicas") == 0,
                "the zero group parked at spec.replicas 0",
                timeout=180,
                every=1,
            )
            wait_until(lambda: not s.pods(naming.selector(group)), "the zero group's pods gone", timeout=180, every=1)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{diagnose(s)}") from None
        st = json.loads(s.kompaktor("status", "--json").stdout)
        assert st["groups"][group]["dead_compactions_recovered"] == 0, st["groups"][group]
        assert st["tables"][table]["files_per_tablet"]["max"] == 1, st["tables"][table]
    finally:
        s.kubectl("delete", "compactorgroup", group, "--wait=true", check=False)
        s.kubectl("delete", "compactionservice", "cs-zero", "--wait=true", check=False)


# -- 4. a lowered cap under steady load (issue 33 §2, §3) ------------------------------------------
STEADY = "steady"  # served by its own CompactionService, below


def test_a_lowered_cap_is_obeyed_under_steady_load(shipped: Shipped, tmp_path: Path) -> None:
    """Three compactor containers (Spark in each), imports arriving all along so the queue never
    empties, then maxReplicas 3 -> 1: the group is at one pod within the longest job + 30 s, every
    job seen running committed once (none interrupted, none retried), the scan exact, and no
    drained container restarted before its pod was deleted."""
    from kompaktor.files.sortedfile import write_sorted
    from kompaktor.files.storage import Storage
    from kompaktor.metadata.store import MetadataStore
    from tests.support.k8s import JobWatch

    s = shipped
    group = "steady"
    body = _group(
        group,
        minReplicas=1,
        maxReplicas=3,
        replicas=3,
        autoscaler="none",
        drainGraceSeconds=60,
        spark={"engine": "spark", "master": "local[1]", "driverMemory": "512m"},
        resources={"requests": {"cpu": "100m", "memory": "512Mi"}, "limits": {"memory": "1536Mi"}},
    )
    service = {
        "apiVersion": "kompaktor.io/v1alpha1",
        "kind": "CompactionService",
        "metadata": {"name": "cs-steady"},
        "spec": {"ratio": 2.0, "tiers": [{"name": "all", "compactorGroup": group}], "tables": [STEADY]},
    }
    s.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [service, body]}))
    store = MetadataStore.from_url(s.env["KOMPAKTOR_REDIS_URL"])
    rows = 2000
    s.kompaktor("table", "create", STEADY, "--splits", ",".join(f"row{r:05d}" for r in range(100, rows, 100)))
    local = Storage.from_uri(str(tmp_path))
    version = 0
    feeding = threading.Event()
    feeding.set()

    def feed() -> None:  # one import over all 20 tablets after another, as a steady ingest
        nonlocal version
        while feeding.is_set():
            write_sorted(local, f"v{version + 1}.parquet", entries(range(rows), version + 1))
            s.kompaktor("import", STEADY, str(tmp_path / f"v{version + 1}.parquet"))
            version += 1

    feeder = threading.Thread(target=feed, daemon=True)
    committed_before = store.bookkeeping.counters().get("compactions_committed", 0)
    feeder.start()
    watch = JobWatch(store, group)
    try:
        try:
            try:
                wait_until(
                    lambda: (
                        sum(1 for c in store.fleet.compactors(group) if c.ecid) == 3
                        and store.queues.stats(group).queued > 0
                    ),
                    "3 busy compactor containers and jobs queued",
                    timeout=400,
                    every=1,
                )
            except TimeoutError as exc:
                raise AssertionError(f"{exc}\n{diagnose(s)}") from None
            before = {p["metadata"]["name"] for p in s.pods(naming.selector(group))}
            restarts: dict[str, int] = {}

            def one_left() -> bool:
                pods = s.pods(naming.selector(group))
                for p in pods:  # a drained container the kubelet restarted would show here
                    for cs in (p.get("status") or {}).get("containerStatuses") or []:
                        name = p["metadata"]["name"]
                        restarts[name] = max(restarts.get(name, 0), cs.get("restartCount", 0))
                return len([p for p in pods if not p["metadata"].get("deletionTimestamp")]) == 1

            watch.window = True
            lowered = time.monotonic()
            s.kubectl("patch", "compactorgroup", group, "--type=merge", "-p", '{"spec": {"maxReplicas": 1}}')
            wait_until(one_left, "one compactor pod left", timeout=400, every=0.5)
            reached_s = time.monotonic() - lowered
            watch.window = False
            longest = watch.longest_job_s()
            print(f"\nreal node: cap 3 -> 1 under load: 1 pod after {reached_s:.1f} s (longest job {longest:.1f} s)")
            assert watch.queued_in_window and min(watch.queued_in_window) > 0, "the queue emptied: not under load"
            assert reached_s <= longest + 30
            (kept,) = [p for p in s.pods(naming.selector(group)) if not p["metadata"].get("deletionTimestamp")]
        finally:
            feeding.clear()
            feeder.join(120)
        wait_until(
            lambda: (
                (q := store.queues.stats(group)).queued == 0
                and q.running == 0
                and not any(t.running for t in store.tables.tablets(store.tables.table_id(STEADY)))
            ),
            "the rest of the work done by the one compactor",
            timeout=600,
            every=2,
        )
    finally:
        watch.close()
    out_file = tmp_path / "scan.parquet"
    s.kompaktor("scan", STEADY, "-o", str(out_file))
    import pyarrow.parquet as pq

    scanned = [(r["row"], r["value"]) for r in pq.read_table(out_file).to_pylist()]
    assert scanned == [(e.row, e.value) for e in entries(range(rows), version)]
    # every job seen running committed, once: an interrupted job would come back under a new ECID
    committed = store.bookkeeping.counters().get("compactions_committed", 0) - committed_before
    assert committed == len(watch.jobs), (committed, len(watch.jobs))
    st = json.loads(s.kompaktor("status", "--json").stdout)
    assert st["groups"][group]["dead_compactions_recovered"] == 0 and not st["dead_letters"], st
    assert kept["metadata"]["name"] in before
    assert not any(restarts.values()), restarts  # no drained container restarted before its pod went
    s.kubectl("delete", "compactorgroup", group)
    s.kubectl("delete", "compactionservice", "cs-steady")
    store.close()


# -- a step down by one on a server without pod-deletion-cost --------------------------------------------
def _replica_set_pods(s: Shipped, deployment: str) -> tuple[set[str], set[str]]:
    """The pods the group's ReplicaSets created and deleted, from their events."""
    created: set[str] = set()
    deleted: set[str] = set()
    for e in json.loads(s.kubectl("get", "events", "-o", "json").stdout)["items"]:
        obj = e.get("involvedObject") or {}
        if obj.get("kind") != "ReplicaSet" or not obj.get("name", "").startswith(f"{deployment}-"):
            continue
        pod = (e.get("message") or "").rsplit(" ", 1)[-1]
        {"SuccessfulCreate": created, "SuccessfulDelete": deleted}.get(e.get("reason"), set()).add(pod)
    return created, deleted


def test_a_step_down_by_one_stops_one_pod_and_starts_none(shipped: Shipped) -> None:
    """Kubernetes 1.20 ignores pod-deletion-cost: the HPA lowering a group 2 -> 1 with the queue
    empty must stop exactly the drained pod and start none (the ReplicaSet removes NotReady pods
    first, so the operator lowers the replicas only once its victim is NotReady)."""
    s, group = shipped, "step"
    dep = naming.deployment_name(group)
    body = _group(group, minReplicas=2, maxReplicas=2, behavior={"scaleDownStabilizationSeconds": 5})
    s.kubectl("apply", "-f", "-", input=json.dumps(body))
    try:

        def at(n: int) -> bool:
            pods = s.pods(naming.selector(group))
            d = s.get("deployment", dep) or {}
            return len(pods) == n and all(map(ready, pods)) and d.get("spec", {}).get("replicas") == n

        try:
            wait_until(lambda: at(2), "the step group at 2 Ready pods", timeout=180, every=1)
            before = {p["metadata"]["name"] for p in s.pods(naming.selector(group))}
            created_before, deleted_before = _replica_set_pods(s, dep)
            s.kubectl("patch", "compactorgroup", group, "--type=merge", "-p", '{"spec": {"minReplicas": 1}}')
            wait_until(lambda: at(1), "the step group at 1 pod", timeout=180, every=1)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{diagnose(s)}") from None
        created, deleted = _replica_set_pods(s, dep)
        started, stopped = created - created_before, deleted - deleted_before
        after = {p["metadata"]["name"] for p in s.pods(naming.selector(group))}
        assert not started, f"pods started by a step down: {started}"
        assert len(stopped) == 1 and stopped <= before and after == before - stopped, (before, stopped, after)
    finally:
        s.kubectl("delete", "compactorgroup", group, "--wait=true", check=False)


# -- 5. backup, and a new install from it (issue 35 §4) -------------------------------------------------
def _back_up(s: Shipped) -> str:
    """A backup of what the tests wrote, taken as the people running it would; returns the scan."""
    out = s.kompaktor("backup", "create")
    assert out.stdout.startswith("backup B"), out.stdout
    return s.kompaktor("scan", TABLE, timeout=300).stdout


def _lose_theredis_volume(core: Any, data: Path) -> None:
    """The Redis PersistentVolumeClaim deleted, its data gone (AOF and RDB): every Redis node lost."""
    core.delete_namespaced_persistent_volume_claim("data-kompaktor-redis-0", NS)
    core.delete_persistent_volume("kompaktor-redis-data")
    wait_until(
        lambda: not [v for v in core.list_persistent_volume().items if v.metadata.name == "kompaktor-redis-data"],
        "the Redis volume gone",
        timeout=60,
        every=1,
    )
    for f in data.iterdir():
        if f.is_dir():
            shutil.rmtree(f)
        else:
            f.unlink()
    redis_volume(core, data)


def _install_from_the_backup_and_scan(s: Shipped, core: Any, before: str) -> None:
    """`helm install` again with coordinator.backup.bootstrapFrom=latest: the scan is what it was."""
    with helm.Config(kubeconfig_path=str(s.cp.kubeconfig), namespace=NS) as cfg:
        cfg.install(
            str(CHART),
            RELEASE,
            {**readme_values(), "coordinator": {"backup": {"bootstrapFrom": "latest"}}},
            namespace=NS,
            timeout=120,
        )
    try:
        wait_ready(s)
        s.env["KOMPAKTOR_REDIS_URL"] = admin_url(core)
        wait_until(
            lambda: s.kompaktor("scan", TABLE, check=False).returncode == 0, "the table restored", timeout=120, every=2
        )
        assert s.kompaktor("scan", TABLE, timeout=300).stdout == before
    finally:
        _delete_and_uninstall_leave_no_container_running(s)


# -- 6. delete and uninstall leave nothing running ---------------------------------------------------
def _delete_and_uninstall_leave_no_container_running(s: Shipped) -> None:
    """The module's end, whichever tests ran and in whatever order (a test of its own would have to
    run last): `kubectl delete -f examples/` and `helm uninstall` leave no pod and no container."""
    s.kubectl("delete", "-f", str(ROOT / "examples"), "--wait=true", "--ignore-not-found")
    with helm.Config(kubeconfig_path=str(s.cp.kubeconfig), namespace=NS) as cfg:
        cfg.uninstall(RELEASE, timeout=120)
    wait_until(
        lambda: not json.loads(s.kubectl("get", "pods", "-o", "json").stdout)["items"],
        "every pod in the namespace gone",
        timeout=180,
        every=1,
    )
    wait_until(lambda: not running_containers(s.node), "no container running on the node", timeout=60, every=1)
