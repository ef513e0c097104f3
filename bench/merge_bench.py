"""Merge benchmark (issues 5 §5, 17 §1): one full-compaction merge of 8 sorted input files,
for each input row-group layout.

``python -m bench.merge_bench [--entries N] [--files 8] [--repeat 3] [--layouts small,one,128mb]
[--shapes base,...|all]`` generates the inputs of each key shape (:data:`SHAPES`, issue 37 §1;
``base``, the default: 16-byte rows, 64-byte values; 10% of entries overwrite an older file's
key, 2% are delete markers; random binary rows, so bytes >= 0x80 occur; the others vary the row
length (4 B, 200 B), the qualifiers per row (1, 64), the value (empty, 4 KiB on 1/32 of the
entries), the duplication across files (60%), the versions per key (~16), the deletes (40%), and
``disjoint``: files whose key ranges do not overlap at all; issue 46's ``hexonerg``,
``timeseries``, ``edges`` and ``uuiddocs``, each in the layout it names), writes them in each
layout — ``small`` (64K-row row groups), ``one`` (one row group per file), ``128mb`` (128 MB
row groups, the Spark/Hive default) — and times on the same files in the same run:

- the Spark engine (warm session; session start-up and the first, cold merge reported apart),
- the in-process Arrow engine, and (``arrow-resumable``, issue 23 §2) the same engine resumable:
  every key range written as a part, checksummed and recorded (in memory here; the compactor
  records in Redis), then the parts appended into the output and deleted — the cost that
  ``DEFAULT_RESUME_MIN_BYTES`` keeps off small merges, printed as a ratio to the plain engine,
- the peers: Polars (lazy, sort + unique), DuckDB (window + ORDER BY + COPY), a pyarrow-only
  merge (read all, sort, vectorized stack, write),
- the I/O floor (read the inputs and write one file, no sort).

``--profile`` (issue 46) instead times one warm Arrow merge by phase (``kompaktor.files.phases``:
thread-seconds and the CPU seconds of each phase's thread) beside each phase's floor measured in
the same run, and Polars' scan / sort / sink, with the load average (docs/architecture.md "Where a
merge's time goes").

Every engine's output is checked to have the same entries as the Arrow engine's, on every shape
and layout. For each
engine it prints the median time, its speed relative to the best peer and to the I/O floor
(``best peer s / engine s``: above 1 is faster) and peak RSS (this process: the compactor /
Spark driver; Spark's JVM and Python workers apart), then a summary across layouts, and writes
``bench/out/merge.csv``.
"""

from __future__ import annotations

import argparse
import csv
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from bench.common import descendants
from kompaktor.files.sortedfile import SCHEMA, WRITER_OPTIONS
from kompaktor.files.storage import Storage
from kompaktor.policy.services import DEFAULT_SPARK_MASTER
from tests.support.mergeinputs import SHAPES, generate, parse_shapes, pyarrow_sort, same_entries

OUT_DIR = Path(__file__).resolve().parent / "out"


#: the shapes ``--shapes`` names by default (of :data:`SHAPES`, in tests.support.mergeinputs)
DEFAULT_SHAPES = ("base",)


#: input layouts (issue 17 §1): rows per row group of each input file
LAYOUTS = ("small", "one", "128mb")
SMALL_ROW_GROUP = 64 * 1024


def relayout(storage: Storage, inputs: list[str], layout: str) -> list[str]:
    """Copies of ``inputs`` cut into row groups as ``layout`` says: ``small`` (64K rows), ``one``
    (one row group per file), ``128mb`` (row groups of 128 MB uncompressed, the Spark/Hive
    default: ~1.2M entries of 110 bytes)."""
    out = []
    for p in inputs:
        dst = f"{layout}/{p.rsplit('/', 2)[-2]}-{p.rsplit('/', 1)[-1]}"
        t = pq.read_table(storage.path(p))
        if layout == "small":
            rows = SMALL_ROW_GROUP
        elif layout == "one":
            rows = max(1, t.num_rows)
        else:
            rows = max(1, int((128 << 20) / max(1.0, t.nbytes / max(1, t.num_rows))))
        storage.ensure_dir(layout)
        with pq.ParquetWriter(storage.path(dst), t.schema, compression="zstd") as w:
            # ParquetWriter caps a row group at 1Mi rows unless told otherwise
            w.write_table(t, row_group_size=rows)
        out.append(dst)
    return out


