"""Kompaktor's Lua as Redis function libraries (:mod:`kompaktor.redisfunctions`) on a real
redis-server: two versions side by side (an upgrade), a server that lost the libraries, a restart,
a killed server brought back from its AOF."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from kompaktor.local.redis_server import RedisProcess
from kompaktor.metadata.store import LIBRARY, MetadataStore
from kompaktor.model.job import Job
from kompaktor.queues.jobqueue import JobQueues
from kompaktor.redisfunctions import LuaLibrary, load_missing
from tests.support.rawredis import raw_redis

pytestmark = pytest.mark.redis


def test_two_versions_side_by_side_each_run_their_own_code(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    old = LuaLibrary("t", "local V = 'old'", {"which": "return V .. ARGV[1]"})
    new = LuaLibrary("t", "local V = 'new'", {"which": "return V .. ARGV[1]"})
    assert old.name != new.name
    assert load_missing(r, [old, new]) == 2
    assert load_missing(r, [old, new]) == 0  # held: nothing loaded again
    assert old.bind(r, "which")(args=["!"]) == b"old!"
    assert new.bind(r, "which")(args=["?"]) == b"new?"
    for lib in (old, new):
        r.function_delete(lib.name)


def test_a_server_that_lost_the_libraries_gets_them_from_the_first_call_that_may_load(store: MetadataStore) -> None:
    """FUNCTION FLUSH (or a new server): a mutation, a queue call and a reservation each find
    their library missing, load it (the default user may) and are applied once."""
    store.load_scripts()
    raw_redis(store).function_flush()
    tid = store.tables.create_table("t", [])
    assert store.tables.table("t").id == tid
    raw_redis(store).function_flush()
    (tablet,) = store.tables.tablet_ids(tid)
    assert store.queues.add(tablet, [Job(tablet, "SYSTEM", 1, "g", {"f": 1})]) == 1
    raw_redis(store).function_flush()
    assert store.queues.poll("g") is not None
    assert store.load_scripts() == 1  # the store's: no call needed it since the last flush


@pytest.mark.parametrize("kill", [False, True])
def test_the_libraries_survive_a_restart(tmp_path: Path, kill: bool) -> None:
    """Redis keeps the libraries in its AOF: after a restart (or a SIGKILL) nothing is loaded
    again, and a compactor — which may not load code — runs at once."""
    server = RedisProcess(tmp_path / "redis").start()
    try:
        store = MetadataStore.from_url(server.url)
        assert store.load_scripts() == 2
        store.close()
        server.stop(kill=kill)
        server.start()
        store = MetadataStore.from_url(server.url)
        libs = [dict(zip(lib[::2], lib[1::2], strict=True)) for lib in raw_redis(store).function_list()]
        held = {lib[b"library_name"].decode() for lib in libs}
        assert {LIBRARY.name, *(lib.name for lib in JobQueues.libraries())} <= held
        assert store.load_scripts() == 0
        store.close()
    finally:
        server.stop()
