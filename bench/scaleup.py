"""Seed 004's scale, timed: from a burst of 11,000 queued jobs to 660 Ready compactor pods.

On the real Kubernetes control plane of the test suite (etcd + kube-apiserver +
kube-controller-manager 1.20 on loopback, tests/k8s/): the chart installed with Helm, the operator
serving ``kompaktor_queue_depth`` to the real HPA controller (autoscaler: builtin), a CompactorGroup
with maxReplicas 660, and a node agent that marks pods Running and Ready without starting processes
(this machine cannot run 660 compactors) on as many 110-pod nodes as needed. The queue is filled
as a full-table compaction of 11,000 tablets would fill it; then emptied.

Prints, and writes ``bench/out/scaleup.csv`` + ``.png`` (replicas over time):
``scale-up: 660 ready in S s; replica changes N; scale-down started after S s``.
Seed 004's CPU-scaled compactors took about 45 minutes to reach their maximum.

Run alone: ``python -m bench.scaleup [--pods 660] [--jobs 11000]``.
"""

from __future__ import annotations

import argparse
import base64
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.common import OUT, ROOT, start_redis, write_csv

NS = "kompaktor"
GROUP = "burst"
PODS_PER_NODE = 110


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.scaleup", description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", type=int, default=660, help="the group's maxReplicas")
    ap.add_argument("--jobs", type=int, default=11_000, help="jobs queued by the burst")
    ap.add_argument(
        "--kcm-qps",
        type=int,
        default=100,
        help="kube-controller-manager's API rate (Kubernetes' default 20/s caps pod creation at ~5/s)",
    )
    ap.add_argument("--stabilization", type=int, default=30, help="scale-down stabilisation window, seconds")
    args = ap.parse_args(argv)

    import helm_python as helm
    import kubernetes

    from kompaktor.local.procs import stop_popen
    from kompaktor.metadata.store import MetadataStore
    from kompaktor.model.job import Job
    from kompaktor.resources import api
    from kompaktor_operator import naming
    from tests.k8s.controlplane import ControlPlane, wait_until
    from tests.k8s.nodeagent import NodeAgent

    jobs_per_replica = max(1, args.jobs // args.pods)
    root = Path(tempfile.mkdtemp(prefix="kompaktor-scaleup-"))
    redis = start_redis()
    cp = ControlPlane(root / "k8s", hpa_sync_s=5, kcm_qps=args.kcm_qps).start()
    print(f"control plane {cp.version} up in {cp.started_in_s:.1f} s", flush=True)
    agent = NodeAgent(cp.api(), nodes=args.pods // PODS_PER_NODE + 2).start()
    operator: subprocess.Popen | None = None
    samples: list[dict] = []
    stop = threading.Event()
    try:
        core = kubernetes.client.CoreV1Api(cp.api())
        apps = kubernetes.client.AppsV1Api(cp.api())
        core.create_namespace({"metadata": {"name": NS}})
        core.create_namespaced_secret(NS, {"metadata": {"name": "redis-url"}, "stringData": {"url": redis.url}})
        with helm.Config(kubeconfig_path=str(cp.kubeconfig), namespace=NS) as cfg:
            cfg.install(
                str(ROOT / "helm" / "kompaktor"),
                "kompaktor",
                {
                    "redis": {"bundled": False, "external": {"existingSecret": "redis-url"}},
                    "storage": {"uri": str(root / "files")},
                    "metricsApi": {"serviceType": "NodePort"},
                    "coordinator": {"enabled": False},
                },
                namespace=NS,
                timeout=120,
            )
        svc = core.read_namespaced_service("kompaktor-metrics-api", NS)
        tls = core.read_namespaced_secret("kompaktor-metrics-api-tls", NS)
        for key in ("tls.crt", "tls.key", "ca.crt"):
            (root / key).write_bytes(base64.b64decode(tls.data[key]))
        env = {
            **os.environ,
            "KUBECONFIG": str(cp.kubeconfig),
            "KOMPAKTOR_REDIS_URL": redis.url,
            "KOMPAKTOR_REDIS_SECRET": "redis-url",
            "KOMPAKTOR_SCALE_INTERVAL": "1",
            "KOMPAKTOR_METRICS_API": f"{svc.spec.cluster_ip}:443",
            "KOMPAKTOR_METRICS_API_CERT": str(root / "tls.crt"),
            "KOMPAKTOR_METRICS_API_KEY": str(root / "tls.key"),
            "KOMPAKTOR_METRICS_API_CA": str(root / "ca.crt"),
            "KOMPAKTOR_METRICS_API_REGISTER": f"{NS}/kompaktor-metrics-api/kompaktor-metrics-api-auth-delegator",
        }
        with open(root / "operator.log", "wb") as out:
            operator = subprocess.Popen(
                [str(Path(sys.executable).parent / "kompaktor"), "operator", "--liveness", ""],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        group = {
            "apiVersion": api.GROUP_VERSION,
            "kind": "CompactorGroup",
            "metadata": {"name": GROUP},
            "spec": {
                "minReplicas": 1,
                "maxReplicas": args.pods,
                "jobsPerReplica": jobs_per_replica,
                "autoscaler": "hpa",
                "behavior": {"scaleDownStabilizationSeconds": args.stabilization},
                "spark": {"engine": "arrow", "master": "local[1]"},
            },
        }
        cp.kubectl("-n", NS, "apply", "-f", "-", input=json.dumps(group))
        dep_name = naming.deployment_name(GROUP)
        wait_until(
            lambda: (apps.read_namespaced_deployment(dep_name, NS).status.ready_replicas or 0) >= 1,
            "the group's first pod Ready",
            timeout=120,
        )
        wait_until(
            lambda: (
                json.loads(cp.kubectl("get", "apiservice", "v1beta1.external.metrics.k8s.io", "-o", "json").stdout)[
                    "status"
                ]["conditions"][0]["status"]
                == "True"
            ),
            "the external metrics API Available",
            timeout=120,
        )

        t0 = time.monotonic()

        def sample() -> None:
            while not stop.is_set():
                try:
                    d = apps.read_namespaced_deployment(dep_name, NS)
                    queue = store.queues.stats(GROUP)
                    row = {
                        "t_s": round(time.monotonic() - t0, 2),
                        "desired": d.spec.replicas,
                        "ready": d.status.ready_replicas or 0,
                        "queued": queue.queued,
                    }
                    samples.append(row)
                    if len(samples) % 10 == 0:
                        print(f"  {row}", flush=True)
                except Exception:
                    pass
                stop.wait(1.0)

        store = MetadataStore.from_url(redis.url)
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        # the burst: one job per tablet of an 11,000-tablet table, as a full-table compaction queues them
        # (the queue bound, 10,000 by default, raised to hold them all)
        store.queues.resize(max(args.jobs, store.queues.max_size()))
        store.queues.add_many(
            [(f"t1;{i:08x}", [Job(f"t1;{i:08x}", "USER", 100, GROUP, {"f": 1})]) for i in range(args.jobs)]
        )
        burst = time.monotonic()
        ready_at = wait_until(
            lambda: (
                (apps.read_namespaced_deployment(dep_name, NS).status.ready_replicas or 0) >= args.pods
                and time.monotonic()
            ),
            f"{args.pods} Ready pods",
            timeout=900,
            every=0.5,
        )
        ready_s = ready_at - burst
        # hold the burst a while: no scale-down while jobs are queued
        hold_until = time.monotonic() + 20
        while time.monotonic() < hold_until:
            time.sleep(1)
        store.queues.clear_all()  # the jobs are done
        emptied = time.monotonic()
        down_at = wait_until(
            lambda: apps.read_namespaced_deployment(dep_name, NS).spec.replicas < args.pods and time.monotonic(),
            "the scale-down to start",
            timeout=600,
            every=0.5,
        )
        down_s = down_at - emptied
        time.sleep(2)
        stop.set()
        sampler.join(5)
        burst_rows = [s for s in samples if s["t_s"] <= emptied - t0]
        changes = sum(1 for a, b in itertools.pairwise(burst_rows) if a["desired"] != b["desired"])
        decreases = sum(1 for a, b in itertools.pairwise(burst_rows) if b["desired"] < a["desired"])
        csv_path = write_csv("scaleup.csv", samples)
        _plot(samples, emptied - t0, burst - t0)
        print(f"samples: {csv_path}; replica decreases while jobs were queued: {decreases}")
        print(
            f"scale-up: {args.pods} ready in {ready_s:.1f} s; replica changes {changes}; "
            f"scale-down started after {down_s:.1f} s",
            flush=True,
        )
        store.close()
    finally:
        stop.set()
        if operator is not None:
            stop_popen(operator, 15)
        agent.stop()
        cp.stop()
        redis.stop()


def _plot(samples: list[dict], emptied_s: float, burst_s: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t_s"] for s in samples]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(t, [s["desired"] for s in samples], label="desired replicas")
    ax.plot(t, [s["ready"] for s in samples], label="ready pods")
    ax.axvline(burst_s, color="grey", linestyle=":", label="burst")
    ax.axvline(emptied_s, color="grey", linestyle="--", label="queue emptied")
    ax.set_xlabel("seconds")
    ax.set_ylabel("compactors")
    ax.legend()
    OUT.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT / "scaleup.png", dpi=100, bbox_inches="tight")


if __name__ == "__main__":
    main()
