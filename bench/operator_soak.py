"""`python -m bench.operator_soak --minutes N`: the operator for an hour on the real control plane (issue 24).

The control plane of the k8s test tier (etcd + kube-apiserver + kube-controller-manager 1.20 on
loopback, tests/k8s/controlplane.py), the chart installed with Helm, a redis-server, the operator
and the coordinator as long-lived local processes (the operator under the chart's ServiceAccount
token, serving ``kompaktor_queue_depth`` to the real HPA controller), and the node agent of the
test tier for the pods: the pods of the two work groups (``w0``, ``w1``) run real ``kompaktor
compactor`` processes (Arrow), every other pod is marked Running and Ready without a process.

For the whole run, on a seeded schedule: churn groups are created, updated (resources, min/max
replicas, jobs per replica, an allowed Spark setting, the engine, the autoscaler kind), scaled
(``kubectl scale``), deleted and re-created under the same names; the work groups are updated now
and then (their pods roll); Compaction CRs (user compactions) are created and deleted, finished or
not; a CompactionService's ratio changes now and then; ingest into three tables comes in bursts
(flushes and bulk imports, then a quiet spell) so the work groups' queues rise and fall and the HPA
scales them up and down.

Every ``--sample`` seconds: RSS, open fds and threads of the operator, the coordinator, Redis and
the control plane's processes (bench.soak's sampling), the apiserver's object counts of the
project's kinds and of their children, and Redis' group/service/user-compaction entries:
``bench/out/operator-soak.csv`` and ``operator-soak.png``.

At the end every CR is deleted and nothing may be left behind: no child Deployment, ReplicaSet,
pod, Service, HPA or NetworkPolicy of a deleted group, no kz:groups / kz:services entry, every
user compaction requested done or cancelled. One line that scripts rely on:

    operator-soak: verified=yes|no minutes=N groups_created=N group_updates=N group_deletes=N
    compactions_requested=N hpa_scale_changes=N rss_growth_pct=X fd_growth=N thread_growth=N leftover_objects=N

Growth (``rss_growth_pct``, ``fd_growth``, ``thread_growth``: the operator's) is measured from the
end of the warm-up (minute 10, or a third of a shorter run) to the end. Exits non-zero when the
verification fails or the operator or the coordinator grew beyond the limits (RSS > 10 %, fds > 5).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import csv
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import OUT, ROOT, start_redis
from bench.soak import plot_processes, sample_processes
from kompaktor.resources import api
from kompaktor_operator import naming
from tests.support.growth import FD_LIMIT, RSS_LIMIT_PCT, Sample, growth
from tests.support.rawredis import raw_redis

NS = "kompaktor"
RELEASE = "kompaktor"
REDIS_SECRET = "kompaktor-redis-url"
BIN = Path(sys.executable).parent
#: groups whose pods run real compactors, and the tables each one serves
WORK_TABLES = {"w0": ["t0", "t1"], "w1": ["t2"]}
CHURN_NAMES = [f"c{i}" for i in range(6)]
MAX_CHURN_LIVE = 4
MANAGED = "app.kubernetes.io/managed-by=kompaktor-operator"
COMPACTOR_PODS = "app.kubernetes.io/component=compactor"
#: the project's processes, held to the limits (the control plane's and Redis' are reported)
LIMITED = ("operator", "coordinator")


def churn_spec(rng: random.Random) -> dict[str, Any]:
    """A churn group's spec: no table is served by it, so the HPA (when it has one) holds it at
    minReplicas; its pods are marked Ready without a process."""
    low = rng.randint(1, 2)
    return {
        "minReplicas": low,
        "maxReplicas": rng.randint(low, 4),
        "jobsPerReplica": rng.randint(1, 4),
        "autoscaler": rng.choice(["hpa", "none"]),
        "behavior": {"scaleDownStabilizationSeconds": 15},
        "drainGraceSeconds": 10,
        "spark": {
            "engine": rng.choice(["arrow", "spark"]),
            "master": "local[1]",
            "conf": {"spark.default.parallelism": str(rng.choice([1, 2, 4]))},
        },
        "resources": {"requests": {"cpu": f"{rng.choice([100, 200, 500])}m", "memory": f"{rng.choice([256, 512])}Mi"}},
    }


def churn_update(rng: random.Random, spec: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """One change to a churn group: (what, merge patch of its spec). ``spec`` is updated too."""
    what = rng.choice(["resources", "replicas-bounds", "jobs-per-replica", "spark-conf", "engine", "autoscaler"])
    if what == "resources":
        patch = {"resources": {"requests": {"cpu": f"{rng.choice([100, 200, 300, 500])}m"}}}
    elif what == "replicas-bounds":
        low = rng.randint(1, 2)
        patch = {"minReplicas": low, "maxReplicas": rng.randint(low, 4)}
    elif what == "jobs-per-replica":
        patch = {"jobsPerReplica": rng.randint(1, 4)}
    elif what == "spark-conf":
        patch = {"spark": {"conf": {"spark.default.parallelism": str(rng.choice([1, 2, 4, 8]))}}}
    elif what == "engine":
        patch = {"spark": {"engine": "spark" if spec["spark"]["engine"] == "arrow" else "arrow"}}
    else:
        patch = {"autoscaler": "none" if spec["autoscaler"] == "hpa" else "hpa"}
    _merge(spec, patch)
    return what, patch


def _merge(into: dict[str, Any], patch: dict[str, Any]) -> None:
    for k, v in patch.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


class OperatorSoak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.root = Path(tempfile.mkdtemp(prefix="kompaktor-operator-soak-"))
        self.stop = threading.Event()
        self.started = 0.0
        self.warm = min(10.0, args.minutes / 3)
        self.samples: list[Sample] = []
        self.rows: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.counts: Counter = Counter()  # what the churn did, by kind
        self.procs: dict[str, subprocess.Popen] = {}
        self.pids: dict[str, int] = {}  # role -> PID of every long-lived process sampled
        self.churn: dict[str, dict[str, Any]] = {}  # live churn group -> its spec
        self.compactions: dict[str, float] = {}  # live Compaction CR -> when created
        self.requested: dict[str, str] = {}  # Compaction CR -> its user compaction id
        self.compaction_seq = 0
        self.fresh_seq = 0
        self.used_names: set[str] = set()  # churn group names created at least once
        self.depth_max: dict[str, int] = {}  # work group -> most jobs queued + running seen
        self.scale_times: dict[str, set[str]] = {}  # HPA uid -> lastScaleTime values seen
        self.hpa_group: dict[str, str] = {}  # HPA uid -> group
        self.work_replicas: list[tuple[float, str, int]] = []  # (minute, group, Deployment replicas) on change

    def minutes(self) -> float:
        return (time.monotonic() - self.started) / 60 if self.started else 0.0

    # -- kubectl -----------------------------------------------------------------------------------
    def kubectl(self, *args: str, input: str | None = None, what: str = "") -> bool:
        out = self.cp.kubectl("-n", NS, *args, check=False, input=input)
        if out.returncode != 0:
            self.errors.append(f"{what or ' '.join(args[:3])}: {out.stderr.strip()[:300]}")
            return False
        return True

    def apply(self, kind: str, name: str, spec: dict[str, Any]) -> bool:
        body = {"apiVersion": api.GROUP_VERSION, "kind": kind, "metadata": {"name": name}, "spec": spec}
        return self.kubectl("apply", "-f", "-", input=json.dumps(body), what=f"apply {kind} {name}")

    def patch(self, plural: str, name: str, spec: dict[str, Any]) -> bool:
        return self.kubectl(
            "patch", plural, name, "--type=merge", "-p", json.dumps({"spec": spec}), what=f"patch {plural} {name}"
        )

    def get(self, plural: str, name: str) -> dict[str, Any] | None:
        with contextlib.suppress(Exception):
            return self.custom.get_namespaced_custom_object(api.GROUP, api.VERSION, NS, plural, name)
        return None

    # -- setup -------------------------------------------------------------------------------------
    def start(self) -> None:
        import helm_python as helm
        import kubernetes

        from kompaktor.client import Client
        from kompaktor.files.storage import Storage
        from kompaktor.metadata.store import MetadataStore
        from tests.k8s.controlplane import ControlPlane, wait_until  # the test suite's control plane
        from tests.k8s.nodeagent import NodeAgent
        from tests.support.k8s import container_env
        from tests.support.ports import free_port

        self.redis = start_redis()
        self.pids["redis-server"] = self.redis.proc.pid
        self.cp = ControlPlane(self.root / "k8s", hpa_sync_s=5)
        self.cp.start()
        for p in self.cp.processes:
            self.pids[p.name] = p.popen.pid
        print(f"control plane {self.cp.version} up in {self.cp.started_in_s:.1f} s", flush=True)
        kapi = self.cp.api()
        self.core = kubernetes.client.CoreV1Api(kapi)
        self.apps = kubernetes.client.AppsV1Api(kapi)
        self.hpas = kubernetes.client.AutoscalingV1Api(kapi)
        self.netpol = kubernetes.client.NetworkingV1Api(kapi)
        self.custom = kubernetes.client.CustomObjectsApi(kapi)
        pythonpath = f"{ROOT / 'compactor'}{os.pathsep}{ROOT / 'operator'}"
        path = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
        (self.root / "pods").mkdir()
        self.agent = NodeAgent(
            kapi,
            mode=lambda pod: "run" if (pod.metadata.labels or {}).get(naming.GROUP_LABEL) in WORK_TABLES else "fake",
            env={"PATH": path, "PYTHONPATH": pythonpath, "KOMPAKTOR_LOG": "WARNING"},
            log_dir=self.root / "pods",
        ).start()
        self.core.create_namespace({"metadata": {"name": NS}})
        self.core.create_namespaced_secret(
            NS, {"metadata": {"name": REDIS_SECRET}, "stringData": {"url": self.redis.url}}
        )
        storage_dir = self.root / "files"
        with helm.Config(kubeconfig_path=str(self.cp.kubeconfig), namespace=NS) as cfg:
            cfg.install(
                str(ROOT / "helm" / "kompaktor"),
                RELEASE,
                {
                    "redis": {"bundled": False, "external": {"existingSecret": REDIS_SECRET}},
                    "storage": {"uri": str(storage_dir)},
                    "metricsApi": {"serviceType": "NodePort"},
                },
                namespace=NS,
                timeout=120,
            )
        svc = self.core.read_namespaced_service(f"{RELEASE}-metrics-api", NS)
        tls = self.core.read_namespaced_secret(f"{RELEASE}-metrics-api-tls", NS)
        for key in ("tls.crt", "tls.key", "ca.crt"):
            (self.root / key).write_bytes(base64.b64decode(tls.data[key]))
        env = {
            **os.environ,
            **container_env(self.cp, self.core, NS, f"{RELEASE}-operator", "operator"),
            "KUBECONFIG": str(self.cp.service_account_kubeconfig(NS, f"{RELEASE}-operator")),
            "KOMPAKTOR_SCALE_INTERVAL": "1",
            "KOMPAKTOR_STATUS_INTERVAL": "2",
            "KOMPAKTOR_METRICS_API": f"{svc.spec.cluster_ip}:443",
            "KOMPAKTOR_METRICS_API_CERT": str(self.root / "tls.crt"),
            "KOMPAKTOR_METRICS_API_KEY": str(self.root / "tls.key"),
            "KOMPAKTOR_METRICS_API_CA": str(self.root / "ca.crt"),
            "KOMPAKTOR_OPERATOR_METRICS_HOST": "127.0.0.1",
            "PATH": path,
            "PYTHONPATH": pythonpath,
        }
        argv = {
            "operator": ["operator", "--liveness", "", "--metrics-port", str(free_port())],
            "coordinator": ["coordinator", "--metrics-port", str(free_port()), "--full-scan-interval", "5"],
        }
        for role, args in argv.items():
            with open(self.root / f"{role}.log", "wb") as out:
                p = subprocess.Popen(
                    [str(BIN / "kompaktor"), *args],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            self.procs[role] = p
            self.pids[role] = p.pid
        self.wait_until = wait_until
        wait_until(
            lambda: any(
                c["type"] == "Available" and c["status"] == "True"
                for c in json.loads(
                    self.cp.kubectl("get", "apiservice", "v1beta1.external.metrics.k8s.io", "-o", "json").stdout
                )["status"].get("conditions", [])
            ),
            "the external metrics APIService Available",
            timeout=120,
        )
        self.store = MetadataStore.from_url(self.redis.url)
        self.client = Client(self.store, Storage.from_uri(str(storage_dir)))

    def setup_workload(self) -> None:
        from kompaktor.local.ingest import ContinuousIngest, split_points

        for group, tables in WORK_TABLES.items():
            self.apply(
                "CompactionService",
                f"svc-{group}",
                {"ratio": 2.0, "tiers": [{"name": "all", "compactorGroup": group}], "tables": tables},
            )
            self.apply(
                "CompactorGroup",
                group,
                {
                    "minReplicas": 1,
                    "maxReplicas": 3,
                    "jobsPerReplica": 2,
                    "autoscaler": "hpa",
                    "behavior": {"scaleDownStabilizationSeconds": 15},
                    "drainGraceSeconds": 20,
                    "spark": {"engine": "arrow", "master": "local[1]"},
                },
            )
            self.counts["groups created"] += 1
        self.ingests = {}
        for i, table in enumerate(t for ts in WORK_TABLES.values() for t in ts):
            self.store.tables.create_table(table, split_points(self.args.tablets))
            self.ingests[table] = ContinuousIngest(self.client, table, seed=self.args.seed + i, batch=500)
        for group in WORK_TABLES:
            self.wait_until(
                lambda g=group: (
                    (self.apps.read_namespaced_deployment(f"kompaktor-{g}", NS).status.ready_replicas or 0) >= 1
                ),
                f"{group}'s first compactor Ready",
                timeout=120,
            )

    # -- the workload ------------------------------------------------------------------------------
    def _ingest(self) -> None:
        """Bursts: a bulk import into every table, then flushes every --flush-interval seconds for
        a minute or two; then a quiet spell of one to three minutes (the queues drain, the HPA
        scales down)."""
        rng = random.Random(self.args.seed + 1)
        while not self.stop.is_set():
            try:
                for ing in self.ingests.values():
                    ing.import_burst(6000, 3, self.root / "imports")
                self.counts["ingest bursts"] += 1
                busy_until = time.monotonic() + rng.uniform(60, 120)
                while time.monotonic() < busy_until and not self.stop.is_set():
                    for ing in self.ingests.values():
                        ing.flush_once()
                    self.stop.wait(self.args.flush_interval)
            except Exception as exc:
                self.errors.append(f"ingest: {exc!r}")
                return
            self.stop.wait(rng.uniform(60, 180))

    def _churn(self) -> None:
        rng = random.Random(self.args.seed + 2)
        # the first churn groups
        for name in CHURN_NAMES[:2]:
            self._create_churn(rng, name)
        while not self.stop.wait(rng.uniform(0.5, 1.5) * self.args.churn_interval):
            ops = ["create", "update", "update", "scale", "delete", "compaction", "compaction-delete"]
            ops += ["work-update", "service-update"] if rng.random() < 0.3 else []
            op = rng.choice(ops)
            try:
                self._one(rng, op)
            except Exception as exc:
                self.errors.append(f"churn {op}: {exc!r}")

    def _create_churn(self, rng: random.Random, name: str) -> None:
        spec = churn_spec(rng)
        if self.apply("CompactorGroup", name, spec):
            self.churn[name] = spec
            self.counts["groups created"] += 1
            self.counts["groups re-created"] += name in self.used_names
            self.used_names.add(name)

    def _one(self, rng: random.Random, op: str) -> None:
        live = sorted(self.churn)
        if op == "create" or (op == "delete" and len(live) <= 1):
            if len(live) >= MAX_CHURN_LIVE:
                op = "delete"
            else:
                # half the time a name of a small pool, not live and whose last CR is gone (its
                # finalizer ran): a re-creation when it was used before; else a name never used
                # (state kept per name would grow with these)
                free = [n for n in CHURN_NAMES if n not in self.churn and self.get(api.GROUPS, n) is None]
                if free and rng.random() < 0.5:
                    self._create_churn(rng, rng.choice(free))
                else:
                    self.fresh_seq += 1
                    self._create_churn(rng, f"g{self.fresh_seq}")
                return
        if op == "delete":
            name = rng.choice(live)
            if self.kubectl("delete", "compactorgroup", name, "--wait=false"):
                del self.churn[name]
                self.counts["group deletes"] += 1
        elif op == "update" and live:
            name = rng.choice(live)
            what, patch = churn_update(rng, self.churn[name])
            if self.patch(api.GROUPS, name, patch):
                self.counts["group updates"] += 1
                self.counts[f"update {what}"] += 1
        elif op == "scale" and live:
            name = rng.choice(live)
            spec = self.churn[name]
            n = rng.randint(spec["minReplicas"], spec["maxReplicas"])
            if self.kubectl("scale", "compactorgroup", name, f"--replicas={n}"):
                self.counts["group updates"] += 1
                self.counts["update scale"] += 1
        elif op == "work-update":
            group = rng.choice(sorted(WORK_TABLES))
            what = rng.choice(["resources", "spark-conf", "max-replicas", "jobs-per-replica"])
            patch: dict[str, Any]
            if what == "resources":
                patch = {"resources": {"requests": {"cpu": f"{rng.choice([100, 200, 300])}m"}}}
            elif what == "spark-conf":
                patch = {"spark": {"conf": {"spark.default.parallelism": str(rng.choice([1, 2, 4]))}}}
            elif what == "max-replicas":
                patch = {"maxReplicas": rng.choice([2, 3])}
            else:
                patch = {"jobsPerReplica": rng.choice([1, 2, 3])}
            if self.patch(api.GROUPS, group, patch):
                self.counts["group updates"] += 1
                self.counts[f"update work {what}"] += 1
        elif op == "service-update":
            group = rng.choice(sorted(WORK_TABLES))
            if self.patch(api.SERVICES, f"svc-{group}", {"ratio": rng.choice([2.0, 2.5, 3.0])}):
                self.counts["service updates"] += 1
        elif op == "compaction" and len(self.compactions) < 3:
            self.compaction_seq += 1
            name = f"uc-{self.compaction_seq}"
            table = rng.choice([t for ts in WORK_TABLES.values() for t in ts])
            if self.apply("Compaction", name, {"table": table}):
                self.compactions[name] = time.monotonic()
                self.counts["compactions requested"] += 1
                early = rng.random()
                if early < 0.15:  # deleted at once, before the operator may have started it
                    self._delete_compaction(name)
                elif early < 0.5:  # deleted once started, most likely still running: cancelled
                    with contextlib.suppress(TimeoutError):
                        self.wait_until(
                            lambda: ((self.get(api.COMPACTIONS, name) or {}).get("status") or {}).get("compactionId"),
                            f"{name} started",
                            timeout=15,
                            every=0.5,
                        )
                    self._delete_compaction(name)
        elif op == "compaction-delete":
            old = [n for n, t in self.compactions.items() if time.monotonic() - t > 30]
            if old:
                self._delete_compaction(rng.choice(sorted(old)))

    def _delete_compaction(self, name: str) -> None:
        self._record_cid(name)
        if self.kubectl("delete", "compaction", name, "--wait=false"):
            del self.compactions[name]
            self.counts["compaction deletes"] += 1

    def _record_cid(self, name: str) -> None:
        obj = self.get(api.COMPACTIONS, name) or {}
        status = obj.get("status") or {}
        if status.get("compactionId"):
            self.requested[name] = status["compactionId"]
            self.counts[f"compaction phase at delete {status.get('phase')}"] += 1
        else:
            self.counts["compaction deleted before it started"] += 1

    def _watch_hpas(self) -> None:
        """The HPA controller's scale changes: each distinct status.lastScaleTime of an HPA; and
        the work groups' Deployment replicas whenever they change."""
        last: dict[str, int] = {}
        while not self.stop.wait(2.0):
            with contextlib.suppress(Exception):
                for h in self.hpas.list_namespaced_horizontal_pod_autoscaler(NS).items:
                    uid = h.metadata.uid
                    self.hpa_group[uid] = h.spec.scale_target_ref.name
                    if h.status and h.status.last_scale_time:
                        self.scale_times.setdefault(uid, set()).add(h.status.last_scale_time.isoformat())
                for group in WORK_TABLES:
                    st = self.store.queues.stats(group)
                    self.depth_max[group] = max(self.depth_max.get(group, 0), st.queued + st.running)
                    d = self.apps.read_namespaced_deployment(f"kompaktor-{group}", NS)
                    if last.get(group) != d.spec.replicas:
                        last[group] = d.spec.replicas
                        self.work_replicas.append((round(self.minutes(), 2), group, d.spec.replicas))

    def hpa_scale_changes(self, groups: tuple[str, ...] | None = None) -> int:
        return sum(len(v) for uid, v in self.scale_times.items() if groups is None or self.hpa_group[uid] in groups)

    # -- sampling ----------------------------------------------------------------------------------
    def objects(self) -> dict[str, int]:
        from kompaktor import keyspace as K

        out: dict[str, int] = {}
        for plural in (api.GROUPS, api.SERVICES, api.COMPACTIONS):
            got = self.custom.list_namespaced_custom_object(api.GROUP, api.VERSION, NS, plural)
            out[plural] = len(got["items"])
        out["deployments"] = len(self.apps.list_namespaced_deployment(NS, label_selector=MANAGED).items)
        out["replicasets"] = len(self.apps.list_namespaced_replica_set(NS, label_selector=COMPACTOR_PODS).items)
        out["pods"] = len(self.core.list_namespaced_pod(NS, label_selector=COMPACTOR_PODS).items)
        out["services"] = len(self.core.list_namespaced_service(NS, label_selector=MANAGED).items)
        out["hpas"] = len(self.hpas.list_namespaced_horizontal_pod_autoscaler(NS, label_selector=MANAGED).items)
        out["networkpolicies"] = len(self.netpol.list_namespaced_network_policy(NS, label_selector=MANAGED).items)
        out["events"] = len(self.core.list_namespaced_event(NS).items)
        out.update(self.etcd_figures())
        r = raw_redis(self.store)
        out["redis_groups"] = self.store.call(r.hlen, K.GROUPS)
        out["redis_services"] = self.store.call(r.hlen, K.SERVICES)
        out["redis_ucomps"] = self.store.call(r.scard, K.UCOMPS)
        return out

    def etcd_figures(self) -> dict[str, float]:
        """etcd's database size, keys and puts so far (its /metrics): what the apiserver stores."""
        import urllib.request

        argv = list(self.cp.processes[0].popen.args)
        url = argv[argv.index("--listen-client-urls") + 1]
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
            text = r.read().decode()
        wanted = {
            "etcd_mvcc_db_total_size_in_bytes": "etcd_db_mb",
            "etcd_debugging_mvcc_keys_total": "etcd_keys",
            "etcd_debugging_mvcc_put_total": "etcd_puts",
            "etcd_mvcc_put_total": "etcd_puts",
        }
        out: dict[str, float] = {}
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name in wanted:
                v = float(value)
                out[wanted[name]] = round(v / 2**20, 2) if name.endswith("_bytes") else int(v)
        return out

    def sample(self) -> None:
        m = round(self.minutes(), 2)
        procs = {f"{role}:{pid}": pid for role, pid in self.pids.items()}
        got = sample_processes(procs, m)
        self.samples.extend(got)
        row: dict[str, Any] = {"minute": m}
        for s in got:
            role = s.role.rsplit(":", 1)[0]
            row.update({f"{role}_rss_mb": s.rss_mb, f"{role}_fds": s.fds, f"{role}_threads": s.threads})
        try:
            row.update(self.objects())
        except Exception as exc:
            row["error"] = type(exc).__name__
        with contextlib.suppress(Exception):
            for group in WORK_TABLES:
                st = self.store.queues.stats(group)
                row[f"{group}_queued"], row[f"{group}_running"] = st.queued, st.running
                row[f"{group}_replicas"] = self.apps.read_namespaced_deployment(f"kompaktor-{group}", NS).spec.replicas
            row["compactions_committed"] = int(self.store.bookkeeping.counters().get("compactions_committed", 0))
        row["hpa_scale_changes"] = self.hpa_scale_changes()
        row["compactor_processes"] = sum(1 for r in self.agent.records if r.stopped is None)
        self.rows.append(row)

    def _sampler(self) -> None:
        while not self.stop.wait(self.args.sample):
            self.sample()
            self.write_csv()  # as it goes: a long run can be watched

    # -- the end -----------------------------------------------------------------------------------
    def leftovers(self) -> dict[str, int]:
        """Everything a deleted CR may leave: its children, pods, Redis entries; requested user
        compactions that are neither done nor cancelled."""
        from kompaktor.metadata import user_compactions as uc

        got = self.objects()
        out = {
            k: got[k]
            for k in (
                api.GROUPS,
                api.SERVICES,
                api.COMPACTIONS,
                "deployments",
                "replicasets",
                "pods",
                "services",
                "hpas",
                "networkpolicies",
                "redis_groups",
                "redis_services",
            )
        }
        out["compactions running"] = sum(1 for c in uc.all_compactions(self.store) if c.state == uc.RUNNING)
        return out

    def finish(self) -> int:
        from kompaktor.metadata import user_compactions as uc

        self.sample()
        alive = {role: p.poll() is None for role, p in self.procs.items()}
        # every CR deleted, as a user would: kubectl delete --all
        for name in list(self.compactions):
            self._record_cid(name)
        self.counts["group deletes"] += len(
            self.custom.list_namespaced_custom_object(api.GROUP, api.VERSION, NS, api.GROUPS)["items"]
        )
        for plural in (api.COMPACTIONS, api.GROUPS, api.SERVICES):
            self.kubectl("delete", plural, "--all", "--timeout=180s")
        try:
            self.wait_until(lambda: not any(self.leftovers().values()), "nothing left behind", timeout=180, every=2)
        except TimeoutError:
            pass
        left = self.leftovers()
        states = Counter()
        for cid in self.requested.values():
            with contextlib.suppress(Exception):
                states[uc.get(self.store, cid).state] += 1
        unfinished = sum(n for s, n in states.items() if s not in (uc.SUCCEEDED, uc.CANCELLED))
        time.sleep(min(60.0, self.args.sample))  # the operator settles after the deletions
        self.sample()
        rss, fds, threads = growth(self.samples, self.warm)
        over = [
            f"{role} rss {rss[role]:+.1f}% fds {fds[role]:+d}"
            for role in LIMITED
            if role in rss and (rss[role] > RSS_LIMIT_PCT or fds[role] > FD_LIMIT)
        ]
        leftover_objects = sum(left.values())
        verified = not self.errors and all(alive.values()) and leftover_objects == 0 and unfinished == 0
        self.write_outputs()
        log = (self.root / "operator.log").read_text(errors="replace")
        print(f"work: {dict(sorted(self.counts.items()))}")
        print(
            f"HPA scale changes: {self.hpa_scale_changes()} "
            f"(work groups {self.hpa_scale_changes(tuple(WORK_TABLES))}); "
            f"most jobs queued + running: {self.depth_max}; "
            f"work groups' Deployment replicas over time: {self.work_replicas[:60]}"
        )
        print(
            f"checks: processes alive at the end={alive} leftovers={left} requested compactions by state="
            f"{dict(states)} operator log: {log.count('Traceback')} tracebacks, {log.count(' ERROR ')} ERROR lines; "
            f"errors={self.errors[:5]}"
        )
        print(
            "growth per process (from the warm-up to the end): "
            + ", ".join(f"{k} rss {v:+.1f}% fds {fds[k]:+d} threads {threads[k]:+d}" for k, v in sorted(rss.items()))
        )
        print(f"limits (rss <= {RSS_LIMIT_PCT:.0f}%, fds <= +{FD_LIMIT}) for {', '.join(LIMITED)}: {over or 'kept'}")
        print(
            f"operator-soak: verified={'yes' if verified else 'no'} minutes={self.args.minutes:g} "
            f"groups_created={self.counts['groups created']} group_updates={self.counts['group updates']} "
            f"group_deletes={self.counts['group deletes']} "
            f"compactions_requested={self.counts['compactions requested']} "
            f"hpa_scale_changes={self.hpa_scale_changes()} rss_growth_pct={rss.get('operator', float('nan')):.1f} "
            f"fd_growth={fds.get('operator', 0)} thread_growth={threads.get('operator', 0)} "
            f"leftover_objects={leftover_objects}",
            flush=True,
        )
        return 0 if verified and not over else 1

    def write_csv(self) -> None:
        OUT.mkdir(parents=True, exist_ok=True)
        keys: list[str] = []
        for r in self.rows:
            keys += [k for k in r if k not in keys]
        with (OUT / f"{self.args.name}.csv").open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(self.rows)

    def write_outputs(self) -> None:
        self.write_csv()
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return
        fig, (a, b, c, d) = plt.subplots(4, 1, figsize=(9, 12), sharex=True)
        plot_processes(a, b, [s for s in self.samples if s.role.rsplit(":", 1)[0] in LIMITED])
        a.set_title("the operator and the coordinator")
        by: dict[str, list[Sample]] = {}
        for s in self.samples:
            if s.role.rsplit(":", 1)[0] in LIMITED:
                by.setdefault(s.role, []).append(s)
        for role, ss in sorted(by.items()):
            c.plot([s.minute for s in ss], [s.threads for s in ss], label=role.rsplit(":", 1)[0])
        c.set_ylabel("threads")
        for k in ("compactorgroups", "compactions", "deployments", "pods", "hpas", "redis_groups", "hpa_scale_changes"):
            rows = [r for r in self.rows if k in r]
            d.plot([r["minute"] for r in rows], [r[k] for r in rows], label=k)
        d.set_xlabel("minute")
        d.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        fig.savefig(OUT / f"{self.args.name}.png", dpi=100)

    # -- the run -----------------------------------------------------------------------------------
    def run(self) -> int:
        try:
            self.start()
            self.setup_workload()
            self.started = time.monotonic()
            self.sample()
            threads = [
                threading.Thread(target=t, daemon=True, name=t.__name__)
                for t in (self._ingest, self._churn, self._watch_hpas, self._sampler)
            ]
            for th in threads:
                th.start()
            deadline = self.started + self.args.minutes * 60
            shown = -1
            while time.monotonic() < deadline and not self.stop.is_set():
                time.sleep(1)
                if int(self.minutes()) != shown:
                    shown = int(self.minutes())
                    print(f"operator-soak: minute {shown} of {self.args.minutes:g}", file=sys.stderr, flush=True)
            self.stop.set()
            for th in threads:
                th.join(timeout=120)
            return self.finish()
        finally:
            self.stop.set()
            self.teardown()

    def teardown(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait(5)
        for stop in (
            getattr(getattr(self, "agent", None), "stop", None),
            getattr(getattr(self, "cp", None), "stop", None),
            getattr(getattr(self, "redis", None), "stop", None),
        ):
            if stop is not None:
                with contextlib.suppress(Exception):
                    stop()
        if self.args.keep:
            print(f"kept: {self.root}")
        else:
            shutil.rmtree(self.root, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.operator_soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=float(os.environ.get("KOMPAKTOR_BENCH_OPERATOR_SOAK_MINUTES", 60)))
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--tablets", type=int, default=16, help="tablets per table")
    p.add_argument("--flush-interval", type=float, default=4.0, help="seconds between flushes in a burst")
    p.add_argument("--churn-interval", type=float, default=10.0, help="mean seconds between churn operations")
    p.add_argument("--sample", type=float, default=60.0, help="seconds between samples")
    p.add_argument("--name", default="operator-soak", help="the outputs' name in bench/out (.csv, .png)")
    p.add_argument("--keep", action="store_true", help="keep the run's directory (logs, files)")
    args = p.parse_args(argv)
    if args.minutes <= 0:
        p.error("--minutes must be > 0")
    soak = OperatorSoak(args)

    def term(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt  # unwinds into run()'s teardown: every process stopped by its PID

    signal.signal(signal.SIGTERM, term)
    try:
        code = soak.run()
    except KeyboardInterrupt:
        print("operator-soak: stopped before the end (no verification)", flush=True)
        code = 130
    sys.exit(code)


if __name__ == "__main__":
    main()
