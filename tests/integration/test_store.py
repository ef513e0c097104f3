"""The metadata store on a real redis-server (issue 3 §4): tables and tablets, properties and
states, every condition of a conditional mutation (rejected by name, nothing half-applied across
tablets), and races between threads and spawned processes."""

from __future__ import annotations

import multiprocessing
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from kompaktor import keyspace as C
from kompaktor.metadata.store import MetadataStore, Mutation
from kompaktor.model.errors import ConditionFailed, StoreUnavailable, TableExistsError, UnknownTableError
from kompaktor.model.tablet import DELETED, OFFLINE, ONLINE, FileMeta, tablet_id
from tests.integration import store_race_worker as W
from tests.support.rawredis import raw_redis
from tests.support.snapshot import snapshot

pytestmark = pytest.mark.redis


# -- tables ------------------------------------------------------------------------------------
def test_create_table_with_splits(store: MetadataStore) -> None:
    tid = store.tables.create_table("t", [b"m", b"\x80", b"a", b"m"])  # unsorted, duplicate, >= 0x80
    info = store.tables.table("t")
    assert (info.id, info.name, info.state, info.props) == (tid, "t", ONLINE, {})
    tablets = store.tables.tablets(tid)
    assert [(t.prev, t.end) for t in tablets] == [(None, b"a"), (b"a", b"m"), (b"m", b"\x80"), (b"\x80", None)]
    assert [t.id for t in tablets] == [tablet_id(tid, t.end) for t in tablets]
    assert all(t.files == {} and t.running == {} and t.selection is None and t.hold is None for t in tablets)
    assert store.tables.tablets_in_range(tid, b"b", b"m") == tablets[1:2]
    assert store.tables.tablets_in_range(tid, b"m\x00", None) == tablets[2:]
    assert store.tables.tablets_in_range(tid, None, b"a") == tablets[:1]
    assert [t.name for t in store.tables.tables()] == ["t"]
    # a table without splits is one tablet
    tid2 = store.tables.create_table("u")
    assert [(t.prev, t.end) for t in store.tables.tablets(tid2)] == [(None, None)]
    assert tid2 != tid


def test_create_table_refusals(store: MetadataStore) -> None:
    store.tables.create_table("t", props={"table.iterator.versions": "3"})
    before = snapshot(raw_redis(store))
    with pytest.raises(TableExistsError, match="'t' already exists"):
        store.tables.create_table("t", [b"x"])
    for bad in ("", "a b", "a/b", "a;b"):
        with pytest.raises(ValueError, match="invalid table name"):
            store.tables.create_table(bad)
    with pytest.raises(ValueError, match="split rows must not be empty"):
        store.tables.create_table("v", [b"a", b""])
    after = snapshot(raw_redis(store))
    after.pop(C.SEQ.encode(), None)
    before.pop(C.SEQ.encode(), None)
    assert after == before


def test_unknown_table(store: MetadataStore) -> None:
    for call in (
        lambda: store.tables.table("nope"),
        lambda: store.tables.set_props("nope", {"table.custom.a": "1"}),
        lambda: store.tables.set_state("nope", OFFLINE),
        lambda: store.tables.delete_table("nope"),
        lambda: store.files.add_files("nope", {"f": FileMeta(1, 1)}),
    ):
        with pytest.raises(UnknownTableError, match="unknown table 'nope'"):
            call()


def test_props(store: MetadataStore) -> None:
    tid = store.tables.create_table("t", props={"table.iterator.versions": "2"})
    store.bookkeeping.pop_dirty()
    store.tables.set_props("t", {"table.custom.x": "é\x80", "table.file.max": "7"})
    assert store.tables.table("t").props == {
        "table.iterator.versions": "2",
        "table.custom.x": "é\x80",
        "table.file.max": "7",
    }
    assert store.bookkeeping.pop_dirty() == store.tables.tablet_ids(tid)  # tablets are re-planned under new props
    store.tables.set_props("t", {"table.custom.x": None, "table.iterator.versions": None, "table.file.max": None})
    assert store.tables.table("t").props == {}


