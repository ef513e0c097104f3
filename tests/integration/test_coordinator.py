"""The coordinator against a real redis-server (issue 4 §4, §5): docs/planner.md §5 at the tablet
level (candidates, dispatch), seed 000 scenarios 1-4, seed 001's 15-step USER + SYSTEM example,
user-compaction cancel, restart and leadership, lost queue keys, dead compactions, dead letters,
garbage collection, tables going offline or being deleted.

Merges are real (the in-process Arrow engine) wherever a compaction commits; tests that only
look at planning register file metadata with chosen sizes instead of writing files. Nothing
sleeps to synchronise: time-based rules are driven by backdating heartbeats and failure
records, or by polling with a deadline."""

from __future__ import annotations

import json
import os
import time

import pytest

from kompaktor import keyspace as C
from kompaktor.client import Client
from kompaktor.coordinator import Coordinator
from kompaktor.engines import make_engine
from kompaktor.engines.api import MergeRequest
from kompaktor.files.sortedfile import SortedFileWriter
from kompaktor.files.storage import Storage
from kompaktor.local.chaos import read_only
from kompaktor.metadata import compactions, failures
from kompaktor.metadata import user_compactions as usercompaction
from kompaktor.metadata.compactions import Reservation
from kompaktor.metadata.status import gather
from kompaktor.metadata.store import MetadataStore, Mutation
from kompaktor.model.errors import ConditionFailed, KompaktorError
from kompaktor.model.job import Job
from kompaktor.model.keys import Entry
from kompaktor.model.tablet import OFFLINE, ONLINE, FileMeta
from kompaktor.policy.services import ServiceConfig, Tier
from kompaktor.policy.tableprops import RATIO, SELECTION_EXPIRY
from tests.support.coordinator import settings
from tests.support.rawredis import raw_redis
from tests.support.wait import poll

pytestmark = pytest.mark.redis

ENGINE = make_engine("arrow")


# -- helpers --------------------------------------------------------------------------------------
@pytest.fixture
def coord(store: MetadataStore, storage: Storage) -> Coordinator:
    """A leading coordinator past its first (full-scan) pass: later ticks are incremental."""
    c = Coordinator(store, storage, settings())
    assert c.tick()
    return c


def only_tablet(store: MetadataStore, table: str = "t") -> str:
    (tid,) = store.tables.tablet_ids(store.tables.table_id(table))
    return tid


def fake_files(store: MetadataStore, tablet_id: str, sizes: dict[str, int]) -> None:
    """Register files (metadata only, chosen sizes) with one tablet."""
    t = store.tables.tablet(tablet_id)
    m = Mutation(table=t.table)
    m.tablet(tablet_id).do("add_files", {n: FileMeta(s, 1).to_json() for n, s in sizes.items()})
    store.mutate(m)


_row = [0]


def write_files(client: Client, table: str, n: int, entries: int = 1, value_size: int = 0) -> list[str]:
    """Write ``n`` real files of ``entries`` entries each (fresh rows, all files alike unless
    ``value_size`` asks for incompressible values) and register them with one bulk mutation;
    returns their paths in creation order."""
    tid = client.store.tables.table_id(table)
    metas = {}
    for _ in range(n):
        rows = []
        for _ in range(entries):
            _row[0] += 1
            value = os.urandom(value_size) if value_size else b"v"
            rows.append(Entry(b"r%07d" % _row[0], b"f", b"q", b"", 1, False, value))
        w = SortedFileWriter(client.storage, client.new_file_path(tid, "flush"))
        w.write_entries(rows)
        info = w.commit()
        metas[info.path] = FileMeta(info.size, info.entries, info.deletes, info.first_row, info.last_row)
    client.store.files.add_files(table, metas)
    return list(metas)


def run(store: MetadataStore, storage: Storage, res: Reservation) -> str | None:
    """What a compactor does with a reservation: merge for real, then commit. Returns the output
    (None when the merge produced nothing)."""
    result = ENGINE.merge(storage, MergeRequest(res.inputs, res.output, res.prev, res.end, res.settings, res.ecid))
    compactions.commit(store, res, result.info)
    return res.output if result.info.entries else None


def queued(c: Coordinator, group: str = "default") -> list[Job]:
    return c.queues.jobs(group, limit=10_000)


def reserve(c: Coordinator, group: str = "default", who: str = "cx") -> Reservation | None:
    return compactions.reserve(c.store, c.queues, group, who)


def reserve_all(c: Coordinator, group: str = "default") -> list[Reservation]:
    out = []
    while (res := reserve(c, group, f"c{len(out)}")) is not None:
        out.append(res)
    return out


def set_service(store: MetadataStore, **kw) -> None:
    store.fleet.put_service(ServiceConfig(**kw))


def scan_rows(client: Client, table: str = "t") -> list[bytes]:
    return [e.row for e in client.scan(table)]


def backdate_heartbeat(store: MetadataStore, ecid: str, seconds: float) -> None:
    raw_redis(store).hset(C.heartbeat_key(ecid), mapping={"compactor": "cx", "updated": str(time.time() - seconds)})


def expire_backoffs(store: MetadataStore) -> None:
    """Move every failure's retry time into the past (instead of waiting out the backoff)."""
    for fp, raw in raw_redis(store).hgetall(C.FAILURES).items():
        rec = json.loads(raw)
        rec["retry_at"] = time.time() - 1
        raw_redis(store).hset(C.FAILURES, fp, json.dumps(rec))


def stop_renewing(c: Coordinator) -> None:
    """The coordinator's lease renewal thread stops, as if the process had died (no resign)."""
    c.lease._stop.set()