def _hwm_mb(pid: int | str) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def reset_peaks() -> None:
    """Reset the peak-RSS counters (VmHWM) of this process and its descendants (Linux)."""
    for pid in ["self", *descendants(os.getpid())]:
        try:
            with open(f"/proc/{pid}/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass


def peak_rss_mb() -> float:
    """Peak RSS of this process (the compactor / Spark driver's Python side) since the last reset."""
    return _hwm_mb("self") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def children_peak_rss_mb() -> float:
    """Sum of the peak RSS of the descendants (JVM, Python workers) since the last reset."""
    return sum(_hwm_mb(p) for p in descendants(os.getpid()))


# ---- peers -----------------------------------------------------------------------------------


def io_floor(storage: Storage, inputs: list[str], out: str) -> int:
    """Read every input and write them into one file, no sort, no stack."""
    with pq.ParquetWriter(storage.path(out), SCHEMA, compression="zstd") as w:
        for p in inputs:
            pf = pq.ParquetFile(storage.path(p))
            for i in range(pf.num_row_groups):
                w.write_table(pf.read_row_group(i))
    return pq.ParquetFile(storage.path(out)).metadata.num_rows


def polars_merge(storage: Storage, inputs: list[str], out: str) -> int:
    """Polars (lazy, all cores): concat with the source index, sort by key with the newest
    version first, keep the first of each column key, drop it when it is a delete, write."""
    import polars as pl

    key = ["row", "cf", "cq", "vis"]
    lf = pl.concat(
        [pl.scan_parquet(storage.path(p)).with_columns(pl.lit(i, pl.Int32).alias("src")) for i, p in enumerate(inputs)]
    )
    lf = (
        lf.sort([*key, "ts", "deleted", "src"], descending=[False] * 4 + [True, True, True])
        .unique(subset=key, keep="first", maintain_order=True)
        .filter(~pl.col("deleted"))
        .drop("src")
    )
    df = lf.collect()
    df.write_parquet(storage.path(out), compression="zstd", row_group_size=128 * 1024)
    return df.height


def duckdb_merge(storage: Storage, inputs: list[str], out: str) -> int:
    """DuckDB: window over each column key (newest source first), drop hidden, ORDER BY, COPY."""
    import duckdb

    files = ", ".join(f"('{storage.path(p)}', {i})" for i, p in enumerate(inputs))
    con = duckdb.connect()
    threads = os.cpu_count() or 2
    con.execute(f"SET threads={threads}")
    con.execute(f"SET temp_directory='{storage.path('duckdb_tmp')}'")
    union = " UNION ALL ".join(
        f"SELECT *, {i} AS src FROM read_parquet('{storage.path(p)}')" for i, p in enumerate(inputs)
    )
    del files
    sql = f"""
    COPY (
      SELECT row, cf, cq, vis, ts, deleted, value FROM (
        SELECT *, row_number() OVER w AS rn, first_value(deleted) OVER w AS newest_deleted
        FROM ({union})
        WINDOW w AS (PARTITION BY row, cf, cq, vis ORDER BY ts DESC, deleted DESC, src DESC)
      ) WHERE rn = 1 AND NOT newest_deleted
      ORDER BY row, cf, cq, vis, ts DESC, deleted DESC
    ) TO '{storage.path(out)}' (FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 131072)
    """
    con.execute(sql)
    con.close()
    return pq.ParquetFile(storage.path(out)).metadata.num_rows


# ---- runner ----------------------------------------------------------------------------------


def cpu_seconds(children: bool = False) -> float:
    """CPU time (user + system) of this process and, with ``children``, of its live descendants
    (Spark's JVM and Python workers): the work an engine does, which other load on the machine
    changes less than its wall time."""
    total = sum(os.times()[:2])
    tick = os.sysconf("SC_CLK_TCK")
    for pid in descendants(os.getpid()) if children else []:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, ValueError, IndexError):
            pass
    return total


#: CPU seconds per run of the last :func:`timed` call
LAST_CPU: list[float] = [0.0]


