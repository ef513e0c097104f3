"""Per-group bounded priority job queues in Redis (docs/planner.md §6, issue 4 §3): order, bound
(reject / evict), resize, per-tablet-per-group replacement, empty adds, the generation sweep,
removal of tablets, counters, and concurrent reservation from threads and processes."""

from __future__ import annotations

import json
import multiprocessing
import threading
from collections import Counter
from types import SimpleNamespace

import pytest

from kompaktor import keyspace as C
from kompaktor.metadata import compactions
from kompaktor.metadata.store import MetadataStore, Mutation
from kompaktor.model.job import Job
from kompaktor.model.tablet import FileMeta
from kompaktor.queues import jobqueue
from kompaktor.queues.jobqueue import DEFAULT_MAX, JobQueues
from tests.integration import queue_race_worker as W
from tests.support.rawredis import raw_redis
from tests.support.snapshot import snapshot

pytestmark = pytest.mark.redis


def job(tablet: str, priority: int, nfiles: int = 1, group: str = "g", tag: str = "") -> Job:
    return Job(tablet, "SYSTEM", priority, group, {f"{tablet}/{tag}f{i}": 100 for i in range(nfiles)})


def drain(q: JobQueues, group: str) -> list[Job]:
    out = []
    while (j := q.poll(group)) is not None:
        out.append(j)
    return out


@pytest.fixture
def q(store: MetadataStore) -> JobQueues:
    return store.queues


# -- order ----------------------------------------------------------------------------------------
def test_one_tables_burst_does_not_hold_another_tables_jobs_behind_it(q: JobQueues) -> None:
    """Issue 27 §2: within one priority and file count, jobs are served fairly by table (start-time
    fair queuing): table A queues 2,000 jobs, then table B 10 of the same priority; B's jobs are
    served within the first 20 (one job of each table in turn), each table's own in FIFO order.
    Priority and file count still come first."""
    q.add_many([(f"ta;{i:05x}", [job(f"ta;{i:05x}", 5, 2)]) for i in range(2000)])
    for i in range(10):
        q.add(f"tb;{i:05x}", [job(f"tb;{i:05x}", 5, 2)])
    q.add("tc;00000", [job("tc;00000", 6, 1)])  # a higher priority, queued last: first
    q.add("td;00000", [job("td;00000", 5, 3)])  # more files at the same priority: before A and B
    first = [j.tablet for j in (q.poll("g") for _ in range(22))]
    assert first[:2] == ["tc;00000", "td;00000"]
    served = first[2:]
    assert [t for t in served if t.startswith("tb;")] == [f"tb;{i:05x}" for i in range(10)], served
    assert [t for t in served if t.startswith("ta;")] == [f"ta;{i:05x}" for i in range(10)], served
    # then A's remaining jobs, still FIFO; a table that was idle starts from the group's
    # virtual time, not ahead of it with credit saved while it had nothing queued
    q.add("tb;99999", [job("tb;99999", 5, 2)])
    rest = [j.tablet for j in drain(q, "g")]
    assert rest.index("tb;99999") <= 1 and len(rest) == 1991
    assert [t for t in rest if t.startswith("ta;")] == [f"ta;{i:05x}" for i in range(10, 2000)]


def test_a_tables_quota_is_its_share_while_others_wait_and_all_of_it_while_none_do(
    q: JobQueues, store: MetadataStore
) -> None:
    """Issue 27 §2, the optional per-table quota (``table.compaction.quota``, Amoro's semantics):
    while table A (quota 1, the default) and table B (quota 0.25) both wait at one priority and
    file count, B is served one job for every four of A's; with A gone, B gets every job; a quota
    set later applies to the jobs queued after it (the table's tablets are re-planned)."""
    a = store.tables.create_table("a", [])
    b = store.tables.create_table("b", [], {"table.compaction.quota": "0.25"})
    q.add_many([(f"{a};{i:05x}", [job(f"{a};{i:05x}", 5, 2)]) for i in range(400)])
    q.add_many([(f"{b};{i:05x}", [job(f"{b};{i:05x}", 5, 2)]) for i in range(100)])
    first = [j.tablet.split(";")[0] for j in (q.poll("g") for _ in range(50))]
    assert Counter(first) == {a: 40, b: 10}, first
    assert first[4] == b and first[:4] == [a] * 4  # B's first job after A's fourth
    q.remove_tablets([f"{a};{i:05x}" for i in range(400)])
    rest = [j.tablet.split(";")[0] for j in drain(q, "g")]
    assert rest == [b] * 90  # alone, B is not held back by its quota
    # A's quota lowered to B's: from the next jobs queued, the two are served in turn
    store.tables.set_props("a", {"table.compaction.quota": "0.25"})
    q.add_many([(f"{a};{i:05x}", [job(f"{a};{i:05x}", 5, 2)]) for i in range(20)])
    q.add_many([(f"{b};{i:05x}", [job(f"{b};{i:05x}", 5, 2)]) for i in range(20)])
    served = [j.tablet.split(";")[0] for j in drain(q, "g")]
    assert served[:10] == [a, b] * 5, served


