"""Crash-safe user compactions (issue 15 §5), against a real redis-server.

A user compaction's start is one atomic mutation (record, request binding, holds); a crash
leaves either no compaction or a whole one, which the coordinator drives to its end. A cancel
cut short is finished by the coordinator. Replays of the same request (the operator's
``start_compaction`` after a restart) get the first compaction's id, never a second compaction
or a refusal."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import pytest

from kompaktor import keyspace as C
from kompaktor.coordinator import Coordinator
from kompaktor.files.storage import Storage
from kompaktor.local.procs import spawn, stop_popen
from kompaktor.metadata import user_compactions as usercompaction
from kompaktor.metadata.store import MetadataStore, Mutation
from kompaktor.model.errors import KompaktorError
from kompaktor.model.tablet import FileMeta
from tests.support.coordinator import settings
from tests.support.procs import python_env
from tests.support.rawredis import raw_redis
from tests.support.snapshot import snapshot

pytestmark = pytest.mark.redis


def add_files(store: MetadataStore, table: str, n: int) -> None:
    tid = store.tables.table_id(table)
    m = Mutation(table=tid)
    for tab in store.tables.tablet_ids(tid):
        m.tablet(tab).do("add_files", {f"tables/{tid}/{tab}-{i}": FileMeta(10, 1).to_json() for i in range(n)})
    store.mutate(m)


def holds(store: MetadataStore, table: str) -> dict[str, str | None]:
    return {t.id: t.hold for t in store.tables.tablets(store.tables.table_id(table))}


def check_whole(store: MetadataStore) -> dict[str, str]:
    """The invariant after any crash: every hold belongs to a registered RUNNING compaction, and
    a registered compaction's tablets are all held by it (nothing advanced it yet). Returns
    table name -> compaction id for the tables that have one."""
    registered = {uc.id: uc for uc in usercompaction.all_compactions(store)}
    found = {}
    for info in store.tables.tables():
        hs = holds(store, info.name)
        owners = set(hs.values()) - {None}
        assert len(owners) <= 1, f"{info.name}: holds of several compactions {owners}"
        if owners:
            (cid,) = owners
            assert cid in registered and registered[cid].state == usercompaction.RUNNING, f"orphan hold {cid}"
            assert all(h == cid for h in hs.values()), f"{info.name}: half-held by {cid}: {hs}"
            assert set(registered[cid].tablets) == set(hs)
            found[info.name] = cid
    for cid, uc in registered.items():
        assert uc.table_name in found and found[uc.table_name] == cid, f"{cid} registered without its holds"
    return found


def test_start_is_all_or_nothing(store: MetadataStore) -> None:
    """A start refused on its last tablet writes nothing at all: no record, no request binding,
    no hold on the tablets before it (the old order left holds no pass would ever visit)."""
    store.tables.create_table("t", [b"g", b"p"])
    last = store.tables.tablet_ids(store.tables.table_id("t"))[-1]
    m = Mutation()
    m.tablet(last).do("set_op", "SPLIT_PENDING")  # an operation in progress there
    store.mutate(m)
    before = snapshot(raw_redis(store), C.PREFIX + "*")
    with pytest.raises(KompaktorError, match="cannot start a user compaction"):
        usercompaction.start(store, "t", request_id="uid-1")
    after = snapshot(raw_redis(store), C.PREFIX + "*")
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    assert changed == {C.SEQ.encode()}  # a compaction number was taken, nothing else
    assert store.ucomps.request_claimed("uid-1") is None and usercompaction.all_compactions(store) == []


def test_concurrent_replays_of_one_request_start_one_compaction(store: MetadataStore, redis_url: str) -> None:
    """Eight starts of the same request at once (an operator restarted mid-handler, twice): one
    compaction, every caller gets its id; none is refused or marked failed."""
    store.tables.create_table("t", [b"g", b"p"])
    got: list[str] = []
    errors: list[BaseException] = []
    gate = threading.Barrier(8)

    def one() -> None:
        s = MetadataStore.from_url(redis_url)
        try:
            gate.wait()
            got.append(usercompaction.start(s, "t", request_id="uid-7"))
        except BaseException as exc:
            errors.append(exc)
        finally:
            s.close()

    threads = [threading.Thread(target=one) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=30)
    assert errors == [] and len(got) == 8 and len(set(got)) == 1
    assert check_whole(store) == {"t": got[0]}
    assert usercompaction.start(store, "t", request_id="uid-7") == got[0]  # a later replay too


def test_a_cancel_cut_short_is_finished_by_the_coordinator(store: MetadataStore, storage: Storage) -> None:
    """The canceller dies after marking the compaction CANCELLED, before releasing anything: the
    coordinator's next pass releases the holds and selections, and SYSTEM compactions run there
    again."""
    store.tables.create_table("t", [b"m"])
    add_files(store, "t", 5)
    coord = Coordinator(store, storage, settings())
    assert coord.tick()
    store.queues.clear_all()
    cid = usercompaction.start(store, "t")
    usercompaction.set_state(store, cid, usercompaction.CANCELLED, "cancelled")  # ... and the canceller died
    assert set(holds(store, "t").values()) == {cid}
    assert coord.tick()
    assert set(holds(store, "t").values()) == {None}
    assert all(t.selection is None for t in store.tables.tablets(store.tables.table_id("t")))
    assert store.ucomps.user_compaction_field(cid, "released") == "1"
    coord.plan_dirty()
    assert {j.kind for j in store.queues.jobs("default")} == {"SYSTEM"}
    assert len(store.queues.jobs("default")) == 2
    coord.resign()


_STARTER = """
import sys
from kompaktor.metadata import user_compactions as uc
from kompaktor.metadata.store import MetadataStore
store = MetadataStore.from_url(sys.argv[1])
print("ready", flush=True)
for i in range(int(sys.argv[2])):
    uc.start(store, f"t{i}", request_id=f"req-{i}")
"""


@pytest.mark.parametrize("kill_after", [0.05, 0.2, 0.5])
def test_starter_killed_at_a_random_point(
    store: MetadataStore, storage: Storage, redis_url: str, kill_after: float
) -> None:
    """A process starting user compactions on 150 tables one after the other is SIGKILLed
    (usually mid-way; how far it got is printed): every table has a whole compaction or none.
    Replaying every request (as the operator would) starts the missing ones and returns the
    existing ones; the coordinator then completes them all."""
    n = 150
    for i in range(n):
        store.tables.create_table(f"t{i}", [b"m"])
    env = python_env()
    p = spawn([sys.executable, "-c", _STARTER, redis_url, str(n)], stdout=subprocess.PIPE, env=env)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
        deadline = time.monotonic() + kill_after
        while time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.005)
        p.send_signal(signal.SIGKILL)  # by its PID; a no-op if it already finished
        p.wait(timeout=10)
    finally:
        stop_popen(p, 5)
    started = check_whole(store)
    print(f"killed after {kill_after}s: {len(started)} of {n} started")
    for name, cid in started.items():
        assert store.ucomps.request_claimed(f"req-{name[1:]}") == cid
    replayed = {f"t{i}": usercompaction.start(store, f"t{i}", request_id=f"req-{i}") for i in range(n)}
    assert all(replayed[name] == cid for name, cid in started.items())
    assert check_whole(store) == replayed
    coord = Coordinator(store, storage, settings())
    assert coord.tick()  # no files: every held tablet is done at once
    assert {usercompaction.get(store, cid).state for cid in replayed.values()} == {usercompaction.SUCCEEDED}
    coord.resign()