def timed(fn: Callable[[], int], repeat: int, children: bool = False) -> tuple[list[float], int]:
    reset_peaks()
    times, n = [], 0
    c0 = cpu_seconds(children)
    for _ in range(repeat):
        t0 = time.perf_counter()
        n = fn()
        times.append(time.perf_counter() - t0)
    LAST_CPU[0] = (cpu_seconds(children) - c0) / max(1, repeat)
    return times, n


def _compare_resumable(console, rows: list[dict], plain_name: str, label: str) -> None:
    """The resumable run (the last row) against the plain engine's row of the same run."""
    plain = next((r for r in rows if r["engine"] == plain_name), None)
    if plain is None:
        return
    res = rows[-1]
    res["note"] += f"; {res['median_s'] / plain['median_s']:.2f}x the plain engine's time"
    console.print(
        f"  resumable / plain {label} engine: median {res['median_s'] / plain['median_s']:.2f}x, "
        f"min {res['min_s'] / plain['min_s']:.2f}x, CPU {res['cpu_s'] / max(1e-9, plain['cpu_s']):.2f}x"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.merge_bench", description=__doc__.splitlines()[0])
    ap.add_argument(
        "--entries",
        type=int,
        default=int(os.environ.get("MERGE_BENCH_ENTRIES", 4_000_000)),
        help="entries in all inputs (env MERGE_BENCH_ENTRIES; default 4,000,000)",
    )
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per engine (median reported)")
    ap.add_argument(
        "--layouts",
        default=None,
        help=f"input layouts, of {', '.join(LAYOUTS)} (default: every one, or the shape's own when it has one)",
    )
    ap.add_argument(
        "--shapes",
        default=",".join(DEFAULT_SHAPES),
        help=f"key shapes, of {', '.join(SHAPES)}, or all (default: base, the original shape)",
    )
    ap.add_argument("--spark-master", default=DEFAULT_SPARK_MASTER)
    ap.add_argument(
        "--engines",
        default="floor,polars,duckdb,pyarrow,arrow,spark",
        help="of floor, polars, duckdb, pyarrow, arrow, arrow-resumable, spark, and with spark: "
        "spark-resumable, spark-per-range",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="instead of the engines' table: the Arrow engine's time by phase beside each phase's floor, "
        "and Polars' (issue 46)",
    )
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temp dir, removed after)")
    ap.add_argument("--csv", default=str(OUT_DIR / "merge.csv"))
    args = ap.parse_args([] if argv is None else argv)  # main() from bench.run: the defaults

    from rich.console import Console
    from rich.table import Table

    from kompaktor.engines import make_engine
    from kompaktor.engines.api import MergeRequest
    from kompaktor.model.iterators import IteratorSettings

    console = Console(width=max(150, Console().width))
    shapes = parse_shapes(args.shapes)  # before anything is made: a typo changes nothing
    scratch = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="kompaktor-bench-"))
    storage = Storage.from_uri(str(scratch / "files"))
    storage.ensure_dir("out")
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    layouts = [x.strip() for x in (args.layouts or ",".join(LAYOUTS)).split(",") if x.strip()]
    rows: list[dict] = []
    profiles: list[dict] = []
    settings = IteratorSettings(max_versions=1, full=True)
    spark_engine = None
    try:
        if "spark" in engines and not args.profile:
            from kompaktor.engines import session as ksp

            reset_peaks()
            t0 = time.perf_counter()
            ksp.get_session(args.spark_master, {"spark.local.dir": str(scratch / "spark-local")})
            spark_engine = make_engine("spark", spark_master=args.spark_master)  # also warms the Python workers
            startup = time.perf_counter() - t0
            rows.append(
                {
                    "shape": "",
                    "layout": "",
                    "engine": "Spark session + worker start-up",
                    "median_s": startup,
                    "min_s": startup,
                    "runs": 1,
                    "entries_in": 0,
                    "entries_out": 0,
                    "entries_per_s": 0,
                    "peak_rss_mb": peak_rss_mb(),
                    "children_peak_rss_mb": children_peak_rss_mb(),
                    "note": "JVM, session and Python workers, once per compactor process",
                }
            )
            console.print(f"Spark session + worker warm-up: {startup:.2f}s")
        for shape in shapes:
            entries = max(args.files, args.entries // shape.entries_div)
            t0 = time.perf_counter()
            generated = generate(storage, entries, args.files, shape=shape)
            console.print(
                f"\n[bold]shape {shape.name}[/bold]: {entries:,} entries in {args.files} files "
                f"({sum(storage.size(p) for p in generated) / 1e6:.1f} MB; {shape}) "
                f"in {time.perf_counter() - t0:.1f}s"
            )
            for layout in _layouts_of(shape, layouts, args):
                inputs = relayout(storage, generated, layout)
                if args.profile:
                    profiles.append(
                        profile_layout(console, storage, inputs, f"{shape.name} x {layout}", settings, MergeRequest)
                    )
                    for p in inputs:
                        storage.delete(p)
                    continue
                md = pq.ParquetFile(storage.path(inputs[0])).metadata
                console.print(
                    f"[bold]{shape.name} x layout {layout}[/bold]: {md.num_row_groups} row group(s) of "
                    f"{md.row_group(0).num_rows:,} rows in the first file"
                )
                got = run_layout(
                    console, storage, inputs, layout, engines, args, settings, spark_engine, MergeRequest, entries
                )
                rows.extend({"shape": shape.name, **r} for r in got)
                for p in inputs:
                    storage.delete(p)
            for p in generated:
                storage.delete(p)
        if args.profile:
            return 0
        print_tables(
            console, rows, [(s.name, x) for s in shapes for x in _layouts_of_all(shapes, layouts, args)], args, Table
        )
        csv_path = Path(args.csv)
        csv_path.parent.mkdir(parents=True, exist_ok=True)
        with open(csv_path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[-1]))
            w.writeheader()
            w.writerows({k: r.get(k, "") for k in rows[-1]} for r in rows)
        console.print(f"wrote {csv_path}")
    finally:
        if not args.dir:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0