# -- docs/planner.md §5 at the tablet level ------------------------------------------------------------
def test_system_candidates_exclude_running_files(store: MetadataStore, coord: Coordinator) -> None:
    store.tables.create_table("t")
    tab = only_tablet(store)
    fake_files(store, tab, {f"A{i}": 10 for i in range(4)})
    coord.plan_dirty()
    (j,) = queued(coord)
    assert (j.kind, sorted(j.files)) == ("SYSTEM", ["A0", "A1", "A2", "A3"])
    res = reserve(coord)
    assert res is not None and sorted(res.inputs) == ["A0", "A1", "A2", "A3"]
    fake_files(store, tab, {f"B{i}": 10 for i in range(4)})
    coord.plan_dirty()
    (j,) = queued(coord)
    assert sorted(j.files) == ["B0", "B1", "B2", "B3"]  # running files are never candidates
    # a queued job over running files is refused at reservation (docs/planner.md §6.4 rule 3)
    coord.queues.add(tab, [Job(tab, "SYSTEM", 0, "default", {"A0": 10, "B0": 10})])
    assert reserve(coord) is None
    assert set(store.tables.tablet(tab).running) == {res.ecid}


def test_system_candidates_exclude_selected_files(store: MetadataStore, coord: Coordinator) -> None:
    tid = store.tables.create_table("t")
    tab = only_tablet(store)
    fake_files(store, tab, {**{f"S{i}": 10 for i in range(4)}, **{f"N{i}": 10 for i in range(4)}})
    m = Mutation(table=tid)
    m.tablet(tab).do(
        "set_selection",
        {
            "id": "UC-other",
            "kind": "USER",
            "files": [f"S{i}" for i in range(4)],
            "done": 0,
            "created": int(time.time() * 1000),
        },
    )
    store.mutate(m)
    coord.plan_dirty()
    jobs = queued(coord)
    # only SYSTEM work on the unselected files (the USER compaction does not exist: no USER jobs)
    assert [(j.kind, sorted(j.files), j.overlaps) for j in jobs] == [("SYSTEM", ["N0", "N1", "N2", "N3"], False)]
    # SYSTEM never reserves a selected file, whatever is queued
    coord.queues.add(tab, [Job(tab, "SYSTEM", 0, "default", {"S0": 10, "N0": 10})])
    assert reserve(coord) is None
    assert store.tables.tablet(tab).running == {}


def test_stale_selection_is_a_system_candidate_and_reserving_over_it_drops_it(
    store: MetadataStore, coord: Coordinator
) -> None:
    tid = store.tables.create_table("t", props={SELECTION_EXPIRY: "1000"})
    tab = only_tablet(store)
    fake_files(store, tab, {**{f"S{i}": 10 for i in range(4)}, **{f"N{i}": 10 for i in range(4)}})
    m = Mutation(table=tid)
    m.tablet(tab).do(
        "set_selection",
        {
            "id": "SEL-1",
            "kind": "SELECTOR",
            "files": [f"S{i}" for i in range(4)],
            "done": 0,
            "created": int(time.time() * 1000) - 60_000,
        },
    )
    store.mutate(m)
    coord.plan_dirty()
    sys_jobs = [j for j in queued(coord) if j.kind == "SYSTEM"]
    assert len(sys_jobs) == 1 and set(sys_jobs[0].files) == {f"S{i}" for i in range(4)} | {f"N{i}" for i in range(4)}
    assert sys_jobs[0].overlaps
    coord.queues.clear_all()
    coord.queues.add(tab, sys_jobs)
    res = reserve(coord)
    assert res is not None and res.job.kind == "SYSTEM"
    t = store.tables.tablet(tab)
    assert t.selection is None and set(t.running) == {res.ecid}


def test_dispatch_by_table_property(store: MetadataStore, coord: Coordinator) -> None:
    # services serve every table by default (tables=("*",)); these serve only tables that ask
    set_service(store, name="fast", tables=("none",), tiers=(Tier("small", 100, "g-small"), Tier("big", None, "g-big")))
    set_service(store, name="users", tables=("none",), tiers=(Tier("all", None, "g-user"),))
    store.tables.create_table(
        "t",
        props={
            "table.compaction.dispatcher.opts.service": "fast",
            "table.compaction.dispatcher.opts.service.user": "users",
        },
    )
    store.tables.create_table("plain")
    tab, plain = only_tablet(store), only_tablet(store, "plain")
    fake_files(store, tab, {f"a{i}": 10 for i in range(4)})
    fake_files(store, plain, {f"p{i}": 10 for i in range(4)})
    coord.plan_dirty()
    assert [j.tablet for j in queued(coord, "g-small")] == [tab]  # 40 bytes < 100: the small tier
    assert queued(coord, "g-small")[0].service == "fast"
    assert [j.tablet for j in queued(coord, "default")] == [plain]
    # USER compactions of t go to the `users` service
    coord.queues.clear_all()
    cid = usercompaction.start(store, "t")
    usercompaction.advance(coord.store)
    coord.plan_dirty()
    (uj,) = queued(coord, "g-user")
    assert (uj.kind, uj.selection, uj.service) == ("USER", cid, "users")
    assert queued(coord, "g-small") == []
    # a table naming a service that does not exist gets no jobs
    store.tables.set_props("plain", {"table.compaction.dispatcher.opts.service": "missing"})
    coord.queues.clear_all()
    coord.plan_dirty()
    assert queued(coord, "default") == []


