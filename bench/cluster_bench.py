"""The Spark engine on a standalone Spark cluster (issue 17 §2): where a merge's time goes.

``python -m bench.cluster_bench [--entries 4000000] [--workers 2]`` starts a master and workers
(1 core each, loopback) with pyspark's ``bin/spark-class`` (the test fixture's
``tests/integration/spark_cluster.py``), then, in a driver process of its own (this process may
already hold a local SparkSession), merges the same inputs twice and reports the wall time and
the share of it the driver spends appending the tasks' parts to the one output file
(``SparkMergeEngine._append_part``), and the Arrow engine's time on the same files in the same
run. Writes ``bench/out/cluster.csv``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import ROOT, write_csv


def _cluster_module():
    from tests.integration import spark_cluster

    return spark_cluster


def driver(master: str, root: str, inputs: list[str], repeat: int) -> None:
    """In the driver process: time merges on the cluster, with the part re-encoding timed apart."""
    from kompaktor.engines import make_engine
    from kompaktor.engines.api import MergeRequest
    from kompaktor.engines.spark import SparkMergeEngine
    from kompaktor.files.storage import Storage
    from kompaktor.model.iterators import IteratorSettings

    spent = [0.0]
    original = SparkMergeEngine._append_part

    def timed_append(*a, **kw):
        t0 = time.perf_counter()
        try:
            return original(*a, **kw)
        finally:
            spent[0] += time.perf_counter() - t0

    SparkMergeEngine._append_part = staticmethod(timed_append)
    t0 = time.perf_counter()
    eng = make_engine("spark", spark_master=master, spark_conf={"spark.cores.max": "64"})
    startup = time.perf_counter() - t0
    storage = Storage.from_uri(root)
    out = []
    for i in range(repeat + 1):
        spent[0] = 0.0
        req = MergeRequest(
            tuple(inputs), "out/spark.parquet", None, None, IteratorSettings(max_versions=1, full=True), f"b{i}"
        )
        if storage.exists(req.output):
            storage.delete(req.output)
        t1 = time.perf_counter()
        res = eng.merge(storage, req)
        wall = time.perf_counter() - t1
        out.append(
            {
                "run": i,
                "wall_s": wall,
                "append_s": spent[0],
                "entries_written": res.entries_written,
                "executors": eng.executors(),
                "startup_s": startup,
            }
        )
    print(json.dumps(out), flush=True)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(prog="bench.cluster_bench", description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=4_000_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--driver", nargs=3, metavar=("MASTER", "ROOT", "INPUTS_JSON"), help=argparse.SUPPRESS)
    args = ap.parse_args([] if argv is None else argv)
    if args.driver:
        driver(args.driver[0], args.driver[1], json.loads(args.driver[2]), args.repeat)
        return []

    from bench.merge_bench import generate
    from kompaktor.engines.api import MergeRequest
    from kompaktor.engines.arrow import ArrowMergeEngine
    from kompaktor.files.storage import Storage
    from kompaktor.model.iterators import IteratorSettings

    sc = _cluster_module()
    scratch = Path(tempfile.mkdtemp(prefix="kompaktor-cluster-bench-"))
    cluster = sc.SparkCluster(scratch / "cluster")
    rows: list[dict] = []
    try:
        storage = Storage.from_uri(str(scratch / "files"))
        storage.ensure_dir("out")
        inputs = generate(storage, args.entries, 8, row_bytes=16, value_bytes=64)
        t0 = time.perf_counter()
        cluster.start(workers=args.workers)
        print(
            f"cluster: master + {args.workers} workers (1 core each) up in {time.perf_counter() - t0:.1f}s", flush=True
        )
        env = dict(
            os.environ,
            SPARK_LOCAL_IP="127.0.0.1",
            PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "compactor"), str(ROOT / "operator")]),
        )
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.cluster_bench",
                "--repeat",
                str(args.repeat),
                "--driver",
                cluster.url,
                storage.uri,
                json.dumps(inputs),
            ],
            env=env,
            cwd=str(ROOT),
            capture_output=True,
            text=True,
            check=False,
        )
        if r.returncode:
            raise SystemExit(f"cluster bench driver failed: {r.stderr.strip().splitlines()[-1:]}")
        runs = json.loads(r.stdout.strip().splitlines()[-1])
        arrow = []
        for i in range(args.repeat):
            req = MergeRequest(
                tuple(inputs), "out/arrow.parquet", None, None, IteratorSettings(max_versions=1, full=True), f"a{i}"
            )
            if storage.exists(req.output):
                storage.delete(req.output)
            t1 = time.perf_counter()
            ArrowMergeEngine().merge(storage, req)
            arrow.append(time.perf_counter() - t1)
        for run in runs:
            rows.append(
                {
                    "entries": args.entries,
                    "workers": args.workers,
                    **run,
                    "append_share": run["append_s"] / run["wall_s"],
                    "arrow_engine_s": min(arrow),
                }
            )
            print(
                f"  run {run['run']}{' (first)' if run['run'] == 0 else ''}: {run['wall_s']:.2f}s on "
                f"{run['executors']} executors, of which the driver appending the parts to the output "
                f"{run['append_s']:.2f}s ({100 * run['append_s'] / run['wall_s']:.0f}%); "
                f"Arrow engine in-process {min(arrow):.2f}s",
                flush=True,
            )
        print(f"wrote {write_csv('cluster.csv', rows)}")
    finally:
        cluster.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
