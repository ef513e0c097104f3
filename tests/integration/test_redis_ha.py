"""Issue 15 §1, §2 and the bad inputs: acknowledged means durable, Redis HA through Sentinel.

Real processes only: redis-server primaries and replicas and redis-sentinel processes on free
loopback ports, each in its own directory, each stopped by its PID (:mod:`kompaktor.local.redis_server`).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from kompaktor.cli import main
from kompaktor.client import Client
from kompaktor.connection import Durability, NotDurable, connect, parse_sentinel_url
from kompaktor.files.storage import Storage
from kompaktor.local.redis_server import RedisHA, RedisProcess
from kompaktor.metadata.store import MetadataStore
from kompaktor.model.errors import StoreUnavailable
from kompaktor.model.keys import Entry
from tests.support.ports import free_port
from tests.support.rawredis import raw_redis
from tests.support.snapshot import snapshot
from tests.support.wait import poll

pytestmark = pytest.mark.redis

PASSWORD = "PLANTED-ha-77c1"


def E(row: bytes) -> Entry:
    return Entry(row, b"f", b"q", b"", 1, False, b"v")


@pytest.fixture
def ha(tmp_path: Path):
    h = RedisHA(tmp_path / "ha", password=PASSWORD)
    try:
        h.start()
        yield h
    finally:
        h.stop()


# -- durability: the plan per deployment ---------------------------------------------------------------
def test_single_node_acknowledges_what_it_fsynced_and_says_when_it_cannot(tmp_path: Path) -> None:
    always = RedisProcess(tmp_path / "always").start()
    everysec = RedisProcess(tmp_path / "everysec", appendfsync="everysec").start()
    try:
        s = MetadataStore.from_url(always.url)
        assert s.durability.plan(raw_redis(s)).label.startswith("fsync: appendfsync always")
        s.tables.create_table("t")  # acknowledged: applied and fsynced
        s.close()
        s = MetadataStore.from_url(everysec.url)
        plan = s.durability.plan(raw_redis(s))
        version = raw_redis(s).info("server")["redis_version"]
        if tuple(int(x) for x in version.split(".")[:2]) >= (7, 2):
            assert plan.commands == (("WAITAOF", 1, 0, s.durability.timeout_ms),)
        else:  # Debian 12: 7.0 has no WAITAOF; the store says what it cannot promise
            assert plan.unsafe and "neither WAITAOF (Redis >= 7.2) nor fsync always" in plan.label
            strict = MetadataStore(connect(everysec.url), everysec.url, durability=Durability("fsync"))
            before = snapshot(raw_redis(s))
            with pytest.raises(StoreUnavailable, match="durability fsync is not possible"):
                strict.ping()  # what every command, the coordinator and a compactor do first
            assert snapshot(raw_redis(s)) == before  # refused before anything was written
        s.close()
    finally:
        always.stop()
        everysec.stop()


def test_with_a_replica_a_write_is_acknowledged_once_the_replica_has_it(tmp_path: Path) -> None:
    primary = RedisProcess(tmp_path / "p").start()
    replica = RedisProcess(tmp_path / "r", replica_of=primary.port).start()
    try:
        s = MetadataStore.from_url(primary.url)
        RedisHA._wait_synced(None, replica, 30)  # type: ignore[arg-type]
        assert s.durability.plan(raw_redis(s)).commands[0][:2] == ("WAIT", 1)
        s.tables.create_table("t", [b"m"])
        rc = replica.client()
        assert rc.hget("kz:tables", "t") is not None  # on the replica when the call returned
        # the replica gone: no write is acknowledged any more, each says so in one line
        replica.stop(kill=True)
        s.durability.forget()
        strict = MetadataStore(connect(primary.url), primary.url, durability=Durability("replicas"))
        with pytest.raises(NotDurable, match=r"WAIT: 0 of 1 replica\(s\)\): it may or may not be kept"):
            strict.tables.create_table("u")
        rc.close()
        s.close()
    finally:
        replica.stop()
        primary.stop()


def test_a_fenced_store_waits_as_its_explicit_durability_asks(tmp_path: Path) -> None:
    """A coordinator given ``durability=replicas`` fences its store: the leader's writes must still
    wait for a replica, and with none they are not acknowledged."""
    primary = RedisProcess(tmp_path / "p").start()
    try:
        strict = MetadataStore(connect(primary.url), primary.url, durability=Durability("replicas"))
        leader = strict.fenced(lambda: 1)
        with pytest.raises(NotDurable, match=r"WAIT: 0 of 1 replica\(s\)"):
            leader.tables.create_table("u")
        strict.close()
    finally:
        primary.stop()


def test_a_reservation_is_acknowledged_once_the_replica_has_it_and_an_empty_poll_waits_for_nothing(
    tmp_path: Path,
) -> None:
    """The folded poll-and-reserve waits for the replica only when it reserved: an idle
    compactor's poll stays one quick call while the replica is down, as a queue poll was."""
    import time

    from kompaktor.metadata import compactions
    from kompaktor.model.job import Job
    from kompaktor.model.tablet import FileMeta

    primary = RedisProcess(tmp_path / "p").start()
    replica = RedisProcess(tmp_path / "r", replica_of=primary.port).start()
    try:
        s = MetadataStore.from_url(primary.url)
        RedisHA._wait_synced(None, replica, 30)  # type: ignore[arg-type]
        tid = s.tables.create_table("t")
        tablet = s.tables.tablet_ids(tid)[0]
        s.files.add_files("t", {f"tables/{tid}/F{i:010x}-n.parquet": FileMeta(1, 1) for i in range(2)})
        files = sorted(s.tables.tablet(tablet).files)
        s.queues.add(tablet, [Job(tablet, "SYSTEM", 1, "g", {f: 1 for f in files})])
        res = compactions.reserve(s, s.queues, "g", "c1")
        assert res is not None
        rc = replica.client()
        assert res.ecid.encode() in rc.get(f"kz:tablet:{tablet}")  # on the replica when reserve returned
        rc.close()
        replica.stop(kill=True)
        s.durability.forget()
        strict = MetadataStore(connect(primary.url), primary.url, durability=Durability("replicas"))
        t0 = time.monotonic()
        assert compactions.reserve(strict, strict.queues, "g", "c1") is None
        assert time.monotonic() - t0 < strict.durability.timeout_ms / 1000
        s.close()
    finally:
        replica.stop()
        primary.stop()


