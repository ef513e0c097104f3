"""The merge kernel alone (issue 37 §2): candidate ways of putting one key range of sorted
inputs into merged order, timed on the same range of every key shape in one run.

``python -m bench.merge_kernels [--entries 4000000] [--range 1000000] [--shapes ...] [--repeat 5]``
(default: every shape but ``disjoint``, which the merge never sees: it skips the sort)
generates each shape's inputs (:func:`bench.merge_bench.generate`, 8 files), cuts one range of
about ``--range`` entries from them (the engine's range size) and times, best of ``--repeat``,
in CPU seconds of this process (DataFusion's and Polars' threads count):

- ``arrow sort``: the engine before issue 37 — ``pc.sort_indices`` on the concatenated key
  columns (made contiguous);
- ``arrow sort, chunked``: the same on one chunk per input (Arrow sorts each chunk, then merges);
- ``prefix merge``: :func:`kompaktor.files.arrowstack.merge_indices` — numpy's stable timsort
  of a 64-bit prefix of each row (it merges the inputs' presorted runs), the full key compared
  only where rows of different inputs share a prefix;
- ``polars merge_sorted``: a tree of pairwise ``merge_sorted`` on the key columns;
- ``datafusion SPM``: each input written (untimed) as a Parquet file declared sorted
  (``file_sort_order``) and read back ordered — its plan is a ``SortPreservingMergeExec`` of the
  files (checked with EXPLAIN); only when the ``datafusion`` package is importable.

Each candidate's order is checked equal to the reference's (the key columns and source taken in
that order). Then the whole merge step of the Arrow engine (order, iterator stack, the kept
entries' columns taken: ``merge_tables_once``) as it was (``sort_merge_once``: the key columns
sorted, put into merged order, the stack run on them) and as it is (the stack on the merge's
key starts), outputs checked equal. Prints one table: seconds per candidate and shape.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bench.merge_bench import SHAPES, generate, parse_shapes
from kompaktor.files.arrowstack import KEY_COLUMNS, MERGE_SORT_KEYS, SOURCE, keep_mask, merge_indices, merge_tables_once
from kompaktor.files.sortedfile import COLUMNS
from kompaktor.files.storage import Storage
from kompaktor.model.iterators import IteratorSettings

KEYS = [name for name, _ in MERGE_SORT_KEYS]
SETTINGS = IteratorSettings(max_versions=1, full=True)


def cut_range(storage: Storage, paths: list[str], entries: int) -> list[pa.Table]:
    """The inputs' entries up to the row below which about ``entries`` entries lie (oldest first)."""
    tables = [pq.read_table(storage.path(p), columns=COLUMNS) for p in paths]
    rows = pa.concat_arrays([t.column("row").combine_chunks() for t in tables])
    if entries >= len(rows):
        return tables
    hi = pc.sort_indices(rows)[entries].as_py()
    cut = rows[hi]
    return [t.filter(pc.less_equal(t.column("row"), cut)) for t in tables]


def with_source(tables: list[pa.Table]) -> list[pa.Table]:
    return [
        t.select([*KEY_COLUMNS, "ts", "deleted"]).append_column(
            SOURCE, pa.array(np.full(t.num_rows, i, dtype=np.int32))
        )
        for i, t in enumerate(tables)
    ]


def arrow_sort(tables: list[pa.Table]) -> pa.Array:
    keys = pa.concat_tables(with_source(tables)).combine_chunks()
    return pc.sort_indices(keys, sort_keys=MERGE_SORT_KEYS)


def arrow_sort_chunked(tables: list[pa.Table]) -> pa.Array:
    keys = pa.concat_tables([t.combine_chunks() for t in with_source(tables)])
    return pc.sort_indices(keys, sort_keys=MERGE_SORT_KEYS)


def prefix_merge(tables: list[pa.Table]) -> pa.Array:
    return pa.array(merge_indices(tables))


def polars_merge(tables: list[pa.Table]) -> pa.Array:
    import polars as pl

    frames = []
    offset = 0
    for i, t in enumerate(with_source(tables)):
        df = pl.from_arrow(t)
        assert isinstance(df, pl.DataFrame)
        df = df.with_columns(
            (-pl.col("ts")).alias("nts"),
            (~pl.col("deleted")).alias("ndel"),
            pl.lit(-i, pl.Int32).alias("nsrc"),
            (pl.int_range(0, t.num_rows, dtype=pl.Int64) + offset).alias("idx"),
        ).select(["row", "cf", "cq", "vis", "nts", "ndel", "nsrc", "idx"])
        frames.append(df)
        offset += t.num_rows
    key = ["row", "cf", "cq", "vis", "nts", "ndel", "nsrc"]
    frames.reverse()  # newest first
    while len(frames) > 1:
        frames = [
            frames[j].merge_sorted(frames[j + 1], key=key) if j + 1 < len(frames) else frames[j]
            for j in range(0, len(frames), 2)
        ]
    # merge_sorted is on one key column: sort the (already nearly sorted) result by the full key
    out = frames[0].sort(key, maintain_order=True)
    return out.get_column("idx").to_arrow()


def sort_merge_once(tables: list[pa.Table]) -> pa.Table:
    """``merge_tables_once`` before issue 37 §2 (full compaction settings)."""
    parts = [
        t.select(COLUMNS).append_column(SOURCE, pa.array(np.full(t.num_rows, i, dtype=np.int32)))
        for i, t in enumerate(tables)
    ]
    table = pa.concat_tables(parts)
    keys = table.select(KEYS).combine_chunks()
    idx = pc.sort_indices(keys, sort_keys=MERGE_SORT_KEYS)
    keep = keep_mask(keys.take(idx), SETTINGS)
    del keys
    return table.drop_columns([SOURCE]).take(idx.filter(pa.array(keep))).combine_chunks()