def test_offline_online_delete(store: MetadataStore) -> None:
    tid = store.tables.create_table("t", [b"m"])
    store.files.add_files("t", {"f1": FileMeta(10, 2, 0, b"a", b"z")})
    store.tables.set_state("t", OFFLINE)
    assert store.tables.table("t").state == OFFLINE
    store.tables.set_state("t", ONLINE)
    assert store.tables.table("t").state == ONLINE
    with pytest.raises(ValueError):
        store.tables.set_state("t", DELETED)
    ids = store.tables.tablet_ids(tid)
    m = Mutation()
    m.tablet(ids[0]).require("exists").do("add_running", "E1", W.running_doc(["f1"]))
    store.mutate(m)
    assert raw_redis(store).hexists(C.RUNNING, "E1")
    assert store.tables.delete_table("t") == ["f1"]
    assert store.tables.table_info(tid).state == DELETED
    assert store.tables.tablet_ids(tid) == [] and all(store.tables.tablet(i) is None for i in ids)
    assert not raw_redis(store).hexists(C.RUNNING, "E1")  # its running compactions can no longer commit
    assert not raw_redis(store).sismember(C.DIRTY, ids[0])
    with pytest.raises(UnknownTableError):
        store.tables.table("t")
    # a compaction of the deleted table fails cleanly
    m = Mutation(table=tid).require_table(ONLINE)
    m.tablet(ids[0]).require("ecid", "E1").do("remove_running", "E1")
    with pytest.raises(ConditionFailed) as exc:
        store.mutate(m)
    assert exc.value.condition == "table state"
    # the name is free again, under a new id
    assert store.tables.create_table("t") != tid


def test_offline_table_refuses_online_only_mutations(store: MetadataStore) -> None:
    store.tables.create_table("t")
    store.tables.set_state("t", OFFLINE)
    with pytest.raises(ConditionFailed, match="table state"):
        store.files.add_files("t", {"f": FileMeta(1, 1, 0, b"a", b"a")}, allow_offline=False)
    assert store.files.add_files("t", {"f": FileMeta(1, 1, 0, b"a", b"a")})  # bulk import may go to offline tables


def test_add_files_registers_with_each_overlapping_tablet(store: MetadataStore) -> None:
    tid = store.tables.create_table("t", [b"c", b"f", b"j"])
    touched = store.files.add_files(
        "t",
        {
            "span": FileMeta(100, 10, 0, b"d", b"j"),  # (c,f] and (f,j]: j is the end row, inclusive
            "edge": FileMeta(1, 1, 0, b"c", b"c"),  # only (-inf,c]
            "empty": FileMeta(1, 0),  # no entries: registered nowhere
        },
    )
    files = {t.end: set(t.files) for t in store.tables.tablets(tid)}
    assert files == {b"c": {"edge"}, b"f": {"span"}, b"j": {"span"}, None: set()}
    assert touched == [tablet_id(tid, b"c"), tablet_id(tid, b"f"), tablet_id(tid, b"j")]
    assert store.tables.tablet(tablet_id(tid, b"f")).files["span"] == FileMeta(100, 10, 0, b"d", b"j")


# -- every condition, rejected by name, nothing half-applied -------------------------------------
@pytest.fixture
def busy(store: MetadataStore) -> tuple[MetadataStore, str, list[str]]:
    """Table with three tablets; the middle one has files f1..f3, f1 compacting as E1, a USER
    selection S1 of f2, a hold H1 and an operation in progress."""
    tid = store.tables.create_table("t", [b"g", b"p"])
    ids = store.tables.tablet_ids(tid)
    m = Mutation(table=tid)
    m.tablet(ids[0]).require("exists").do("add_files", {"a1": {"size": 1, "entries": 1}})
    m.tablet(ids[1]).require("exists").do("add_files", {f: {"size": 1, "entries": 1} for f in ("f1", "f2", "f3")}).do(
        "add_running", "E1", W.running_doc(["f1"])
    ).do("set_selection", {"id": "S1", "kind": "USER", "files": ["f2"], "done": 0, "created": 0}).do(
        "set_hold", "H1"
    ).do("set_op", "split")
    store.mutate(m)
    t = store.tables.tablet(ids[1])
    assert set(t.files) == {"f1", "f2", "f3"} and set(t.running) == {"E1"}
    assert t.selection.id == "S1" and t.selection.files == ("f2",) and (t.hold, t.op) == ("H1", "split")
    assert raw_redis(store).sismember(C.running_group_key("g"), "E1")
    return store, tid, ids


