"""Queue throughput under load (issues 4 §6 and 8 §4): P client processes (default 8) each run
reserve + commit round trips against one local Redis. Checks that no job is reserved twice and
none is lost; reports round trips per second and p50/p99 latency. Aim: 2,000 round trips/s.

``--broker``: the same cycles made as compactor pods make them, asked of the coordinator's broker
(issue 34 §1), measured in the same run after the direct ones, and the ratio printed."""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
from pathlib import Path

from bench.common import fill_tablets, percentile, start_redis, write_csv
from tests.support.rawredis import raw_redis


def _worker(
    url: str, group: str, out: mp.Queue, ready: mp.Queue, go, profile: str | None = None, broker: bool = False
) -> None:
    from kompaktor.metadata.brokered import BrokeredJobs
    from kompaktor.metadata.jobs import DirectJobs, Jobs
    from kompaktor.metadata.store import MetadataStore
    from kompaktor.model.tablet import FileInfo

    store = MetadataStore.from_url(url)
    jobs: Jobs = BrokeredJobs(store) if broker else DirectJobs(store)
    store.ping()
    ready.put(1)
    go.wait()
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    cpu0 = time.process_time()
    lat: list[float] = []
    ecids: list[str] = []
    reserved_files: list[list[str]] = []
    while True:
        t0 = time.perf_counter()
        res = jobs.reserve(group, f"bench-{mp.current_process().pid}")
        if res is None:
            break
        info = FileInfo(res.output, 1000, 10, 0, (b"a",), (b"b",))
        jobs.commit(res, info.meta)
        lat.append(time.perf_counter() - t0)
        ecids.append(res.ecid)
        reserved_files.append(list(res.inputs))
    if prof is not None and profile:
        prof.disable()
        prof.dump_stats(str(Path(profile) / f"client-{mp.current_process().pid}.prof"))
    cpu = time.process_time() - cpu0
    out.put(json.dumps({"lat": lat, "ecids": ecids, "files": reserved_files, "cpu": cpu}))


def _redis_cpu(r) -> float:
    """CPU seconds (user + system) the Redis server has used so far."""
    cpu = r.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def _print_commandstats(stats: dict, cycles: int) -> None:
    """Redis server time per command during the measured part, per reserve+commit cycle."""
    print("redis commandstats (measured part): command, calls per cycle, µs per call, server µs per cycle")
    for name, st in sorted(stats.items(), key=lambda kv: -kv[1]["usec"]):
        print(
            f"  {name.removeprefix('cmdstat_'):<16} {st['calls'] / max(cycles, 1):6.2f} "
            f"{st['usec_per_call']:8.1f} {st['usec'] / max(cycles, 1):8.1f}"
        )


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument(
        "--broker",
        action="store_true",
        help="also run the cycles through the coordinator's broker (2 threads, as a coordinator "
        "serves), after the direct ones, and print the ratio",
    )
    ap.add_argument(
        "--profile",
        metavar="DIR",
        help="write each client's cProfile stats to DIR and print Redis "
        "server time per command (INFO commandstats) for the measured part",
    )
    args = ap.parse_args(argv)
    rows = [_run(args, broker=False)]
    if args.broker:
        rows.append(_run(args, broker=True))
        ratio = rows[1]["round_trips_per_s"] / max(rows[0]["round_trips_per_s"], 1)
        print(
            f"through the broker: {rows[1]['round_trips_per_s']:,}/s vs {rows[0]['round_trips_per_s']:,}/s direct "
            f"= {ratio:.2f}x; p50 {rows[1]['p50_ms']} ms vs {rows[0]['p50_ms']} ms"
        )
    write_csv("queue.csv", rows)
    if any(r["reserved_twice"] or r["lost"] for r in rows):
        raise SystemExit("queue benchmark found a job reserved twice or lost")
    return rows


