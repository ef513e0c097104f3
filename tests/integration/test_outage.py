"""A Redis outage of 30 s (issue 15 §6): a real coordinator process and a real compactor process
ride it out and resume, against a real redis-server stopped and restarted on the same port and
data directory (AOF).

The compactor is in the middle of a merge when Redis goes; the merge finishes while Redis is
away, so the compactor has to hold on to its finished output and retry the commit for the rest
of the outage. Afterwards: both processes are still running, the commit landed exactly once, the
coordinator declared nothing dead (it gives heartbeats a full dead-after period from the moment
Redis is back), and new work is planned and compacted."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kompaktor import keyspace as C
from kompaktor.client import Client
from kompaktor.files.storage import Storage
from kompaktor.local.procs import spawn, stop_popen
from kompaktor.local.redis_server import RedisProcess
from kompaktor.metadata.store import MetadataStore
from tests.support.entries import entries
from tests.support.procs import python_env
from tests.support.rawredis import raw_redis
from tests.support.wait import poll

pytestmark = pytest.mark.redis

GATED = str(Path(__file__).parent / "gated_engine.py")
OUTAGE_S = 30.0


def flush(client: Client, table: str, n: int, start: int) -> None:
    for i in range(start, start + n):
        client.flush(table, entries(range(i * 10, i * 10 + 50), i, width=4, value=lambda r: b"v" * 64))


def tablet_files(store: MetadataStore) -> set[str]:
    (t,) = store.tables.tablets(store.tables.table_id("t"))
    return set(t.files)


def test_coordinator_and_compactor_ride_out_a_30s_outage(tmp_path: Path) -> None:
    server = RedisProcess(tmp_path / "redis").start()
    url = server.url
    storage = Storage.from_uri(str(tmp_path / "files"))
    store = MetadataStore.from_url(url)
    client = Client(store, storage)
    gate = tmp_path / "gate"
    env = python_env(KOMPAKTOR_TEST_GATE=str(gate))
    common = ["--redis", url, "--storage", storage.uri]
    stack = contextlib.ExitStack()
    logs = {name: stack.enter_context((tmp_path / f"{name}.log").open("wb")) for name in ("coordinator", "compactor")}
    procs: list[subprocess.Popen] = []
    try:
        store.tables.create_table("t", props={"table.compaction.major.ratio": "2"})
        flush(client, "t", 4, 0)
        rows_before = sorted(e.row for e in client.scan("t"))
        coord = spawn(
            [
                sys.executable,
                "-m",
                "kompaktor",
                "coordinator",
                *common,
                "--metrics-port",
                "-1",
                "--lease",
                "3",
                "--dead-after",
                "10",
                "--full-scan-interval",
                "5",
            ],
            stdout=subprocess.DEVNULL,
            stderr=logs["coordinator"],
            env=env,
        )
        procs.append(coord)
        comp = spawn(
            [
                sys.executable,
                GATED,
                "compactor",
                *common,
                "--group",
                "default",
                "--engine",
                "arrow",
                "--http-port",
                "-1",
                "--id",
                "survivor",
            ],
            stdout=subprocess.DEVNULL,
            stderr=logs["compactor"],
            env=env,
        )
        procs.append(comp)
        alive = (coord, comp)
        poll(lambda: Path(f"{gate}.held").exists(), "a merge in flight", alive=alive)
        (ecid,) = store.running.running_index()

        # the outage: Redis stops; the merge is let finish 5 s in, so the commit waits ~25 s
        server.stop()
        went = time.monotonic()
        while time.monotonic() - went < OUTAGE_S:
            if time.monotonic() - went > 5 and not gate.exists():
                gate.touch()
            for p in alive:
                assert p.poll() is None, f"{p.args[3:5]} exited during the outage"
            time.sleep(0.2)
        server.start()
        back = time.monotonic()

        poll(
            lambda: store.bookkeeping.counters().get("compactions_committed", 0) == 1,
            "the commit after the outage",
            alive=alive,
        )
        committed_after = time.monotonic() - back
        (out,) = tablet_files(store)
        assert ecid not in store.running.running_index()
        assert sorted(e.row for e in client.scan("t")) == rows_before
        assert store.bookkeeping.counters().get("dead_compactions", 0) == 0 and store.running.dead_log() == set()
        # both resume: new files are planned by the coordinator and compacted by the compactor
        flush(client, "t", 3, 100)
        poll(
            lambda: store.bookkeeping.counters().get("compactions_committed", 0) == 2,
            "a compaction after the outage",
            alive=alive,
        )
        assert out not in tablet_files(store) and len(tablet_files(store)) == 1
        print(
            f"outage {OUTAGE_S:.0f}s; commit landed {committed_after:.1f}s after Redis came back; "
            f"fencing token now {int(raw_redis(store).get(C.FENCE))}"
        )
        for p in alive:
            assert p.poll() is None
    finally:
        codes = [stop_popen(p, 60) for p in procs]  # one SIGTERM each, as above
        stack.close()
        store.close()
        server.stop()
    assert codes == [0, 0], codes


def test_a_coordinator_started_after_an_outage_does_not_declare_compactions_dead(tmp_path: Path) -> None:
    """The leader is killed during a 15 s outage; a new coordinator process starts once Redis is
    back, before the compactor has sent a heartbeat again (it is held stopped): the heartbeat is
    15 s old, past dead-after (10 s), yet the new leader declares nothing dead — no leader had
    completed a pass for longer than dead-after, so it gives every compaction dead-after from its
    takeover. The compactor resumes and commits."""
    server = RedisProcess(tmp_path / "redis").start()
    storage = Storage.from_uri(str(tmp_path / "files"))
    store = MetadataStore.from_url(server.url)
    client = Client(store, storage)
    gate = tmp_path / "gate"
    env = python_env(KOMPAKTOR_TEST_GATE=str(gate))
    common = ["--redis", server.url, "--storage", storage.uri]
    coord_args = [
        sys.executable,
        "-m",
        "kompaktor",
        "coordinator",
        *common,
        "--metrics-port",
        "-1",
        "--lease",
        "3",
        "--dead-after",
        "10",
        "--full-scan-interval",
        "5",
    ]
    stack = contextlib.ExitStack()
    log = stack.enter_context((tmp_path / "coordinator.log").open("wb"))
    procs: list[subprocess.Popen] = []
    try:
        store.tables.create_table("t", props={"table.compaction.major.ratio": "2"})
        flush(client, "t", 4, 0)
        first = spawn(coord_args, stdout=subprocess.DEVNULL, stderr=log, env=env)
        procs.append(first)
        comp = spawn(
            [
                sys.executable,
                GATED,
                "compactor",
                *common,
                "--group",
                "default",
                "--engine",
                "arrow",
                "--http-port",
                "-1",
                "--id",
                "held",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        procs.append(comp)
        poll(lambda: Path(f"{gate}.held").exists(), "a merge in flight", alive=(first, comp))
        (ecid,) = store.running.running_index()
        poll(lambda: store.lease.coordinator_seen() is not None, "a completed pass")
        server.stop()
        first.send_signal(signal.SIGKILL)  # the leader dies during the outage
        first.wait(timeout=10)
        went = time.monotonic()
        while time.monotonic() - went < 15.0:
            assert comp.poll() is None
            time.sleep(0.2)
        comp.send_signal(signal.SIGSTOP)  # its heartbeats have not resumed yet
        server.start()
        second = spawn(coord_args, stdout=subprocess.DEVNULL, stderr=log, env=env)
        procs.append(second)
        poll(lambda: int(raw_redis(store).get(C.FENCE) or 0) == 2, "the new coordinator leads", alive=(second,))
        seen = store.lease.coordinator_seen()
        poll(lambda: (store.lease.coordinator_seen() or 0) > seen, "a pass of the new leader", alive=(second,))
        assert ecid in store.running.running_index() and store.bookkeeping.counters().get("dead_compactions", 0) == 0
        comp.send_signal(signal.SIGCONT)
        gate.touch()
        poll(
            lambda: store.bookkeeping.counters().get("compactions_committed", 0) == 1,
            "the commit",
            alive=(second, comp),
        )
        assert store.bookkeeping.counters().get("dead_compactions", 0) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
        # one SIGTERM each (stop_popen's): a second one landing while the interpreter shuts down
        # (its handlers already reset) killed the process with -15 now and then
        codes = [stop_popen(p, 60) for p in procs]
        stack.close()
        store.close()
        server.stop()
    assert codes[1:] == [0, 0], codes