FAILING = [
    (["absent"], "tablet absent"),
    (["files_present", ["f1", "nope"]], "files present"),
    (["files_free", ["f3", "f1"]], "files not compacting"),
    (["files_exactly", ["f1", "f2"]], "files unchanged"),
    (["files_exactly", ["f1", "f2", "f3", "f4"]], "files unchanged"),
    (["ecid", "E2"], "compaction registered"),
    (["no_running"], "no running compactions"),
    (["no_op"], "no operation in progress"),
    (["no_hold"], "no user compaction pending"),
    (["hold_is", "H2"], "user compaction pending"),
    (["no_selection"], "no selection"),
    (["selection_is", "S2"], "selection"),
    (["files_in_selection", ["f2", "f3"]], "files selected"),
    (["files_not_selected", ["f3", "f2"]], "files not selected"),
    (["version", 0], "tablet unchanged"),
    (["no_such_condition"], "unknown condition"),
]
PASSING = [
    ["exists"],
    ["files_present", ["f1", "f2", "f3"]],
    ["files_free", ["f2", "f3"]],
    ["files_exactly", ["f3", "f2", "f1"]],
    ["ecid", "E1"],
    ["hold_is", "H1"],
    ["selection_is", "S1"],
    ["files_in_selection", ["f2"]],
    ["files_not_selected", ["f1", "f3"]],
]


def _mutation_touching_everything(tid: str, ids: list[str], cond: list) -> Mutation:
    """Passing conditions and real ops on the first and last tablets and the table; ``cond`` on
    the middle tablet, whose ops would also change things if they ran."""
    m = Mutation(table=tid).require_table(ONLINE)
    m.table_ops = [["set_prop", "table.custom.x", "1"], ["set_state", OFFLINE]]
    m.tablet(ids[0]).require("exists").require("files_present", ["a1"]).do(
        "add_files", {"new0": {"size": 1, "entries": 1}}
    ).do("add_running", "E9", W.running_doc(["a1"]))
    mid = m.tablet(ids[1])
    for c in PASSING:
        mid.require(*c)
    mid.require(*cond).do("remove_running", "E1").do("remove_files", ["f1"]).do("clear_hold").do("clear_selection")
    m.tablet(ids[2]).require("exists").do("add_files", {"new2": {"size": 1, "entries": 1}})
    return m


@pytest.mark.parametrize("cond, name", FAILING, ids=[f"{c[0]}-{n}" for c, n in FAILING])
def test_each_condition_rejects_by_name_and_changes_nothing(busy, cond: list, name: str) -> None:
    store, tid, ids = busy
    before = snapshot(raw_redis(store))
    with pytest.raises(ConditionFailed) as exc:
        store.mutate(_mutation_touching_everything(tid, ids, cond))
    assert exc.value.condition == name
    assert ids[1] in str(exc.value) and name in str(exc.value)
    assert snapshot(raw_redis(store)) == before


def test_the_same_mutation_with_passing_conditions_applies_everything(busy) -> None:
    store, tid, ids = busy
    versions = [t.version for t in store.tables.tablets(tid)]
    new = store.mutate(_mutation_touching_everything(tid, ids, ["version", versions[1]]))
    assert new == [v + 1 for v in versions]
    t0, t1, t2 = store.tables.tablets(tid)
    assert set(t0.files) == {"a1", "new0"} and set(t0.running) == {"E9"}
    assert set(t1.files) == {"f2", "f3"} and t1.running == {} and t1.hold is None and t1.selection is None
    assert set(t2.files) == {"new2"}
    info = store.tables.table("t")
    assert info.state == OFFLINE and info.props == {"table.custom.x": "1"}
    assert raw_redis(store).hget(C.RUNNING, "E9").decode() == ids[0] and not raw_redis(store).hexists(C.RUNNING, "E1")
    assert raw_redis(store).smembers(C.running_group_key("g")) == {b"E9"}


