"""Tablet split and merge on a real redis-server (issue 9; seeds 002, 003, 004 "When a Tablet is
split or merged"): the merged view of every row is unchanged across random splits, merges,
compactions and flushes (property test); automatic splits past ``table.split.threshold``;
split/merge refused while a compaction runs, and a compaction whose tablet was split meanwhile
fails to commit and leaves no output; the coordinator re-plans the new tablets and their
compactions (Arrow engine) write only their own rows; the ``table split|merge`` CLI."""

from __future__ import annotations

import itertools
import json

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kompaktor import keyspace as C
from kompaktor.cli.table import table as table_cli
from kompaktor.client import Client
from kompaktor.coordinator import Coordinator
from kompaktor.engines import make_engine
from kompaktor.engines.api import MergeRequest
from kompaktor.files.sortedfile import iter_entries
from kompaktor.metadata import compactions
from kompaktor.metadata import tablet_ops as tabletops
from kompaktor.metadata.store import MetadataStore, Mutation
from kompaktor.metadata.tablet_ops import TabletOpRefused
from kompaktor.model.errors import ConditionFailed
from kompaktor.model.job import Job
from kompaktor.model.keys import Entry
from kompaktor.model.tablet import Tablet, tablet_id
from kompaktor.policy.deletes import DeleteHorizonError
from kompaktor.policy.tableprops import SPLIT_THRESHOLD
from tests.support.coordinator import settings as coordinator_settings
from tests.support.rawredis import raw_redis

pytestmark = pytest.mark.redis

ENGINE = make_engine("arrow")


# -- helpers -------------------------------------------------------------------------------------
def E(row: bytes, ts: int = 1, deleted: bool = False, cq: bytes = b"q") -> Entry:
    return Entry(row, b"f", cq, b"", ts, deleted, b"" if deleted else row + b"@%d" % ts)


def view(client: Client, table: str) -> list[Entry]:
    return list(client.scan(table))


def tablets(store: MetadataStore, table: str) -> list[Tablet]:
    return store.tables.tablets(store.tables.table_id(table))


def assert_partition(store: MetadataStore, table: str) -> None:
    """The tablets cover the row space exactly once, in order, each under its end-row id."""
    ts = tablets(store, table)
    assert ts[0].prev is None and ts[-1].end is None
    for a, b in itertools.pairwise(ts):
        assert a.end == b.prev and a.end is not None
    assert [t.id for t in ts] == [tablet_id(t.table, t.end) for t in ts]


def tablet_docs(store: MetadataStore, table: str) -> dict[bytes, bytes]:
    tid = store.tables.table_id(table)
    keys = [C.tablet_key(i) for i in store.tables.tablet_ids(tid)]
    return {k.encode(): raw_redis(store).get(k) for k in keys} | {
        b"z": tuple(raw_redis(store).zrange(C.tablets_key(tid), 0, -1))
    }


def run_reservation(client: Client, res: compactions.Reservation):
    return ENGINE.merge(client.storage, MergeRequest(res.inputs, res.output, res.prev, res.end, res.settings, res.ecid))


def compact_tablet(client: Client, t: Tablet) -> str | None:
    """A full SYSTEM compaction of tablet ``t``, the way a compactor runs it; returns the output
    (None when the output was empty) after checking it holds only the tablet's rows."""
    job = Job(t.id, "SYSTEM", 1, "test", {f: m.size for f, m in t.files.items()})
    res = compactions.try_reserve(client.store, job, "test-compactor", "test")
    result = run_reservation(client, res)
    compactions.commit(client.store, res, result.info)
    if result.info.entries == 0:
        return None
    assert_rows_within(client, res.output, t.prev, t.end)
    return res.output


def assert_rows_within(client: Client, path: str, prev: bytes | None, end: bytes | None) -> None:
    rows = [e.row for e in iter_entries(client.storage, path)]
    assert rows, path
    assert all((prev is None or r > prev) and (end is None or r <= end) for r in rows), (path, prev, end)