def test_the_quota_step_inside_redis_is_the_policys(q: JobQueues, store: MetadataStore) -> None:
    """The queue script reads the quota from the table's properties itself: the virtual-time step
    it takes is :func:`policy.tableprops.quota_step`'s, for quotas that round either way."""
    from kompaktor.policy.tableprops import QUOTA, quota_step

    for n, quota in enumerate(["1", "0.5", "0.3", "0.26", "0.1", "0.0015", "0.001"]):
        tid = store.tables.create_table(f"s{n}", [], {QUOTA: quota})
        q.add(
            f"{tid};00000",
            [job(f"{tid};00000", 5, 1, group=f"s{n}"), job(f"{tid};00000", 5, 1, group=f"s{n}", tag="x")],
        )
        members = raw_redis(store).zrange(C.queue_key(f"s{n}"), 0, -1)
        vts = sorted(int(m[9:21]) for m in members)
        assert vts[1] - vts[0] == quota_step({QUOTA: quota}), quota


def sized(tablet: str, priority: int, nbytes: int) -> Job:
    return Job(tablet, "SYSTEM", priority, "g", {f"{tablet}/f0": nbytes})


def test_the_queue_is_bounded_in_input_bytes_as_well_as_in_jobs(q: JobQueues, store: MetadataStore) -> None:
    """Issue 27 §2: whichever bound is hit first. With 1,000 bytes allowed, jobs of 400 bytes:
    two fit; a third of higher priority evicts the last (lowest) one; one of the same priority is
    rejected; the group's bytes follow every insert and removal, and a job bigger than the bound
    still runs when the queue is empty."""
    assert q.max_bytes() == jobqueue.DEFAULT_MAX_BYTES
    q.set_max_bytes(1000)
    assert q.add("t;1", [sized("t;1", 5, 400)]) == 1
    assert q.add("t;2", [sized("t;2", 4, 400)]) == 1
    assert q.stats("g").bytes == 800
    assert q.add("t;3", [sized("t;3", 4, 400)]) == 0  # not above the lowest: rejected
    assert q.add("t;4", [sized("t;4", 9, 400)]) == 1  # above it: t;2 evicted
    st = q.stats("g")
    assert (st.queued, st.bytes, st.rejected) == (2, 800, 2)
    from kompaktor.coordinator.metrics import QueueMetrics

    metrics = QueueMetrics.create()
    metrics.export(store)  # what the coordinator's /metrics says
    assert metrics.registry.get_sample_value("kompaktor_queue_bytes", {"group": "g"}) == 800
    assert [j.tablet for j in drain(q, "g")] == ["t;4", "t;1"]
    assert q.stats("g").bytes == 0
    assert q.add("t;5", [sized("t;5", 1, 5000)]) == 1  # alone it may exceed the bound
    assert q.stats("g").bytes == 5000
    assert q.remove_tablets(["t;5"]) == 1  # a tablet that left: its bytes go with it
    assert q.stats("g").bytes == 0
    with pytest.raises(ValueError):
        q.set_max_bytes(-1)
    q.set_max_bytes(0)  # no byte bound
    assert q.add_many([(f"u;{i}", [sized(f"u;{i}", 1, 10**12)]) for i in range(3)]) == 3
    assert q.stats("g").bytes == 3 * 10**12


def test_order_priority_desc_then_files_desc_then_fifo(q: JobQueues) -> None:
    q.add("a", [job("a", -5, 2)])
    q.add("b", [job("b", 10, 1)])
    q.add("c", [job("c", -5, 3)])
    q.add("d", [job("d", -5, 2)])  # same priority and files as a: after a (FIFO)
    q.add("e", [job("e", 20767, 1), job("e", -32768, 1, tag="x")])  # the extremes of the ranges
    q.add("f", [job("f", 10, 4)])
    order = [(j.tablet, j.priority, len(j.files)) for j in drain(q, "g")]
    assert order == [
        ("e", 20767, 1),
        ("f", 10, 4),
        ("b", 10, 1),
        ("c", -5, 3),
        ("a", -5, 2),
        ("d", -5, 2),
        ("e", -32768, 1),
    ]
    assert q.poll("g") is None
    assert q.stats("g").dequeued == 7
    assert q.queued_tablets("g") == set()