def test_durability_setting_is_checked() -> None:
    for bad in ("always", "replicas:0", "fsync:2", "replicas:x"):
        with pytest.raises(StoreUnavailable, match="invalid durability"):
            Durability(bad)
    assert Durability("replicas:2").replicas == 2
    assert Durability(sentinel=True).mode == "replicas" and Durability().mode == "auto"


# -- Sentinel ---------------------------------------------------------------------------------------------
def test_sentinel_url_parsing() -> None:
    u = parse_sentinel_url("redis+sentinel://:p%40ss@10.0.0.1:26379,[::1]:26380/mymaster/3?sentinel_password=s")
    assert u.sentinels == [("10.0.0.1", 26379), ("::1", 26380)] and u.service == "mymaster" and u.db == 3
    assert u.password == "p@ss" and u.sentinel_password == "s" and not u.tls
    assert parse_sentinel_url("rediss+sentinel://h:1/m").tls
    for bad, why in [
        ("redis+sentinel:///m", "name at least one sentinel"),
        ("redis+sentinel://h:x/m", "host:port"),
        ("redis+sentinel://h:1/", "/SERVICE"),
        ("redis+sentinel://h:1/m/x", "a number"),
        ("redis+sentinel://h:1/m?bogus=1", "unknown parameter"),
    ]:
        with pytest.raises(StoreUnavailable, match=why):
            parse_sentinel_url(bad)


def test_failover_loses_no_acknowledged_write(ha: RedisHA, tmp_path: Path) -> None:
    """Writers flush and import through the Sentinel URL while the primary is SIGKILLed; Sentinel
    promotes the replica, the clients reconnect; every write that was acknowledged is there."""
    store = MetadataStore.from_url(ha.url)
    assert store.durability.mode == "replicas"
    client = Client(store, Storage.from_uri(str(tmp_path / "files")))
    store.tables.create_table("t", [b"m"])
    acked: list[bytes] = []
    unknown: list[bytes] = []
    stop = threading.Event()

    def writer() -> None:
        n = 0
        while not stop.is_set():
            row = b"%c%08d" % (b"az"[n % 2], n)
            n += 1
            try:
                client.flush("t", [E(row)])
                acked.append(row)
            except StoreUnavailable:
                unknown.append(row)  # not acknowledged: may or may not be there

    th = threading.Thread(target=writer)
    th.start()
    try:
        poll(lambda: len(acked) >= 20, "20 acknowledged writes", 120)
        old = ha.kill_primary()
        before = len(acked)
        new = ha.wait_failover(old.port)
        ha.restart(old)  # back as a replica of the new primary: writes are acknowledged again
        poll(lambda: len(acked) >= before + 20, "20 more acknowledged writes", 120)
    finally:
        stop.set()
        th.join(timeout=120)
    assert new != old.port and ha.failovers == 1
    seen = {e.row for e in client.scan("t")}
    lost = [r for r in acked if r not in seen]
    assert lost == [] and len(acked) >= 40
    store.close()


