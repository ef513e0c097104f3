"""What acknowledged-means-durable costs (issue 15 §1): queue and commit throughput under each
Redis deployment, all in one run on the same machine.

Per setup, P client processes run the compactor's round trip — poll the queue and reserve (one
script call), commit (a mutation) — over J queued jobs (what bench.queue_bench measures), and one
client adds J jobs to the queues (queue writes, which are not acknowledged to anyone and carry no
wait). Setups:

  before        one redis-server, appendfsync everysec, no wait (the old behaviour: up to ~1 s of
                acknowledged writes lost with the node)
  fsync         one redis-server, appendfsync always (the local default: fsynced before the reply)
  replica       primary + replica (everysec), every mutation followed by WAIT 1
  replica+fsync primary + replica, both appendfsync always, WAIT 1

``python -m bench.durability_bench [--jobs J] [--procs P]``; CSV in bench/out/durability.csv.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import fill_tablets, percentile, write_csv
from bench.queue_bench import _worker
from tests.support.rawredis import raw_redis

SETUPS = [
    ("before", "everysec", False, "none"),
    ("fsync", "always", False, "auto"),
    ("replica", "everysec", True, "replicas"),
    ("replica+fsync", "always", True, "replicas"),
]


def _one(label: str, fsync: str, replica: bool, durability: str, jobs: int, procs: int) -> dict:
    from kompaktor.local.redis_server import RedisHA, RedisProcess
    from kompaktor.metadata.store import MetadataStore
    from kompaktor.model.job import Job

    d = Path(tempfile.mkdtemp(prefix="kompaktor-bench-durability-"))
    servers = [RedisProcess(d / "p", appendfsync=fsync).start()]
    if replica:
        servers.append(RedisProcess(d / "r", appendfsync=fsync, replica_of=servers[0].port).start())
        RedisHA._wait_synced(None, servers[1], 60)  # type: ignore[arg-type]
    os.environ["KOMPAKTOR_DURABILITY"] = durability  # the clients' (spawned below) too
    try:
        url = servers[0].url
        store = MetadataStore.from_url(url)
        store.ping()
        plan = store.durability.plan(raw_redis(store)).label
        queues = store.queues
        queues.resize(max(jobs, 1))
        ids, tid = fill_tablets(store, jobs, "dbench")
        plans = [
            (t, [Job(t, "SYSTEM", -32000, "g", {f"tables/{tid}/F{n:07x}{k}.parquet": 1000 for k in range(3)})])
            for n, t in enumerate(ids)
        ]
        t0 = time.perf_counter()
        for i in range(0, len(plans), 100):  # the coordinator adds in batches
            queues.add_many(plans[i : i + 100])
        add_s = time.perf_counter() - t0
        ctx = mp.get_context("spawn")
        out: mp.Queue = ctx.Queue()
        ready: mp.Queue = ctx.Queue()
        go = ctx.Event()
        ps = [ctx.Process(target=_worker, args=(url, "g", out, ready, go)) for _ in range(procs)]
        for p in ps:
            p.start()
        for _ in ps:
            ready.get(timeout=120)
        t0 = time.perf_counter()
        go.set()
        results = [json.loads(out.get(timeout=900)) for _ in ps]
        wall = time.perf_counter() - t0
        for p in ps:
            p.join()
        lat = [x for r in results for x in r["lat"]]
        store.close()
        row = {
            "setup": label,
            "durability": plan,
            "jobs": jobs,
            "procs": procs,
            "queue_adds_per_s": round(jobs / add_s),
            "reserve_commit_per_s": round(len(lat) / wall),
            "p50_ms": round(percentile(lat, 0.5) * 1000, 2),
            "p99_ms": round(percentile(lat, 0.99) * 1000, 2),
            "lost": jobs - len(lat),
        }
        print(
            f"{label:14} queue adds {row['queue_adds_per_s']:>7,}/s · reserve+commit "
            f"{row['reserve_commit_per_s']:>6,}/s (p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms) · {plan}",
            flush=True,
        )
        return row
    finally:
        os.environ.pop("KOMPAKTOR_DURABILITY", None)
        for s in servers:
            s.stop()


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=3000)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="run every setup this many times, interleaved (a busy machine varies); medians reported",
    )
    args = ap.parse_args(argv)
    rows = [dict(_one(*s, args.jobs, args.procs), round=r + 1) for r in range(args.rounds) for s in SETUPS]
    write_csv("durability.csv", rows)
    print(f"medians of {args.rounds} rounds ({args.jobs:,} jobs, {args.procs} clients):")
    base = None
    for label, *_ in SETUPS:
        mine = [r for r in rows if r["setup"] == label]
        adds = statistics.median(r["queue_adds_per_s"] for r in mine)
        trips = statistics.median(r["reserve_commit_per_s"] for r in mine)
        p50 = statistics.median(r["p50_ms"] for r in mine)
        base = base or (adds, trips)
        print(
            f"  {label:14} queue adds {adds:>8,.0f}/s ({adds / base[0]:.0%}) · reserve+commit {trips:>6,.0f}/s "
            f"({trips / base[1]:.0%}), p50 {p50} ms"
        )
    if any(r["lost"] for r in rows):
        raise SystemExit("durability benchmark: a job was lost")
    return rows


if __name__ == "__main__":
    main()
