"""Backups at scale (docs/backup.md): how long a backup and a restore of N tablets take, and how
long a client's calls stall while a backup is taken (the largest PING/GET round trip of a client
calling in a loop, against the same client's before the backup, in the same minutes).

    python -m bench.backup_bench --tablets 1000000
"""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import time
from pathlib import Path

from bench.common import start_redis, tablet_doc
from tests.support.rawredis import raw_redis


def _populate(store, storage, tablets: int, files: int) -> None:
    """A table of ``tablets`` tablets; ``files`` files each spanning 1/files of the rows (so every
    tablet references one, as bulk-imported files are shared). The tablets are written directly
    (as bench.planning_bench does): one create of a million splits would hold Redis too long."""
    from kompaktor import keyspace as C
    from kompaktor.model.names import data_file
    from kompaktor.model.tablet import FileMeta
    from kompaktor.model.tablet import tablet_id as make_id

    splits = [format(i, "08x").encode() for i in range(1, tablets)]
    tid = store.tables.create_table("big", [])
    ends = [*splits, None]
    per = max(1, tablets // files)
    paths = [data_file(tid, "import", n + 1) for n in range(files)]
    for p in paths:
        storage.ensure_dir(str(Path(p).parent))
        out = storage.open_output(p)
        out.write(b"x")
        out.close()
    pipe = raw_redis(store).pipeline(transaction=False)
    for i in range(0, len(splits), 10_000):
        pipe.zadd(C.tablets_key(tid), {end.hex(): 0 for end in splits[i : i + 10_000]})
    pipe.execute()
    meta = FileMeta(64_000_000, 1_000_000, 10, b"a", b"z", 5, 9).to_json()
    prev = None
    for n, end in enumerate(ends):
        fs = {paths[min(n // per, files - 1)]: meta}
        pipe.set(C.tablet_key(make_id(tid, end)), tablet_doc(tid, prev, end, fs))
        prev = end
        if n % 5000 == 4999:
            pipe.execute()
    pipe.execute()


def _stalls(url: str, stop, out) -> None:
    """A client in a process of its own (the backup's decoding would hold this one's GIL) that
    times GETs until ``stop``; sends its round trips back on ``out``."""
    import redis

    r = redis.Redis.from_url(url)
    times = []
    while not stop.is_set():
        t0 = time.perf_counter()
        r.get("kz:coordinator:seen")
        times.append(time.perf_counter() - t0)
    out.put(times)


class Probe:
    def __init__(self, url: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.stop, self.out = ctx.Event(), ctx.Queue()
        self.proc = ctx.Process(target=_stalls, args=(url, self.stop, self.out))
        self.proc.start()
        time.sleep(1.0)  # started and connected

    def finish(self) -> list[float]:
        self.stop.set()
        times = self.out.get()
        self.proc.join()
        return times


def _show(times: list[float]) -> str:
    times = sorted(times)
    return f"max {times[-1] * 1000:.1f} ms, p99 {times[int(len(times) * 0.99)] * 1000:.2f} ms"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tablets", type=int, default=100_000)
    p.add_argument("--files", type=int, default=100)
    args = p.parse_args()
    from kompaktor.files.storage import Storage
    from kompaktor.metadata import backup
    from kompaktor.metadata.store import MetadataStore

    storage = Storage.from_uri(tempfile.mkdtemp(prefix="kompaktor-backup-bench-"))
    redis = start_redis()
    try:
        store = MetadataStore.from_url(redis.url)
        t0 = time.perf_counter()
        _populate(store, storage, args.tablets, args.files)
        print(f"populated {args.tablets} tablets in {time.perf_counter() - t0:.1f} s", flush=True)
        probe = Probe(redis.url)
        time.sleep(3.0)
        quiet = probe.finish()
        probe = Probe(redis.url)
        t0 = time.perf_counter()
        m = backup.create(store, storage)
        took = time.perf_counter() - t0
        during = probe.finish()
        print(
            f"backup: {m.tablets} tablets, {m.bytes / 1e6:.1f} MB in {took:.1f} s; another client's round "
            f"trips while it ran: {_show(during)}; before it: {_show(quiet)}",
            flush=True,
        )
        raw_redis(store).flushall()
        t0 = time.perf_counter()
        r = backup.restore(store, storage, m.id)
        print(f"restore: {r.tablets} tablets into an empty Redis in {time.perf_counter() - t0:.1f} s", flush=True)
        assert len(store.tables.tablet_ids(store.tables.table_id("big"))) == args.tablets
    finally:
        redis.stop()


if __name__ == "__main__":
    main()