def test_job_round_trips_through_the_queue(q: JobQueues) -> None:
    j = Job(
        "1;~",
        "USER",
        7,
        "g",
        {"tables/1/F1.parquet": 123456789012, "tables/1/F2.parquet": 0},
        "svc",
        "UC-000001",
        False,
        {"note": "x"},
    )
    s = Job("1;~", "SYSTEM", -3, "g", {"tables/1/F3.parquet": 5}, overlaps=True)
    q.add("1;~", [j, s])
    assert drain(q, "g") == [j, s]


# -- bound ----------------------------------------------------------------------------------------
def test_bound_rejects_new_job_not_above_lowest_priority(q: JobQueues) -> None:
    assert q.max_size() == DEFAULT_MAX
    q.resize(3)
    for t, p in (("a", 5), ("b", 3), ("c", 1)):
        assert q.add(t, [job(t, p)]) == 1
    assert q.add("d", [job("d", 1, nfiles=9)]) == 0  # equal priority: rejected (files not compared)
    assert q.add("e", [job("e", -100)]) == 0
    st = q.stats("g")
    assert (st.queued, st.rejected, st.lowest_priority) == (3, 2, 1)
    assert q.queued_tablets("g") == {"a", "b", "c"}  # rejected tablets get no index entry
    # higher than the lowest: the last entry is evicted (counted as rejected), its tablet forgotten
    assert q.add("f", [job("f", 2)]) == 1
    st = q.stats("g")
    assert (st.queued, st.rejected, st.lowest_priority) == (3, 3, 2)
    assert q.queued_tablets("g") == {"a", "b", "f"}
    assert [j.tablet for j in drain(q, "g")] == ["a", "b", "f"]


def test_eviction_takes_fewest_files_then_newest_among_lowest(q: JobQueues) -> None:
    q.resize(4)
    q.add("top", [job("top", 9)])
    q.add("a", [job("a", 1, 2)])
    q.add("b", [job("b", 1, 1)])
    q.add("c", [job("c", 1, 1)])  # lowest priority, fewest files, newest: the last entry
    q.add("n1", [job("n1", 2)])
    assert q.queued_tablets("g") == {"top", "a", "b", "n1"}
    q.add("n2", [job("n2", 2)])
    assert q.queued_tablets("g") == {"top", "a", "n1", "n2"}
    q.add("n3", [job("n3", 2)])
    assert q.queued_tablets("g") == {"top", "n1", "n2", "n3"}
    assert q.stats("g").rejected == 3
    assert [j.tablet for j in drain(q, "g")] == ["top", "n1", "n2", "n3"]


def test_bound_within_one_add_keeps_the_index_exact(q: JobQueues, store: MetadataStore) -> None:
    """A tablet's own job admitted earlier in the same add can be the one evicted: it must not
    stay in the tablet's index (nor count as admitted)."""
    q.resize(2)
    q.add("x", [job("x", 5)])
    assert q.add("t", [job("t", 1, tag="a"), job("t", 3, tag="b"), job("t", 4, tag="c")]) == 1
    # the queue had x(5); t:a(1) admitted -> full; t:b(3) evicts t:a; t:c(4) evicts t:b
    assert [(j.tablet, j.priority) for j in q.jobs("g")] == [("x", 5), ("t", 4)]
    idx = raw_redis(store).hget(C.queue_index_key("g"), "t")
    members = set(raw_redis(store).zrange(C.queue_key("g"), 0, -1))
    assert set(m.encode() for m in json.loads(idx)["ids"]) <= members
    assert len(json.loads(idx)["ids"]) == 1
    assert q.stats("g").rejected == 2
    # removing the tablet removes exactly its one entry
    assert q.remove_tablets(["t"]) == 1
    assert [j.tablet for j in q.jobs("g")] == ["x"]


