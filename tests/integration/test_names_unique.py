"""Issue 15 §6: file names are never handed out twice, even after Redis loses its last writes,
and giving a finished file its name never replaces a file already there.

The rollback is real: a redis-server of its own, its append-only files copied aside, more writes,
then the server stopped and started from the copy — what a crash under ``appendfsync everysec``
or a failover to a replica that had not received the last writes does to the metadata."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kompaktor import keyspace as C
from kompaktor.client import Client
from kompaktor.files.storage import Storage
from kompaktor.local.redis_server import RedisProcess
from kompaktor.metadata import compactions
from kompaktor.metadata.store import MetadataStore
from kompaktor.model.job import Job
from kompaktor.model.keys import Entry
from tests.support.rawredis import raw_redis


def E(row: bytes) -> Entry:
    return Entry(row, b"f", b"q", b"", 1, False, b"v")


def rollback(server: RedisProcess, saved: Path) -> None:
    """Stop the server and start it from the append-only files saved earlier."""
    server.stop()
    aof = server.data_dir / "appendonlydir"
    shutil.rmtree(aof)
    shutil.copytree(saved, aof)
    server.start()


@pytest.fixture
def server(tmp_path: Path):
    s = RedisProcess(tmp_path / "redis").start()
    yield s
    s.stop()


def test_names_stay_unique_after_redis_loses_its_last_writes(server: RedisProcess, tmp_path: Path) -> None:
    store = MetadataStore.from_url(server.url)
    storage = Storage.from_uri(str(tmp_path / "files"))
    client = Client(store, storage)
    store.tables.create_table("t")
    client.flush("t", [E(b"a")])
    saved = tmp_path / "aof-before"
    shutil.copytree(server.data_dir / "appendonlydir", saved)
    seq_before = int(raw_redis(store).hget(C.SEQ, "file"))

    # writes that will be lost: a flush and a compaction's output name
    lost_flush = client.flush("t", [E(b"b")])
    tablet = store.tables.tablet_ids(store.tables.table_id("t"))[0]
    files = sorted(store.tables.tablet(tablet).files)
    first = compactions.try_reserve(store, Job(tablet, "SYSTEM", 1, "g", {f: 1 for f in files}), "c1", "g")
    storage.ensure_dir(str(Path(first.output).parent))
    Path(storage.path(first.output)).write_bytes(b"the first compaction's output")

    rollback(server, saved)
    assert int(raw_redis(store).hget(C.SEQ, "file")) == seq_before  # the counter went back
    again = client.flush("t", [E(b"c")])
    files = sorted(store.tables.tablet(tablet).files)
    second = compactions.try_reserve(store, Job(tablet, "SYSTEM", 1, "g", {f: 1 for f in files}), "c2", "g")
    # the same sequence numbers were handed out again, the names are not the same
    assert [p.split("/")[-1][:11] for p in again] == [p.split("/")[-1][:11] for p in lost_flush]
    assert set(again).isdisjoint(lost_flush)
    assert second.output.split("/")[-1][:11] == first.output.split("/")[-1][:11]
    assert second.output != first.output
    assert Path(storage.path(first.output)).read_bytes() == b"the first compaction's output"
    store.close()


def test_a_move_never_replaces_an_existing_file(tmp_path: Path) -> None:
    storage = Storage.from_uri(str(tmp_path / "files"))
    storage.ensure_dir("tables/1")
    Path(storage.path("tables/1/A.parquet")).write_bytes(b"committed")
    Path(storage.path("tables/1/_tmp_x_A.parquet")).write_bytes(b"late writer")
    with pytest.raises(FileExistsError, match="not replacing it"):
        storage.move("tables/1/_tmp_x_A.parquet", "tables/1/A.parquet")
    assert Path(storage.path("tables/1/A.parquet")).read_bytes() == b"committed"
    assert Path(storage.path("tables/1/_tmp_x_A.parquet")).read_bytes() == b"late writer"
    storage.move("tables/1/_tmp_x_A.parquet", "tables/1/B.parquet")
    assert Path(storage.path("tables/1/B.parquet")).read_bytes() == b"late writer"
    assert not storage.exists("tables/1/_tmp_x_A.parquet")
