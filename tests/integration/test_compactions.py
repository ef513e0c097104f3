"""Reserve and commit as single conditional mutations on a real redis-server (issues 4 and 8):
the reserve mutation names the output and decides full vs partial atomically and reports the
tablet's range and the table's properties; the commit mutation also drops the heartbeat and
maintains the commit counters; a resent mutation (lost reply) is recognised and counts once;
the new ops are validated before anything is written."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kompaktor import keyspace as C
from kompaktor.metadata import compactions
from kompaktor.metadata.store import MetadataStore, Mutation
from kompaktor.model.errors import ConditionFailed, KompaktorError
from kompaktor.model.job import Job
from kompaktor.model.names import ecid_nonce
from kompaktor.model.tablet import FileInfo, FileMeta
from tests.integration import store_race_worker as W
from tests.support.rawredis import raw_redis
from tests.support.snapshot import snapshot

pytestmark = pytest.mark.redis


def table_with_files(store: MetadataStore, n: int = 3, props: dict[str, str] | None = None) -> tuple[str, str]:
    """A table split at "m"; the second tablet holds ``n`` files F..0 to F..n-1. Returns (table id, tablet id)."""
    tid = store.tables.create_table("t", [b"m"], props)
    tablet = store.tables.tablet_ids(tid)[1]
    m = Mutation(table=tid)
    m.tablet(tablet).do(
        "add_files", {f"tables/{tid}/F{i:010x}.parquet": FileMeta(100 + i, 1).to_json() for i in range(n)}
    )
    store.mutate(m)
    return tid, tablet


def job(tablet: str, files: list[str], kind: str = "SYSTEM", group: str = "g") -> Job:
    return Job(tablet, kind, 1, group, {f: 100 for f in files})


def output_info(path: str) -> FileInfo:
    return FileInfo(path, 1000, 10, 0, (b"n",), (b"o",))


def resend_every_mutation(store: MetadataStore, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Send every mutation twice with the same arguments — what redis-py does when a connection
    breaks after the script ran — and answer with the second reply. Returns the replies."""
    real = store._core._eval_durable
    replies: list[Any] = []

    def twice(arg: str) -> Any:
        replies.append(real(arg))
        replies.append(real(arg))
        return replies[-1]

    monkeypatch.setattr(store._core, "_eval_durable", twice)
    return replies


# -- reserve ---------------------------------------------------------------------------------------
def test_reserve_names_the_output_decides_full_and_reports_range_and_props(store: MetadataStore) -> None:
    tid, tablet = table_with_files(store, 3, {"table.iterator.versions": "3"})
    files = sorted(store.tables.tablet(tablet).files)
    seq = int(raw_redis(store).hget(C.SEQ, "file") or 0)
    partial = compactions.try_reserve(store, job(tablet, files[:2]), "c1", "g")
    assert not partial.full and not partial.settings.full
    assert partial.output == f"tables/{tid}/C{seq + 1:010x}-{ecid_nonce(partial.ecid)}.parquet"
    assert (partial.prev, partial.end, partial.table) == (b"m", None, tid)
    assert partial.inputs == tuple(files[:2]) and partial.settings.max_versions == 3
    t = store.tables.tablet(tablet)
    assert t.running[partial.ecid].output == partial.output and t.running[partial.ecid].files == tuple(files[:2])
    assert raw_redis(store).hget(C.RUNNING, partial.ecid).decode() == tablet
    assert raw_redis(store).sismember(C.running_group_key("g"), partial.ecid)
    compactions.remove_running(store, tablet, partial.ecid)

    full = compactions.try_reserve(store, job(tablet, list(reversed(files))), "c1", "g")
    assert full.full and full.settings.full and full.inputs == tuple(files)  # oldest first
    assert full.output == f"tables/{tid}/A{seq + 2:010x}-{ecid_nonce(full.ecid)}.parquet"
    assert store.tables.tablet(tablet).running[full.ecid].output == full.output


