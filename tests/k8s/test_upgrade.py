"""`helm upgrade` from the previous release on the real node, with data in place, ingest running
and a merge in flight (docs/upgrading.md, "What `helm upgrade` does, tested").

The previous release's chart and images are built from its own tree (tests/support/releases.py,
:func:`tests.support.images.release_images`: its images carry its version) and installed in a
namespace of their own; a table with continuous ingest through the Python client, its own record
of every acknowledged write and delete (tests/k8s/upgrade_ingest.py) checked against a scan every
20 batches; compactions running, one of them held mid-upload by a proxy in front of S3 so that it
spans the upgrade. Then `helm upgrade` to this checkout's chart and images with the values file
(`-f values.yaml`), once more, the same release, with `--reuse-values`; and last the same release
rebuilt: images of different content under the same tags, deployed by their digests (the chart's
`*.image.digest` values), with another merge held mid-upload until the rollout has stopped the
compactor that held it, so that its job is redone by the new one.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes
import pytest
import yaml

from kompaktor import __version__, keyspace
from kompaktor.metadata.format import FORMAT_VERSION
from kompaktor.resources import api
from kompaktor_operator import naming
from tests.k8s.controlplane import ControlPlane, wait_until
from tests.k8s.node import GATEWAY, RealNode
from tests.k8s.shipped import BIN, BUCKET, RELEASE, Shipped, admin_url, diagnose, readme_values, ready, redis_volume
from tests.k8s.upgrade_ingest import SPLITS, Ingest, Reference, Verdict, row
from tests.support.images import Rebuilt
from tests.support.rawredis import raw_redis

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "kompaktor"
NS = "kompaktor-up"
VOLUME = "kompaktor-up-redis-data"
INGEST, SLOW = "up_ingest", "up_slow"  # served by the groups "up" and "slow"
SLOW_SECRET = "s3-slow"  # the slow group's S3 endpoint: the holding proxy


@dataclass
class Upgrade:
    s: Shipped
    old: str  # the previous release's version
    values_file: Path
    proxy: Any  # TcpProxy in front of S3 for the slow group
    store: Any
    client: Any
    commits: list[float] = field(default_factory=list)  # when the commit counter was seen to rise


def _storage_env(s3: Any) -> dict[str, str]:
    return {
        "AWS_ACCESS_KEY_ID": s3.access_key,
        "AWS_SECRET_ACCESS_KEY": s3.secret_key,
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": s3.endpoint,
    }


def _namespace(core: Any, s3: Any, proxy: Any, data: Path) -> None:
    core.create_namespace({"metadata": {"name": NS}})
    env = _storage_env(s3)
    core.create_namespaced_secret(NS, {"metadata": {"name": "s3-credentials"}, "stringData": env})
    slow = {**env, "AWS_ENDPOINT_URL": proxy.endpoint}
    core.create_namespaced_secret(NS, {"metadata": {"name": SLOW_SECRET}, "stringData": slow})
    os.chown(data, 999, 999)
    redis_volume(core, data, name=VOLUME, ns=NS)


def _values(cp: ControlPlane) -> dict[str, Any]:
    from tests.support.k8s import install_values

    values = readme_values()
    values["compactor"]["allowedSecrets"] = [SLOW_SECRET]
    return install_values(cp, values)


@pytest.fixture(scope="module")
def up(real_cluster: tuple[ControlPlane, RealNode], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upgrade]:
    from tests.support.images import release_images
    from tests.support.releases import checkout, previous
    from tests.support.s3server import S3Server
    from tests.support.tcpproxy import TcpProxy

    cp, node = real_cluster
    work = tmp_path_factory.mktemp("previous")
    old = previous()
    for archive in release_images(old, work / "images").values():
        node.containerd.import_image(archive)
    old_chart = checkout(old, work / "chart") / "helm" / "kompaktor"
    core = kubernetes.client.CoreV1Api(cp.api())
    s3 = S3Server(tmp_path_factory.mktemp("s3-up"), host=GATEWAY).start()
    proxy = TcpProxy((GATEWAY, s3.port), host=GATEWAY).start()
    try:
        s3.create_bucket(BUCKET)
        _namespace(core, s3, proxy, tmp_path_factory.mktemp("redis-up"))
        values_file = work / "values.yaml"
        values_file.write_text(yaml.safe_dump(_values(cp)))
        s = Shipped(cp, node, {}, s3, ns=NS)
        try:
            with helm.Config(kubeconfig_path=str(cp.kubeconfig), namespace=NS) as cfg:
                cfg.install(str(old_chart), RELEASE, yaml.safe_load(values_file.read_text()), namespace=NS, timeout=120)
            _wait_on_version(s, old.version)
            s.env = {**os.environ, **_storage_env(s3), "KOMPAKTOR_REDIS_URL": admin_url(core, NS)}
            s.env["KOMPAKTOR_STORAGE"] = f"s3://{BUCKET}/tables"
            with pytest.MonkeyPatch.context() as mp:
                for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_ENDPOINT_URL"):
                    mp.setenv(k, s.env[k])
                u = _connect(s, old.version, values_file, proxy)
                try:
                    yield u
                finally:
                    u.store.close()
        finally:
            _uninstall(s, core)
    finally:
        proxy.stop()
        s3.stop()


def _connect(s: Shipped, old: str, values_file: Path, proxy: Any) -> Upgrade:
    from kompaktor.client import Client
    from kompaktor.files.storage import Storage
    from kompaktor.metadata.store import MetadataStore

    store = MetadataStore.from_url(s.env["KOMPAKTOR_REDIS_URL"])
    client = Client(store, Storage.from_uri(s.env["KOMPAKTOR_STORAGE"]))
    return Upgrade(s, old, values_file, proxy, store, client)


def _uninstall(s: Shipped, core: Any) -> None:
    s.kubectl("delete", "compactorgroups,compactionservices", "--all", "--wait=true", check=False)
    with helm.Config(kubeconfig_path=str(s.cp.kubeconfig), namespace=NS) as cfg:
        cfg.uninstall(RELEASE, timeout=120, ignore_not_found=True)
    wait_until(lambda: not _pods_of(s), "every pod of the upgrade's namespace gone", timeout=180, every=1)
    core.delete_namespace(NS)
    core.delete_persistent_volume(VOLUME)


def _pods_of(s: Shipped) -> list[dict[str, Any]]:
    return list(json.loads(s.kubectl("get", "pods", "-o", "json").stdout)["items"])


def _tag(image: str) -> str:
    """An image reference's tag (``repo:tag`` or ``repo:tag@sha256:…``)."""
    return image.split("@", 1)[0].rsplit(":", 1)[1]