# -- bad input: one line, non-zero exit, nothing changed ------------------------------------------------------
def _cli(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def _one_line(r, *needles: str) -> str:
    err = r.stderr if hasattr(r, "stderr") else r.output
    lines = [x for x in err.splitlines() if x.strip()]
    assert r.exit_code == 1 and len(lines) == 1, err
    for n in needles:
        assert n in lines[0], lines[0]
    assert PASSWORD not in err
    return lines[0]


def test_bad_redis_setups_are_one_line_and_change_nothing(ha: RedisHA, tmp_path: Path) -> None:
    primary = ha.primary()
    replica = next(s for s in ha.servers if s is not primary)
    pc, rc = primary.client(), replica.client()
    store = MetadataStore.from_url(ha.url)
    store.tables.create_table("t")
    store.close()
    before = snapshot(pc), snapshot(rc)
    storage = str(tmp_path / "files")
    nobody = f"redis+sentinel://:{PASSWORD}@127.0.0.1:{free_port()},127.0.0.1:{free_port()}/kompaktor/0"
    cases = [
        (nobody, ["no Sentinel at 127.0.0.1:", "names a primary for this service"]),
        (ha.url.replace("/kompaktor/", "/other/"), ["no Sentinel at", "none monitors it"]),
        (ha.url.replace(PASSWORD, "wrong"), ["refused the credentials"]),
        (replica.url, ["is a read-only replica, not the primary", "redis+sentinel://"]),
        (primary.url.replace("redis://", "rediss://"), ["does not speak TLS", "use redis://"]),
    ]
    for url, needles in cases:
        _one_line(_cli("table", "create", "u", "--redis", url, "--storage", storage), *needles)
    assert (snapshot(pc), snapshot(rc)) == before
    pc.close()
    rc.close()


def test_sentinel_url_is_redacted_in_errors() -> None:
    url = f"redis+sentinel://:{PASSWORD}@127.0.0.1:{free_port()}/k/0?sentinel_password={PASSWORD}"
    r = _cli("table", "list", "--redis", url)
    _one_line(r, "redis+sentinel://***@", "sentinel_password=***")


def test_up_ha_runs_primary_replica_and_three_sentinels_and_stops_them(tmp_path: Path) -> None:
    """`kompaktor up --ha`: the URL it prints is a Sentinel URL that works (a table created through
    it lands on the primary and its replica); Ctrl-C stops every Redis and Sentinel process."""
    import os
    import signal
    import socket
    import subprocess
    import sys

    from .test_local import ARROW_ONLY

    cfg = tmp_path / "local.yaml"
    cfg.write_text(ARROW_ONLY)
    p = subprocess.Popen(
        [sys.executable, "-m", "kompaktor", "up", "--ha", "--config", str(cfg), "--data-dir", str(tmp_path / "data")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = p.stdout.readline()  # type: ignore[union-attr]
        assert "kompaktor is up: KOMPAKTOR_REDIS_URL=redis+sentinel://127.0.0.1:" in line, line
        url = line.split("KOMPAKTOR_REDIS_URL=", 1)[1].split()[0]
        env = {**os.environ, "KOMPAKTOR_REDIS_URL": url}
        subprocess.run(
            [sys.executable, "-m", "kompaktor", "table", "create", "t"],
            env=env,
            check=True,
            capture_output=True,
            timeout=120,
        )
        sentinels = [int(hp.rsplit(":", 1)[1]) for hp in url.split("//", 1)[1].split("/", 1)[0].split(",")]
        assert len(sentinels) == 3
        data = tmp_path / "data" / "redis-ha"
        assert sorted(d.name for d in data.iterdir()) == [
            "redis-0",
            "redis-1",
            "sentinel-0",
            "sentinel-1",
            "sentinel-2",
        ]
        store = MetadataStore.from_url(url)
        assert store.durability.plan(raw_redis(store)).commands[0][:2] == ("WAIT", 1)
        ports = [
            int(raw_redis(store).info("replication")["slave0"]["port"]),
            raw_redis(store).connection_pool.get_master_address()[1],
        ]
        store.close()
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=120) == 0

        def closed(port: int) -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) != 0

        for port in [*sentinels, *ports]:  # every server and sentinel is gone: nothing listens any more
            poll(lambda port=port: closed(port), f"port {port} to stop listening", timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