def test_full_is_decided_against_the_files_at_reservation(store: MetadataStore) -> None:
    """A job planned as full, after a new file arrived, is reserved as a partial compaction of
    its files (the new file stays); it is not discarded."""
    tid, tablet = table_with_files(store, 2)
    planned = job(tablet, sorted(store.tables.tablet(tablet).files))
    store.files.add_files("t", {f"tables/{tid}/F{9:010x}.parquet": FileMeta(5, 1, 0, b"n", b"n")})
    res = compactions.try_reserve(store, planned, "c1", "g")
    assert not res.full and res.output.split("/")[-1].startswith("C")


def test_reserve_reports_the_range_of_the_tablet_when_it_reserved(store: MetadataStore) -> None:
    """The range comes from the reserving mutation itself, so a split or merge just before it
    cannot leave the reservation with an old range."""
    _tid, tablet = table_with_files(store, 2)
    m = Mutation()
    m.tablet(tablet).do("set_range", b"g".hex())  # as if the tablet before it had been split
    store.mutate(m)
    res = compactions.try_reserve(store, job(tablet, sorted(store.tables.tablet(tablet).files)), "c1", "g")
    assert res.prev == b"g"


@pytest.mark.parametrize("cond", ["table state", "no operation in progress"])
def test_a_refused_reservation_changes_nothing(store: MetadataStore, cond: str) -> None:
    tid, tablet = table_with_files(store, 2)
    files = sorted(store.tables.tablet(tablet).files)
    if cond == "table state":
        store.tables.set_state("t", "OFFLINE")
    else:
        m = Mutation(table=tid)
        m.tablet(tablet).do("set_op", "split")
        store.mutate(m)
    before = snapshot(raw_redis(store))
    with pytest.raises(ConditionFailed) as exc:
        compactions.try_reserve(store, job(tablet, files), "c1", "g")
    assert exc.value.condition == cond
    assert snapshot(raw_redis(store)) == before  # no ECID, and no file sequence number taken


def test_a_reservation_with_unusable_settings_leaves_no_ecid(store: MetadataStore) -> None:
    tid, tablet = table_with_files(store, 2)
    store.mutate(Mutation(table=tid, table_ops=[["set_prop", "table.iterator.versions", "many"]]))
    with pytest.raises(KompaktorError, match="not an integer"):
        compactions.try_reserve(store, job(tablet, sorted(store.tables.tablet(tablet).files)), "c1", "g")
    assert store.tables.tablet(tablet).running == {} and not raw_redis(store).hlen(C.RUNNING)


def test_a_resent_reservation_is_recognised(store: MetadataStore, monkeypatch: pytest.MonkeyPatch) -> None:
    _tid, tablet = table_with_files(store, 2)
    files = sorted(store.tables.tablet(tablet).files)
    seq = int(raw_redis(store).hget(C.SEQ, "file") or 0)
    replies = resend_every_mutation(store, monkeypatch)
    res = compactions.try_reserve(store, job(tablet, files), "c1", "g")
    assert replies[0] == replies[1]  # the resend answered with the first outcome
    assert int(raw_redis(store).hget(C.SEQ, "file")) == seq + 1  # one output name allocated
    assert set(store.tables.tablet(tablet).running) == {res.ecid}


# -- commit ----------------------------------------------------------------------------------------
def test_commit_drops_the_heartbeat_and_counts_in_the_same_mutation(store: MetadataStore) -> None:
    _tid, tablet = table_with_files(store, 3)
    files = sorted(store.tables.tablet(tablet).files)
    res = compactions.try_reserve(store, job(tablet, files, group="small"), "c1", "small")
    compactions.heartbeat(store, res, {"entries_read": 1})
    assert raw_redis(store).exists(C.heartbeat_key(res.ecid))
    compactions.commit(store, res, output_info(res.output))
    t = store.tables.tablet(tablet)
    assert set(t.files) == {res.output} and t.running == {}
    assert not raw_redis(store).exists(C.heartbeat_key(res.ecid))
    assert not raw_redis(store).hexists(C.RUNNING, res.ecid) and not raw_redis(store).sismember(
        C.running_group_key("small"), res.ecid
    )
    counters = store.bookkeeping.counters()
    assert counters["compactions_committed"] == 1 and counters["committed:small"] == 1
    assert raw_redis(store).hget(C.COMMITS_BY_TABLET, tablet) == b"1"