def _wait_on_version(s: Shipped, version: str) -> None:
    """The operator pod (operator + coordinator) and the bundled Redis pod of ``version``'s
    images Ready, and no other left (a rollout finished)."""

    def settled() -> bool:
        pods = s.pods(f"app.kubernetes.io/instance={RELEASE}")
        images = {_tag(c["image"]) for p in pods for c in p["spec"]["containers"]}
        kinds = {p["metadata"]["labels"].get("app.kubernetes.io/component") for p in pods}
        return len(pods) == 2 and kinds == {"operator", "redis"} and images == {version} and all(map(ready, pods))

    try:
        wait_until(settled, f"the operator and Redis pods of {version} Ready, alone", timeout=300, every=1)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{diagnose(s)}") from None


# -- the groups, the ingest and the merge held in flight ---------------------------------------------
def _group(name: str, **spec: Any) -> dict[str, Any]:
    base = {
        "minReplicas": 1,
        "maxReplicas": 1,
        "replicas": 1,
        "autoscaler": "none",
        "drainGraceSeconds": 10,
        "spark": {"engine": "arrow", "master": "local[1]"},
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}},
    }
    return {"apiVersion": api.GROUP_VERSION, "kind": "CompactorGroup", "metadata": {"name": name}, "spec": base | spec}


def _service(name: str, group: str, table: str) -> dict[str, Any]:
    spec = {"ratio": 2.0, "tiers": [{"name": "all", "compactorGroup": group}], "tables": [table]}
    return {"apiVersion": api.GROUP_VERSION, "kind": "CompactionService", "metadata": {"name": name}, "spec": spec}


def _apply_groups(u: Upgrade, *groups: dict[str, Any]) -> None:
    s = u.s
    s.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(groups)}))
    for g in (o["metadata"]["name"] for o in groups if o["kind"] == "CompactorGroup"):
        try:
            wait_until(
                lambda g=g: (p := s.pods(naming.selector(g))) and all(map(ready, p)),
                f"the {g} group's pod Ready",
                timeout=180,
                every=1,
            )
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{diagnose(s)}") from None


