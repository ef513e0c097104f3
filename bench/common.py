"""Helpers shared by the benchmarks: an embedded Redis, timing, output files."""

from __future__ import annotations

import csv
import tempfile
from pathlib import Path

from tests.support.procs import descendants  # noqa: F401 (the benchmarks' process trees)
from tests.support.rawredis import raw_redis

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"


def start_redis():
    """A redis-server in a temp dir of its own; its ``stop()`` also removes the dir (a bench's AOF
    of a million tablets is hundreds of MB: the benches used to leave them all in /tmp)."""
    import shutil

    from kompaktor.local.redis_server import RedisProcess

    data = tempfile.mkdtemp(prefix="kompaktor-bench-redis-")
    redis = RedisProcess(data).start()
    stop = redis.stop

    def stop_and_remove(*args, **kwargs):
        try:
            return stop(*args, **kwargs)
        finally:
            shutil.rmtree(data, ignore_errors=True)

    redis.stop = stop_and_remove
    return redis


def write_csv(name: str, rows: list[dict]) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / name
    if rows:
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return path


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def tablet_doc(tid: str, prev: bytes | None, end: bytes | None, files: dict) -> str:
    """A tablet's metadata document as the store keeps it, written directly to seed big tables."""
    import json

    doc = {
        "table": tid,
        "prev": None if prev is None else prev.hex(),
        "end": None if end is None else end.hex(),
        "files": files,
        "running": {},
        "v": 1,
    }
    return json.dumps(doc)


def fill_tablets(store, jobs: int, name: str) -> tuple[list[str], str]:
    """A table ``name`` of ``jobs`` tablets with three small files each; (tablet IDs, table ID)."""
    from kompaktor import keyspace as C

    splits = [format(i, "06x").encode() for i in range(1, jobs)]
    tid = store.tables.create_table(name, splits)
    ids = store.tables.tablet_ids(tid)
    pipe = raw_redis(store).pipeline(transaction=False)
    prev = None
    for n, (tablet_id, end) in enumerate(zip(ids, [*splits, None], strict=True)):
        fs = {f"tables/{tid}/F{n:07x}{k}.parquet": {"size": 1000, "entries": 10, "deletes": 0} for k in range(3)}
        pipe.set(C.tablet_key(tablet_id), tablet_doc(tid, prev, end, fs))
        prev = end
    pipe.execute()
    return ids, tid
