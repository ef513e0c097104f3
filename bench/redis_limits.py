"""Limits of one Redis primary (issue 15 §7): Redis memory per tablet, per file reference and per
queued job, and conditional mutations per second, measured on an embedded redis-server.

All of Kompaktor's metadata lives in one Redis primary (a mutation touches a table, its tablets
and the group queues in one script, so the keyspace is not shardable across a Redis Cluster).
The ceiling is therefore the primary's memory and its single thread. Run:

    .venv/bin/python -m bench.redis_limits --tablets 20000 --files 10
"""

from __future__ import annotations

import argparse
import json
import threading
import time

from bench.common import start_redis
from tests.support.rawredis import raw_redis


def used(r) -> int:
    return int(r.info("memory")["used_memory"])


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tablets", type=int, default=20_000)
    ap.add_argument("--files", type=int, default=10, help="file references per tablet")
    ap.add_argument("--mutations", type=int, default=4000, help="mutations timed per client count")
    ap.add_argument(
        "--appendfsync",
        choices=["always", "everysec", "no"],
        default=None,
        help="set the server's appendfsync before measuring (default: as started)",
    )
    args = ap.parse_args(argv)
    import tempfile

    from kompaktor.coordinator import Coordinator, CoordinatorSettings
    from kompaktor.files.storage import Storage
    from kompaktor.metadata.store import MetadataStore, Mutation
    from kompaktor.model.names import data_file
    from kompaktor.model.tablet import FileMeta

    redis = start_redis()
    try:
        store = MetadataStore.from_url(redis.url)
        r = raw_redis(store)
        if args.appendfsync:
            r.config_set("appendfsync", args.appendfsync)
        base = used(r)
        splits = [b"row%010d" % (i * 1000) for i in range(1, args.tablets)]
        tid = store.tables.create_table("limits", splits)
        ids = store.tables.tablet_ids(tid)
        after_tablets = used(r)
        rows = [None, *splits]
        seq = 0
        for i in range(0, len(ids), 500):
            m = Mutation(table=tid)
            for k, tab in enumerate(ids[i : i + 500]):
                prev = rows[i + k] or b"row0000000000"
                files = {}
                for _ in range(args.files):
                    seq += 1
                    files[data_file(tid, "flush", seq)] = FileMeta(
                        64_000_000, 1_000_000, 0, prev + b"a", prev + b"z"
                    ).to_json()
                m.tablet(tab).do("add_files", files)
            store.mutate(m)
        r.delete("kz:dirty")
        for k in r.scan_iter(match="kz:mut:*"):  # the idempotence records expire after 10 minutes
            r.delete(k)
        after_files = used(r)
        coord = Coordinator(store, Storage.from_uri(tempfile.mkdtemp()), CoordinatorSettings())
        assert coord.try_lead()
        queued = coord.full_scan()
        after_queue = used(r)
        coord.resign()

        # conditional mutations per second: one file added to a random tablet, 1 and 4 clients
        rates = {}
        for clients in (1, 4):
            n = args.mutations // clients
            done = []

            def work(c: int, n: int = n, done: list[int] = done) -> None:
                s = MetadataStore.from_url(redis.url)
                for j in range(n):
                    tab = ids[(c * 7919 + j * 104729) % len(ids)]
                    m = Mutation(table=tid)
                    m.tablet(tab).require("exists").do(
                        "add_files", {f"tables/{tid}/X{c}-{j}.parquet": FileMeta(1, 1).to_json()}
                    )
                    s.mutate(m)
                done.append(n)
                s.close()

            t0 = time.perf_counter()
            threads = [threading.Thread(target=work, args=(c,)) for c in range(clients)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            rates[clients] = sum(done) / (time.perf_counter() - t0)
        info = r.info("server")
        persistence = r.config_get("appendfsync")
        tablet_b = (after_tablets - base) / len(ids)
        file_b = (after_files - after_tablets) / (len(ids) * args.files)
        job_b = (after_queue - after_files) / max(1, queued)
        gib = 1 << 30
        out = {
            "redis": info["redis_version"],
            "appendfsync": persistence.get("appendfsync"),
            "tablets": len(ids),
            "files_per_tablet": args.files,
            "jobs_queued": queued,
            "bytes_per_tablet": round(tablet_b),
            "bytes_per_file_reference": round(file_b),
            "bytes_per_queued_job": round(job_b),
            "tablets_per_GiB_with_10_files_each": int(gib / (tablet_b + 10 * file_b)),
            "file_references_per_GiB": int(gib / file_b),
            "mutations_per_s_1_client": round(rates[1]),
            "mutations_per_s_4_clients": round(rates[4]),
        }
        print(json.dumps(out, indent=1))
        return out
    finally:
        redis.stop()


if __name__ == "__main__":
    main()