def _layouts_of(shape, layouts: list[str], args) -> list[str]:
    """The layouts a shape runs in: ``--layouts`` when given, else the shape's own layout (the
    issue-46 shapes were reported in one), else every layout."""
    if args.layouts is not None:
        return layouts
    return [shape.layout] if shape.layout else list(LAYOUTS)


def _layouts_of_all(shapes, layouts: list[str], args) -> list[str]:
    return list(dict.fromkeys(x for s in shapes for x in _layouts_of(s, layouts, args)))


PEERS = ("Polars", "DuckDB", "pyarrow sort")
FLOOR = "I/O floor"


def run_layout(
    console,
    storage: Storage,
    inputs: list[str],
    layout: str,
    engines: list[str],
    args,
    settings,
    spark_engine,
    request_cls,
    entries: int | None = None,
) -> list[dict]:
    """Every engine on one layout's inputs; rows with their ratios to the best peer and floor."""
    rows: list[dict] = []
    outputs: dict[str, str] = {}
    entries = entries or args.entries
    input_bytes = sum(storage.size(p) for p in inputs)

    def record(name: str, times: list[float], n_out: int, base_mb: float, note: str = "") -> None:
        med = statistics.median(times)
        peak = peak_rss_mb()
        rows.append(
            {
                "layout": layout,
                "engine": name,
                "median_s": med,
                "min_s": min(times),
                "runs": len(times),
                "cpu_s": LAST_CPU[0],
                "entries_in": entries,
                "entries_out": n_out,
                "entries_per_s": entries / med,
                "mb_per_s": input_bytes / 1e6 / med,
                "peak_rss_mb": peak,
                "peak_rss_growth_mb": max(0.0, peak - base_mb),
                "children_peak_rss_mb": children_peak_rss_mb(),
                "note": note,
            }
        )
        console.print(
            f"  {name}: median {med:.2f}s, min {min(times):.2f}s over {len(times)} runs "
            f"({entries / med / 1e6:.2f} M entries/s), {LAST_CPU[0]:.2f} CPU s per run, "
            f"peak RSS {peak:.0f} MB"
        )

    def engine_fn(engine, out: str) -> Callable[[], int]:
        def run() -> int:
            if storage.exists(out):
                storage.delete(out)
            req = request_cls(inputs=tuple(inputs), output=out, prev=None, end=None, settings=settings, tmp_tag="bench")
            return engine.merge(storage, req).entries_written

        return run

    def file_fn(fn, out: str) -> Callable[[], int]:
        def run() -> int:
            if storage.exists(out):
                storage.delete(out)
            return fn(storage, inputs, out)

        return run

    def bench(name: str, fn: Callable[[], int], out: str | None, note: str = "", children: bool = False) -> None:
        base = current_rss_mb()
        times, n = timed(fn, args.repeat, children)
        if out is not None:
            outputs[name] = out
        record(name, times, n, base, note)

    from kompaktor.engines.arrow import ArrowMergeEngine

    if "arrow" in engines:  # first: the reference output
        bench(
            "Arrow engine",
            engine_fn(ArrowMergeEngine(), f"out/{layout}-arrow.parquet"),
            f"out/{layout}-arrow.parquet",
            "in-process, key ranges streamed",
        )
    if "arrow-resumable" in engines:
        bench(
            "Arrow engine, resumable",
            resumable_fn(storage, inputs, settings, request_cls, f"out/{layout}-arrow-resumable.parquet"),
            f"out/{layout}-arrow-resumable.parquet",
            "parts written, checksummed, recorded, appended, deleted",
        )
        _compare_resumable(console, rows, "Arrow engine", "Arrow")
    if "floor" in engines:
        bench(FLOOR, file_fn(io_floor, f"out/{layout}-floor.parquet"), None, "read + write, no sort: not a merge")
    if "polars" in engines:
        bench("Polars", file_fn(polars_merge, f"out/{layout}-polars.parquet"), f"out/{layout}-polars.parquet")
    if "duckdb" in engines:
        bench("DuckDB", file_fn(duckdb_merge, f"out/{layout}-duckdb.parquet"), f"out/{layout}-duckdb.parquet")
    if "pyarrow" in engines:
        bench("pyarrow sort", file_fn(pyarrow_sort, f"out/{layout}-pyarrow.parquet"), f"out/{layout}-pyarrow.parquet")
    if spark_engine is not None:
        reset_peaks()
        cold, _n = timed(engine_fn(spark_engine, f"out/{layout}-spark.parquet"), 1)
        console.print(f"  Spark engine, first run on this layout: {cold[0]:.2f}s")
        bench(
            "Spark engine (warm)",
            engine_fn(spark_engine, f"out/{layout}-spark.parquet"),
            f"out/{layout}-spark.parquet",
            f"master {args.spark_master}",
            children=True,
        )

    if spark_engine is not None and "spark-per-range" in engines:
        from kompaktor.engines.spark import SparkMergeEngine  # the session of spark_engine

        bench(
            "Spark engine, a task per range",
            engine_fn(
                SparkMergeEngine(args.spark_master, warm=False, range_runs=False),
                f"out/{layout}-spark-per-range.parquet",
            ),
            f"out/{layout}-spark-per-range.parquet",
            "before issue 23: every range's task decodes a big row group from its start",
            children=True,
        )

    if spark_engine is not None and "spark-resumable" in engines:
        from kompaktor.engines.spark import SparkMergeEngine  # the session of spark_engine

        bench(
            "Spark engine, resumable",
            resumable_fn(
                storage,
                inputs,
                settings,
                request_cls,
                f"out/{layout}-spark-resumable.parquet",
                SparkMergeEngine(args.spark_master, warm=False, resume_min_bytes=0),
            ),
            f"out/{layout}-spark-resumable.parquet",
            "parts kept, checksummed, recorded; deleted after",
            children=True,
        )
        _compare_resumable(console, rows, "Spark engine (warm)", "Spark")

    names = list(outputs)
    for name in names[1:]:
        if not same_entries(storage, outputs[names[0]], outputs[name]):
            console.print(f"[red]output of {name} differs from {names[0]}[/red]")
            for r in rows:
                if r["engine"] == name:
                    r["note"] = (r["note"] + "; OUTPUT DIFFERS").lstrip("; ")
    for out in outputs.values():
        storage.delete(out)
    best = min((r for r in rows if r["engine"] in PEERS), key=lambda r: r["median_s"], default=None)
    floor = next((r for r in rows if r["engine"] == FLOOR), None)
    best_min = min((r for r in rows if r["engine"] in PEERS), key=lambda r: r["min_s"], default=None)
    best_cpu = min((r for r in rows if r["engine"] in PEERS), key=lambda r: r["cpu_s"], default=None)
    for r in rows:
        r["best_peer"] = best["engine"] if best else ""
        r["speed_vs_best_peer"] = best["median_s"] / r["median_s"] if best else None
        r["speed_vs_floor"] = floor["median_s"] / r["median_s"] if floor else None
        # the same on the fastest run of each (less sensitive to other load on the machine)
        r["min_vs_best_peer"] = best_min["min_s"] / r["min_s"] if best_min else None
        r["min_vs_floor"] = floor["min_s"] / r["min_s"] if floor else None
        r["cpu_vs_best_peer"] = best_cpu["cpu_s"] / r["cpu_s"] if best_cpu and r["cpu_s"] else None
    return rows