def test_dispatch_by_table_pattern(store: MetadataStore, coord: Coordinator) -> None:
    set_service(store, name="logs", tables=("logs_*",), tiers=(Tier("t", None, "g-logs"),))
    set_service(store, name="users-only", tables=("metrics",), kinds=("USER",), tiers=(Tier("t", None, "g-u"),))
    store.tables.create_table("logs_2024")
    store.tables.create_table("metrics")
    logs, metrics = only_tablet(store, "logs_2024"), only_tablet(store, "metrics")
    fake_files(store, logs, {f"l{i}": 10 for i in range(4)})
    fake_files(store, metrics, {f"m{i}": 10 for i in range(4)})
    coord.plan_dirty()
    assert [j.tablet for j in queued(coord, "g-logs")] == [logs]
    assert [j.tablet for j in queued(coord, "default")] == [metrics]  # no SYSTEM pattern matches
    assert queued(coord, "g-u") == []
    # a property wins over a pattern
    store.tables.set_props("logs_2024", {"table.compaction.dispatcher.opts.service": "default"})
    coord.full_scan()
    assert sorted(j.tablet for j in queued(coord, "default")) == sorted([logs, metrics])


# -- seed 000 ---------------------------------------------------------------------------------------
def test_seed000_scenario1_new_files_while_queued(
    store: MetadataStore, storage: Storage, client: Client, coord: Coordinator
) -> None:
    """T1 has F1,F4,F5,F6; F4,F5,F6 is queued on EE2; F7 arrives: the queued job becomes
    F4..F7; F8 arrives: F4..F8. The old jobs are gone, never run."""
    set_service(store, name="default", tiers=(Tier("ee2", None, "EE2"),))
    store.tables.create_table("t", props={RATIO: "2"})
    tab = only_tablet(store)
    (f1,) = write_files(client, "t", 1, entries=50, value_size=1000)  # big: never worth compacting with small ones
    f4_6 = write_files(client, "t", 3)
    coord.plan_dirty()
    (j,) = queued(coord, "EE2")
    assert sorted(j.files) == sorted(f4_6)
    (f7,) = write_files(client, "t", 1)
    coord.plan_dirty()
    (j,) = queued(coord, "EE2")
    assert sorted(j.files) == sorted([*f4_6, f7])
    (f8,) = write_files(client, "t", 1)
    coord.plan_dirty()
    (j,) = queued(coord, "EE2")
    assert sorted(j.files) == sorted([*f4_6, f7, f8])
    assert coord.queues.stats("EE2").rejected == 0  # replaced, not rejected
    res = reserve(coord, "EE2")
    assert sorted(res.inputs) == sorted([*f4_6, f7, f8])
    assert reserve(coord, "EE2") is None
    before = scan_rows(client)
    out = run(store, storage, res)
    assert set(store.tables.tablet(tab).files) == {f1, out}
    assert scan_rows(client) == before


def test_seed000_scenario2_replanned_into_another_group(store: MetadataStore, coord: Coordinator) -> None:
    """T1 has F1..F4; F1,F2,F3 is queued on the small group IE1; F5..F9 arrive; a job of
    F1..F9 is queued on EE2. The IE1 job can no longer run and is gone after the sweep."""
    set_service(store, name="default", ratio=2.0, tiers=(Tier("ie1", 100, "IE1"), Tier("ee2", None, "EE2")))
    store.tables.create_table("t")
    tab = only_tablet(store)
    fake_files(store, tab, {"F1": 10, "F2": 10, "F3": 10, "F4": 50})
    coord.plan_dirty()
    (j,) = queued(coord, "IE1")
    assert sorted(j.files) == ["F1", "F2", "F3"]
    fake_files(store, tab, {f"F{i}": 10 for i in range(5, 10)})
    coord.plan_dirty()
    (j,) = queued(coord, "EE2")
    assert sorted(j.files) == [f"F{i}" for i in range(1, 10)]
    # replacement is per group (docs/planner.md §6.2): the IE1 entry waits for the sweep...
    assert [sorted(j.files) for j in queued(coord, "IE1")] == [["F1", "F2", "F3"]]
    # ... but it can never run together with the EE2 job: whichever reserves first wins
    res = reserve(coord, "EE2")
    assert sorted(res.inputs) == [f"F{i}" for i in range(1, 10)]
    assert reserve(coord, "IE1") is None
    # and a full scan sweeps stale entries: re-queue the old job and sweep
    coord.queues.add(tab, [j for j in [Job(tab, "SYSTEM", -32000, "IE1", {"F1": 10, "F2": 10, "F3": 10})]])
    coord.full_scan()
    assert queued(coord, "IE1") == []


def test_seed000_scenario3_table_deleted(
    store: MetadataStore, storage: Storage, client: Client, coord: Coordinator
) -> None:
    """A queued job of a deleted table fails cleanly: no reservation, nothing written; a job
    already running when the table goes fails to commit and leaves no output."""
    store.tables.create_table("t", [b"r5"], props={RATIO: "2"})
    t1, t2 = store.tables.tablet_ids(store.tables.table_id("t"))
    _row[0] = 0
    write_files(client, "t", 3)  # rows r0000001.. all fall in the first tablet (<= r5)
    _row[0] = 6_000_000
    write_files(client, "t", 3)  # rows r6000001..: the second tablet
    coord.plan_dirty()
    assert sorted(j.tablet for j in queued(coord)) == [t1, t2]
    running = reserve(coord)
    result = ENGINE.merge(
        storage, MergeRequest(running.inputs, running.output, running.prev, running.end, running.settings, running.ecid)
    )
    store.tables.delete_table("t")
    with pytest.raises(ConditionFailed):
        compactions.commit(store, running, result.info)
    compactions.release(store, storage, running)
    assert not storage.exists(running.output)
    assert raw_redis(store).hlen(C.RUNNING) == 0
    files_before = storage.list_files("tables")
    assert reserve(coord) is None  # the other tablet's queued job is discarded
    assert storage.list_files("tables") == files_before
    assert raw_redis(store).hlen(C.RUNNING) == 0