def coordinator(store, storage, **kw) -> Coordinator:
    c = Coordinator(store, storage, coordinator_settings(**kw))
    assert c.try_lead()
    return c


def fill(client: Client, table: str, batches: int, rows: range, step: int = 1) -> None:
    """``batches`` flushes over the same rows (newer versions each time): overlapping files."""
    for b in range(batches):
        client.flush(table, [E(b"row%05d" % i, ts=b + 1) for i in rows[::step]])


# -- property: the merged view survives splits, merges, compactions and flushes ---------------------
ROWS = st.binary(min_size=1, max_size=3).map(lambda b: bytes(x % 6 + 0x61 if x < 200 else x for x in b))
ENTRIES = st.lists(st.builds(E, ROWS, st.integers(1, 4), st.booleans(), st.sampled_from([b"a", b"b"])), max_size=25)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("split"), st.lists(ROWS, min_size=1, max_size=3)),
        st.tuples(st.just("merge"), st.one_of(st.none(), ROWS), st.one_of(st.none(), ROWS)),
        st.tuples(st.just("compact"), ROWS),
        st.tuples(st.just("flush"), ENTRIES),
    ),
    min_size=1,
    max_size=8,
)
_names = itertools.count()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=ENTRIES, splits=st.lists(ROWS, max_size=3), ops=OPS)
def test_merged_view_unchanged_across_splits_and_merges(client: Client, first, splits, ops) -> None:
    name = f"p{next(_names)}"
    client.store.tables.create_table(name, splits)
    client.flush(name, first)
    store = client.store
    for op in ops:
        before = view(client, name)
        if op[0] == "split":
            tabletops.split(store, name, op[1])
            ends = {t.end for t in tablets(store, name)}
            assert set(op[1]) <= ends
        elif op[0] == "merge":
            start, end = op[1], op[2]
            if start is not None and end is not None and start > end:
                start, end = end, start
            docs = tablet_docs(store, name)
            try:
                merged = tabletops.merge(store, name, start, end)
            except TabletOpRefused as exc:
                event("merge refused (unsafe)")
                assert "Compact the range first" in str(exc)
                assert tablet_docs(store, name) == docs  # a refusal changes nothing
            else:
                event("merged" if merged else "nothing to merge")
                if merged is not None:
                    t = store.tables.tablet(merged)
                    assert start is None or t.prev is None or t.prev < start
                    assert end is None or t.end is None or t.end >= end
        elif op[0] == "compact":
            t = next(t for t in tablets(store, name) if t.contains_row(op[1]))
            if t.files:
                compact_tablet(client, t)
        else:
            try:
                client.flush(name, op[1])
                before = None
            except DeleteHorizonError:  # a put a dropped delete marker may hide: refused, nothing changed
                event("flush refused (delete horizon)")
        assert_partition(store, name)
        if before is not None:
            assert view(client, name) == before, op
    # and finally everything merges back into one tablet once each tablet holds only its rows
    for t in tablets(store, name):
        if t.files:
            compact_tablet(client, t)
    before = view(client, name)
    tabletops.merge(store, name)
    assert len(tablets(store, name)) == 1
    assert view(client, name) == before