def test_resize_evicts_last_entries_in_every_queue(q: JobQueues) -> None:
    for i in range(5):
        q.add(f"t{i}", [job(f"t{i}", i, group="g1"), job(f"t{i}", 10 + i, group="g2")])
    with pytest.raises(ValueError, match="> 0"):
        q.resize(0)
    assert q.max_size() == DEFAULT_MAX
    assert q.resize(2) == 6
    assert q.max_size() == 2
    assert [j.priority for j in q.jobs("g1")] == [4, 3]
    assert [j.priority for j in q.jobs("g2")] == [14, 13]
    assert q.stats("g1").rejected == 3 and q.stats("g2").rejected == 3
    assert q.queued_tablets("g1") == {"t3", "t4"}
    # the new bound applies to future adds, and to queues created later
    assert q.add("t9", [job("t9", 0, group="g1")]) == 0
    q.add("a", [job("a", 1, group="new")])
    q.add("b", [job("b", 2, group="new")])
    assert q.add("c", [job("c", 1, group="new")]) == 0
    assert q.resize(2) == 0  # unchanged: nothing evicted
    assert q.resize(50) == 0


# -- add / replace --------------------------------------------------------------------------------
def test_add_replaces_only_this_tablets_entries_in_this_group(q: JobQueues) -> None:
    assert q.add("A", [job("A", 1, tag="old1"), job("A", 2, tag="old2")]) == 2
    q.add("B", [job("B", 1)])
    q.add("A", [job("A", -1, group="h", tag="h")])  # another group: A's entries in g stay
    assert len(q.jobs("g")) == 3
    stats_before = q.stats("g")
    assert q.add("A", [job("A", 3, 2, tag="new")]) == 1
    got = q.jobs("g")
    assert [(j.tablet, j.priority) for j in got] == [("A", 3), ("B", 1)]
    assert q.stats("g").rejected == stats_before.rejected  # replacement is not rejection
    assert [j.tablet for j in q.jobs("h")] == ["A"]
    assert q.queued_tablets("g") == {"A", "B"} and q.queued_tablets("h") == {"A"}


def test_empty_add_touches_nothing(q: JobQueues, store: MetadataStore) -> None:
    q.add("A", [job("A", 1)])
    before = snapshot(raw_redis(store))
    assert q.add("A", []) == 0
    assert q.add("Z", []) == 0
    assert snapshot(raw_redis(store)) == before
    assert [j.tablet for j in q.jobs("g")] == ["A"]


def test_rejected_add_still_removes_the_tablets_old_entries(q: JobQueues) -> None:
    q.resize(2)
    q.add("A", [job("A", 5)])
    q.add("B", [job("B", 5)])
    # A is re-planned to a job that is not above the lowest priority of a full queue... but A's
    # own entry is removed first, so there is room again.
    assert q.add("A", [job("A", 1)]) == 1
    assert [(j.tablet, j.priority) for j in q.jobs("g")] == [("B", 5), ("A", 1)]


def test_add_many_is_add_for_many_tablets(q: JobQueues, store: MetadataStore) -> None:
    """The coordinator's pipelined add: same order, replacement, bound and index as add()."""
    other = store.queues
    q.add("A", [job("A", 9, tag="old")])
    q.resize(4)
    plans = [
        ("A", [job("A", 1), job("A", 2, group="h")]),
        ("B", [job("B", 3, 2)]),
        ("C", []),
        ("D", [job("D", 3, 3), job("D", 0, tag="x"), job("D", -1, tag="y")]),
    ]
    assert q.add_many(plans, gen=7) == 5  # A:1, B:1, D:2 in g (D:y rejected), A:1 in h
    got_g = [(j.tablet, j.priority) for j in q.jobs("g")]
    assert got_g == [("D", 3), ("B", 3), ("A", 1), ("D", 0)]
    assert q.stats("g").rejected == 1
    assert q.queued_tablets("g") == {"A", "B", "D"} and q.queued_tablets("h") == {"A"}
    assert {json.loads(v)["gen"] for v in raw_redis(store).hvals(C.queue_index_key("g"))} == {7}
    assert other.add_many([]) == 0


# -- generations / removal ------------------------------------------------------------------------
def test_generation_sweep_removes_tablets_not_replanned(q: JobQueues) -> None:
    g0 = q.generation()
    q.add("old", [job("old", 1), job("old", 1, group="h", tag="h")], g0)
    q.add("keep", [job("keep", 1, tag="first")], g0)
    gen = q.begin_full_scan()
    assert gen == g0 + 1 == q.generation()
    q.add("keep", [job("keep", 2, tag="second")], gen)
    q.add("fresh", [job("fresh", 3, group="h")])  # default: the current generation
    removed = q.end_full_scan(gen)
    assert removed == 2
    assert [(j.tablet, j.priority) for j in q.jobs("g")] == [("keep", 2)]
    assert [j.tablet for j in q.jobs("h")] == ["fresh"]
    assert q.queued_tablets("g") == {"keep"} and q.queued_tablets("h") == {"fresh"}
    assert "g" in q.groups() and "h" in q.groups()  # queues are never deleted for being empty


