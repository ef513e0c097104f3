"""Planning throughput: a full scan of N tablets with 20 files each, and an incremental pass
where 1% changed (issue 4 §6). Aim: full scan of 100,000 tablets under 10 s on 2 cores.

At a big instance's scale (issue 27 §1, ``--tablets 1000000 --files 10``, opt-in): aims of a full
pass < 30 s with the coordinator's RSS < 1 GB, an incremental pass (1% changed) < 1 s; prints the
Redis memory per tablet and the longest command Redis ran during the passes (its SLOWLOG, every
command over 5 ms), since one long command holds every compactor's commit up."""

from __future__ import annotations

import argparse
import random
import time

from bench.common import start_redis, tablet_doc, write_csv
from tests.support.rawredis import raw_redis


def setup(store, tablets: int, files: int, seed: int = 7) -> list[str]:
    """Create a table with ``tablets`` tablets holding ``files`` files each (metadata only)."""
    from kompaktor import keyspace as C
    from kompaktor.model.tablet import tablet_id as make_id

    rng = random.Random(seed)
    splits = [format(i, "08x").encode() for i in range(1, tablets)]
    # the table with its one tablet, then the rest written directly: one create of a million
    # splits would be one script running for longer than Redis lets a script hold it
    tid = store.tables.create_table("bench", [])
    ends = [*splits, None]
    ids = [make_id(tid, end) for end in ends]
    pipe = raw_redis(store).pipeline(transaction=False)
    for i in range(0, len(ends) - 1, 10_000):
        pipe.zadd(C.tablets_key(tid), {end.hex(): 0 for end in ends[i : i + 10_000] if end is not None})
    pipe.execute()
    prev = None
    for n, (tablet_id, end) in enumerate(zip(ids, [*splits, None], strict=True)):
        fs = {
            f"tables/{tid}/F{n:07x}{k:03x}.parquet": {
                "size": rng.randint(1, 64) * 1_000_000,
                "entries": 1000,
                "deletes": 0,
                "first": None,
                "last": None,
            }
            for k in range(files)
        }
        pipe.set(C.tablet_key(tablet_id), tablet_doc(tid, prev, end, fs))
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
    import resource

    from kompaktor.coordinator import Coordinator, CoordinatorSettings
    from kompaktor.coordinator.planpool import PARALLEL_MIN_TABLETS
    from kompaktor.files.storage import Storage
    from kompaktor.metadata.store import MetadataStore

    redis = start_redis()
    try:
        store = MetadataStore.from_url(redis.url)
        mem0 = raw_redis(store).info("memory")["used_memory"]
        t0 = time.perf_counter()
        ids = setup(store, args.tablets, args.files)
        setup_s = time.perf_counter() - t0
        per_tablet = (raw_redis(store).info("memory")["used_memory"] - mem0) / max(1, len(ids))
        raw_redis(store).config_set("slowlog-log-slower-than", 5000)
        raw_redis(store).config_set("slowlog-max-len", 10_000)
        raw_redis(store).slowlog_reset()
        rss0 = _rss_mb()
        import tempfile

        storage = Storage.from_uri(tempfile.mkdtemp())
        coord = Coordinator(store, storage)
        workers = coord.settings.plan_workers if len(ids) >= PARALLEL_MIN_TABLETS else 0
        coord.try_lead()
        t0 = time.perf_counter()
        queued_full = coord.full_scan()
        full_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        queued_again = coord.full_scan()  # the periodic case: queues already built (and full)
        again_s = time.perf_counter() - t0
        changed = random.Random(1).sample(ids, max(1, len(ids) // 100))
        store.bookkeeping.mark_dirty(changed)
        t0 = time.perf_counter()
        queued_inc = coord.plan_dirty()
        inc_s = time.perf_counter() - t0
        coord.resign()
        # the baseline, same run: one thread plans every tablet (queues built, as the pass above)
        alone = Coordinator(store, storage, CoordinatorSettings(plan_workers=0))
        alone.try_lead()
        t0 = time.perf_counter()
        alone.full_scan()
        alone_s = time.perf_counter() - t0
        alone.resign()
        rows = [
            {
                "pass": "full scan",
                "tablets": len(ids),
                "seconds": round(full_s, 3),
                "tablets_per_s": round(len(ids) / full_s),
                "jobs_queued": queued_full,
            },
            {
                "pass": "full scan, queues built",
                "tablets": len(ids),
                "seconds": round(again_s, 3),
                "tablets_per_s": round(len(ids) / again_s),
                "jobs_queued": queued_again,
            },
            {
                "pass": "full scan, queues built, one thread",
                "tablets": len(ids),
                "seconds": round(alone_s, 3),
                "tablets_per_s": round(len(ids) / alone_s),
                "jobs_queued": queued_again,
            },
            {
                "pass": "incremental (1% changed)",
                "tablets": len(changed),
                "seconds": round(inc_s, 3),
                "tablets_per_s": round(len(changed) / inc_s),
                "jobs_queued": queued_inc,
            },
        ]
        slow = raw_redis(store).slowlog_get(10_000)
        longest = max((e["duration"] for e in slow), default=0) / 1000
        aim = 30 if len(ids) >= 1_000_000 else 10
        print(
            f"planning: setup {setup_s:.1f}s; full scan of {len(ids):,} tablets × {args.files} files: "
            f"{full_s:.2f}s ({len(ids) / full_s:,.0f} tablets/s, aim < {aim} s), again with the queues built: "
            f"{again_s:.2f}s; incremental 1%: {inc_s:.3f}s (aim < 1 s)"
        )
        print(
            f"  the pass with the queues built: {again_s:.2f}s with {workers} planning worker process(es) beside "
            f"the coordinator, {alone_s:.2f}s in one thread ({alone_s / again_s:.2f}x)"
        )
        print(
            f"  coordinator RSS {rss0:,.0f} MB before the passes, {_rss_mb():,.0f} MB after, peak "
            f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MB (aim < 1,024; includes the "
            f"bench's own setup); Redis {per_tablet:,.0f} bytes per tablet of {args.files} files; Redis commands "
            f"over 5 ms during the passes: {len(slow)}, longest {longest:.1f} ms"
        )
        write_csv("planning.csv", rows)
        return rows
    finally:
        redis.stop()


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


if __name__ == "__main__":
    main()