def test_split_shares_files_and_divides_their_sizes(client: Client) -> None:
    client.store.tables.create_table("t")
    fill(client, "t", 2, range(100))
    (t,) = tablets(client.store, "t")
    before = view(client, "t")
    new = tabletops.split(client.store, "t", [b"row00030", b"row00060", b"zzz"])
    assert new == [tablet_id(t.table, r) for r in (b"row00030", b"row00060", b"zzz")] + [t.id]
    ts = tablets(client.store, "t")
    assert [(x.prev, x.end) for x in ts] == [
        (None, b"row00030"),
        (b"row00030", b"row00060"),
        (b"row00060", b"zzz"),
        (b"zzz", None),
    ]
    for x in ts[:3]:
        assert set(x.files) == set(t.files)  # the same files, each read in its own range
        assert all(m.size < t.files[f].size for f, m in x.files.items())
    assert ts[3].files == {}  # no file has rows after "zzz"
    assert view(client, "t") == before
    for f, m in t.files.items():  # the parts add up to about the whole
        assert abs(sum(x.files[f].size for x in ts[:3]) - m.size) <= 3
    # splitting at an existing split point changes nothing
    assert tabletops.split(client.store, "t", [b"row00030"]) == []
    with pytest.raises(ValueError):
        tabletops.split(client.store, "t", [b""])
    # merge everything back: one tablet with the files' sizes summed again
    assert tabletops.merge(client.store, "t") == t.id
    (m,) = tablets(client.store, "t")
    assert (m.prev, m.end, set(m.files)) == (None, None, set(t.files))
    assert all(abs(m.files[f].size - t.files[f].size) <= 3 for f in t.files)
    assert view(client, "t") == before


def test_merge_refused_when_a_tablet_already_compacted_a_shared_file(client: Client) -> None:
    """A file still in tablet A but compacted away in B overlaps B's rows: merging would bring
    B's outdated rows back (e.g. deleted ones). Refused; after a compaction of A it works."""
    store = client.store
    store.tables.create_table("t")
    client.flush("t", [E(b"a"), E(b"m")])
    tabletops.split(store, "t", [b"g"])
    _, b = tablets(store, "t")
    client.flush("t", [E(b"m", ts=5, deleted=True)])  # delete row m in B
    compact_tablet(client, tablets(store, "t")[1])  # full: the delete and m are gone from B
    before = view(client, "t")
    assert [e.row for e in before] == [b"a"]
    with pytest.raises(TabletOpRefused, match="kompaktor compact t --wait"):
        tabletops.merge(store, "t")
    with pytest.raises(TabletOpRefused, match="kompaktor compact t --start 'b' --end 'z' --wait"):
        tabletops.merge(store, "t", b"b", b"z")
    compact_tablet(client, tablets(store, "t")[0])
    assert tabletops.merge(store, "t") == b.id
    assert view(client, "t") == before  # m stays deleted