def test_remove_tablets_in_every_group(q: JobQueues) -> None:
    q.add("A", [job("A", 1), job("A", 2, group="h", tag="h")])
    q.add("B", [job("B", 1), job("B", 2, group="h", tag="h")])
    q.add("C", [job("C", 1)])
    assert q.remove_tablets(["A", "B", "nope"]) == 4
    assert [j.tablet for j in q.jobs("g")] == ["C"]
    assert q.jobs("h") == []
    assert q.remove_tablets([]) == 0
    assert q.stats("g").rejected == 0


# -- counters ---------------------------------------------------------------------------------------
def test_stats_counters_and_oldest_age(q: JobQueues, store: MetadataStore, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1_000_000.0]
    monkeypatch.setattr(jobqueue, "time", SimpleNamespace(time=lambda: clock[0]))
    empty = q.stats("g")
    assert (
        empty.queued,
        empty.running,
        empty.rejected,
        empty.dequeued,
        empty.dead_lettered,
        empty.oldest_age_s,
        empty.lowest_priority,
        empty.depth,
    ) == (0, 0, 0, 0, 0, 0.0, 0, 0)
    q.add("A", [job("A", 4), job("A", -2, tag="x")])
    clock[0] += 10
    q.add("B", [job("B", 7)])
    clock[0] += 5
    st = q.stats("g")
    assert (st.queued, st.lowest_priority) == (3, -2)
    assert st.oldest_age_s == pytest.approx(15.0)
    # running (maintained by the metadata) and dead letters (per group) feed the depth
    raw_redis(store).sadd(C.running_group_key("g"), "ECID-1", "ECID-2")
    raw_redis(store).hset(C.DEADLETTER, "fp1", '{"group": "g"}')
    raw_redis(store).hset(C.DEADLETTER, "fp2", '{"group": "other"}')
    st = q.stats("g")
    assert (st.running, st.depth, st.dead_lettered) == (2, 5, 1)
    # B is polled first (priority 7): A is still the oldest
    assert q.poll("g").tablet == "B"
    assert q.stats("g").oldest_age_s == pytest.approx(15.0)
    assert q.poll("g").tablet == "A" and q.poll("g").tablet == "A"
    st = q.stats("g")
    assert (st.queued, st.dequeued, st.oldest_age_s, st.lowest_priority) == (0, 3, 0.0, 0)
    # a tablet queued again after its jobs were taken starts a new age
    q.add("B", [job("B", 1)])
    clock[0] += 2
    assert q.stats("g").oldest_age_s == pytest.approx(2.0)
    # re-planning a queued tablet (its entries replaced) keeps the time it was first queued
    for _ in range(3):
        clock[0] += 10
        q.add("B", [job("B", 2, tag="replanned")])
    q.add("A", [job("A", 1)])
    st = q.stats("g")
    assert st.oldest_age_s == pytest.approx(32.0) and list(drain(q, "g")[0].files) == ["B/replannedf0"]
    # once taken, the next enqueue is young again
    q.add("B", [job("B", 1)])
    assert q.stats("g").oldest_age_s == pytest.approx(0.0)


def test_clear_all_forgets_queues_but_keeps_the_bound(q: JobQueues, store: MetadataStore) -> None:
    q.resize(7)
    q.add("A", [job("A", 1)])
    seq = int(raw_redis(store).get(C.QUEUE_SEQ))
    q.clear_all()
    assert q.groups() == [] and q.poll("g") is None and not q.has_generation()
    assert q.max_size() == 7 and int(raw_redis(store).get(C.QUEUE_SEQ)) == seq  # settings and sequence stay
    q.add("A", [job("A", 1)])
    assert int(raw_redis(store).get(C.QUEUE_SEQ)) == seq + 1


# -- concurrent reservation -------------------------------------------------------------------------
N_TABLETS = 12


