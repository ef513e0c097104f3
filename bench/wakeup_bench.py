"""`python -m bench.wakeup_bench`: how soon an idle compactor takes a job queued for its group,
and what idle compactors cost Redis — polling only (the old way, measured as the baseline in the
same run) against waiting for a wake-up (issue 27 §3).

On an embedded redis-server, ``--compactors`` compactors of one group (Arrow engine, in this
process) sit idle; a real coordinator then queues one small job at a time, each time after the
compactors have gone back to waiting, and the time from the queue write to the job leaving the
queue (reserved) is measured. Idle cost: Redis commands per second per compactor while nothing
is queued (``INFO commandstats``, over ``--idle-seconds``). Aims: p99 pick-up <= 100 ms, idle
commands no more than polling's.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.common import percentile, start_redis

GROUP = "default"
AIM_P99_MS = 100.0


def _calls(r) -> int:
    return sum(int(v["calls"]) for k, v in r.info("commandstats").items() if k.startswith("cmdstat_"))


def run_mode(url: str, root: Path, wake: bool, args: argparse.Namespace) -> tuple[list[float], float]:
    import redis

    from kompaktor.client import Client
    from kompaktor.coordinator import Coordinator
    from kompaktor.files.storage import Storage
    from kompaktor.metadata.store import MetadataStore
    from kompaktor.worker import Compactor, WorkerSettings
    from tests.support.entries import entries

    r = redis.Redis.from_url(url)
    r.flushall()
    store = MetadataStore.from_url(url)
    storage = Storage.from_uri(str(root / ("wake" if wake else "poll")))
    client = Client(store, storage)
    workers = [
        Compactor(MetadataStore.from_url(url), storage, WorkerSettings(GROUP, f"c{i}", engine="arrow", wake=wake))
        for i in range(args.compactors)
    ]
    threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
    for t in threads:
        t.start()
    try:
        time.sleep(3)  # every compactor started and idle
        before = _calls(r)
        time.sleep(args.idle_seconds)
        idle_per_s = (_calls(r) - before) / args.idle_seconds / args.compactors
        latencies = []
        coord = Coordinator(store, storage)
        for j in range(args.jobs):
            table = f"t{j}"
            store.tables.create_table(table, [])
            for k in range(4):
                client.flush(table, entries(50, k, prefix="r", width=4, value=lambda r: b"v"))
            # the compactors back in their idle wait (they go there after an empty poll)
            time.sleep(args.settle)
            t0 = time.perf_counter()
            if coord.full_scan() != 1:
                raise SystemExit("the coordinator did not queue the job")
            while store.queues.stats(GROUP).queued:
                time.sleep(0.0005)
            latencies.append((time.perf_counter() - t0) * 1000)
        return latencies, idle_per_s
    finally:
        for w in workers:
            w.request_drain("bench done")
        for t in threads:
            t.join(timeout=30)
        store.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.wakeup_bench", description=__doc__.splitlines()[0])
    ap.add_argument("--compactors", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--idle-seconds", type=float, default=10.0)
    ap.add_argument("--settle", type=float, default=2.5, help="seconds between jobs (compactors back to idle)")
    args = ap.parse_args([] if argv is None else argv)
    root = Path(tempfile.mkdtemp(prefix="kompaktor-wake-"))
    server = start_redis()
    try:
        res = {mode: run_mode(server.url, root, mode == "wake", args) for mode in ("poll", "wake")}
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(f"{args.compactors} idle compactors, {args.jobs} jobs queued one at a time")
    for mode, (lat, idle) in res.items():
        print(
            f"  {mode:4s}: pick-up p50 {percentile(lat, 0.5):7.1f} ms  p99 {percentile(lat, 0.99):7.1f} ms"
            f"   idle Redis commands {idle:5.2f}/s per compactor"
        )
    p99 = percentile(res["wake"][0], 0.99)
    ratio = res["wake"][1] / max(1e-9, res["poll"][1])
    print(
        f"  wake-up p99 {p99:.1f} ms (aim <= {AIM_P99_MS:.0f} ms); idle commands wake/poll {ratio:.2f}x (aim <= 1.0x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
