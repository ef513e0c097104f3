"""Redis upgraded under load (docs/architecture.md "Redis HA and failover"): `kompaktor up --ha`
(a primary, a replica, three sentinels; coordinator and compactors as their own Redis users)
while a writer flushes and the compactors compact. The roll an upgrade makes: the replica
stopped by its PID and started again on its data; a SENTINEL FAILOVER to it; the old primary
stopped and started again as a replica. Then every acknowledged write is there (the test's own
list of them), the new primary holds the function libraries and the ACL users the old one had,
compactions commit after the failover, and no process of the system exited.

Real processes only: redis-server, redis-sentinel, the coordinator and compactor processes; the
moments are observed (Sentinel, INFO, counters), never timed."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from kompaktor.client import Client
from kompaktor.files.storage import Storage
from kompaktor.local.cluster import LocalCluster
from kompaktor.local.config import load_config
from kompaktor.local.ingest import split_points
from kompaktor.local.redis_server import RedisHA, RedisProcess
from kompaktor.metadata import acl
from kompaktor.metadata.store import LIBRARY, MetadataStore
from kompaktor.model.errors import StoreUnavailable
from kompaktor.model.keys import Entry
from tests.support.wait import poll

from .test_local import ARROW_ONLY

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def _libraries(srv: RedisProcess) -> set[str]:
    c = srv.client()
    try:
        # each library a flat [name, value, ...] reply
        return {dict(zip(lib[::2], lib[1::2], strict=True))[b"library_name"].decode() for lib in c.function_list()}
    finally:
        c.close()


def _users(srv: RedisProcess) -> dict[str, tuple[frozenset[str], frozenset[frozenset[str]]]]:
    """``ACL LIST`` per user: its root rules and its selectors, each as a set (a server lists a
    user's commands in an order of its own)."""
    c = srv.client()
    try:
        lines = [line.decode() if isinstance(line, bytes) else str(line) for line in c.acl_list()]
    finally:
        c.close()
    out = {}
    for line in lines:
        root, *selectors = line.replace(")", "").split("(")
        name = root.split()[1]
        out[name] = (frozenset(root.split()), frozenset(frozenset(s.split()) for s in selectors))
    return out


class Writer(threading.Thread):
    """Flushes one new row at a time until stopped; keeps the rows acknowledged (the reference)."""

    def __init__(self, client: Client) -> None:
        super().__init__(daemon=True)
        self.client, self.acked, self.stop = client, list[bytes](), threading.Event()

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            rows = [b"%c%07d" % (b"ahq"[i % 3], n + i) for i in range(30)]
            n += 30
            try:
                self.client.flush("t", [Entry(r, b"f", b"q", b"", 1, False, r) for r in rows])
                self.acked.extend(rows)
            except StoreUnavailable:
                pass  # not acknowledged (a failover, or no replica to WAIT for): may or may not be there

    def more(self, n: int, what: str) -> None:
        target = len(self.acked) + n
        poll(lambda: len(self.acked) >= target, what, timeout=180)


def _committed(store: MetadataStore) -> int:
    return sum(v for k, v in store.bookkeeping.counters().items() if str(k).startswith("committed:"))


def test_redis_rolled_under_load_loses_nothing_and_keeps_functions_and_users(tmp_path: Path) -> None:
    cluster = LocalCluster(
        load_config(ARROW_ONLY), tmp_path / "up", ha=True, coordinator_args=["--full-scan-interval", "2"]
    ).start()
    writer: Writer | None = None
    try:
        ha, store = cluster.redis_ha, cluster.store
        assert ha is not None and store is not None
        libraries, users = _libraries(ha.primary()), _users(ha.primary())
        assert LIBRARY.name in libraries and set(users) >= set(acl.ROLES)
        store.tables.create_table("t", split_points(3))
        writer = Writer(Client(store, Storage.from_uri(cluster.storage_uri)))
        writer.start()
        poll(lambda: _committed(store) >= 1, "a first compaction committed", timeout=180, ignore=StoreUnavailable)

        _restart_replica(ha)
        writer.more(60, "writes acknowledged after the replica's restart")
        old = ha.primary()
        new_port = _failover(ha, old)
        after_failover = _committed(store)
        old.stop()  # the old primary's upgrade: stopped by its PID, started again as a replica
        ha.restart(old)
        writer.more(60, "writes acknowledged after the roll")
        poll(lambda: _committed(store) > after_failover, "a compaction committed after the failover", timeout=180)
        writer.stop.set()
        writer.join(timeout=120)

        new = ha.primary()
        assert new.port == new_port != old.port
        assert _libraries(new) >= libraries and _users(new) == users
        seen = {e.row for e in Client(store, Storage.from_uri(cluster.storage_uri)).scan("t")}
        assert [r for r in writer.acked if r not in seen] == []
        _assert_all_running(cluster, ha)
    finally:
        if writer is not None:
            writer.stop.set()
            writer.join(timeout=120)
        cluster.stop()


def _restart_replica(ha: RedisHA) -> None:
    """The replica's upgrade: SIGTERM by its PID, started again on its data directory."""
    primary = ha.primary()
    (replica,) = [s for s in ha.servers if s is not primary]
    replica.stop()
    replica.start()
    ha.wait_stable(120)


def _failover(ha: RedisHA, old: RedisProcess) -> int:
    """SENTINEL FAILOVER (what an operator runs before upgrading the primary); the new primary's port."""
    c = ha.sentinels[0].client()
    try:
        c.execute_command("SENTINEL", "FAILOVER", ha.SERVICE)
    finally:
        c.close()
    return ha.wait_failover(old.port, 120)


def _assert_all_running(cluster: LocalCluster, ha: RedisHA) -> None:
    assert cluster.coordinator is not None and cluster.coordinator.alive, "the coordinator exited"
    compactors = [p for ps in cluster.compactors.values() for p in ps]
    assert compactors and all(p.alive for p in compactors), [(p.name, p.popen.poll()) for p in compactors]
    assert cluster.exited == []
    assert all(s.running for s in ha.servers) and all(s.running for s in ha.sentinels)