def test_seed000_scenario4_coordinator_dies_job_queued_again(
    store: MetadataStore, storage: Storage, client: Client
) -> None:
    """The process holding the queue dies; T1's compaction is queued again from the metadata
    by whoever takes over (here: a new coordinator, after the queue keys were lost too)."""
    set_service(store, name="default", tiers=(Tier("ee2", None, "EE2"),))
    store.tables.create_table("t", props={RATIO: "2"})
    files = write_files(client, "t", 3)
    first = Coordinator(store, storage, settings(lease_ms=300))
    assert first.tick()
    (j,) = queued(first, "EE2")
    assert sorted(j.files) == sorted(files)
    # the first coordinator dies (no resign, no more renewals) and the queues are lost
    stop_renewing(first)
    first.queues.clear_all()
    second = Coordinator(store, storage, settings(lease_ms=300))
    poll(second.tick, "the second coordinator to lead", every=0.02)
    (j2,) = queued(second, "EE2")
    assert (j2.tablet, sorted(j2.files), j2.kind) == (j.tablet, sorted(files), "SYSTEM")
    res = reserve(second, "EE2")
    out = run(store, storage, res)
    assert set(store.tables.tablet(res.tablet).files) == {out}


# -- seed 001 -----------------------------------------------------------------------------------------
def test_seed001_user_compaction_while_system_compactions_run(
    store: MetadataStore, storage: Storage, client: Client, coord: Coordinator
) -> None:
    set_service(store, name="default", max_open=30)
    store.tables.create_table("t")
    tab = only_tablet(store)
    r = raw_redis(store)

    def system_never_takes_selected() -> None:
        t = store.tables.tablet(tab)
        sel = set(t.selection.files) if t.selection else set()
        for rc in t.running.values():
            if rc.kind == "SYSTEM":
                assert not sel & set(rc.files)

    # 1. Tablet A has 200 files F1...F200
    f = write_files(client, "t", 200)
    rows = scan_rows(client)
    assert len(rows) == 200
    # 2. A system compaction job is running on 30 files F171...F200
    sys1 = compactions.try_reserve(
        store,
        Job(tab, "SYSTEM", 0, "default", {p: store.tables.tablet(tab).files[p].size for p in f[170:]}),
        "c-sys1",
        "default",
    )
    # 3. A user compaction is initiated and must wait: it places a hold on the tablet
    cid = usercompaction.start(store, "t")
    usercompaction.advance(coord.store)
    t = store.tables.tablet(tab)
    assert t.hold == cid and t.selection is None
    # 4. The system compaction of F171...F200 completes producing F201
    f201 = run(store, storage, sys1)
    assert set(store.tables.tablet(tab).files) == {*f[:170], f201}
    # 5. The planner asks for another system compaction; the hold prevents it from starting
    coord.plan_dirty()
    assert queued(coord) and all(j.kind == "SYSTEM" for j in queued(coord))
    assert reserve_all(coord) == []
    assert store.tables.tablet(tab).running == {}
    # 6. The user compaction selects F1...F170, F201; they are no longer SYSTEM candidates
    usercompaction.advance(coord.store)
    t = store.tables.tablet(tab)
    assert t.hold is None and t.selection.id == cid and t.selection.kind == "USER"
    assert set(t.selection.files) == {*f[:170], f201}
    # 7. Several disjoint USER jobs cover the selected files
    coord.plan_dirty()
    ujobs = queued(coord)
    assert len(ujobs) >= 2 and all(j.kind == "USER" and j.selection == cid for j in ujobs)
    covered = [p for j in ujobs for p in j.files]
    assert len(covered) == len(set(covered)) and set(covered) == set(t.selection.files)
    user_running = reserve_all(coord)
    assert len(user_running) == len(ujobs)
    # 8. 40 new files F301...F340 arrive while the user compaction runs
    new = write_files(client, "t", 40)
    # 9. A new system compaction is queued on new files only
    coord.plan_dirty()
    sjobs = queued(coord)
    assert sjobs and all(j.kind == "SYSTEM" and set(j.files) <= set(new) for j in sjobs)
    sys2 = reserve(coord, who="c-sys2")
    assert sys2.job.kind == "SYSTEM"
    system_never_takes_selected()
    # 10. The user jobs complete; their outputs replace their inputs in the selection
    outs = [run(store, storage, res) for res in user_running]
    t = store.tables.tablet(tab)
    assert set(t.selection.files) == set(outs) and t.selection.done == len(outs)
    assert usercompaction.get(store, cid).done == 0
    # 11. A user job is queued for the intermediate outputs
    coord.plan_dirty()
    (u_last,) = [j for j in queued(coord) if j.kind == "USER"]
    assert set(u_last.files) == set(outs)
    # 12. The system compaction on new files completes producing F341
    f341 = run(store, storage, sys2)
    # 13. A system compaction of the other new files and F341 is queued (outside the selection)
    coord.plan_dirty()
    sjobs = [j for j in queued(coord) if j.kind == "SYSTEM"]
    rest = set(new) - set(sys2.inputs)
    assert len(sjobs) == 1 and set(sjobs[0].files) == rest | {f341}
    (u_again,) = [j for j in queued(coord) if j.kind == "USER"]  # re-planned: the same files
    assert (set(u_again.files), u_again.selection) == (set(outs), cid)
    both = reserve_all(coord)
    assert sorted(res.job.kind for res in both) == ["SYSTEM", "USER"]
    system_never_takes_selected()
    # 14. The user compaction of the outputs completes producing F406: done, selection nullified
    (u_res,) = [res for res in both if res.job.kind == "USER"]
    (s_res,) = [res for res in both if res.job.kind == "SYSTEM"]
    f406 = run(store, storage, u_res)
    t = store.tables.tablet(tab)
    assert t.selection is None and r.sismember(C.ucomp_done_key(cid), tab)
    usercompaction.advance(coord.store)
    uc = usercompaction.get(store, cid)
    assert (uc.state, uc.done, uc.total) == (usercompaction.SUCCEEDED, 1, 1)
    f_sys = run(store, storage, s_res)
    assert set(store.tables.tablet(tab).files) == {f406, f_sys}
    # 15. No selected files: system compactions may take any file, the user output included
    store.tables.set_props("t", {RATIO: "1"})
    coord.plan_dirty()
    (j,) = queued(coord)
    assert (j.kind, set(j.files)) == ("SYSTEM", {f406, f_sys})
    last = run(store, storage, reserve(coord))
    assert set(store.tables.tablet(tab).files) == {last}
    assert scan_rows(client) == sorted(rows + [e for e in scan_rows(client) if e not in set(rows)])
    assert len(scan_rows(client)) == 240


