"""Reading and writing tables from Spark and Arrow (docs/spark.md), ratios from the same run:

- ``read_arrow`` against the entry iterator scans used before it (the heap merge of
  ``merged_view`` over each tablet's files), in entries of the merged view per second;
- the ``kompaktor`` source's read against ``spark.read.parquet`` of the same files (both
  materialized with the ``noop`` sink), in entries read per second;
- ``kompaktor.spark.write`` against ``repartitionByRange`` + ``sortWithinPartitions`` +
  ``write.parquet`` of the same DataFrame.

The table has ``--tablets`` tablets, each with ``--files`` flushed files of overlapping rows (a
version of every key per file)."""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from bench.common import start_redis, write_csv
from kompaktor.client import Client
from kompaktor.files.sortedfile import SCHEMA, SortedFileWriter
from kompaktor.files.storage import Storage
from kompaktor.metadata.store import MetadataStore
from kompaktor.model.iterators import IteratorSettings, merged_view


def fill(client: Client, entries: int, tablets: int, files: int) -> None:
    """``files`` files per tablet of ``entries / files`` entries each, every key in each of them."""
    keys = entries // files
    splits = [b"r%09d" % (keys * i // tablets) for i in range(1, tablets)]
    tid = client.store.tables.create_table("bench", splits)
    rows = pa.array([b"r%09d" % i for i in range(keys)], pa.binary())
    for k in range(files):
        table = pa.table(
            {
                "row": rows,
                "cf": pa.array([b"f"] * keys, pa.binary()),
                "cq": pa.array([b"q"] * keys, pa.binary()),
                "vis": pa.array([b""] * keys, pa.binary()),
                "ts": pa.array([1000 + k] * keys, pa.int64()),
                "deleted": pa.array([False] * keys),
                "value": pa.array([b"v%d-%032d" % (k, 0)] * keys, pa.binary()),
            },
            schema=SCHEMA,
        )
        w = SortedFileWriter(client.storage, client.new_file_path(tid, "import"))
        w.write_table(table, checked=True)
        info = w.commit()
        client.store.files.add_files("bench", {info.path: info.meta})


def timed(fn: Callable[[], int]) -> tuple[float, int]:
    t0 = time.perf_counter()
    n = fn()
    return time.perf_counter() - t0, n


def arrow_rows(client: Client, no_entry_scan: bool = False) -> list[dict]:
    def read_arrow() -> int:
        return sum(b.num_rows for b in client.read_arrow("bench"))

    def entry_scan() -> int:  # the scan before read_arrow: a heap merge of entries per tablet
        tid = client.store.tables.table_id("bench")
        settings = IteratorSettings()
        tablets = client.store.tables.tablets(tid)
        return sum(sum(1 for _ in merged_view(client.tablet_sources(t), settings)) for t in tablets)

    out = []
    measures = (("read_arrow", read_arrow), ("entry scan (before)", entry_scan))
    for name, fn in measures[:1] if no_entry_scan else measures:
        s, n = timed(fn)
        out.append({"what": name, "seconds": round(s, 2), "entries": n, "entries_per_s": round(n / s)})
    return out


def spark_rows(client: Client, redis_url: str, work: Path, repeat: int = 1, master: str = "local[2]") -> list[dict]:
    import kompaktor.spark as kspark
    from kompaktor.engines import session

    conf = {"spark.sql.shuffle.partitions": "4", "spark.local.dir": str(work)}
    if master.startswith("spark://"):  # executors of 1 core on each of the cluster's workers
        conf |= {"spark.executor.cores": "1", "spark.executor.memory": "900m", "spark.cores.max": "2"}
    spark = session.get_session(master, conf)
    conn = {"redis": redis_url, "storage": client.storage.uri}
    tid = client.store.tables.table_id("bench")
    # a file spanning several tablets is listed by each of them: read it once
    paths = sorted({client.storage.path(f) for t in client.store.tables.tablets(tid) for f in t.files})
    raw = spark.read.parquet(*paths)
    n_raw = raw.count()
    n_view = kspark.read(spark, "bench", **conn).count()
    client.store.tables.create_table("copy", [t.end for t in client.store.tables.tablets(tid) if t.end])

    def noop(df) -> int:  # type: ignore[no-untyped-def]
        df.write.format("noop").mode("overwrite").save()
        return 0

    runs = [
        ("spark read: kompaktor source", lambda: noop(kspark.read(spark, "bench", **conn)), n_raw),
        ("spark read: read.parquet of the files", lambda: noop(spark.read.parquet(*paths)), n_raw),
        ("spark write: kompaktor.spark.write", lambda: kspark.write(raw, "copy", **conn) or 0, n_raw),
        (
            "spark write: repartitionByRange + sort + parquet",
            lambda: (
                raw.repartitionByRange(4, "row")
                .sortWithinPartitions("row", "cf", "cq", "vis")
                .write.mode("overwrite")
                .parquet(str(work / "out.parquet"))
                or 0
            ),
            n_raw,
        ),
    ]
    times: dict[str, list[float]] = {name: [] for name, _fn, _n in runs}
    # in rounds: a change of the machine's load falls on every run alike; the first round only
    # warms up (the JVM's code, the Python workers' imports: 24 s against 10 s for the same write)
    for round_ in range(1 + repeat):
        for name, fn, _n in runs:
            took = timed(fn)[0]
            if round_:
                times[name].append(took)
    out = []
    for name, _fn, n in runs:
        s = statistics.median(times[name])
        out.append({"what": name, "seconds": round(s, 2), "entries": n, "entries_per_s": round(n / s)})
    print(f"the source's merged view: {n_view:,} of {n_raw:,} entries read (entries/s: entries read)")
    session.stop_session()
    return out


def on_spark(client: Client, redis_url: str, work: Path, args: argparse.Namespace) -> list[dict]:
    """The Spark measures, on ``local[2]`` or (``--cluster``) a standalone master and 2 workers of
    1 core each on loopback, stopped by PID afterwards."""
    if not args.cluster:
        return spark_rows(client, redis_url, work, args.repeat)
    from tests.integration.spark_cluster import SparkCluster

    cluster = SparkCluster(work / "cluster")
    try:
        cluster.start(workers=2)
        return spark_rows(client, redis_url, work, args.repeat, cluster.url)
    finally:
        cluster.stop()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.spark_io", description=__doc__)
    ap.add_argument("--entries", type=int, default=4_000_000)
    ap.add_argument("--tablets", type=int, default=4)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument(
        "--repeat", type=int, default=1, help="Spark runs per measure, in rounds after a warm-up round (median)"
    )
    ap.add_argument(
        "--cluster", action="store_true", help="the Spark runs on a standalone master + 2 workers started here"
    )
    ap.add_argument("--no-entry-scan", action="store_true", help="skip the entry scan (minutes at 16M)")
    ap.add_argument("--no-spark", action="store_true", help="read_arrow against the entry scan only")
    args = ap.parse_args(argv)
    redis = start_redis()
    work = Path(tempfile.mkdtemp(prefix="kompaktor-bench-sparkio-"))
    try:
        client = Client(MetadataStore.from_url(redis.url), Storage.from_uri(str(work / "files")))
        fill(client, args.entries, args.tablets, args.files)
        rows = arrow_rows(client, args.no_entry_scan)
        if not args.no_spark:
            rows += on_spark(client, redis.url, work, args)
    finally:
        redis.stop()
        shutil.rmtree(work, ignore_errors=True)
    for r in rows:
        print(f"{r['what']:<50} {r['seconds']:>8.2f} s {r['entries_per_s']:>12,} entries/s")
    by = {r["what"]: r["seconds"] for r in rows}
    if "entry scan (before)" in by:
        print(f"read_arrow / entry scan: {by['entry scan (before)'] / by['read_arrow']:.1f}x faster")
    if not args.no_spark:
        src, pq_ = by["spark read: kompaktor source"], by["spark read: read.parquet of the files"]
        wr, pw = by["spark write: kompaktor.spark.write"], by["spark write: repartitionByRange + sort + parquet"]
        print(f"spark read: source / read.parquet = {src / pq_:.2f}; write: kompaktor / parquet = {wr / pw:.2f}")
    write_csv(f"spark-io-{args.entries}{'-cluster' if args.cluster else ''}.csv", rows)


if __name__ == "__main__":
    main()
