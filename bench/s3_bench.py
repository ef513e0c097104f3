"""`python -m bench.s3_bench`: the same merge on the local disk and on an S3 API server, same run.

The inputs (the merge bench's data: 8 sorted files, overwrites and deletes) are written to a
local directory and to a bucket of an S3 API server on loopback (moto in server mode, the test
suite's; pure Python, so its figures are a floor for the protocol's overhead, not a prediction of
AWS); each engine merges them on each store. Prints wall time per store, the ratio S3 / local,
and the requests the merge made by kind (the server's own request log): a compaction's output is
written once — no COPY, no DELETE.

Then the garbage collector's listing: ``--gc-objects`` objects in table directories, listed as a
coordinator's pass lists them; prints objects/s, LIST requests, and what a store of a million
objects costs per bounded pass (``GC_PASS_OBJECTS``) and in all.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.s3_bench")
    p.add_argument("--entries", type=int, default=1_000_000)
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--gc-objects", type=int, default=20_000)
    args = p.parse_args(argv)

    from bench.merge_bench import generate
    from kompaktor.engines import make_engine
    from kompaktor.engines.api import MergeRequest
    from kompaktor.files.storage import Storage
    from kompaktor.model.iterators import IteratorSettings
    from tests.support.s3server import S3Server

    root = Path(tempfile.mkdtemp(prefix="kompaktor-s3bench-"))
    s3 = S3Server(root / "s3", record=True).start()
    try:
        s3.create_bucket("bench")
        os.environ.update(s3.env())
        stores = {"local": Storage.from_uri(str(root / "local")), "s3": Storage.from_uri("s3://bench/merge")}
        inputs = {name: generate(st, args.entries, args.files) for name, st in stores.items()}
        engines = {"arrow": make_engine("arrow")}
        print(f"{args.entries:,} entries in {args.files} files; best of {args.repeat}")
        for ename, engine in engines.items():
            best: dict[str, float] = {}
            for sname, st in stores.items():
                times = []
                for r in range(args.repeat):
                    req = MergeRequest(
                        inputs=tuple(inputs[sname]),
                        output=f"out/{ename}-{r}.parquet",
                        prev=None,
                        end=None,
                        settings=IteratorSettings(),
                        tmp_tag=f"ECID-bench{r}",
                    )
                    if sname == "s3":
                        s3.reset_requests()
                    t0 = time.perf_counter()
                    engine.merge(st, req)
                    times.append(time.perf_counter() - t0)
                    if sname == "s3":
                        kinds = dict(sorted(s3.requests("bench").items()))
                best[sname] = min(times)
            print(
                f"  {ename:6s} local {best['local']:6.2f}s   s3 {best['s3']:6.2f}s   "
                f"s3/local {best['s3'] / best['local']:.2f}x   requests on s3: {kinds}"
            )
            if kinds.get("COPY", 0) or kinds.get("DELETE", 0):
                print("  a merge on S3 copied or deleted objects", file=sys.stderr)
                return 1
        gc_listing(s3, args.gc_objects)
        return 0
    finally:
        s3.stop()


def gc_listing(s3, n: int, tables: int = 10) -> None:
    """List ``n`` objects in ``tables`` table directories the way a garbage-collection pass does."""
    from concurrent.futures import ThreadPoolExecutor

    from kompaktor.coordinator.gc import GC_PASS_OBJECTS
    from kompaktor.files.storage import Storage

    api = s3.client()
    keys = [f"gc/tables/{i % tables:04d}/F{i:010x}-0000000000000000.parquet" for i in range(n)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: api.put_object(Bucket="bench", Key=k, Body=b""), keys))
    storage = Storage.from_uri("s3://bench/gc")
    s3.reset_requests()
    t0 = time.perf_counter()
    listed = sum(len(storage.list_files(f"tables/{d}")) for d in storage.list_dirs("tables"))
    wall = time.perf_counter() - t0
    lists = s3.requests("bench")["LIST"]
    rate = listed / wall
    print(
        f"gc listing: {listed:,} objects in {tables} table directories, {wall:.2f}s, {rate:,.0f} objects/s, "
        f"{lists} LIST requests"
    )
    print(
        f"  at this rate a store of 1,000,000 objects lists in {1e6 / rate:.0f}s; a coordinator pass lists "
        f"at most {GC_PASS_OBJECTS:,} ({GC_PASS_OBJECTS / rate:.0f}s) and the next resumes after it"
    )


if __name__ == "__main__":
    sys.exit(main())