def _ingest(u: Upgrade) -> Ingest:
    u.s.kompaktor("table", "create", INGEST, "--splits", ",".join(SPLITS))
    return Ingest(
        lambda entries: u.client.flush(INGEST, entries),
        lambda: {e.row: e.value for e in u.client.scan(INGEST)},
    ).start()


def _hold_a_merge(u: Upgrade) -> None:
    """The slow table's one job reserved and its output's upload held in the proxy."""
    from tests.support.entries import entries

    u.proxy.hold_when(b"PUT ")
    u.s.kompaktor("table", "create", SLOW)
    for version in range(3):
        u.client.flush(SLOW, entries(range(200), version, prefix="s"))
    wait_until(u.proxy.held.is_set, "the slow merge's upload held by the proxy", timeout=180, every=0.5)
    busy = [c for c in u.store.fleet.compactors("slow") if c.ecid]
    assert busy, "the held upload is not a merge's"


def _watch_commits(u: Upgrade, stop: Any) -> None:
    last = -1
    while not stop.wait(0.2):
        try:
            n = u.store.bookkeeping.counters().get("compactions_committed", 0)
        except Exception:  # Redis restarting: the next sample is 0.2 s away
            continue
        if last >= 0 and n > last:
            u.commits.append(time.monotonic())
        last = n


def _longest_gap(times: list[float], start: float, end: float) -> float:
    inside = [start, *(t for t in times if start < t < end), end]
    return max(b - a for a, b in itertools.pairwise(inside))


# -- the upgrade ---------------------------------------------------------------------------------------
def _backup_by_the_previous_release(u: Upgrade, ingest: Ingest) -> tuple[str, Reference, int]:
    """A backup taken by the previous release's own code (in its coordinator container), with the
    ingest's record as it stood when the backup began and the first batch written after it."""
    pod = u.s.pods("app.kubernetes.io/component=operator")[0]["metadata"]["name"]
    with ingest.lock:
        before, first_later = ingest.ref.copy(), ingest.batches
    out = u.s.kubectl("exec", pod, "-c", "coordinator", "--", "kompaktor", "backup", "create")
    assert out.stdout.startswith("backup B"), out.stdout
    return out.stdout.split()[1].rstrip(":"), before, first_later


def _helm_upgrade(u: Upgrade, *, reuse_values: bool) -> float:
    """`helm upgrade` to this checkout's chart: `-f values.yaml`, or `--reuse-values`."""
    values = None if reuse_values else yaml.safe_load(u.values_file.read_text())
    t0 = time.monotonic()
    with helm.Config(kubeconfig_path=str(u.s.cp.kubeconfig), namespace=NS) as cfg:
        cfg.upgrade(str(CHART), RELEASE, values, namespace=NS, timeout=180, reuse_values=reuse_values)
    _wait_on_version(u.s, __version__)
    return time.monotonic() - t0


def _compactors_on(u: Upgrade, group: str, version: str) -> bool:
    dep = u.s.get("deployment", naming.deployment_name(group)) or {}
    images = [c["image"] for c in dep.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])]
    return bool(images) and all(_tag(i) == version for i in images)


def _compactors_on_ref(u: Upgrade, group: str, ref: str) -> bool:
    dep = u.s.get("deployment", naming.deployment_name(group)) or {}
    images = [c["image"] for c in dep.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])]
    return images == [ref]


def _pods(u: Upgrade) -> dict[str, int]:
    """Every pod of the namespace: uid -> restarts."""
    return {
        p["metadata"]["uid"]: sum(c.get("restartCount", 0) for c in p["status"].get("containerStatuses") or [])
        for p in _pods_of(u.s)
        if not p["metadata"].get("deletionTimestamp")
    }


def _all_on(u: Upgrade, version: str) -> bool:
    """Every pod of the namespace runs ``version``'s images and is Ready, none terminating (the
    compactor groups' rollouts finished)."""
    pods = _pods_of(u.s)
    tags = {_tag(c["image"]) for p in pods for c in p["spec"]["containers"]}
    return tags == {version} and all(map(ready, pods)) and not any(p["metadata"].get("deletionTimestamp") for p in pods)


def _work_done(u: Upgrade) -> bool:
    out = u.s.kompaktor("status", "--json", check=False)
    if out.returncode != 0:
        return False
    st = json.loads(out.stdout)
    groups = [st["groups"].get(g, {}) for g in ("up", "slow")]
    return all(g.get("queued") == 0 and g.get("running") == 0 for g in groups) and (
        st["tables"][SLOW]["files_per_tablet"]["max"] == 1
    )