@pytest.mark.parametrize(
    "table_conds, name",
    [
        ([["exists"], ["state_in", [OFFLINE]]], "table state"),
        ([["absent", "other"]], "table absent"),
        ([["bogus"]], "unknown table condition"),
    ],
)
def test_table_conditions_reject_by_name(busy, table_conds, name: str) -> None:
    store, tid, ids = busy
    before = snapshot(raw_redis(store))
    m = _mutation_touching_everything(tid, ids, ["exists"])
    m.table_conds = table_conds
    with pytest.raises(ConditionFailed) as exc:
        store.mutate(m)
    assert exc.value.condition == name
    assert snapshot(raw_redis(store)) == before
    m = Mutation(table="999").require_table()
    with pytest.raises(ConditionFailed, match="table exists"):
        store.mutate(m)


@pytest.mark.parametrize(
    "build, name",
    [
        # ops that cannot apply are rejected before anything is written (a Lua error half-way
        # through would leave the earlier writes in place)
        (
            lambda m, ids: m.tablet(ids[0][:-1] + "zz").do("add_files", {"x": {"size": 1, "entries": 1}}),
            "tablet exists",
        ),
        (lambda m, ids: m.tablet(ids[0]).do("no_such_op"), "unknown operation"),
        (lambda m, ids: m.tablet(ids[0]).do("selection_replace", ["a1"], "out"), "selection"),
        (lambda m, ids: m.tablet(ids[0]).do("create", {"table": "1"}, "zz"), "tablet absent"),
        (lambda m, ids: m.tablet(ids[0]).do("add_running", "E5", {"files": []}), "bad operation"),
        (lambda m, ids: m.table_ops.append(["no_such_table_op"]), "unknown operation"),
    ],
)
def test_ops_that_cannot_apply_are_rejected_before_any_write(busy, build, name: str) -> None:
    store, tid, ids = busy
    before = snapshot(raw_redis(store))
    m = Mutation(table=tid)
    m.table_ops = [["set_prop", "table.custom.y", "2"]]
    m.tablet(ids[2]).require("exists").do("add_files", {"new2": {"size": 1, "entries": 1}})
    build(m, ids)
    with pytest.raises(ConditionFailed) as exc:
        store.mutate(m)
    assert exc.value.condition == name
    assert snapshot(raw_redis(store)) == before


def test_rejection_messages_name_the_tablet_and_detail(busy) -> None:
    store, _tid, ids = busy
    m = Mutation()
    m.tablet(ids[1]).require("files_free", ["f1"]).do("add_running", "E2", W.running_doc(["f1"]))
    with pytest.raises(ConditionFailed, match=rf"rejected: files not compacting \(f1 on tablet {ids[1]}\)"):
        store.mutate(m)


# -- races -------------------------------------------------------------------------------------
N_THREADS = 24
N_PROCS = 6


def test_threads_race_for_the_same_files_exactly_one_wins(busy) -> None:
    store, _tid, ids = busy
    barrier = threading.Barrier(N_THREADS)
    with ThreadPoolExecutor(N_THREADS) as pool:
        results = list(
            pool.map(lambda i: W.claim(store.url, [ids[1]], ["f2", "f3"], f"T{i}", barrier), range(N_THREADS))
        )
    assert results.count("won") == 1
    assert set(results) == {"won", "files not compacting"}
    winner = f"T{results.index('won')}"
    t = store.tables.tablet(ids[1])
    assert set(t.running) == {"E1", winner}
    assert {ecid for ecid in raw_redis(store).hkeys(C.RUNNING)} == {b"E1", winner.encode()}