# -- user compaction cancel ---------------------------------------------------------------------------
def test_user_compaction_cancel_removes_selection_holds_and_queued_jobs(
    store: MetadataStore, storage: Storage, client: Client, coord: Coordinator
) -> None:
    # USER jobs run in their own group, so re-planning SYSTEM work does not replace them
    set_service(store, name="users", tables=("none",), tiers=(Tier("all", None, "g-user"),))
    store.tables.create_table("t", [b"r1", b"r2"], props={"table.compaction.dispatcher.opts.service.user": "users"})
    t1, t2, t3 = store.tables.tablet_ids(store.tables.table_id("t"))
    for base in (0, 1_000_000, 2_000_000):
        _row[0] = base
        write_files(client, "t", 4)
    # t3 has a SYSTEM compaction running: the user compaction's hold stays pending there
    coord.plan_dirty()
    sys_res = None
    for res in reserve_all(coord):
        if res.tablet == t3:
            sys_res = res
        else:
            compactions.release(store, storage, res)
    assert sys_res is not None
    coord.queues.clear_all()
    cid = usercompaction.start(store, "t")
    usercompaction.advance(coord.store)
    assert store.tables.tablet(t1).selection.id == cid and store.tables.tablet(t2).selection.id == cid
    assert store.tables.tablet(t3).hold == cid and store.tables.tablet(t3).selection is None
    coord.plan_dirty()
    assert sorted(j.tablet for j in queued(coord, "g-user")) == [t1, t2]
    running = reserve(coord, "g-user")  # t1's USER job starts; t2's stays queued
    assert running.job.kind == "USER" and running.tablet == t1
    result = ENGINE.merge(
        storage, MergeRequest(running.inputs, running.output, running.prev, running.end, running.settings, running.ecid)
    )
    usercompaction.cancel(store, cid)
    uc = usercompaction.get(store, cid)
    assert uc.state == usercompaction.CANCELLED
    for tab in (t1, t2, t3):
        t = store.tables.tablet(tab)
        assert t.selection is None and t.hold is None
    assert queued(coord, "g-user") == []
    coord.plan_dirty()
    assert queued(coord, "g-user") == []
    # the running USER job cannot commit any more; releasing it leaves nothing behind
    files_t1 = set(store.tables.tablet(t1).files)
    with pytest.raises(ConditionFailed):
        compactions.commit(store, running, result.info)
    compactions.release(store, storage, running)
    assert not storage.exists(running.output) and set(store.tables.tablet(t1).files) == files_t1
    # SYSTEM compactions take the files again, including where the hold was pending
    run(store, storage, sys_res)
    coord.plan_dirty()
    got = reserve_all(coord)
    assert sorted(res.tablet for res in got) == [t1, t2] and all(res.job.kind == "SYSTEM" for res in got)
    usercompaction.advance(coord.store)
    assert usercompaction.get(store, cid).state == usercompaction.CANCELLED


# -- restart, leadership, lost queues --------------------------------------------------------------------
def test_coordinator_restart_rebuilds_queues(store: MetadataStore, storage: Storage) -> None:
    store.tables.create_table("t", [b"m"])
    ids = store.tables.tablet_ids(store.tables.table_id("t"))
    for i, tab in enumerate(ids):
        fake_files(store, tab, {f"{i}-{k}": 10 for k in range(5)})
    a = Coordinator(store, storage, settings())
    assert a.tick()
    before = sorted((j.tablet, sorted(j.files)) for j in queued(a))
    assert [t for t, _ in before] == ids
    a.resign()
    # the queues are a cache: the next coordinator rebuilds them whether they survived or not
    b = Coordinator(store, storage, settings())
    assert b.tick()
    assert sorted((j.tablet, sorted(j.files)) for j in queued(b)) == before  # no duplicates
    b.resign()
    b.queues.clear_all()
    c = Coordinator(store, storage, settings())
    assert c.tick()
    assert sorted((j.tablet, sorted(j.files)) for j in queued(c)) == before


def test_a_new_leader_rebuilds_partially_lost_queues(store: MetadataStore, storage: Storage) -> None:
    """A new leader always runs a full scan first, even if the generation key survived."""
    store.tables.create_table("t")
    tab = only_tablet(store)
    fake_files(store, tab, {f"f{k}": 10 for k in range(5)})
    a = Coordinator(store, storage, settings())
    assert a.tick()
    a.resign()
    raw_redis(store).delete(C.queue_key("default"), C.queue_jobs_key("default"), C.queue_index_key("default"))
    b = Coordinator(store, storage, settings())
    assert b.tick()
    assert [j.tablet for j in queued(b)] == [tab]