class MemoryResumeLog:
    """A :class:`~kompaktor.model.resume.ResumeLog` in memory (the bench has no Redis; the
    compactor's writes one small hash field per part)."""

    fingerprint = "0" * 64

    def __init__(self) -> None:
        self.cuts: tuple = ()
        self.parts: dict = {}

    def load(self):
        return None

    def start(self, cuts, now_ms: int) -> None:
        self.cuts = cuts

    def record(self, part) -> None:
        self.parts[part.index] = part

    def drop(self, index: int) -> None:
        self.parts.pop(index, None)


def resumable_fn(
    storage: Storage, inputs: list[str], settings, request_cls, out: str, engine=None
) -> Callable[[], int]:
    """One resumable merge from scratch (default: the Arrow engine at any size), its parts
    deleted after (as after a commit)."""
    from kompaktor.engines.arrow import ArrowMergeEngine

    engine = engine or ArrowMergeEngine(resume_min_bytes=0)

    def run() -> int:
        if storage.exists(out):
            storage.delete(out)
        req = request_cls(
            inputs=tuple(inputs),
            output=out,
            prev=None,
            end=None,
            settings=settings,
            tmp_tag="bench",
            resume=MemoryResumeLog(),
        )
        result = engine.merge(storage, req)
        for part in result.parts:
            storage.delete(part)
        return result.entries_written

    return run


