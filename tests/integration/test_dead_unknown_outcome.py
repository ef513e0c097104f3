"""A dead compaction whose removal Redis applied but could not confirm durable (the replica gone,
as in a failover) is still handled whole in the same pass: outputs deleted, counted in the dead
log, its failure recorded. Seen in the failover chaos runs: the pass ended at the unconfirmed
removal and the next one no longer saw the ECID. Real redis-server primary and replica."""

from __future__ import annotations

from pathlib import Path

import pytest

from kompaktor.client import Client
from kompaktor.connection import Durability, connect
from kompaktor.coordinator.dead import detect_dead
from kompaktor.files.storage import Storage
from kompaktor.local.redis_server import RedisHA, RedisProcess
from kompaktor.metadata import compactions
from kompaktor.metadata.store import MetadataStore
from kompaktor.model.job import Job
from kompaktor.model.keys import Entry
from kompaktor.model.names import tmp_name

pytestmark = pytest.mark.redis


def test_a_dead_compaction_removed_without_a_durable_reply_is_handled_in_the_same_pass(tmp_path: Path) -> None:
    primary = RedisProcess(tmp_path / "p").start()
    replica = RedisProcess(tmp_path / "r", replica_of=primary.port).start()
    store = None
    try:
        RedisHA._wait_synced(None, replica, 30)  # type: ignore[arg-type]
        store = MetadataStore.from_url(primary.url)
        storage = Storage.from_uri(str(tmp_path / "files"))
        client = Client(store, storage)
        store.tables.create_table("t", [])
        for i in range(3):
            client.flush("t", [Entry(b"r%03d" % i, b"f", b"q", b"", 1, False, b"v")])
        (tablet,) = store.tables.tablet_ids(store.tables.table_id("t"))
        files = {f: 100 for f in store.tables.tablet(tablet).files}
        res = compactions.try_reserve(store, Job(tablet, "SYSTEM", 1, "default", files), "c1", "default")
        assert res is not None
        tmp = tmp_name(res.output, res.ecid)
        storage.ensure_dir(str(Path(tmp).parent))
        Path(storage.path(tmp)).write_bytes(b"half a merge")  # what the dead compactor left
        replica.stop(kill=True)  # from now on Redis applies writes but cannot confirm them durable
        unconfirmed = MetadataStore(
            connect(primary.url), primary.url, durability=Durability("replicas", timeout_ms=200)
        )

        assert detect_dead(unconfirmed, storage, dead_after_s=0, max_attempts=3) == [res.ecid]

        t = store.tables.tablet(tablet)
        assert res.ecid not in t.running and set(t.files) == set(files)  # inputs kept, job removed
        assert res.ecid in store.running.dead_log()
        assert not storage.exists(tmp)
        assert res.ecid not in store.running.running_index()
        assert detect_dead(unconfirmed, storage, dead_after_s=0, max_attempts=3) == []  # handled once
    finally:
        if store is not None:
            store.close()
        replica.stop()
        primary.stop()