def _run(args: argparse.Namespace, broker: bool) -> dict:
    import threading

    from kompaktor.coordinator.broker import Broker
    from kompaktor.metadata.store import MetadataStore
    from kompaktor.model.job import Job

    redis = start_redis()
    stop = threading.Event()
    try:
        store = MetadataStore.from_url(redis.url)
        queues = store.queues
        queues.resize(max(args.jobs, 1))
        ids, tid = fill_tablets(store, args.jobs, "qbench")
        queues.add_many(
            [
                (t, [Job(t, "SYSTEM", -32000, "g", {f"tables/{tid}/F{n:07x}{k}.parquet": 1000 for k in range(3)})])
                for n, t in enumerate(ids)
            ]
        )
        ctx = mp.get_context("spawn")
        out: mp.Queue = ctx.Queue()
        ready: mp.Queue = ctx.Queue()
        go = ctx.Event()
        if args.profile:
            Path(args.profile).mkdir(parents=True, exist_ok=True)
        if broker:
            Broker(MetadataStore.from_url(redis.url)).start(stop)
        procs = [
            ctx.Process(target=_worker, args=(redis.url, "g", out, ready, go, args.profile, broker))
            for _ in range(args.procs)
        ]
        for p in procs:
            p.start()
        for _ in procs:
            ready.get(timeout=120)  # every client connected: measure the round trips only
        raw_redis(store).config_resetstat()
        redis_cpu0 = _redis_cpu(raw_redis(store))
        t0 = time.perf_counter()
        go.set()
        results = [json.loads(out.get(timeout=600)) for _ in procs]
        wall = time.perf_counter() - t0
        redis_cpu = _redis_cpu(raw_redis(store)) - redis_cpu0
        for p in procs:
            p.join()
        lat = [x for r in results for x in r["lat"]]
        ecids = [e for r in results for e in r["ecids"]]
        files = [f for r in results for fl in r["files"] for f in fl]
        client_cpu = sum(r["cpu"] for r in results)
        twice = len(files) - len(set(files))
        lost = args.jobs - len(ecids)
        row = {
            "mode": "broker" if broker else "direct",
            "procs": args.procs,
            "jobs": args.jobs,
            "round_trips": len(lat),
            "wall_s": round(wall, 2),
            "round_trips_per_s": round(len(lat) / wall),
            "p50_ms": round(percentile(lat, 0.5) * 1000, 2),
            "p99_ms": round(percentile(lat, 0.99) * 1000, 2),
            "reserved_twice": twice,
            "lost": lost,
            "client_cpu_us_per_trip": round(client_cpu / max(len(lat), 1) * 1e6),
            "redis_cpu_us_per_trip": round(redis_cpu / max(len(lat), 1) * 1e6),
        }
        print(
            f"queue ({row['mode']}): {args.procs} processes, {len(lat):,} reserve+commit round trips in {wall:.1f}s = "
            f"{row['round_trips_per_s']:,}/s; p50 {row['p50_ms']} ms, "
            f"p99 {row['p99_ms']} ms; reserved twice: {twice}, lost: {lost} (aim 2,000/s); CPU per round trip: "
            f"clients {row['client_cpu_us_per_trip']} µs, Redis {row['redis_cpu_us_per_trip']} µs"
        )
        stats = raw_redis(store).info("commandstats")
        # the cycle's function calls (the queue pop folded into the reserving function, then the
        # committing mutation; a last call finds the queue empty); a function's own commands are
        # counted inside its FCALL time (and again under their own names)
        scripts = [st for name, st in stats.items() if name in ("cmdstat_fcall", "cmdstat_evalsha", "cmdstat_eval")]
        scripts_us = sum(st["usec"] for st in scripts)
        calls = sum(st["calls"] for st in scripts)
        row["redis_time_us_per_trip"] = round(scripts_us / max(len(lat), 1), 1)
        row["script_calls_per_trip"] = round(calls / max(len(lat), 1), 2)
        print(
            f"  Redis time per reserve+commit (INFO commandstats of its 2 function calls, 2 round trips; "
            f"{row['script_calls_per_trip']} calls per cycle measured): "
            f"{row['redis_time_us_per_trip']} µs (aim <= 100 µs; {args.procs} clients on this machine's cores)"
        )
        if args.profile:
            _print_commandstats(stats, len(lat))
        return row
    finally:
        stop.set()
        redis.stop()


if __name__ == "__main__":
    main()