def test_second_coordinator_waits_then_takes_over(store: MetadataStore, storage: Storage) -> None:
    store.tables.create_table("t")
    tab = only_tablet(store)
    # the lease is short, but long enough that a loaded machine does not pass it between a's ticks
    a = Coordinator(store, storage, settings(lease_ms=1500))
    b = Coordinator(store, storage, settings(lease_ms=1500))
    assert a.tick()
    fence_a = a.fence
    for _ in range(5):
        assert not b.tick()  # waits while the first holds the lease
        assert a.tick()  # and the first keeps renewing it
    assert b.fence is None
    # while b waits, it does nothing: dirty tablets stay for the leader
    fake_files(store, tab, {f"f{k}": 10 for k in range(5)})
    assert not b.tick()
    assert queued(b) == [] and raw_redis(store).sismember(C.DIRTY, tab)
    # a stops renewing (dies): b takes over once the lease expires, with a higher fencing token
    stop_renewing(a)
    poll(b.tick, "b to lead", timeout=10, every=0.02)
    assert b.fence > fence_a
    assert [j.tablet for j in queued(b)] == [tab]
    # a comes back: it lost the lease and must not act
    assert not a.tick()
    assert a.fence is None
    assert b.tick()


def test_deleted_queue_keys_are_rebuilt(store: MetadataStore, storage: Storage, coord: Coordinator) -> None:
    store.tables.create_table("t", [b"m"])
    ids = store.tables.tablet_ids(store.tables.table_id("t"))
    for i, tab in enumerate(ids):
        fake_files(store, tab, {f"{i}-{k}": 10 for k in range(5)})
    assert coord.tick()
    before = sorted((j.tablet, sorted(j.files)) for j in queued(coord))
    assert len(before) == 2
    keys = list(raw_redis(store).scan_iter(match=C.PREFIX + "queue:*"))
    raw_redis(store).delete(*keys)
    assert coord.tick()  # the same leader notices and rebuilds
    assert sorted((j.tablet, sorted(j.files)) for j in queued(coord)) == before


# -- dead compactions, failures -------------------------------------------------------------------------
def test_dead_compaction_recovery(store: MetadataStore, storage: Storage, client: Client, coord: Coordinator) -> None:
    store.tables.create_table("t")
    tab = only_tablet(store)
    files = write_files(client, "t", 4)
    coord.plan_dirty()
    res = reserve(coord)
    # the compactor got half-way: a temporary output exists; then it died
    storage.ensure_dir(res.output.rsplit("/", 1)[0])
    with storage.fs.open_output_stream(storage.path(res.tmp_path())) as out:
        out.write(b"partial")
    compactions.heartbeat(store, res, {"entries_read": 1})
    assert coord.detect_dead() == []  # its heartbeat is fresh
    backdate_heartbeat(store, res.ecid, 60)
    assert coord.detect_dead() == [res.ecid]
    t = store.tables.tablet(tab)
    assert t.running == {} and set(t.files) == set(files)
    assert not storage.exists(res.tmp_path()) and not storage.exists(res.output)
    assert not raw_redis(store).exists(C.heartbeat_key(res.ecid)) and not raw_redis(store).hexists(C.RUNNING, res.ecid)
    assert raw_redis(store).scard(C.running_group_key("default")) == 0
    assert store.bookkeeping.counters()["dead_compactions"] == 1
    # the tablet is re-planned once its backoff passes, and the job runs to completion
    coord.plan_dirty()
    assert queued(coord) == []  # backing off: neither queued nor dirty, but still to be run
    assert failures.pending_retries(store) == 1 and gather(store)["retries_pending"] == 1
    expire_backoffs(store)
    assert coord.tick()
    assert failures.pending_retries(store) == 0
    (j,) = queued(coord)
    assert set(j.files) == set(files)
    out = run(store, storage, reserve(coord))
    assert set(store.tables.tablet(tab).files) == {out}
    assert len(scan_rows(client)) == 4


def test_dead_compaction_without_any_heartbeat(store: MetadataStore, coord: Coordinator) -> None:
    store.tables.create_table("t")
    tab = only_tablet(store)
    fake_files(store, tab, {f"f{k}": 10 for k in range(4)})
    coord.plan_dirty()
    res = reserve(coord)
    assert coord.detect_dead() == []  # just started
    # it started long ago and never sent a heartbeat
    t = store.tables.tablet(tab)
    rc = t.running[res.ecid].to_json()
    rc["started"] -= 60_000
    m = Mutation()
    m.tablet(tab).do("remove_running", res.ecid).do("add_running", res.ecid, rc)
    store.mutate(m)
    assert coord.detect_dead() == [res.ecid]
    assert store.tables.tablet(tab).running == {}


def test_dead_letter_after_repeated_failures(store: MetadataStore, storage: Storage, client: Client) -> None:
    coord = Coordinator(store, storage, settings(max_attempts=3))
    assert coord.tick()
    store.tables.create_table("t")
    tab = only_tablet(store)
    files = write_files(client, "t", 4)
    for attempt in range(3):
        expire_backoffs(store)
        coord.tick()
        res = reserve(coord)
        assert res is not None, f"attempt {attempt}: the job was not re-queued"
        assert set(res.inputs) == set(files)
        backdate_heartbeat(store, res.ecid, 60)
        assert coord.detect_dead() == [res.ecid]
    (dl,) = failures.dead_letters(store)
    assert (dl.tablet, list(dl.files), dl.group, dl.count) == (tab, sorted(files), "default", 3)
    assert "died" in dl.last_error
    assert coord.queues.stats("default").dead_lettered == 1
    coord.metrics.export(coord.store)
    assert coord.metrics.registry.get_sample_value("kompaktor_dead_lettered_jobs", {"group": "default"}) == 1
    # a dead-lettered job is never queued again, not even by a full scan
    expire_backoffs(store)
    coord.tick()
    coord.full_scan()
    assert queued(coord) == []
    # once the tablet's files change it is a different job, planned afresh
    (f5,) = write_files(client, "t", 1)
    coord.tick()
    (j,) = queued(coord)
    assert set(j.files) == {*files, f5}


