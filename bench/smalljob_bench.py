"""Small jobs (issue 17 §3): the whole cycle of a tiny compaction, per engine.

``python -m bench.smalljob_bench [--jobs 30] [--engines arrow,spark]``: on an embedded
redis-server and a local storage directory, a one-tablet table gets two flushed files of 1,000
entries each and a real coordinator plans the job; what is timed is one compactor cycle
(:meth:`kompaktor.worker.Compactor.run_one`): reserve -> merge the two files -> commit, with the
compactor's own engine (the Spark engine on a warm session, its start-up reported apart). Prints
median / p90 per engine and writes ``bench/out/smalljob.csv``. Aims: arrow <= 50 ms, warm Spark
<= 500 ms.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.common import percentile, start_redis, write_csv
from kompaktor.policy.services import DEFAULT_SPARK_MASTER

AIMS_MS = {"arrow": 50.0, "spark": 500.0}


def entries(k: int, n: int = 1000) -> list:
    from tests.support.entries import entries

    # every job's files overlap (same rows, newer timestamps): versions to suppress
    return entries(n, k, width=6, deleted=lambda i: k % 2 == 1 and i % 10 == 0, value=lambda i: b"v%08d" % i)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(prog="bench.smalljob_bench", description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=30, help="timed cycles per engine")
    ap.add_argument("--engines", default="arrow,spark")
    ap.add_argument("--spark-master", default=DEFAULT_SPARK_MASTER)
    args = ap.parse_args([] if argv is None else argv)

    from kompaktor.client import Client
    from kompaktor.coordinator import Coordinator
    from kompaktor.files.storage import Storage
    from kompaktor.metadata.store import MetadataStore
    from kompaktor.worker import Compactor, WorkerSettings

    rows: list[dict] = []
    redis = start_redis()
    scratch = Path(tempfile.mkdtemp(prefix="kompaktor-smalljob-"))
    try:
        store = MetadataStore.from_url(redis.url)
        storage = Storage.from_uri(str(scratch / "files"))
        client = Client(store, storage)
        coordinator = Coordinator(store, storage)
        for engine in [e.strip() for e in args.engines.split(",") if e.strip()]:
            table = f"small_{engine}"
            # ratio 1: two files of equal size are a job (the default ratio waits for more)
            store.tables.create_table(table, [], {"table.compaction.major.ratio": "1"})
            settings = WorkerSettings("default", f"bench-{engine}", engine=engine, spark_master=args.spark_master)
            w = Compactor(store, storage, settings)
            t0 = time.perf_counter()
            _ = w.engine  # the compactor starts its engine once, before its first job
            startup = time.perf_counter() - t0
            times: list[float] = []
            for k in range(args.jobs + 2):  # the first two cycles warm up (imports, first job)
                client.flush(table, entries(2 * k))
                client.flush(table, entries(2 * k + 1))
                queued = coordinator.full_scan()
                if queued < 1:
                    raise SystemExit(f"small-job bench: the coordinator queued no job ({engine}, cycle {k})")
                t1 = time.perf_counter()
                outcome = w.run_one()
                dt = time.perf_counter() - t1
                if outcome is None or outcome.status != "committed":
                    raise SystemExit(f"small-job bench: cycle {k} on {engine} did not commit: {outcome}")
                if k >= 2:
                    times.append(dt)
            tablet = next(iter(store.tables.tablets(store.tables.table_id(table))))
            assert len(tablet.files) == 1, tablet.files
            med, p90 = statistics.median(times) * 1000, percentile(times, 0.9) * 1000
            aim = AIMS_MS.get(engine)
            rows.append(
                {
                    "engine": engine,
                    "jobs": len(times),
                    "median_ms": round(med, 1),
                    "p90_ms": round(p90, 1),
                    "min_ms": round(min(times) * 1000, 1),
                    "aim_ms": aim,
                    "met": med <= aim if aim else None,
                    "engine_startup_s": round(startup, 2),
                }
            )
            print(
                f"  {engine}: reserve -> merge 2 x 1,000 entries -> commit: median {med:.1f} ms, p90 {p90:.1f} ms "
                f"over {len(times)} jobs (aim <= {aim:.0f} ms: {'met' if med <= aim else 'NOT met'}); "
                f"engine start-up {startup:.2f}s",
                flush=True,
            )
        path = write_csv("smalljob.csv", rows)
        print(f"wrote {path}")
    finally:
        redis.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