def test_a_resent_commit_is_recognised_and_counts_once(store: MetadataStore, monkeypatch: pytest.MonkeyPatch) -> None:
    _tid, tablet = table_with_files(store, 3)
    res = compactions.try_reserve(store, job(tablet, sorted(store.tables.tablet(tablet).files)), "c1", "g")
    replies = resend_every_mutation(store, monkeypatch)
    compactions.commit(store, res, output_info(res.output))  # the resend must not be reported as rejected
    assert json.loads(replies[1])["ok"] and replies[0] == replies[1]
    assert set(store.tables.tablet(tablet).files) == {res.output}
    assert (
        store.bookkeeping.counters()["compactions_committed"] == 1 and store.bookkeeping.counters()["committed:g"] == 1
    )
    assert raw_redis(store).hget(C.COMMITS_BY_TABLET, tablet) == b"1"


def test_the_commit_log_holds_each_commit_applied_once(store: MetadataStore, monkeypatch: pytest.MonkeyPatch) -> None:
    _tid, tablet = table_with_files(store, 3)
    assert store.bookkeeping.commit_log() == []
    res = compactions.try_reserve(store, job(tablet, sorted(store.tables.tablet(tablet).files)), "c1", "g")
    resend_every_mutation(store, monkeypatch)
    compactions.commit(store, res, output_info(res.output))  # sent twice, applied once
    assert store.bookkeeping.commit_log() == [res.ecid]


def test_a_rejected_commit_counts_nothing_and_keeps_the_heartbeat(store: MetadataStore) -> None:
    _tid, tablet = table_with_files(store, 3)
    res = compactions.try_reserve(store, job(tablet, sorted(store.tables.tablet(tablet).files)), "c1", "g")
    compactions.heartbeat(store, res, {"entries_read": 1})
    compactions.remove_running(store, tablet, res.ecid)  # as dead-compaction detection does
    before = snapshot(raw_redis(store))
    with pytest.raises(ConditionFailed, match="compaction registered"):
        compactions.commit(store, res, output_info(res.output))
    assert snapshot(raw_redis(store)) == before
    assert "compactions_committed" not in store.bookkeeping.counters()


# -- the ops themselves ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "op",
    [
        ["add_running", "E2", W.running_doc(["f"]), {"template": "t/%s%010x%s", "full": "A", "partial": "C"}],
        ["add_running", "E2", W.running_doc(["f"]), {"template": "t/%s%010x", "full": "A"}],
        ["add_running", "E2", W.running_doc(["f"]), "t/%s%010x"],
        ["drop_heartbeat", 7],
        ["count_commit", None],
        ["remove_inputs", "E-none"],
        ["remove_inputs", 7],
    ],
)
def test_malformed_new_ops_are_rejected_before_any_write(store: MetadataStore, op: list) -> None:
    tid, tablet = table_with_files(store, 1)
    before = snapshot(raw_redis(store))
    m = Mutation(table=tid)
    m.tablet(store.tables.tablet_ids(tid)[0]).do("add_files", {"x": FileMeta(1, 1).to_json()})
    m.tablet(tablet).do(*op)
    with pytest.raises(ConditionFailed) as exc:
        store.mutate(m)
    assert exc.value.condition == "bad operation"
    assert snapshot(raw_redis(store)) == before


def test_table_reads_return_fields_of_the_table_after_the_ops(store: MetadataStore) -> None:
    tid = store.tables.create_table("t", props={"table.iterator.versions": "2"})
    m = Mutation(table=tid, table_reads=["props", "state", "nope"]).require_table()
    m.table_ops = [["set_state", "OFFLINE"]]
    out = store.apply(m)
    assert json.loads(out["table"]["props"]) == {"table.iterator.versions": "2"}
    assert out["table"]["state"] == "OFFLINE" and out["table"]["nope"] is None
    assert "table" not in store.apply(Mutation(table=tid).require_table())