@pytest.mark.parametrize("contenders", [N_PROCS])
def test_processes_race_across_two_tablets_all_or_nothing(store: MetadataStore, contenders: int) -> None:
    """Spawned processes each try to claim two of three files on two tablets in one mutation;
    claims overlap, so exactly one wins per round, and no tablet ever holds a half claim."""
    tid = store.tables.create_table("t", [b"m"])
    ids = store.tables.tablet_ids(tid)
    store.files.add_files("t", {f: FileMeta(1, 1, 0, b"a", b"z") for f in ("x", "y", "z")})
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager, ctx.Pool(contenders) as pool:
        for rnd in range(3):
            barrier = manager.Barrier(contenders)
            pairs = [["x", "y"], ["y", "z"], ["z", "x"]]
            jobs = [
                pool.apply_async(W.claim, (store.url, ids, pairs[i % 3], f"P{rnd}-{i}", barrier))
                for i in range(contenders)
            ]
            results = [j.get(timeout=120) for j in jobs]
            assert results.count("won") == 1, results
            assert set(results) <= {"won", "files not compacting"}
            a, b = store.tables.tablets(tid)
            assert a.running.keys() == b.running.keys() == {f"P{rnd}-{results.index('won')}"}
            # release for the next round
            m = Mutation()
            for t in (a, b):
                for ecid in t.running:
                    m.tablet(t.id).require("ecid", ecid).do("remove_running", ecid)
            store.mutate(m)


def test_no_lost_updates_threads_and_processes(store: MetadataStore) -> None:
    """Read-version-then-compare-and-set from spawned processes and threads at once: every
    update lands exactly once, and the version counts them all."""
    tid = store.tables.create_table("t")
    (tablet_id,) = store.tables.tablet_ids(tid)
    v0 = store.tables.tablet(tablet_id).version
    per_worker, n_threads = 15, 4
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager, ctx.Pool(N_PROCS) as pool:
        barrier = manager.Barrier(N_PROCS + n_threads)
        jobs = [
            pool.apply_async(W.add_files_cas, (store.url, tablet_id, f"p{i}", per_worker, barrier))
            for i in range(N_PROCS)
        ]
        with ThreadPoolExecutor(n_threads) as threads:
            tjobs = [
                threads.submit(W.add_files_cas, store.url, tablet_id, f"t{i}", per_worker, barrier)
                for i in range(n_threads)
            ]
            conflicts = [j.result(timeout=120) for j in tjobs]
        conflicts += [j.get(timeout=120) for j in jobs]
    workers = [f"p{i}" for i in range(N_PROCS)] + [f"t{i}" for i in range(n_threads)]
    t = store.tables.tablet(tablet_id)
    assert set(t.files) == {f"{w}-{i}" for w in workers for i in range(per_worker)}
    assert t.version == v0 + len(workers) * per_worker
    assert sum(conflicts) > 0  # the race was real


def test_concurrent_create_table_of_one_name(store: MetadataStore) -> None:
    def create(_: int) -> str:
        s = MetadataStore.from_url(store.url)
        try:
            return s.tables.create_table("t", [b"a", b"b"])
        except TableExistsError:
            return "exists"
        finally:
            s.close()

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(create, range(16)))
    winners = [r for r in results if r != "exists"]
    assert len(winners) == 1
    tid = store.tables.table_id("t")
    assert winners == [tid] and len(store.tables.tablet_ids(tid)) == 3
    # the losers left no tables or tablets behind
    assert len([k for k in raw_redis(store).keys(C.PREFIX + "tablet:*")]) == 3
    assert len([k for k in raw_redis(store).keys(C.PREFIX + "table:*") if k.count(b":") == 2]) == 1