# -- garbage collection ---------------------------------------------------------------------------------
def test_gc_deletes_unreferenced_files_and_old_temp_outputs_only(
    store: MetadataStore, storage: Storage, client: Client, coord: Coordinator
) -> None:
    store.tables.create_table("t", props={RATIO: "2"})
    store.tables.create_table("gone")
    tab = only_tablet(store)
    inputs = write_files(client, "t", 3)
    coord.plan_dirty()
    out = run(store, storage, reserve(coord))  # the 3 inputs are now garbage
    keep = write_files(client, "t", 1)
    gone_files = write_files(client, "gone", 2)
    store.tables.delete_table("gone")
    # a running compaction: its temporary output must survive; a finished ECID's must not
    write_files(client, "t", 2)
    coord.plan_dirty()
    running = reserve(coord)
    assert running is not None
    run_tmp = running.tmp_path()
    dead_tmp = f"tables/{store.tables.table_id('t')}/_tmp_ECID-deadbeef_C0000000999.parquet"
    for p in (run_tmp, dead_tmp):
        with storage.fs.open_output_stream(storage.path(p)) as o:
            o.write(b"x")
    # young files are left alone
    assert coord.collect_garbage(grace_s=3600) == []
    deleted = set(coord.collect_garbage(grace_s=0))
    assert deleted == {*inputs, *gone_files, dead_tmp}
    referenced = set(store.tables.tablet(tab).files)
    assert {out, *keep} <= referenced
    remaining = {p for p, _ in storage.list_files("tables")}
    assert referenced | {run_tmp} == remaining
    assert store.bookkeeping.counters()["gc_deleted"] == len(deleted)
    # the running compaction still completes
    run(store, storage, running)
    assert len(scan_rows(client)) == 3 + 1 + 2
    assert coord.collect_garbage(grace_s=0) == sorted(running.inputs)
    assert len(scan_rows(client)) == 6


def test_gc_on_a_read_only_storage_stops_its_pass_and_the_leader_goes_on(
    store: MetadataStore, storage: Storage, client: Client, coord: Coordinator
) -> None:
    """A storage that refuses deletes (read-only, unreachable) stops the garbage collection pass —
    it used to end the coordinator process (seen in the soak) — and the next pass collects."""
    store.tables.create_table("t", props={RATIO: "2"})
    inputs = write_files(client, "t", 3)
    coord.plan_dirty()
    run(store, storage, reserve(coord))  # the 3 inputs are now garbage
    with read_only(storage.root) as made:
        if not made:
            pytest.skip("needs root and mount")
        assert coord.collect_garbage(grace_s=0) == []
        assert coord.tick()  # a whole pass: planning goes on, GC waits for the next one
        assert {p for p, _ in storage.list_files("tables")} >= set(inputs)
    assert set(coord.collect_garbage(grace_s=0)) == set(inputs)
    assert len(scan_rows(client)) == 3


# -- tables offline or deleted -----------------------------------------------------------------------
def test_table_offline_removes_queued_jobs_and_refuses_reservation(store: MetadataStore, coord: Coordinator) -> None:
    store.tables.create_table("t", [b"m"])
    ids = store.tables.tablet_ids(store.tables.table_id("t"))
    for i, tab in enumerate(ids):
        fake_files(store, tab, {f"{i}-{k}": 10 for k in range(5)})
    coord.plan_dirty()
    jobs = queued(coord)
    assert len(jobs) == 2
    store.tables.set_state("t", OFFLINE)
    # a compactor polling before the coordinator notices: refused, nothing registered
    assert reserve(coord) is None
    assert raw_redis(store).hlen(C.RUNNING) == 0
    # the coordinator removes what is queued for the offline table
    for j in jobs:
        coord.queues.add(j.tablet, [j])
    coord.tick()
    assert queued(coord) == []
    coord.full_scan()
    assert queued(coord) == []
    store.tables.set_state("t", ONLINE)
    coord.tick()
    assert sorted(j.tablet for j in queued(coord)) == ids


def test_table_deleted_removes_queued_jobs_and_refuses_reservation(store: MetadataStore, coord: Coordinator) -> None:
    store.tables.create_table("t", [b"m"])
    store.tables.create_table("other")
    ids = store.tables.tablet_ids(store.tables.table_id("t"))
    for i, tab in enumerate(ids):
        fake_files(store, tab, {f"{i}-{k}": 10 for k in range(5)})
    fake_files(store, only_tablet(store, "other"), {f"o{k}": 10 for k in range(5)})
    coord.plan_dirty()
    assert len(queued(coord)) == 3
    store.tables.delete_table("t")
    coord.tick()  # an incremental pass
    assert [j.tablet for j in queued(coord)] == [only_tablet(store, "other")]
    # a job of the deleted table that is still queued somewhere is refused
    coord.queues.add(ids[0], [Job(ids[0], "SYSTEM", 0, "default", {"0-0": 10, "0-1": 10})])
    got = reserve_all(coord)
    assert [res.tablet for res in got] == [only_tablet(store, "other")]
    assert raw_redis(store).hlen(C.RUNNING) == 1


