"""`make bench`: every benchmark, each printing figures measured in this run.

Set KOMPAKTOR_BENCH_QUICK=1 for a short smoke run (smaller sizes), KOMPAKTOR_BENCH_SOAK_MINUTES=60
for the hour-long soak (10 minutes by default), KOMPAKTOR_BENCH_OPERATOR_SOAK_MINUTES=60 for the
operator's hour of churn on the real control plane (10 minutes by default), KOMPAKTOR_BENCH_LARGE=1 to add
the planner over a million tablets (~3 min, ~2 GB of Redis) and the 16M-entry merge (every layout
and engine: ~30 min and ~7 GB of memory for the in-memory peers on a 2-core machine, so not in the
default run)."""

from __future__ import annotations

import os
import sys
import time


def main() -> None:
    quick = os.environ.get("KOMPAKTOR_BENCH_QUICK") == "1"
    large = os.environ.get("KOMPAKTOR_BENCH_LARGE") == "1"
    from bench import (
        cluster_bench,
        ingest_bench,
        merge_bench,
        operator_soak,
        planning_bench,
        queue_bench,
        s3_bench,
        scaleup,
        smalljob_bench,
        soak,
        spark_io,
        wakeup_bench,
    )

    soak_minutes = os.environ.get("KOMPAKTOR_BENCH_SOAK_MINUTES", "2" if quick else "10")
    operator_soak_minutes = os.environ.get("KOMPAKTOR_BENCH_OPERATOR_SOAK_MINUTES", "3" if quick else "10")

    runs = [
        ("planner", planning_bench.main, ["--tablets", "5000"] if quick else []),
        ("queues", queue_bench.main, ["--jobs", "2000"] if quick else []),
        ("merge engines, every input layout", merge_bench.main, ["--entries", "200000"] if quick else []),
        (
            "Spark and Arrow reading and writing tables",
            spark_io.main,
            ["--entries", "200000"] if quick else ["--entries", "16000000"] if large else [],
        ),
        *(
            [("planner at a big instance's scale", planning_bench.main, ["--tablets", "1000000", "--files", "10"])]
            if large and not quick
            else []
        ),
        *(
            [
                (
                    "merge engines, 16M entries",
                    merge_bench.main,
                    ["--entries", "16000000", "--repeat", "2", "--csv", str(merge_bench.OUT_DIR / "merge16m.csv")],
                )
            ]
            if large and not quick
            else []
        ),
        (
            "the Spark engine on a standalone cluster, 1 then 2 workers",
            cluster_bench.main,
            ["--entries", "200000", "--repeat", "1"] if quick else [],
        ),
        (
            "the same merge on the local disk and on an S3 API server",
            s3_bench.main,
            ["--entries", "200000", "--repeat", "1"] if quick else [],
        ),
        (
            "an idle compactor woken by a queued job, against polling",
            wakeup_bench.main,
            ["--jobs", "10", "--idle-seconds", "5"] if quick else [],
        ),
        (
            "small jobs: reserve -> merge 2 x 1,000 entries -> commit",
            smalljob_bench.main,
            ["--jobs", "10"] if quick else [],
        ),
        ("end-to-end ingest", ingest_bench.main, ["--entries", "60000", "--duration", "30"] if quick else []),
        (
            "autoscaling to 660 compactors (real control plane)",
            scaleup.main,
            ["--pods", "110", "--jobs", "1100"] if quick else [],
        ),
        (f"soak with faults, {soak_minutes} minutes", soak.main, ["--minutes", soak_minutes]),
        (
            f"the operator under churn on the real control plane, {operator_soak_minutes} minutes",
            operator_soak.main,
            ["--minutes", operator_soak_minutes],
        ),
    ]
    failed = []
    for name, fn, args in runs:
        print(f"\n=== {name} ===", flush=True)
        t0 = time.perf_counter()
        try:
            fn(args)
        except SystemExit as exc:
            if exc.code not in (None, 0):
                failed.append(f"{name}: {exc.code}")
        print(f"({name}: {time.perf_counter() - t0:.0f}s)")
    if failed:
        sys.exit("benchmarks failed: " + "; ".join(failed))


if __name__ == "__main__":
    main()