# -- automatic splits ----------------------------------------------------------------------------
def test_auto_split_past_threshold(client: Client, storage) -> None:
    store = client.store
    store.tables.create_table("t")
    store.tables.create_table("small")
    fill(client, "t", 1, range(2000))
    fill(client, "small", 1, range(10))
    before = view(client, "t")
    (t,) = tablets(store, "t")
    size = tabletops.tablet_size(t)
    assert tabletops.auto_split(store) == []  # default threshold 1G: nothing to do
    store.tables.set_props("t", {SPLIT_THRESHOLD: str(size // 5)})
    coord = coordinator(store, storage)
    raw_redis(store).delete(C.SPLIT_CHECK)
    assert coord.tick()  # the coordinator's tick runs auto_split
    ts = tablets(store, "t")
    assert 5 <= len(ts) <= 16
    assert all(tabletops.tablet_size(x) <= size // 5 for x in ts)
    assert_partition(store, "t")
    assert view(client, "t") == before
    assert len(tablets(store, "small")) == 1
    sizes = [sum(1 for e in view(client, "t") if x.contains_row(e.row)) for x in ts]
    assert min(sizes) > 2000 / 16 / 2  # about even pieces, from metadata only
    # a bad threshold is logged and skipped, not fatal
    store.tables.set_props("small", {SPLIT_THRESHOLD: "1K"})
    raw_redis(store).hset(C.table_key(store.tables.table_id("small")), "props", json.dumps({SPLIT_THRESHOLD: "lots"}))
    assert coord.tick()
    assert len(tablets(store, "small")) == 1


def test_auto_split_waits_for_running_compactions_without_starving(client: Client, storage) -> None:
    store = client.store
    store.tables.create_table("t")
    fill(client, "t", 4, range(200))
    coord = coordinator(store, storage)
    coord.tick()
    queues = store.queues
    (group,) = queues.groups()
    res = compactions.reserve(store, queues, group, "c1")
    assert res is not None
    (t,) = tablets(store, "t")
    smallest = min(m.size for m in t.files.values())  # still over after the compaction
    store.tables.set_props("t", {SPLIT_THRESHOLD: str(smallest // 2)})
    assert tabletops.auto_split(store, queues, tablet_ids=[t.id]) == []
    (t,) = tablets(store, "t")
    assert t.op == tabletops.SPLIT_PENDING and t.running  # refused, marked: no new compactions
    coord.tick()
    assert queues.jobs(group) == []  # the planner skips a split-pending tablet
    result = run_reservation(client, res)
    compactions.commit(store, res, result.info)
    before = view(client, "t")
    new = tabletops.auto_split(store, queues)
    assert len(new) >= 2
    assert all(x.op is None for x in tablets(store, "t"))
    assert view(client, "t") == before


# -- racing running compactions (seed 004) ---------------------------------------------------------
def test_split_and_merge_refused_while_a_compaction_runs(client: Client, storage) -> None:
    store = client.store
    store.tables.create_table("t", [b"row00100"])
    fill(client, "t", 4, range(200))
    coord = coordinator(store, storage)
    coord.tick()
    queues = store.queues
    (group,) = queues.groups()
    res = compactions.reserve(store, queues, group, "c1")
    docs = tablet_docs(store, "t")
    with pytest.raises(TabletOpRefused, match=r"compaction.*running"):
        tabletops.split(store, "t", [b"row00050", b"row00150"])
    with pytest.raises(TabletOpRefused, match=r"compaction.*running"):
        tabletops.merge(store, "t")
    assert tablet_docs(store, "t") == docs
    # it finishes: now the split goes through, and the merged view is the same
    compactions.commit(store, res, run_reservation(client, res).info)
    before = view(client, "t")
    tabletops.split(store, "t", [b"row00050", b"row00150"])
    assert len(tablets(store, "t")) == 4
    assert view(client, "t") == before


@pytest.mark.parametrize("keeps_id", [False, True])
def test_compaction_committing_after_its_tablet_split_fails_and_removes_output(
    client: Client, storage, keeps_id: bool
) -> None:
    """A compactor declared dead (its ECID removed) lets the split happen; when it comes back and
    commits, the commit is rejected (tablet gone, or same id with another range) and the worker's
    release removes its output. The tablet keeping the old id is the right-hand one."""
    store = client.store
    store.tables.create_table("t", [b"row00100"])
    fill(client, "t", 4, range(200))
    coord = coordinator(store, storage, dead_after_s=0.0)
    coord.tick()
    queues = store.queues
    (group,) = queues.groups()
    res = None
    while True:
        r = compactions.reserve(store, queues, group, "c1")
        assert r is not None
        if (r.end is None) == keeps_id:
            res = r
            break
        compactions.release(store, storage, r)
    result = run_reservation(client, res)
    assert res.output in {p for p, _ in storage.list_files("tables")}
    assert coord.detect_dead() == [res.ecid]  # no heartbeat: dead, its registration removed
    before = view(client, "t")
    tabletops.split(store, "t", [b"row00050", b"row00150"])
    with pytest.raises(ConditionFailed) as exc:
        compactions.commit(store, res, result.info)
    assert exc.value.condition in ("tablet exists", "compaction registered")
    compactions.release(store, storage, res)  # what the worker does
    assert res.output not in {p for p, _ in storage.list_files("tables")}
    assert not any(res.ecid in p for p, _ in storage.list_files("tables"))
    assert view(client, "t") == before


def test_reservation_or_commit_against_a_changed_range_is_rejected(client: Client) -> None:
    """The tablet keeping its id after a split or merge has another range: a reservation made
    from the old metadata must not commit (its output holds other rows than the tablet's)."""
    store = client.store
    store.tables.create_table("t")
    fill(client, "t", 2, range(50))
    (t,) = tablets(store, "t")
    job = Job(t.id, "SYSTEM", 1, "g", {f: m.size for f, m in t.files.items()})
    res = compactions.try_reserve(store, job, "c", "g")
    m = Mutation()
    m.tablet(t.id).do("set_range", b"row00020".hex())  # as if split under the compaction
    store.mutate(m)
    with pytest.raises(ConditionFailed, match="range"):
        compactions.commit(store, res, run_reservation(client, res).info)
    compactions.release(store, client.storage, res)
    with pytest.raises(ConditionFailed, match="range"):  # a reservation from a stale read
        m = Mutation(table=t.table)
        m.tablet(t.id).require("range", None).do("set_op", "x")
        store.mutate(m)


# -- the coordinator re-plans the new tablets ---------------------------------------------------------
def test_coordinator_replans_new_tablets_and_outputs_hold_only_their_rows(client: Client, storage) -> None:
    store = client.store
    store.tables.create_table("t")
    fill(client, "t", 5, range(300))
    coord = coordinator(store, storage)
    coord.tick()
    queues = store.queues
    (group,) = queues.groups()
    (old,) = tablets(store, "t")
    assert {j.tablet for j in queues.jobs(group)} == {old.id}
    before = view(client, "t")
    new = tabletops.split(store, "t", [b"row00100", b"row00200"])
    assert queues.jobs(group) == []  # the old tablet's queued jobs are gone
    assert set(new) <= {x.decode() for x in raw_redis(store).smembers(C.DIRTY)}
    coord.tick()
    assert {j.tablet for j in queues.jobs(group)} == set(new)
    done = 0
    while (res := compactions.reserve(store, queues, group, "c1")) is not None:
        t = store.tables.tablet(res.tablet)
        assert (res.prev, res.end) == (t.prev, t.end)
        result = run_reservation(client, res)
        compactions.commit(store, res, result.info)
        assert_rows_within(client, res.output, res.prev, res.end)
        done += 1
    assert done == 3
    ts = tablets(store, "t")
    assert all(len(x.files) == 1 for x in ts)
    assert view(client, "t") == before
    # each tablet now holds only its own rows: merging them is safe again
    assert tabletops.merge(store, "t", b"row00050", b"row00250") == ts[-1].id
    assert view(client, "t") == before
    coord.tick()
    assert {j.tablet for j in queues.jobs(group)} <= {ts[-1].id}


# -- CLI -------------------------------------------------------------------------------------------------
def test_cli_split_and_merge(client: Client, redis_url: str, tmp_path) -> None:
    client.store.tables.create_table("t")
    fill(client, "t", 1, range(20))
    before = view(client, "t")
    common = ["--redis", redis_url, "--storage", str(tmp_path / "files")]
    run = CliRunner().invoke
    r = run(table_cli, ["split", "t", "row00005", "row00010", *common])
    assert r.exit_code == 0, r.output
    assert "3 tablets" in r.output
    r = run(table_cli, ["split", "t", "--hex", b"row00015".hex(), "ff00", *common])
    assert r.exit_code == 0, r.output
    assert [t.end for t in tablets(client.store, "t")] == [b"row00005", b"row00010", b"row00015", b"\xff\x00", None]
    r = run(table_cli, ["split", "t", "--hex", "zz", *common])
    assert r.exit_code == 1 and "not hex" in r.output
    r = run(table_cli, ["merge", "t", "--start", "row00007", "--end", "row00012", *common])
    assert r.exit_code == 0, r.output
    assert [t.end for t in tablets(client.store, "t")] == [b"row00005", b"row00015", b"\xff\x00", None]
    r = run(table_cli, ["merge", "t", *common])
    assert r.exit_code == 0, r.output
    assert len(tablets(client.store, "t")) == 1
    r = run(table_cli, ["merge", "t", *common])
    assert r.exit_code == 0 and "nothing to merge" in r.output
    assert view(client, "t") == before
    client.store.tables.set_state("t", "OFFLINE")
    r = run(table_cli, ["split", "t", "m", *common])
    assert r.exit_code == 1 and "OFFLINE" in r.output