def current_rss_mb() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def print_tables(console, rows: list[dict], cases: list[tuple[str, str]], args, table_cls) -> None:
    """Every row, then one summary line per (shape, layout) with the ratios beside the aims."""

    def f2(v) -> str:
        return f"{v:.2f}" if isinstance(v, float) else ""

    table = table_cls(
        title=f"merge of {args.files} sorted files, {args.entries:,} entries (value4k: 1/32), "
        f"{os.cpu_count()} cores; "
        "speed = best peer s / engine s (> 1: faster)"
    )
    for col in (
        "shape",
        "layout",
        "engine",
        "median s",
        "min s",
        "CPU s",
        "M entries/s",
        "vs best peer (median/min/CPU)",
        "vs I/O floor (median/min)",
        "peak RSS MB",
        "RSS growth MB",
        "JVM+workers MB",
    ):
        table.add_column(col, justify="left" if col in ("shape", "layout", "engine") else "right")
    for r in rows:
        table.add_row(
            r.get("shape", ""),
            r["layout"],
            r["engine"][:28],
            f"{r['median_s']:.2f}",
            f"{r['min_s']:.2f}",
            f2(r.get("cpu_s")),
            f"{r['entries_per_s'] / 1e6:.2f}" if r["entries_per_s"] else "",
            "/".join(f2(r.get(k)) for k in ("speed_vs_best_peer", "min_vs_best_peer", "cpu_vs_best_peer"))
            if r.get("best_peer")
            else "",
            "/".join(f2(r.get(k)) for k in ("speed_vs_floor", "min_vs_floor")) if r.get("best_peer") else "",
            f"{r['peak_rss_mb']:.0f}",
            f"{r['peak_rss_growth_mb']:.0f}" if "peak_rss_growth_mb" in r else "",
            f"{r['children_peak_rss_mb']:.0f}" if r["children_peak_rss_mb"] else "",
        )
    console.print(table)
    summary = table_cls(
        title="per shape x layout: aims Arrow >= 1.2x best peer (>= 0.9x the I/O floor on disjoint), "
        "Spark (warm) >= 1.0x best peer; a layout's time vs the small-row-group layout (aim <= 1.2x)"
    )
    for col in (
        "shape",
        "layout",
        "best peer",
        "floor s",
        "Arrow s",
        "Arrow vs peer (median/min/CPU)",
        "Arrow vs floor",
        "Arrow vs small layout",
        "Spark s",
        "Spark vs peer (median/min/CPU)",
        "Spark vs floor",
        "Spark vs small layout",
    ):
        summary.add_column(col, justify="left" if col in ("shape", "layout", "best peer") else "right")
    for shape, layout in cases:
        small = {r["engine"]: r["median_s"] for r in rows if r["layout"] == "small" and r.get("shape") == shape}
        by = {r["engine"]: r for r in rows if r["layout"] == layout and r.get("shape") == shape}
        a, sp, fl = by.get("Arrow engine"), by.get("Spark engine (warm)"), by.get(FLOOR)
        peer = next(iter(by.values()))["best_peer"] if by else ""

        def cells(r, name: str, small: dict = small) -> list[str]:
            if r is None:
                return ["", "", "", ""]
            rel = r["median_s"] / small[name] if name in small else None
            vs_peer = "/".join(f2(r.get(k)) for k in ("speed_vs_best_peer", "min_vs_best_peer", "cpu_vs_best_peer"))
            return [f"{r['median_s']:.2f}", vs_peer, f2(r["speed_vs_floor"]), f2(rel)]

        summary.add_row(
            shape,
            layout,
            f"{peer} {by[peer]['median_s']:.2f}s" if peer in by else "",
            f"{fl['median_s']:.2f}" if fl else "",
            *cells(a, "Arrow engine"),
            *cells(sp, "Spark engine (warm)"),
        )
    console.print(summary)