# -- retries and number range ------------------------------------------------------------------
def test_a_resent_mutation_is_not_applied_twice(busy) -> None:
    """redis-py resends a script call whose connection broke; the first attempt may have been
    applied. The same mutation id must answer with the first outcome, not be evaluated again
    (a commit would otherwise be reported as rejected after it succeeded)."""
    store, _tid, ids = busy
    m = Mutation()
    m.tablet(ids[1]).require("ecid", "E1").require("files_present", ["f1"]).do("remove_running", "E1").do(
        "remove_files", ["f1"]
    ).do("add_files", {"A9": {"size": 1, "entries": 1}})
    raw = m.to_json("the-same-id")
    first = store.call(store._core._mutate, args=[raw])
    version = store.tables.tablet(ids[1]).version
    assert store.call(store._core._mutate, args=[raw]) == first  # the resend
    t = store.tables.tablet(ids[1])
    assert t.version == version and set(t.files) == {"A9", "f2", "f3"} and t.running == {}
    # a new call of the same mutation is a new attempt, and is rejected now
    with pytest.raises(ConditionFailed, match="compaction registered"):
        store.mutate(m)


def test_numbers_round_trip_exactly_through_the_script(store: MetadataStore) -> None:
    """Redis's Lua cjson keeps 14 significant digits: sizes up to 10**14 - 1 bytes and millisecond
    timestamps are exact (nanosecond timestamps would not be)."""
    tid = store.tables.create_table("t")
    (tablet_id,) = store.tables.tablet_ids(tid)
    store.files.add_files("t", {"f": FileMeta(10**14 - 1, 10**13 + 7, 3, b"a", b"b")})
    m = Mutation()
    started = 4_102_444_800_000  # 2100-01-01 in ms
    doc = {**W.running_doc(["f"]), "started": started}
    m.tablet(tablet_id).require("exists").do("add_running", "E1", doc)
    store.mutate(m)
    t = store.tables.tablet(tablet_id)
    assert t.files["f"] == FileMeta(10**14 - 1, 10**13 + 7, 3, b"a", b"b")
    assert t.running["E1"].started_ms == started and isinstance(t.files["f"].size, int)


@pytest.mark.parametrize("size", [1, 2, 3, 10])
def test_tablet_batches_are_get_tablets_in_batches(store: MetadataStore, size: int) -> None:
    tid = store.tables.create_table("t", [b"b", b"c", b"d", b"e"])
    store.files.add_files("t", {"f": FileMeta(10, 2, 0, b"a", b"z")})
    ids = [*store.tables.tablet_ids(tid), f"{tid};missing"]
    batches = list(store.tables.tablet_batches(ids, size))
    assert len(batches) == -(-len(ids) // size) and all(len(b) == size for b in batches[:-1])
    assert [t for b in batches for t in b] == store.tables.get_tablets(ids) == store.tables.tablets(tid)
    assert list(store.tables.tablet_batches([], size)) == []


def test_tablet_doc_batches_keep_one_read_in_flight(store: MetadataStore) -> None:
    """The next batch's MGET is sent before a batch is handed out: a caller that stops early, or
    writes between batches, leaves the connections in step; a connection lost with a read in
    flight is read again (the client's retries)."""
    tid = store.tables.create_table("t", [b"b", b"c", b"d", b"e"])
    store.files.add_files("t", {"f": FileMeta(10, 2, 0, b"a", b"z")})
    ids = store.tables.tablet_ids(tid)
    docs = store.tables.tablet_docs(ids)
    assert [d for b in store.tables.tablet_doc_batches(ids, 2) for d in b] == docs
    it = store.tables.tablet_doc_batches(ids, 2)
    assert next(it) == docs[:2]
    it.close()  # the second batch's reply was never read: its connection is dropped, not reused
    assert store.tables.tablet_docs(ids) == docs and store.tables.tablet(ids[0]) is not None
    it = store.tables.tablet_doc_batches(ids, 2)
    first = next(it)
    raw_redis(store).client_kill_filter(_type="normal", skipme=True)  # the MGET in flight is lost with its connection
    assert [*first, *(d for b in it for d in b)] == docs
    with pytest.raises(StoreUnavailable):  # no Redis: the store's error, after the client's retries
        next(MetadataStore.from_url("redis://127.0.0.1:1/0").tables.tablet_doc_batches(ids, 2))
