"""Planning throughput: a full scan of N tablets with 20 files each, and an incremental pass
where 1% changed (issue 4 §6). Aim: full scan of 100,000 tablets under 10 s on 2 cores."""

from __future__ import annotations

import argparse
import json
import random
import time

from bench.common import start_redis, write_csv


def setup(store, tablets: int, files: int, seed: int = 7) -> list[str]:
    """Create a table with ``tablets`` tablets holding ``files`` files each (metadata only)."""
    from kompaktor import keyspace as C

    rng = random.Random(seed)
    splits = [format(i, "08x").encode() for i in range(1, tablets)]
    tid = store.create_table("bench", splits)
    ids = store.tablet_ids(tid)
    pipe = store._r.pipeline(transaction=False)
    prev = None
    for n, (tablet_id, end) in enumerate(zip(ids, [*splits, None], strict=True)):
        fs = {f"tables/{tid}/F{n:07x}{k:03x}.parquet": {"size": rng.randint(1, 64) * 1_000_000,
                                                     "entries": 1000, "deletes": 0, "first": None, "last": None}
              for k in range(files)}
        doc = {"table": tid, "prev": None if prev is None else prev.hex(), "end": None if end is None else end.hex(),
               "files": fs, "running": {}, "v": 1}
        pipe.set(C.tablet_key(tablet_id), json.dumps(doc))
        prev = end
        if n % 5000 == 4999:
            pipe.execute()
    pipe.execute()
    return ids


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tablets", type=int, default=100_000)
    ap.add_argument("--files", type=int, default=20)
    args = ap.parse_args(argv)
    from kompaktor.coordinator import Coordinator
    from kompaktor.files.storage import Storage
    from kompaktor.metadata.store import MetadataStore

    redis = start_redis()
    try:
        store = MetadataStore.from_url(redis.url)
        t0 = time.perf_counter()
        ids = setup(store, args.tablets, args.files)
        setup_s = time.perf_counter() - t0
        import tempfile

        coord = Coordinator(store, Storage.from_uri(tempfile.mkdtemp()))
        coord.try_lead()
        t0 = time.perf_counter()
        queued_full = coord.full_scan()
        full_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        queued_again = coord.full_scan()  # the periodic case: queues already built (and full)
        again_s = time.perf_counter() - t0
        changed = random.Random(1).sample(ids, max(1, len(ids) // 100))
        store.mark_dirty(changed)
        t0 = time.perf_counter()
        queued_inc = coord.plan_dirty()
        inc_s = time.perf_counter() - t0
        rows = [
            {"pass": "full scan", "tablets": len(ids), "seconds": round(full_s, 3),
             "tablets_per_s": round(len(ids) / full_s), "jobs_queued": queued_full},
            {"pass": "full scan, queues built", "tablets": len(ids), "seconds": round(again_s, 3),
             "tablets_per_s": round(len(ids) / again_s), "jobs_queued": queued_again},
            {"pass": "incremental (1% changed)", "tablets": len(changed), "seconds": round(inc_s, 3),
             "tablets_per_s": round(len(changed) / inc_s), "jobs_queued": queued_inc},
        ]
        print(f"planning: setup {setup_s:.1f}s; full scan of {len(ids):,} tablets × {args.files} files: "
              f"{full_s:.2f}s ({len(ids) / full_s:,.0f} tablets/s, aim < 10 s), again with the queues built: "
              f"{again_s:.2f}s; incremental 1%: {inc_s:.3f}s")
        write_csv("planning.csv", rows)
        return rows
    finally:
        redis.stop()


if __name__ == "__main__":
    main()