def merge_once(tables: list[pa.Table]) -> pa.Table:
    return merge_tables_once(tables, SETTINGS)


class DataFusionMerge:
    """The range's inputs as Parquet files declared sorted, merged by DataFusion."""

    def __init__(self, tables: list[pa.Table], scratch: Path) -> None:
        from datafusion import SessionConfig, SessionContext, col

        self.dir = scratch / "df"
        shutil.rmtree(self.dir, ignore_errors=True)
        offset = 0
        cfg = SessionConfig().with_target_partitions(max(2, len(tables)))
        self.ctx = SessionContext(cfg)
        order = [
            [
                col("row").sort(ascending=True),
                col("cf").sort(ascending=True),
                col("cq").sort(ascending=True),
                col("vis").sort(ascending=True),
                col("ts").sort(ascending=False),
                col("deleted").sort(ascending=False),
            ]
        ]
        selects = []
        for i, t in enumerate(tables):
            d = self.dir / f"t{i}"
            d.mkdir(parents=True)
            k = t.select([*KEY_COLUMNS, "ts", "deleted"]).append_column(
                "idx", pa.array(np.arange(offset, offset + t.num_rows, dtype=np.int64))
            )
            pq.write_table(k, d / "part.parquet", row_group_size=1 << 20)
            offset += t.num_rows
            self.ctx.register_parquet(f"t{i}", str(d), file_sort_order=order)
            selects.append(f"SELECT row, cf, cq, vis, ts, deleted, {i} AS src, idx FROM t{i}")
        self.sql = (
            f"SELECT idx FROM ({' UNION ALL '.join(selects)}) "
            "ORDER BY row, cf, cq, vis, ts DESC, deleted DESC, src DESC"
        )

    def plan(self) -> str:
        return "\n".join(str(r) for r in self.ctx.sql("EXPLAIN " + self.sql).collect()[0].column(1).to_pylist())

    def __call__(self, tables: list[pa.Table]) -> pa.Array:
        batches = self.ctx.sql(self.sql).collect()
        return pa.concat_arrays([b.column(0) for b in batches if b.num_rows])


def best_of(fn: Callable[[list[pa.Table]], Any], tables: list[pa.Table], repeat: int) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.process_time()  # CPU seconds: what other load on the machine changes least
        out = fn(tables)
        best = min(best, time.process_time() - t0)
    assert out is not None
    return best, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.merge_kernels", description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=4_000_000)
    ap.add_argument("--range", type=int, default=1_000_000, dest="range_entries")
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--shapes", default=",".join(s for s in SHAPES if s != "disjoint"))
    ap.add_argument("--no-datafusion", action="store_true")
    args = ap.parse_args(argv)
    shapes = parse_shapes(args.shapes)
    scratch = Path(tempfile.mkdtemp(prefix="kompaktor-kernels-"))
    storage = Storage.from_uri(str(scratch / "files"))
    results: list[tuple[str, int, dict[str, float]]] = []
    try:
        for shape in shapes:
            entries = max(args.files, args.entries // shape.entries_div)
            paths = generate(storage, entries, args.files, shape=shape)
            tables = cut_range(storage, paths, max(1, args.range_entries // shape.entries_div))
            n = sum(t.num_rows for t in tables)
            cands: dict[str, Callable[[list[pa.Table]], pa.Array]] = {
                "arrow sort": arrow_sort,
                "arrow sort, chunked": arrow_sort_chunked,
                "prefix merge": prefix_merge,
                "polars merge_sorted": polars_merge,
            }
            if not args.no_datafusion:
                try:
                    df = DataFusionMerge(tables, scratch)
                except ImportError:
                    pass
                else:
                    plan = df.plan()
                    spm = "SortPreservingMergeExec" in plan and "SortExec:" not in plan
                    print(f"{shape.name}: DataFusion plan {'merges' if spm else 'SORTS'}:\n{plan}", file=sys.stderr)
                    cands["datafusion SPM" if spm else "datafusion (sorts)"] = df
            ref_keys = pa.concat_tables(with_source(tables)).combine_chunks()
            times: dict[str, float] = {}
            ref = None
            for name, fn in cands.items():
                s, idx = best_of(fn, tables, args.repeat)
                got = ref_keys.take(idx)
                if ref is None:
                    ref = got
                elif not got.equals(ref):
                    name += " (WRONG ORDER)"
                times[name] = s
            before = None
            for name, fn in (("merge step, sort (before)", sort_merge_once), ("merge step, merge (now)", merge_once)):
                s, out = best_of(fn, tables, args.repeat)
                if before is None:
                    before = out
                elif not out.equals(before):
                    name += " (DIFFERS)"
                times[name] = s
            results.append((shape.name, n, times))
            print(shape.name, n, {k: round(v, 3) for k, v in times.items()}, f"load {os.getloadavg()[0]:.1f}")
            for p in paths:
                storage.delete(p)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    names = list(dict.fromkeys(k for _s, _n, t in results for k in t))
    print("| shape | range entries | " + " | ".join(names) + " |")
    print("|---|---:|" + "---:|" * len(names))
    for shape_name, n, t in results:
        print(f"| {shape_name} | {n:,} | " + " | ".join(f"{t[k]:.3f}" if k in t else "" for k in names) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
