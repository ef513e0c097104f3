"""Fencing of the coordinator (issue 15 §4), against a real redis-server.

A coordinator that lost its lease while it could not tell (stopped, paused, cut off) must change
nothing once another has taken over: every write it makes carries its fencing token and is
refused inside Redis. Shown twice: in process, path by path (each kind of coordinator write,
attempted by the replaced leader, is refused and the metadata is byte for byte unchanged); and
with real processes: a coordinator process frozen with SIGSTOP past its lease, replaced, then
resumed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kompaktor import keyspace as C
from kompaktor.coordinator import Coordinator, CoordinatorSettings
from kompaktor.files.storage import Storage
from kompaktor.local.procs import spawn, stop_popen
from kompaktor.metadata import compactions, failures, tablet_ops
from kompaktor.metadata import user_compactions as usercompaction
from kompaktor.metadata.store import MetadataStore, Mutation
from kompaktor.model.errors import Fenced
from kompaktor.model.job import Job
from kompaktor.model.names import tmp_name
from kompaktor.model.tablet import FileMeta
from tests.support.coordinator import settings as quiet_settings
from tests.support.procs import python_env
from tests.support.rawredis import raw_redis
from tests.support.snapshot import snapshot
from tests.support.wait import poll

pytestmark = pytest.mark.redis


def settings(**kw) -> CoordinatorSettings:
    """A short lease: the tests wait for it to expire."""
    return quiet_settings(**{"lease_ms": 1500, **kw})


def put(storage: Storage, rel: str, data: bytes) -> None:
    storage.ensure_dir(rel.rsplit("/", 1)[0])
    Path(storage.path(rel)).write_bytes(data)


def add_files(store: MetadataStore, tablet_ids: list[str], n: int, tag: str) -> None:
    table = store.tables.tablet(tablet_ids[0]).table
    m = Mutation(table=table)
    for tab in tablet_ids:
        m.tablet(tab).do("add_files", {f"tables/{table}/{tag}-{tab}-{i}": FileMeta(10, 1).to_json() for i in range(n)})
    store.mutate(m)


def test_a_replaced_leader_changes_nothing(store: MetadataStore, storage: Storage) -> None:
    """Every kind of coordinator write, made by a leader that another has replaced while its own
    clock still told it it led, is refused in Redis: queue rebuilds, requeues, dead-compaction
    handling, failure bookkeeping, user-compaction progress, splits, garbage collection."""
    store.tables.create_table("t", [b"g", b"p"])
    tabs = store.tables.tablet_ids(store.tables.table_id("t"))
    add_files(store, tabs, 5, "a")
    a = Coordinator(store, storage, settings())
    assert a.tick() and a.fence == 1
    # work for a: a dead compaction (with a temporary output), a user compaction to advance, a
    # failed job whose backoff has passed, dirty tablets, an unreferenced old file
    res = compactions.reserve(store, store.queues, "default", "c1")
    assert res is not None
    tmp_out = tmp_name(res.output, res.ecid)
    put(storage, tmp_out, b"partial")
    store.running.put_heartbeat(res.ecid, {"updated": time.time() - 100})
    other = next(t for t in tabs if t != res.tablet)
    cid = usercompaction.start(store, "t", b"q")  # the last tablet only
    failures.record_failure(store, other, ["x"], "default", "boom", base_backoff_s=0.0)
    add_files(store, [other], 1, "b")
    garbage = f"tables/{store.tables.table_id('t')}/garbage.parquet"
    put(storage, garbage, b"x")
    os.utime(storage.path(garbage), (time.time() - 3600, time.time() - 3600))

    # a stops renewing (as if frozen); b takes the lease, fencing token 2, and does nothing yet
    a.lease._stop.set()
    b = Coordinator(store, storage, settings())
    poll(b.try_lead, "b takes over")
    assert b.fence == 2
    before = snapshot(raw_redis(store), C.PREFIX + "*")
    files_before = sorted(rel for rel, _ in storage.list_files("tables"))

    # a wakes up believing its lease still valid (a pause right after its last check)
    a.lease._valid_until = float("inf")
    job = Job(other, "SYSTEM", 1, "default", {f"tables/x/{i}": 1 for i in range(2)})
    attempts: list[tuple[str, Callable[[], object]]] = [
        ("a whole pass", a.tick),
        ("dead-compaction handling", a.detect_dead),
        ("user-compaction progress", lambda: usercompaction.advance(a.store)),
        ("failure bookkeeping", lambda: failures.redirty_due(a.store)),
        ("failure counting", lambda: failures.record_failure(a.store, other, ["y"], "default", "late")),
        ("automatic split", lambda: tablet_ops.split(a.store, "t", [b"j"], queues=a.queues)),
        ("queue rebuild", a.full_scan),
        ("incremental planning", a.plan_dirty),
        ("requeue", lambda: a.queues.add(other, [job])),
        ("queue sweep", lambda: a.queues.remove_tablets([other])),
        ("new queue generation", a.queues.begin_full_scan),
        ("marking tablets dirty", lambda: a.store.bookkeeping.mark_dirty(tabs)),
        ("garbage collection", lambda: a.collect_garbage(grace_s=0)),
    ]
    refused = []
    for what, attempt in attempts:
        with pytest.raises(Fenced):
            attempt()
        refused.append(what)
    assert snapshot(raw_redis(store), C.PREFIX + "*") == before, "the replaced leader changed the metadata"
    assert sorted(rel for rel, _ in storage.list_files("tables")) == files_before
    assert storage.exists(tmp_out) and storage.exists(garbage)
    assert len(refused) == len(attempts)

    # the new leader acts normally: the dead compaction goes, the user compaction advances
    assert b.tick()
    assert store.tables.tablet(res.tablet).running == {} and not storage.exists(tmp_out)
    assert store.tables.tablet(tabs[-1]).selection is not None and store.tables.tablet(tabs[-1]).selection.id == cid
    # a, told by its own check, stops: it neither leads nor writes
    a.lease._valid_until = 0.0
    assert not a.tick() and a.fence is None
    b.resign()


def _coordinator(url: str, storage_uri: str, log: Path) -> subprocess.Popen:
    env = python_env()
    with open(log, "wb") as f:
        return spawn(
            [
                sys.executable,
                "-m",
                "kompaktor",
                "coordinator",
                "--redis",
                url,
                "--storage",
                storage_uri,
                "--metrics-port",
                "-1",
                "--lease",
                "2",
                "--full-scan-interval",
                "0",
                "--gc-interval",
                "0.2",
                "--gc-grace",
                "0",
                "--dead-after",
                "1",
            ],
            stdout=subprocess.DEVNULL,
            stderr=f,
            env=env,
        )


def test_sigstopped_coordinator_process_is_fenced(
    store: MetadataStore, storage: Storage, redis_url: str, tmp_path: Path
) -> None:
    """A real coordinator process, busy with back-to-back full scans (2,000 tablets), is frozen
    with SIGSTOP, its 2 s lease runs out, another coordinator takes over; when the first is
    resumed nothing it does changes the metadata or deletes a file, and it keeps running as a
    follower."""
    store.tables.create_table("t", [b"%05d" % i for i in range(1, 2000)])
    tabs = store.tables.tablet_ids(store.tables.table_id("t"))
    add_files(store, tabs, 4, "f")
    keep = f"tables/{store.tables.table_id('t')}/not-yet-referenced.parquet"
    log = tmp_path / "a.log"
    a = _coordinator(redis_url, storage.uri, log)
    try:
        poll(lambda: raw_redis(store).get(C.FENCE) == b"1", "the process leads", timeout=60)
        poll(lambda: int(raw_redis(store).get(C.QUEUE_GENERATION) or 0) >= 3, "a few full scans", timeout=60)
        os.kill(a.pid, signal.SIGSTOP)
        b = Coordinator(store, storage, settings(lease_ms=2000))
        poll(b.try_lead, "another coordinator takes over", timeout=30)
        assert b.fence == 2
        # a file the frozen leader's garbage collection would take (grace 0, referenced by nothing)
        put(storage, keep, b"x")
        before = snapshot(raw_redis(store), C.PREFIX + "*")
        os.kill(a.pid, signal.SIGCONT)
        poll(
            lambda: b"stops acting as leader" in log.read_bytes() or b"lost the coordinator lease" in log.read_bytes(),
            "the resumed leader notices",
            timeout=30,
        )
        # watch for a while: the resumed process runs on (as a follower) and changes nothing
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            assert snapshot(raw_redis(store), C.PREFIX + "*") == before, (
                "the resumed, replaced leader changed the metadata"
            )
            assert storage.exists(keep)
            time.sleep(0.1)
        assert a.poll() is None
        text = log.read_text()
        how = "refused by Redis (FENCED)" if "FENCED" in text else "stopped by its own lease check"
        print(f"resumed leader: {how}")
        assert b.tick()  # the new leader works on
        b.resign()
    finally:
        a.send_signal(signal.SIGCONT)
        stop_popen(a, 20)