def test_finished_user_compactions_are_forgotten_after_their_retention(store: MetadataStore) -> None:
    """Found by the soak bench: every user compaction ever run stayed in Redis (two keys and an
    id), and every coordinator pass read them all. A finished one is kept for its retention
    (status, `kompaktor compact --status`), then forgotten; a running one never is."""
    store.tables.create_table("empty", [])
    store.tables.create_table("busy", [])
    fake_files(store, only_tablet(store, "busy"), {"t/F1.parquet": 10, "t/F2.parquet": 10})
    running = usercompaction.start(store, "busy")
    done = usercompaction.start(store, "empty")
    usercompaction.advance(store)  # no files: every tablet done at once
    assert usercompaction.get(store, done).state == usercompaction.SUCCEEDED
    usercompaction.advance(store, retention_s=3600)
    assert usercompaction.get(store, done).state == usercompaction.SUCCEEDED  # within retention: kept
    usercompaction.advance(store, retention_s=0)
    assert store.ucomps.list_user_compactions() == [running]  # running: never forgotten
    assert usercompaction.get(store, running).state == usercompaction.RUNNING
    assert not store.call(raw_redis(store).exists, C.ucomp_key(done), C.ucomp_done_key(done))
    with pytest.raises(KompaktorError, match="unknown user compaction"):
        usercompaction.get(store, done)


def test_failures_of_jobs_that_cannot_come_back_are_forgotten(store: MetadataStore) -> None:
    """Found by the soak bench: a failed job's record stayed in kz:failures for good once the
    job ran again and committed (or its files went elsewhere), and every pass read them all."""
    store.tables.create_table("t", [])
    tablet = only_tablet(store)
    fake_files(store, tablet, {"t/F1.parquet": 10, "t/F2.parquet": 10})
    failures.record_failure(store, tablet, ["t/F1.parquet", "t/F2.parquet"], "default", "boom")  # can recur
    failures.record_failure(store, tablet, ["t/F1.parquet", "t/F0.parquet"], "default", "boom")  # F0 is gone
    failures.record_failure(store, "gone;~", ["t/F9.parquet"], "default", "boom")  # its tablet is gone
    assert failures.forget_settled(store) == 2
    (left,) = store.running.failures().values()
    assert left.files == ("t/F1.parquet", "t/F2.parquet")
    # the job ran again and committed: its files are replaced, its failure goes with them
    m = Mutation(table=store.tables.tablet(tablet).table)
    m.tablet(tablet).do("remove_files", ["t/F1.parquet", "t/F2.parquet"]).do(
        "add_files", {"t/A3.parquet": FileMeta(20, 1).to_json()}
    )
    store.mutate(m)
    assert failures.forget_settled(store) == 1 and store.running.failures() == {}


# -- a big pass planned on more than one core ---------------------------------------------------------
def test_a_full_pass_shared_with_worker_processes_queues_exactly_what_one_thread_queues(
    store: MetadataStore, storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Jobs, removals of an offline table's queued jobs and a selector's selections come out the same
    whether the coordinator plans every tablet itself or hands shares to worker processes."""
    from kompaktor.coordinator import planpool

    store.tables.create_table("a", [b"%03d" % i for i in range(1, 60)])
    store.tables.create_table("off", [b"m"])
    store.tables.create_table("sel", [b"m"], props={"table.compaction.selector": "too-many-deletes"})
    for i, tab in enumerate(store.tables.tablet_ids(store.tables.table_id("a"))):
        fake_files(store, tab, {f"a{i}-{k}": 10 * (1 + k % 3) for k in range(3 + i % 4)})
    off = store.tables.tablet_ids(store.tables.table_id("off"))
    for i, tab in enumerate(off):
        fake_files(store, tab, {f"off{i}-{k}": 10 for k in range(5)})
    for i, tab in enumerate(store.tables.tablet_ids(store.tables.table_id("sel"))):
        t = store.tables.tablet(tab)
        m = Mutation(table=t.table)
        m.tablet(tab).do("add_files", {f"sel{i}-{k}": FileMeta(10, 10, 9 if k == 0 else 0).to_json() for k in range(2)})
        store.mutate(m)
    store.tables.set_state("off", OFFLINE)

    def one_pass(workers: int, url: str | None = None) -> tuple[list[tuple], dict[str, object], int]:
        for k in raw_redis(store).scan_iter("kz:queue*"):
            raw_redis(store).delete(k)
        for tab in off:  # queued before the table went offline: the pass removes them
            store.queues.add(tab, [Job(tab, "SYSTEM", 1, "default", {f"x-{tab}": 1})])
        for tab in store.tables.tablet_ids(store.tables.table_id("sel")):
            raw_redis(store).set(
                C.tablet_key(tab), json.dumps({**json.loads(raw_redis(store).get(C.tablet_key(tab))), "sel": None})
            )
        c = Coordinator(store, storage, settings(plan_workers=workers))
        if url is not None:
            c._planpool.url = url
        assert c.try_lead()
        try:
            queued_n = c.full_scan()
            assert (c._planpool._pool is not None) == (workers > 0 and url is None)  # a failed one is dropped
            assert c.stats["planned"] == 60 + 2  # the offline table's tablets are not planned
            jobs = sorted((j.tablet, j.kind, j.priority, j.group, sorted(j.files)) for j in queued(c))
            sels = {
                t: store.tables.tablet(t).selection.files for t in store.tables.tablet_ids(store.tables.table_id("sel"))
            }
            return jobs, sels, queued_n
        finally:
            c.resign()

    serial = one_pass(0)
    monkeypatch.setattr(planpool, "PARALLEL_MIN_TABLETS", 1)
    shared = one_pass(2)
    assert serial[0] and all(not j[0].startswith(store.tables.table_id("off") + ";") for j in serial[0])
    assert all(serial[1].values()), "the selector chose the files with deletes"
    assert shared == serial
    # workers that cannot reach Redis (or die) cost time only: their shares are planned here
    assert one_pass(2, url="redis://127.0.0.1:1/0") == serial