# ---- --profile: where the time goes (issue 46 §1) ---------------------------------------------

#: the Arrow engine's phases in the order printed (kompaktor.files.phases); worker phases run on
#: the engine's threads, ``wait`` and ``write`` on the merge's own thread
ARROW_PHASES = ("plan", "wait_turn", "read", "merge", "take", "encode", "copy", "write", "wait")


def load_average() -> str:
    """The 1-minute load average and the runnable tasks now (``/proc/loadavg``)."""
    try:
        with open("/proc/loadavg") as f:
            parts = f.read().split()
        return f"{parts[0]} ({parts[3]} runnable)"
    except OSError:
        return "?"


def _clocked(out: dict[str, float], name: str, fn: Callable[[], object]) -> None:
    """``out[name]``: wall seconds of ``fn()``; ``out[name + " CPU"]``: its CPU seconds (this
    process, every thread; on a loaded machine, what it cost rather than how long it waited)."""
    t0, c0 = time.perf_counter(), cpu_seconds()
    fn()
    out[name] = time.perf_counter() - t0
    out[f"{name} CPU"] = cpu_seconds() - c0


def floors(storage: Storage, inputs: list[str], output: str) -> dict[str, float]:
    """Each phase's floor, measured on the same files: pyarrow decoding every column of the
    inputs (all threads) and the key columns alone, a plain encode of the merged output (in
    memory, one thread, as the engine's workers encode a range) and its write to a file, and the
    I/O floor (read every input and write them into one file, no merge)."""
    key_cols = ["row", "cf", "cq", "vis", "ts", "deleted"]
    out: dict[str, float] = {}
    _clocked(out, "decode all columns", lambda: [pq.read_table(storage.path(p)) for p in inputs])
    _clocked(out, "decode key columns", lambda: [pq.read_table(storage.path(p), columns=key_cols) for p in inputs])
    merged = pq.read_table(storage.path(output))
    sink = pa.BufferOutputStream()
    _clocked(out, "encode output", lambda: pq.write_table(merged, sink, row_group_size=128 * 1024, **WRITER_OPTIONS))
    data = sink.getvalue()
    path = storage.path("out/profile-write.bin")
    _clocked(out, "write output bytes", lambda: Path(path).write_bytes(data))
    storage.delete("out/profile-write.bin")
    _clocked(out, "I/O floor", lambda: io_floor(storage, inputs, "out/profile-floor.parquet"))
    storage.delete("out/profile-floor.parquet")
    return out