@pytest.mark.parametrize("kind", ["USER", "SELECTOR"])
def test_selection_done_shrinks_the_selection_then_completes_it(store: MetadataStore, kind: str) -> None:
    """A USER or SELECTOR compaction commits without reading the tablet first: mutate.lua replaces
    the inputs by the output in the selection, or, when no other selected file is left, clears it
    (and records a user compaction's tablet as done)."""
    tid, tablet = table_with_files(store, 4)
    files = sorted(store.tables.tablet(tablet).files)
    ucomp = "U1" if kind == "USER" else None
    m = Mutation(table=tid)
    m.tablet(tablet).do("set_selection", {"id": "S1", "kind": kind, "files": files[:3], "done": 0, "created": 0})
    store.mutate(m)

    def done(inputs: list[str], output: str | None) -> None:
        m = Mutation(table=tid)
        m.tablet(tablet).require("selection_is", "S1").do("selection_done", inputs, output, ucomp)
        store.mutate(m)

    done(files[:2], "X")
    sel = store.tables.tablet(tablet).selection
    assert sel is not None and (sel.files, sel.done) == ((files[2], "X"), 1)
    done([files[2]], None)  # an empty output leaves the selection
    sel = store.tables.tablet(tablet).selection
    assert sel is not None and (sel.files, sel.done) == (("X",), 2)
    assert not raw_redis(store).exists(C.ucomp_done_key("U1"))
    done(["X"], "Y")
    assert store.tables.tablet(tablet).selection is None
    assert raw_redis(store).smembers(C.ucomp_done_key("U1")) == ({tablet.encode()} if ucomp else set())


def test_selection_done_needs_a_selection(store: MetadataStore) -> None:
    tid, tablet = table_with_files(store, 1)
    before = snapshot(raw_redis(store))
    m = Mutation(table=tid)
    m.tablet(tablet).do("selection_done", ["f"], None, None)
    with pytest.raises(ConditionFailed, match="no selection to update"):
        store.mutate(m)
    assert snapshot(raw_redis(store)) == before


# -- the folded poll-and-reserve (one script call: lua/reserve.lua) ----------------------------------
def function_calls(store: MetadataStore) -> int:
    return int(raw_redis(store).info("commandstats").get("cmdstat_fcall", {}).get("calls", 0))


def reset_stats(store: MetadataStore) -> None:
    """Functions loaded (a first FCALL would fail and count), statistics reset."""
    store.load_scripts()
    raw_redis(store).config_resetstat()


def test_reserve_polls_and_reserves_in_one_script_call_as_try_reserve_would(store: MetadataStore) -> None:
    """The folded reservation writes what :func:`try_reserve` writes (the running record, its
    files oldest first, the output's name) and reports the same; one script call in all."""
    tid, tablet = table_with_files(store, 3)
    other_tid = store.tables.create_table("u", [b"m"])
    other = store.tables.tablet_ids(other_tid)[1]
    files = sorted(store.tables.tablet(tablet).files, reverse=True)  # the job's order is not the inputs' order
    m = Mutation(table=other_tid)
    m.tablet(other).do("add_files", {f.replace(f"/{tid}/", f"/{other_tid}/"): FileMeta(1, 1).to_json() for f in files})
    store.mutate(m)
    store.queues.add(tablet, [job(tablet, files)])
    reset_stats(store)
    res = compactions.reserve(store, store.queues, "g", "c1")
    assert res is not None and function_calls(store) == 1
    by_python = compactions.try_reserve(store, job(other, sorted(store.tables.tablet(other).files)), "c1", "g")
    assert res.inputs == tuple(sorted(files)) and res.full and res.prev == b"m" and res.end is None
    assert (res.full, res.prev, res.end) == (by_python.full, by_python.prev, by_python.end)
    assert res.output.startswith(f"tables/{tid}/A") and res.output.endswith(f"-{ecid_nonce(res.ecid)}.parquet")
    folded = json.loads(raw_redis(store).get(C.tablet_key(tablet)))["running"][res.ecid]
    direct = json.loads(raw_redis(store).get(C.tablet_key(other)))["running"][by_python.ecid]
    assert folded["files"] == list(res.inputs)
    same = ("kind", "group", "priority", "compactor")
    assert set(folded) == set(direct) and {k: folded[k] for k in same} == {k: direct[k] for k in same}
    assert raw_redis(store).hget(C.RUNNING, res.ecid) == tablet.encode()
    assert store.queues.stats("g").dequeued == 1 and store.queues.jobs("g") == []