def _kz(env: dict[str, str], *args: str) -> str:
    out = subprocess.run([str(BIN / "kompaktor"), *args], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"kompaktor {' '.join(args)}: {out.stderr}"
    return out.stdout


def _restores(u: Upgrade, backup: str, before: Reference, later: list[bytes], tmp: Path) -> Verdict:
    """The backup the previous release took, restored by this checkout's `kompaktor restore` into
    an empty redis-server on loopback, scanned there against the ingest's record when it began."""
    import pyarrow.parquet as pq

    from tests.conftest import RedisServer

    (tmp / "restore-redis").mkdir()
    server = RedisServer(tmp / "restore-redis")
    server.start()
    try:
        env = {**u.s.env, "KOMPAKTOR_REDIS_URL": server.url}
        _kz(env, "restore", backup)
        _kz(env, "scan", INGEST, "-o", str(tmp / "restored.parquet"))
        rows = {r["row"]: r["value"] for r in pq.read_table(tmp / "restored.parquet").to_pylist()}
        return before.check(rows, later)
    finally:
        server.stop()


def _later_rows(first: int, end: int) -> list[bytes]:
    """Rows a batch from ``first`` on wrote or deleted (a delete reaches 4 batches back)."""
    return [row(j, i) for i in range(max(0, first - 4), end) for j in range(len(SPLITS) + 1)]


def _setup(u: Upgrade) -> Ingest:
    """The previous release running a table under ingest and a merge held in flight."""
    _apply_groups(
        u,
        _service("cs-up", "up", INGEST),
        _service("cs-slow", "slow", SLOW),
        _group("up"),
        _group("slow", storage={"credentialsSecret": SLOW_SECRET}),
    )
    ingest = _ingest(u)
    wait_until(lambda: len(u.commits) >= 3 or None, "compactions committing under ingest", timeout=180, every=1)
    _hold_a_merge(u)
    return ingest


def _first_upgrade(u: Upgrade) -> tuple[float, float]:
    """0.2.0 -> this checkout with `-f values.yaml`; the held upload let go once the operator has
    moved the slow group to this checkout's compactor image. Returns (helm upgrade to settled
    seconds, longest seconds without a commit from the upgrade's start to the held merge done)."""
    start = time.monotonic()
    took = _helm_upgrade(u, reuse_values=False)
    wait_until(lambda: _compactors_on(u, "slow", __version__), "the slow group on this checkout's image", 180, 1)
    wait_until(lambda: _compactors_on(u, "up", __version__), "the up group on this checkout's image", 180, 1)
    u.proxy.release()
    wait_until(_slow_done(u), "the held merge's job done again", timeout=240, every=1)
    return took, _longest_gap(u.commits, start, time.monotonic())


def _slow_done(u: Upgrade) -> Any:
    tid = u.store.tables.table_id(SLOW)
    return lambda: all(len(t.files) == 1 and not t.running for t in u.store.tables.tablets(tid))


# -- the same release, rebuilt ---------------------------------------------------------------------
#: the chart value naming each image's digest, by the image's repository name
_DIGEST_VALUES = {"kompaktor-operator": "operator", "kompaktor-compactor": "compactor", "kompaktor-redis": "redis"}


def _rebuild(u: Upgrade, work: Path) -> dict[str, Rebuilt]:
    """This checkout's three images rebuilt with different content under the same tags, imported
    into the node (its tags now name the rebuilt images) together with the ``repository@digest``
    name a pull by digest records. Repository -> the rebuilt image."""
    from tests.support.images import rebuilt

    out = {}
    work.mkdir()
    for ref, archive in u.s.node.images.items():
        repo, _, tag = ref.rpartition(":")
        if tag != __version__:
            continue  # the node's pause image
        r = rebuilt(archive, work / f"{repo.rsplit('/', 1)[1]}.tar", stamp=f"{ref} {time.time_ns()}")
        u.s.node.containerd.import_image(r.archive)
        u.s.node.containerd.ctr("images", "tag", ref, f"{repo}@{r.digest}")
        out[repo] = r
    assert set(out) == {f"ghcr.io/kompaktor/{name}" for name in _DIGEST_VALUES}, out
    return out


def _runs_rebuilt(u: Upgrade, images: dict[str, Rebuilt]) -> bool:
    """Every pod of the namespace Ready, none terminating, and each of its containers running the
    rebuilt image of its repository (the image ID the kubelet reports)."""
    pods = _pods_of(u.s)
    if not pods or not all(map(ready, pods)) or any(p["metadata"].get("deletionTimestamp") for p in pods):
        return False
    for p in pods:
        for c in p["status"].get("containerStatuses") or []:
            r = images.get(c["image"].split("@", 1)[0].rpartition(":")[0])
            if r is None or not (c.get("imageID", "").endswith(r.digest) or c.get("imageID", "").endswith(r.image_id)):
                return False
    return True


#: a PUT of a table file (a merge's output), not of the write probe a compactor makes at start
TABLE_FILE_PUT = re.compile(rb"^PUT [^ ]*\.parquet[ ?]", re.MULTILINE)


def _hold_a_redo(u: Upgrade) -> dict[str, Any]:
    """Another merge of the slow table, every upload of its output held (the S3 client's retries
    too, so none lands): the slow group's one pod, busy with it."""
    from tests.support.entries import entries

    u.proxy.hold_when(TABLE_FILE_PUT, every=True)
    for version in (3, 4):
        u.client.flush(SLOW, entries(range(200), version, prefix="s"))
    wait_until(u.proxy.held.is_set, "the second slow merge's upload held by the proxy", timeout=180, every=0.5)
    pods = u.s.pods(naming.selector("slow"))
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    return pods[0]


def _running_on_slow(u: Upgrade) -> set[str]:
    tid = u.store.tables.table_id(SLOW)
    return {ecid for t in u.store.tables.tablets(tid) for ecid in t.running}


def _freeze_mid_job(u: Upgrade, pod: dict[str, Any]) -> str | None:
    """SIGSTOP the compactor processes of ``pod`` (not its init, tini) and return the ECID of the
    merge they hold; None (and the processes continued) when they were between two attempts. A
    stopped process sends nothing: the reservation it holds can end only by its death."""
    now = u.s.get("pod", pod["metadata"]["name"]) or {}
    assert now["metadata"]["uid"] == pod["metadata"]["uid"], "the slow pod was replaced before it was stopped"
    cid = now["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    out = u.s.node.containerd.ctr("tasks", "ps", cid).stdout
    pids = [int(line.split()[0]) for line in out.splitlines()[1:] if line.strip()]
    procs = [p for p in pids if Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")[0].rsplit(b"/")[-1] != b"tini"]
    assert procs, out
    for pid in procs:
        os.kill(pid, signal.SIGSTOP)
    running = _running_on_slow(u)
    mine = {c.ecid for c in u.store.fleet.compactors("slow") if c.ecid}
    if len(running) == 1 and running <= mine:
        return next(iter(running))
    for pid in procs:
        os.kill(pid, signal.SIGCONT)
    return None


def _rebuilt_upgrade(u: Upgrade, work: Path) -> tuple[float, float, str]:
    """The same release rebuilt, deployed with `-f values.yaml` plus the new digests, while a slow
    merge is held mid-upload. Once the operator has moved the slow group to the rebuilt image, the
    compactor holding the merge is stopped (SIGSTOP) mid-job, so that only the rollout ends it:
    its job must be re-queued and done once, by the new pod, after the hold is let go. Returns
    (seconds to every pod on the rebuilt images, longest seconds without a commit from the
    upgrade's start to the redone job done, the ECID the rollout cut short)."""
    old = _hold_a_redo(u)
    images = _rebuild(u, work)
    pods = _pods(u)
    _helm_upgrade(u, reuse_values=False)  # the same tags alone: nothing to roll, nothing rolls
    assert _pods(u) == pods, "an upgrade by tags alone replaced a pod"
    values = yaml.safe_load(u.values_file.read_text())
    for repo, r in images.items():
        values.setdefault(_DIGEST_VALUES[repo.rsplit("/", 1)[1]], {}).setdefault("image", {})["digest"] = r.digest
    start = time.monotonic()
    with helm.Config(kubeconfig_path=str(u.s.cp.kubeconfig), namespace=NS) as cfg:
        cfg.upgrade(str(CHART), RELEASE, values, namespace=NS, timeout=180)
    compactor = images["ghcr.io/kompaktor/kompaktor-compactor"]
    pinned = f"{compactor.ref}@{compactor.digest}"
    wait_until(lambda: _compactors_on_ref(u, "slow", pinned), "the slow group on the rebuilt image", 180, 1)
    held = wait_until(lambda: _freeze_mid_job(u, old), "the old slow compactor stopped mid-job", 180, 1)
    gone = lambda: old["metadata"]["uid"] not in {p["metadata"]["uid"] for p in _pods_of(u.s)}  # noqa: E731
    try:
        wait_until(gone, "the stopped pod removed by the rollout", 300, 1)
        # let go at once: the new pod that takes the re-queued job must not sit on a held upload
        # (long enough, its liveness probe fails and the kubelet restarts it)
        u.proxy.release()
        wait_until(lambda: _runs_rebuilt(u, images), "every pod on the rebuilt images, Ready", 300, 1)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{diagnose(u.s)}") from None
    took = time.monotonic() - start
    wait_until(_slow_done(u), "the cut-short job redone", timeout=240, every=1)
    return took, _longest_gap(u.commits, start, time.monotonic()), held


def _slow_rows(u: Upgrade) -> dict[bytes, bytes]:
    return {e.row: e.value for e in u.client.scan(SLOW)}


@pytest.mark.timeout(1500)
def test_helm_upgrade_from_the_previous_release_then_the_same_release_again(up: Upgrade, tmp_path: Path) -> None:

    from tests.support.k8s import JobWatch

    u, stop = up, threading.Event()
    watcher = threading.Thread(target=_watch_commits, args=(u, stop), daemon=True)
    watcher.start()
    watches = [JobWatch(u.store, g) for g in ("up", "slow")]
    try:
        ingest = _setup(u)
        backup, before, first_later = _backup_by_the_previous_release(u, ingest)
        took1, gap1 = _first_upgrade(u)
        assert ingest.verify().clean, ingest.verdicts[-1]
        wait_until(lambda: _all_on(u, __version__), "every pod on this checkout's images, Ready", 240, 1)
        pods = _pods(u)
        start2 = time.monotonic()
        took2 = _helm_upgrade(u, reuse_values=True)
        gap2 = _longest_gap(u.commits, start2, time.monotonic())
        assert _pods(u) == pods, "the same release again replaced or restarted a pod"
        took3, gap3, cut_short = _rebuilt_upgrade(u, tmp_path / "rebuilt")
        ingest.stop()
        wait_until(lambda: _work_done(u), "the queued work done", timeout=300, every=2)
    finally:
        stop.set()
        for w in watches:
            w.close()
    final = ingest.verify()
    log = u.store.bookkeeping.commit_log()
    seen = {e for w in watches for e in w.jobs}
    redone = len(seen - set(log))
    from tests.support.entries import entries

    newest = {e.row: e.value for e in entries(range(200), 4, prefix="s")}
    restored = _restores(u, backup, before, _later_rows(first_later, ingest.batches), tmp_path)
    from tests.support.k8s import FIGURES

    FIGURES.append(
        f"upgrade {u.old} -> {__version__} (-f values.yaml): settled in {took1:.1f} s, "
        f"{gap1:.1f} s without a commit; again (--reuse-values): {took2:.1f} s, {gap2:.1f} s without a commit; "
        f"rebuilt (digests): every pod on the new images in {took3:.1f} s, {gap3:.1f} s without a commit; "
        f"batches {ingest.batches}, unsure {len(ingest.ref.unsure)} rows, errors {len(ingest.errors)}; "
        f"commits {len(log)}, jobs redone {redone}, writes lost {len(final.lost)}, "
        f"resurrected {len(final.resurrected)}"
    )
    assert final.clean, final
    assert all(v.clean for v in ingest.verdicts), [v for v in ingest.verdicts if not v.clean]
    assert len(log) == len(set(log)), "a compaction committed twice"
    assert cut_short in seen and cut_short not in log, "the job the rebuilt rollout cut short was not redone"
    assert _slow_rows(u) == newest, "the redone merge's table does not read as its newest flush"
    assert restored.clean, restored
    assert raw_redis(u.store).hget(keyspace.FORMAT, "version") == str(FORMAT_VERSION).encode()
    _new_crs_reconcile(u)
    assert not any(_pods(u).values()), "a container restarted (crash loop)"


def _new_crs_reconcile(u: Upgrade) -> None:
    """A CompactorGroup created after the upgrade gets its pod."""
    _apply_groups(u, _group("fresh"))
    u.s.kubectl("delete", "compactorgroup", "fresh", "--wait=true")