def polars_phases(storage: Storage, inputs: list[str], out: str) -> dict[str, float]:
    """Polars' merge (:func:`polars_merge`) in three timed steps: scan (the inputs read into one
    frame), sort + unique + filter (in memory), sink (the Parquet write)."""
    import polars as pl

    key = ["row", "cf", "cq", "vis"]
    got: dict[str, float] = {}
    frames: list = []
    scans = [
        pl.scan_parquet(storage.path(p)).with_columns(pl.lit(i, pl.Int32).alias("src")) for i, p in enumerate(inputs)
    ]
    _clocked(got, "scan", lambda: frames.append(pl.concat(scans).collect()))
    _clocked(
        got,
        "sort+unique",
        lambda: frames.append(
            frames[0]
            .lazy()
            .sort([*key, "ts", "deleted", "src"], descending=[False] * 4 + [True, True, True])
            .unique(subset=key, keep="first", maintain_order=True)
            .filter(~pl.col("deleted"))
            .drop("src")
            .collect()
        ),
    )
    _clocked(
        got, "sink", lambda: frames[1].write_parquet(storage.path(out), compression="zstd", row_group_size=128 * 1024)
    )
    storage.delete(out)
    return got


def profile_layout(console, storage: Storage, inputs: list[str], label: str, settings, request_cls) -> dict:
    """One profiled Arrow merge of ``inputs``: its wall time and thread-seconds per phase, the
    floors beside them, Polars' phases; the load average before and after each part."""
    from kompaktor.engines.arrow import ArrowMergeEngine
    from kompaktor.files.phases import profiling

    out = f"out/{label}-profile.parquet"
    load_before = load_average()
    req = request_cls(inputs=tuple(inputs), output=out, prev=None, end=None, settings=settings, tmp_tag="bench")
    engine = ArrowMergeEngine()
    engine.merge(storage, req)  # warm: the page cache and the code paths, as the timed run finds them
    storage.delete(out)
    reset_peaks()
    cpu0 = cpu_seconds()
    with profiling() as clock:
        t0 = time.perf_counter()
        engine.merge(storage, req)
        wall = time.perf_counter() - t0
    cpu = cpu_seconds() - cpu0
    peak = peak_rss_mb()
    load_during = load_average()
    fl = floors(storage, inputs, out)
    storage.delete(out)
    pol = polars_phases(storage, inputs, f"out/{label}-profile-polars.parquet")
    result = {
        "label": label,
        "wall": wall,
        "cpu": cpu,
        "peak_rss_mb": peak,
        "workers": engine.workers,
        "phases": dict(clock.seconds),
        "phase_cpu": dict(clock.cpu),
        "floors": fl,
        "polars": pol,
        "load": f"{load_before} -> {load_during} -> {load_average()}",
    }
    print_profile(console, result)
    return result


def print_profile(console, r: dict) -> None:
    ph, cpu, fl, pol = r["phases"], r["phase_cpu"], r["floors"], r["polars"]
    console.print(
        f"[bold]profile {r['label']}[/bold]: Arrow engine wall {r['wall']:.2f}s, CPU {r['cpu']:.2f}s, "
        f"{r['workers']} workers, peak RSS {r['peak_rss_mb']:.0f} MB; load {r['load']}"
    )

    def fmt(k: str, d: dict = fl) -> str:
        return f"{k} {d[k]:.2f}s ({d[k + ' CPU']:.2f} CPU s)"

    floor_of = {
        "read": f"{fmt('decode all columns')}, {fmt('decode key columns')}",
        "encode": fmt("encode output"),
        "write": fmt("write output bytes"),
    }
    for name in ARROW_PHASES:
        if name in ph:
            share = ph[name] / r["wall"]
            console.print(
                f"    {name:<10} {ph[name]:7.2f} thread-s ({share:5.0%} of wall), {cpu.get(name, 0.0):6.2f} CPU s "
                f"on the thread  floor: {floor_of.get(name, '')}"
            )
    console.print(f"    {fmt('I/O floor')}; Polars: " + ", ".join(fmt(k, pol) for k in ("scan", "sort+unique", "sink")))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