def test_a_template_decoded_once_keeps_nothing_of_an_earlier_reservation(store: MetadataStore) -> None:
    """Redis keeps each template it decoded (a compactor sends the same text on every call): every
    reservation after the first is still its own — its ECID, time, table, tablet, files, priority
    and selection — whichever kind came before it, and a compactor of another name or group has
    its own templates."""
    tids, tablets = [], []
    for name, n in (("t1", 3), ("t2", 2), ("t3", 4)):
        tid = store.tables.create_table(name, [b"m"])
        tablet = store.tables.tablet_ids(tid)[1]
        m = Mutation(table=tid)
        new = {f"tables/{tid}/F{i:010x}.parquet": FileMeta(1, 1).to_json() for i in range(n)}
        m.tablet(tablet).do("add_files", new)
        store.mutate(m)
        tids.append(tid)
        tablets.append(tablet)
    files = [sorted(store.tables.tablet(t).files) for t in tablets]
    m = Mutation(table=tids[1])  # the second tablet's first file is selected: a SELECTOR job
    sel = {"id": "S1", "kind": "SELECTOR", "files": files[1][:1], "done": 0, "created": 0}
    m.tablet(tablets[1]).do("set_selection", sel)
    store.mutate(m)
    queued = [
        Job(tablets[0], "SYSTEM", 9, "g", {f: 1 for f in files[0]}),
        Job(tablets[1], "SELECTOR", 8, "g", {files[1][0]: 1}, selection="S1"),
        Job(tablets[2], "SYSTEM", 7, "g", {f: 1 for f in files[2][1:]}),
    ]
    for j in queued:
        store.queues.add(j.tablet, [j])
    got = []
    for compactor in ("c1", "c1", "c2"):
        before = compactions.now_ms()
        res = compactions.reserve(store, store.queues, "g", compactor)
        assert res is not None
        got.append((res, before, compactions.now_ms()))
    assert len({res.ecid for res, _, _ in got}) == 3
    for (res, before, after), j, tid, compactor in zip(got, queued, tids, ("c1", "c1", "c2"), strict=True):
        rec = json.loads(raw_redis(store).get(C.tablet_key(j.tablet)))["running"][res.ecid]
        assert res.job.tablet == j.tablet and rec["files"] == sorted(j.files) == list(res.inputs)
        assert (rec["kind"], rec["priority"], rec["compactor"], rec["group"]) == (j.kind, j.priority, compactor, "g")
        assert rec.get("selection") == j.selection  # left out of a SYSTEM record, as Python does
        assert isinstance(rec["started"], int) and before <= rec["started"] <= after
        assert rec["output"] == res.output and res.output.startswith(f"tables/{tid}/")
        assert res.output.endswith(f"-{ecid_nonce(res.ecid)}.parquet")
        assert raw_redis(store).hget(C.RUNNING, res.ecid) == j.tablet.encode()
    assert [res.full for res, _, _ in got] == [True, False, False]  # all of t1's files; one of t2's; t3's but one


def test_the_folded_reserve_orders_files_as_file_order_key(store: MetadataStore) -> None:
    tid = store.tables.create_table("t")
    tablet = store.tables.tablet_ids(tid)[0]
    names = [f"tables/{tid}/{p}{s:010x}-n.parquet" for p, s in (("C", 9), ("A", 2), ("F", 30), ("F", 4), ("C", 11))]
    m = Mutation(table=tid)
    m.tablet(tablet).do("add_files", {n: FileMeta(1, 1).to_json() for n in names})
    store.mutate(m)
    store.queues.add(tablet, [job(tablet, names[:4])])
    res = compactions.reserve(store, store.queues, "g", "c1")
    assert res is not None and not res.full
    want = sorted(names[:4], key=lambda n: n.rsplit("/", 1)[1][1:])
    assert list(res.inputs) == want == list(store.tables.tablet(tablet).running[res.ecid].files)