def racy_setup(store: MetadataStore, q: JobQueues) -> dict[str, list[str]]:
    """A table of N_TABLETS tablets with 6 files each, and for every tablet several overlapping
    jobs in two groups (and the same job twice): at most one of them may reserve per file."""
    tid = store.tables.create_table("race", [b"%02d" % i for i in range(1, N_TABLETS)])
    files: dict[str, list[str]] = {}
    m = Mutation(table=tid)
    for t in store.tables.tablets(tid):
        names = [f"tables/{tid}/F{t.id.split(';')[1]}_{i}.parquet" for i in range(6)]
        files[t.id] = names
        m.tablet(t.id).do("add_files", {n: FileMeta(10, 1).to_json() for n in names})
    store.mutate(m)
    for tab, names in files.items():

        def j(fs: list[str], group: str, prio: int, tab: str = tab) -> Job:
            return Job(tab, "SYSTEM", prio, group, {f: 10 for f in fs})

        q.add(tab, [j(names[:4], "g", -20), j(names[:4], "g", -21), j(names[2:6], "g", -22), j(names[4:], "g", -23)])
        q.add(tab, [j(names[:2], "h", -20), j(names[3:5], "h", -21), j(names, "h", -30)])
    return files


def check_reservations(
    store: MetadataStore, got: list[tuple[str, str, list[str]]], files: dict[str, list[str]]
) -> None:
    assert got, "nothing was reserved"
    ecids = [e for e, _, _ in got]
    assert len(ecids) == len(set(ecids))
    per_file = Counter((tab, f) for _, tab, fs in got for f in fs)
    assert max(per_file.values()) == 1, "a file was reserved twice"
    for tab in files:
        t = store.tables.tablet(tab)
        mine = {e: fs for e, tb, fs in got if tb == tab}
        assert {e: sorted(r.files) for e, r in t.running.items()} == {e: sorted(fs) for e, fs in mine.items()}
        assert mine, f"tablet {tab} got no reservation"
    assert raw_redis(store).hlen(C.RUNNING) == len(got)
    assert raw_redis(store).scard(C.running_group_key("g")) + raw_redis(store).scard(C.running_group_key("h")) == len(
        got
    )


def test_concurrent_reserve_threads_never_reserve_twice(store: MetadataStore, q: JobQueues, redis_url: str) -> None:
    files = racy_setup(store, q)
    total = sum(len(q.jobs(g)) for g in ("g", "h"))
    got: list[tuple[str, str, list[str]]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(6)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        s = MetadataStore.from_url(redis_url)
        try:
            qs = s.queues
            barrier.wait(timeout=30)
            live = ["g", "h"] if i % 2 else ["h", "g"]
            while live:
                for g in list(live):
                    res = compactions.reserve(s, qs, g, f"c{i}")
                    if res is None:
                        live.remove(g)
                    else:
                        with lock:
                            got.append((res.ecid, res.tablet, list(res.inputs)))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            s.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    check_reservations(store, got, files)
    # every queued job was polled exactly once: no job came back
    assert q.stats("g").dequeued + q.stats("h").dequeued == total
    assert q.jobs("g") == [] and q.jobs("h") == []


def test_concurrent_reserve_processes_never_reserve_twice(store: MetadataStore, q: JobQueues, redis_url: str) -> None:
    files = racy_setup(store, q)
    total = sum(len(q.jobs(g)) for g in ("g", "h"))
    ctx = multiprocessing.get_context("spawn")
    n = 4
    with ctx.Manager() as mgr:
        barrier = mgr.Barrier(n)
        with ctx.Pool(n) as pool:
            results = [
                pool.apply_async(W.reserve_all, (redis_url, ["g", "h"] if i % 2 else ["h", "g"], f"p{i}", barrier))
                for i in range(n)
            ]
            got = [r for res in results for r in res.get(timeout=120)]
    check_reservations(store, got, files)
    assert q.stats("g").dequeued + q.stats("h").dequeued == total


def test_queue_operations_of_an_unreachable_redis_are_store_unavailable() -> None:
    """What a compactor's loop handles: polling and waiting for work on a Redis that is not
    there fail as StoreUnavailable (one line, retried), never as a raw client error."""
    from kompaktor.connection import connect
    from kompaktor.model.errors import StoreUnavailable
    from tests.support.ports import free_port

    queues = JobQueues(connect(f"redis://127.0.0.1:{free_port()}/0", retries=0, socket_timeout=1.0))
    with pytest.raises(StoreUnavailable):
        queues.poll("g")
    with pytest.raises(StoreUnavailable):
        queues.wait_for_work("g", 0.1)
