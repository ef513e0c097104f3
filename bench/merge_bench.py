"""Merge benchmark (issue 5 §5): one full-compaction merge of 8 sorted input files.

``python -m bench.merge_bench [--entries N] [--files 8] [--repeat 3]`` generates the inputs
(10% of entries overwrite an older file's key, 2% are delete markers; random binary rows, so
bytes >= 0x80 occur), then times on the same files in the same run:

- the Spark engine (warm session; session start-up and the first, cold merge reported apart),
- the in-process Arrow engine,
- DuckDB (read_parquet, window for newest version + delete suppression, ORDER BY, COPY),
- a pyarrow-only merge (read all, sort, vectorized stack, write),
- the I/O floor (read the inputs and write one file, no sort).

Every engine's output is checked to have the same entries as the Arrow engine's. Prints a table
(rich) and writes ``bench/out/merge.csv``. Peak RSS is that of this process (the driver /
compactor process; Spark's JVM and Python workers are separate processes and reported apart
where measurable).
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

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kompaktor.files.sortedfile import SCHEMA, write_sorted
from kompaktor.files.storage import Storage
from kompaktor.model.keys import ARROW_SORT_KEYS

OUT_DIR = Path(__file__).resolve().parent / "out"


def _binary(values: np.ndarray, width: int) -> pa.Array:
    """Fixed-width big-endian bytes of unsigned ints, as a binary array (any byte values)."""
    raw = values.astype(f">u{width}").tobytes()
    fsb = pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(values), [None, pa.py_buffer(raw)])
    return fsb.cast(pa.binary())


def make_table(ids: np.ndarray, ts: np.ndarray, deleted: np.ndarray, rng: np.random.Generator,
               value_bytes: int = 40) -> pa.Table:
    """Entries for column-key ids: row = id // 4 (8 bytes), cf = 2 families, cq = 2 qualifiers."""
    n = len(ids)
    row = _binary(ids // 4, 8)
    fam = pa.array(np.where((ids % 4) < 2, b"f0", b"f1"), pa.binary())
    qual = pa.array(np.where((ids % 2) == 0, b"q0", b"q1"), pa.binary())
    vis = pa.array(np.where((ids % 3) == 0, b"", b"A&B"), pa.binary())
    vals = rng.integers(0, 256, size=n * value_bytes, dtype=np.uint8).tobytes()
    value = pa.FixedSizeBinaryArray.from_buffers(pa.binary(value_bytes), n, [None, pa.py_buffer(vals)])
    value = pc.if_else(pa.array(deleted), pa.scalar(b"", pa.binary()), value.cast(pa.binary()))
    t = pa.Table.from_arrays([row, fam, qual, vis, pa.array(ts, pa.int64()), pa.array(deleted), value],
                             schema=SCHEMA)
    return t.sort_by(ARROW_SORT_KEYS)


def generate(storage: Storage, entries: int, files: int = 8, seed: int = 7) -> list[str]:
    """Write ``files`` sorted inputs holding ``entries`` in total; return their paths, oldest first."""
    rng = np.random.default_rng(seed)
    per = entries // files
    next_id = 0
    universe = rng.permutation(np.arange(entries * 2, dtype=np.uint64)) * np.uint64(2654435761) % np.uint64(2**61)
    paths: list[str] = []
    for f in range(files):
        n = per if f < files - 1 else entries - per * (files - 1)
        n_over = n // 10 if f else 0
        n_del = n // 50 if f else 0
        n_new = n - n_over - n_del
        new = universe[next_id:next_id + n_new]
        next_id += n_new
        old = universe[:next_id - n_new] if f else new
        picks = rng.choice(old, size=n_over + n_del, replace=True) if f else np.array([], np.uint64)
        ids = np.concatenate([new, picks])
        deleted = np.zeros(len(ids), dtype=bool)
        deleted[n_new + n_over:] = True
        ts = (f + 1) * 10_000_000 + rng.integers(0, 1_000_000, size=len(ids))
        path = f"bench/F{f:06d}.parquet"
        write_sorted(storage, path, make_table(ids, ts, deleted, rng))
        paths.append(path)
    return paths


def _descendants(pid: int) -> list[int]:
    """Child processes (recursively) of ``pid``, from /proc: Spark's JVM and its Python workers."""
    parents: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            parents.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in parents.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
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
    for pid in ["self", *_descendants(os.getpid())]:
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
    return sum(_hwm_mb(p) for p in _descendants(os.getpid()))


# ---- peers -----------------------------------------------------------------------------------

def io_floor(storage: Storage, inputs: list[str], out: str) -> int:
    """Read every input and write them into one file, no sort, no stack."""
    with pq.ParquetWriter(storage.path(out), SCHEMA, compression="zstd") as w:
        for p in inputs:
            pf = pq.ParquetFile(storage.path(p))
            for i in range(pf.num_row_groups):
                w.write_table(pf.read_row_group(i))
    return pq.ParquetFile(storage.path(out)).metadata.num_rows


def pyarrow_sort(storage: Storage, inputs: list[str], out: str) -> int:
    """pyarrow alone: read all, concat, sort, newest-version + delete suppression, write."""
    from kompaktor.files.arrowstack import merge_tables

    tables = [pq.read_table(storage.path(p)) for p in inputs]
    merged = merge_tables(tables)
    pq.write_table(merged, storage.path(out), compression="zstd", row_group_size=128 * 1024)
    return merged.num_rows


def duckdb_merge(storage: Storage, inputs: list[str], out: str) -> int:
    """DuckDB: window over each column key (newest source first), drop hidden, ORDER BY, COPY."""
    import duckdb

    files = ", ".join(f"('{storage.path(p)}', {i})" for i, p in enumerate(inputs))
    con = duckdb.connect()
    threads = os.cpu_count() or 2
    con.execute(f"SET threads={threads}")
    con.execute(f"SET temp_directory='{storage.path('duckdb_tmp')}'")
    union = " UNION ALL ".join(
        f"SELECT *, {i} AS src FROM read_parquet('{storage.path(p)}')" for i, p in enumerate(inputs))
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

def timed(fn: Callable[[], int], repeat: int) -> tuple[list[float], int]:
    reset_peaks()
    times, n = [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        n = fn()
        times.append(time.perf_counter() - t0)
    return times, n


def same_entries(storage: Storage, a: str, b: str) -> bool:
    ta, tb = pq.read_table(storage.path(a)), pq.read_table(storage.path(b))
    return ta.select(SCHEMA.names).cast(SCHEMA).equals(tb.select(SCHEMA.names).cast(SCHEMA))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.merge_bench", description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=int(os.environ.get("MERGE_BENCH_ENTRIES", 4_000_000)),
                    help="entries in all inputs (env MERGE_BENCH_ENTRIES; default 4,000,000)")
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per engine (median reported)")
    ap.add_argument("--spark-master", default="local[*]")
    ap.add_argument("--engines", default="floor,pyarrow,duckdb,arrow,spark")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temp dir, removed after)")
    ap.add_argument("--csv", default=str(OUT_DIR / "merge.csv"))
    args = ap.parse_args([] if argv is None else argv)  # main() from bench.run: the defaults

    from rich.console import Console
    from rich.table import Table

    from kompaktor.engines import make_engine
    from kompaktor.engines.api import MergeRequest
    from kompaktor.model.iterators import IteratorSettings

    console = Console(width=max(150, Console().width))
    scratch = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="kompaktor-bench-"))
    storage = Storage.from_uri(str(scratch / "files"))
    storage.ensure_dir("out")
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    rows: list[dict] = []
    try:
        t0 = time.perf_counter()
        inputs = generate(storage, args.entries, args.files)
        input_bytes = sum(storage.size(p) for p in inputs)
        console.print(f"generated {args.entries:,} entries in {args.files} files "
                      f"({input_bytes / 1e6:.1f} MB) in {time.perf_counter() - t0:.1f}s")
        settings = IteratorSettings(max_versions=1, full=True)
        outputs: dict[str, str] = {}

        def record(name: str, times: list[float], n_out: int, note: str = "") -> None:
            med = statistics.median(times)
            rows.append({"engine": name, "median_s": med, "min_s": min(times), "runs": len(times),
                         "entries_in": args.entries, "entries_out": n_out,
                         "entries_per_s": args.entries / med, "mb_per_s": input_bytes / 1e6 / med,
                         "peak_rss_mb": peak_rss_mb(), "children_peak_rss_mb": children_peak_rss_mb(), "note": note})
            console.print(f"  {name}: median {med:.2f}s over {len(times)} runs "
                          f"({args.entries / med / 1e6:.2f} M entries/s)")

        def engine_fn(engine, out: str) -> Callable[[], int]:
            def run() -> int:
                if storage.exists(out):
                    storage.delete(out)
                req = MergeRequest(inputs=tuple(inputs), output=out, prev=None, end=None,
                                   settings=settings, tmp_tag="bench")
                return engine.merge(storage, req).entries_written
            return run

        def file_fn(fn, out: str) -> Callable[[], int]:
            def run() -> int:
                if storage.exists(out):
                    storage.delete(out)
                return fn(storage, inputs, out)
            return run

        if "floor" in engines:
            times, n = timed(file_fn(io_floor, "out/floor.parquet"), args.repeat)
            record("I/O floor (read + write, no sort)", times, n, "not a merge: lower bound")
        if "pyarrow" in engines:
            times, n = timed(file_fn(pyarrow_sort, "out/pyarrow.parquet"), args.repeat)
            outputs["pyarrow sort"] = "out/pyarrow.parquet"
            record("pyarrow sort", times, n)
        if "duckdb" in engines:
            times, n = timed(file_fn(duckdb_merge, "out/duckdb.parquet"), args.repeat)
            outputs["DuckDB"] = "out/duckdb.parquet"
            record("DuckDB", times, n)
        if "arrow" in engines:
            eng = make_engine("arrow")
            times, n = timed(engine_fn(eng, "out/arrow.parquet"), args.repeat)
            outputs["Arrow engine"] = "out/arrow.parquet"
            record("Arrow engine (in-process, key-range chunks)", times, n)
        if "spark" in engines:
            from kompaktor.engines import session as ksp

            reset_peaks()
            t0 = time.perf_counter()
            ksp.get_session(args.spark_master, {"spark.local.dir": str(scratch / "spark-local")})
            startup = time.perf_counter() - t0
            rows.append({"engine": "Spark session start-up", "median_s": startup, "min_s": startup, "runs": 1,
                         "entries_in": 0, "entries_out": 0, "entries_per_s": 0, "mb_per_s": 0,
                         "peak_rss_mb": peak_rss_mb(), "children_peak_rss_mb": children_peak_rss_mb(),
                         "note": "JVM, session and Python workers, once per compactor process"})
            console.print(f"  Spark session start-up: {startup:.2f}s")
            eng = make_engine("spark", spark_master=args.spark_master)  # also warms the Python workers
            startup = time.perf_counter() - t0
            rows[-1]["median_s"] = rows[-1]["min_s"] = startup
            console.print(f"  Spark session + worker warm-up: {startup:.2f}s")
            reset_peaks()
            cold, _n = timed(engine_fn(eng, "out/spark.parquet"), 1)
            rows.append({"engine": "Spark merge, first (cold) run", "median_s": cold[0], "min_s": cold[0],
                         "runs": 1, "entries_in": args.entries, "entries_out": _n,
                         "entries_per_s": args.entries / cold[0], "mb_per_s": input_bytes / 1e6 / cold[0],
                         "peak_rss_mb": peak_rss_mb(), "children_peak_rss_mb": children_peak_rss_mb(),
                         "note": "first merge in the session"})
            times, n = timed(engine_fn(eng, "out/spark.parquet"), args.repeat)
            outputs["Spark engine"] = "out/spark.parquet"
            record("Spark engine (warm)", times, n, f"master {args.spark_master}")

        names = list(outputs)
        for name in names[1:]:
            if not same_entries(storage, outputs[names[0]], outputs[name]):
                console.print(f"[red]output of {name} differs from {names[0]}[/red]")
                for r in rows:
                    if r["engine"].startswith(name.split()[0]):
                        r["note"] = (r["note"] + "; OUTPUT DIFFERS").lstrip("; ")
        peers = [r for r in rows if r["engine"] in ("pyarrow sort", "DuckDB")
                 or r["engine"].startswith("Arrow engine")]
        best = min((r["median_s"] for r in peers), default=None)
        for r in rows:
            r["vs_best_peer"] = (r["median_s"] / best) if best and r["entries_in"] else None

        table = Table(title=f"merge of {args.files} sorted files, {args.entries:,} entries "
                            f"({input_bytes / 1e6:.1f} MB), {os.cpu_count()} cores")
        for col in ("engine", "median s", "entries/s", "MB/s", "x best peer", "peak RSS MB",
                    "JVM+workers MB", "note"):
            table.add_column(col, justify="left" if col in ("engine", "note") else "right")
        for r in rows:
            table.add_row(r["engine"], f"{r['median_s']:.2f}",
                          f"{r['entries_per_s']:,.0f}" if r["entries_per_s"] else "",
                          f"{r['mb_per_s']:.1f}" if r["mb_per_s"] else "",
                          f"{r['vs_best_peer']:.2f}" if r["vs_best_peer"] else "",
                          f"{r['peak_rss_mb']:.0f}",
                          f"{r['children_peak_rss_mb']:.0f}" if r["children_peak_rss_mb"] else "", r["note"])
        console.print(table)
        csv_path = Path(args.csv)
        csv_path.parent.mkdir(parents=True, exist_ok=True)
        with open(csv_path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        console.print(f"wrote {csv_path}")
    finally:
        if not args.dir:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