def test_the_folded_reserve_discards_stale_jobs_in_bounded_calls(store: MetadataStore) -> None:
    """Stale jobs are discarded inside Redis, at most RESERVE_MAX_STALE per call, and counted."""
    from kompaktor.metadata.store.base import RESERVE_MAX_STALE

    _tid, tablet = table_with_files(store, 3)
    files = sorted(store.tables.tablet(tablet).files)
    stale = RESERVE_MAX_STALE + 4
    # jobs of other tablets (queued first: a higher priority) whose files are gone
    for i in range(stale):
        gone = Job(f"{tablet}x{i}", "SYSTEM", 5, "g", {f"gone/{i}.parquet": 1})
        store.queues.add(gone.tablet, [gone])
    store.queues.add(tablet, [job(tablet, files)])
    reset_stats(store)
    res = compactions.reserve(store, store.queues, "g", "c1")
    assert res is not None and res.inputs == tuple(files)
    assert function_calls(store) == 2  # one call per RESERVE_MAX_STALE stale jobs, then the reservation
    assert store.bookkeeping.counters()["stale_jobs_discarded"] == stale
    assert store.queues.stats("g").dequeued == stale + 1
    assert compactions.reserve(store, store.queues, "g", "c1") is None


def test_a_job_the_templates_do_not_express_comes_back_and_is_reserved_in_python(store: MetadataStore) -> None:
    """A SYSTEM job flagged overlaps-selection needs the stale-selection check: popped by the
    script, reserved by try_reserve. A USER job whose user compaction is gone is discarded."""
    _tid, tablet = table_with_files(store, 3)
    files = sorted(store.tables.tablet(tablet).files)
    user = Job(tablet, "USER", 9, "g", {f: 1 for f in files}, selection="UC-gone")
    over = Job(tablet, "SYSTEM", 1, "g", {f: 1 for f in files[:2]}, overlaps=True)
    store.queues.add(tablet, [user, over])
    res = compactions.reserve(store, store.queues, "g", "c1")
    assert res is not None and res.job == over and res.inputs == tuple(files[:2])
    assert set(store.tables.tablet(tablet).running) == {res.ecid}
    assert store.bookkeeping.counters()["stale_jobs_discarded"] == 1  # the USER job
    assert store.queues.stats("g").dequeued == 2


def test_a_resent_folded_reserve_returns_the_recorded_outcome(
    store: MetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call resent after a broken connection (redis-py resends the same arguments) answers with
    the first attempt's outcome: it neither pops a second job nor registers a second ECID."""
    _tid, tablet = table_with_files(store, 4)
    files = sorted(store.tables.tablet(tablet).files)
    store.queues.add(tablet, [job(tablet, files[:2]), job(tablet, files[2:])])
    real, script = store._core.call, store._core._reserve
    replies: list[Any] = []

    def twice(fn: Any, *args: Any, **kwargs: Any) -> Any:
        if fn is not script:
            return real(fn, *args, **kwargs)
        replies.append(real(fn, *args, **kwargs))
        replies.append(real(fn, *args, **kwargs))
        return replies[-1]

    monkeypatch.setattr(store._core, "call", twice)
    res = compactions.reserve(store, store.queues, "g", "c1")
    assert res is not None and replies[0] == replies[1]
    assert set(store.tables.tablet(tablet).running) == {res.ecid}
    assert store.queues.stats("g").dequeued == 1 and len(store.queues.jobs("g")) == 1


def test_commit_is_refused_when_an_input_is_gone(store: MetadataStore) -> None:
    tid, tablet = table_with_files(store, 3)
    files = sorted(store.tables.tablet(tablet).files)
    res = compactions.try_reserve(store, job(tablet, files), "c1", "g")
    m = Mutation(table=tid)
    m.tablet(tablet).do("remove_files", [files[1]])
    store.mutate(m)
    before = snapshot(raw_redis(store))
    with pytest.raises(ConditionFailed, match="files present"):
        compactions.commit(store, res, output_info(res.output))
    assert snapshot(raw_redis(store)) == before
