"""``Client.read_arrow`` (docs/spark.md, "Reading"): the merged view as Arrow batches, held to a
reference view written here from the merge rules (not the product's merge) on random keys with
versions and deletes, and a read's files pinned against compactions and the garbage collector,
on a real redis-server with the real compactor (Arrow engine)."""

from __future__ import annotations

import itertools
import threading

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kompaktor.client import Client, cut_part, plan_read
from kompaktor.coordinator.gc import collect_garbage
from kompaktor.files.sortedfile import SCHEMA, table_to_entries
from kompaktor.files.storage import Storage
from kompaktor.metadata.store import MetadataStore
from kompaktor.model.errors import KompaktorError
from kompaktor.model.keys import Entry
from kompaktor.worker import Compactor, WorkerSettings
from tests.integration.test_worker import make_table, plan

pytestmark = [pytest.mark.redis, pytest.mark.timeout(300)]


def reference(flushes: list[list[Entry]], start: bytes | None, end: bytes | None, versions: int) -> list[Entry]:
    """The merged view by its rules: per column key, newest timestamp first, a marker before a put
    of its timestamp, a newer flush before an older one; a marker hides what follows it; the
    first ``versions`` puts remain."""
    ranked = [(e, -k) for k, f in enumerate(flushes) for e in f]
    ranked = [(e, r) for e, r in ranked if (start is None or e.row >= start) and (end is None or e.row <= end)]
    out: list[Entry] = []
    by_column = itertools.groupby(
        sorted(ranked, key=lambda t: (t[0].column_key, -t[0].ts, not t[0].deleted, t[1])), key=lambda t: t[0].column_key
    )
    for _ck, group in by_column:
        kept = 0
        for e, _r in group:
            if e.deleted:
                break
            if kept < versions:
                out.append(e)
                kept += 1
    return out


def entries_of(reader: pa.RecordBatchReader) -> list[Entry]:
    assert reader.schema == SCHEMA
    return [e for b in reader for e in table_to_entries(pa.Table.from_batches([b]))]


key = st.tuples(
    st.sampled_from([b"a", b"b", b"m", b"m\x00", b"\x80", b"\xff"]),
    st.sampled_from([b"f", b"g"]),
    st.sampled_from([b"q", b"r"]),
    st.sampled_from([b"", b"x"]),
    st.integers(1, 4),
    st.booleans(),
)
flush_st = st.lists(key, max_size=25, unique=True).map(
    lambda ks: [Entry(r, f, q, v, ts, d, b"" if d else b"%s@%d" % (r, ts)) for r, f, q, v, ts, d in ks]
)
row = st.none() | st.sampled_from([b"a", b"b", b"c", b"m", b"\x80", b"\xff"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flushes=st.lists(flush_st, min_size=1, max_size=4), start=row, end=row, versions=st.integers(1, 3))
def test_read_arrow_is_the_reference_view(
    client: Client, flushes: list[list[Entry]], start: bytes | None, end: bytes | None, versions: int
) -> None:
    name = f"t{client.store.next_seq('test')}"
    client.store.tables.create_table(name, [b"b", b"m"])
    for f in flushes:
        if f:
            client.flush(name, f)
    want = reference(flushes, start, end, versions)
    assert entries_of(client.read_arrow(name, start, end, max_versions=versions)) == want
    if versions == 1:  # the table's own setting (one version) and the scan built on it
        assert list(client.scan(name, start, end)) == want


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    flushes=st.lists(flush_st, min_size=1, max_size=4),
    start=row,
    end=row,
    versions=st.integers(1, 3),
    piece=st.integers(1, 12),
    group=st.integers(1, 4),
)
def test_a_read_in_pieces_is_the_reference_view(
    client: Client,
    flushes: list[list[Entry]],
    start: bytes | None,
    end: bytes | None,
    versions: int,
    piece: int,
    group: int,
) -> None:
    """Issue 44: a tablet whose files hold more than ``piece_entries`` entries is read in row
    ranges cut at its files' row groups (of ``group`` entries here), one after another — and the
    result is still the reference view, whatever the cut, the range and the versions."""
    name = f"t{client.store.next_seq('test')}"
    client.store.tables.create_table(name, [b"m"])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("kompaktor.files.sortedfile.ROW_GROUP_SIZE", group)
        for f in flushes:
            if f:
                client.flush(name, f)
    tablets = client.store.tables.tablets(client.store.tables.table_id(name))
    for part in plan_read(tablets, start, end):
        pieces = cut_part(client.storage, part, piece)
        assert all(a.end == b.prev for a, b in itertools.pairwise(pieces))  # consecutive ranges
        assert start is not None or (pieces[0].prev, pieces[-1].end) == (part.prev, part.end)
    got = client.read_arrow(name, start, end, max_versions=versions, piece_entries=piece)
    assert entries_of(got) == reference(flushes, start, end, versions)


def test_a_big_tablet_is_cut_into_pieces_of_about_piece_entries(client: Client) -> None:
    """Two files of 100 rows each in row groups of 10: pieces of about 50 input entries are four
    ranges, cut at row-group ends (40 to 60 entries each), that tile the tablet; with the row range starting at row 60,
    the pieces wholly before it are left out and the first one kept starts the read at it."""
    client.store.tables.create_table("big", [])
    rows = [b"r%03d" % i for i in range(100)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("kompaktor.files.sortedfile.ROW_GROUP_SIZE", 10)
        for ts in (1, 2):
            client.flush("big", [Entry(r, b"f", b"q", b"", ts, False, r) for r in rows])
    tablets = client.store.tables.tablets(client.store.tables.table_id("big"))
    (part,) = plan_read(tablets, None, None)
    pieces = cut_part(client.storage, part, 50)
    # cuts where the running count passes 50, 100, 150 entries (two row groups per 10 rows)
    ends = [b"r029", b"r049", b"r079"]
    assert [(p.prev, p.end) for p in pieces] == list(itertools.pairwise([None, *ends, None]))
    (part,) = plan_read(tablets, b"r060", None)
    assert [(p.prev, p.start) for p in cut_part(client.storage, part, 50)] == [(b"r049", b"r060"), (b"r079", None)]
    assert [e.row for e in entries_of(client.read_arrow("big", b"r060", None, piece_entries=50))] == rows[60:]
    assert cut_part(client.storage, part, 200) == [part]  # small enough: no footer read, one piece
    with pytest.raises(KompaktorError, match=r"^piece_entries must be at least 1, not 0$"):
        client.read_arrow("big", piece_entries=0)


def compact_everything(store: MetadataStore, storage: Storage) -> int:
    plan(store, storage)
    worker = Compactor(store, storage, WorkerSettings("default", "c-read", engine="arrow", heartbeat_s=0.2))
    done = 0
    while (outcome := worker.run_one()) is not None:
        assert outcome.status == "committed"
        done += 1
    return done


def test_a_compaction_and_the_collector_during_a_read_take_nothing_from_it(
    client: Client, store: MetadataStore, storage: Storage
) -> None:
    """A read pins its files: compactions replace every one of them while it runs and the
    collector (grace 0) deletes none of them; the read returns the view as it began. Once the
    read ends, the next pass deletes them."""
    tid = make_table(client)
    want = list(client.scan("t"))
    before = {f for t in store.tables.tablets(tid) for f in t.files}
    reader = client.read_arrow("t", batch_rows=7)
    first = reader.read_next_batch()  # the read runs
    assert compact_everything(store, storage) == 2
    after = {f for t in store.tables.tablets(tid) for f in t.files}
    assert not before & after  # every file the read uses was replaced
    assert collect_garbage(store, storage, grace_s=0.0) == []
    got = list(table_to_entries(pa.Table.from_batches([first]))) + entries_of(reader)
    assert got == want
    assert sorted(collect_garbage(store, storage, grace_s=0.0)) == sorted(before)
    assert list(client.scan("t")) == want


@pytest.mark.parametrize("read", [0, 1], ids=["dropped-unread", "dropped-after-one-batch"])
def test_a_reader_dropped_before_its_end_releases_its_files(
    client: Client, store: MetadataStore, storage: Storage, read: int
) -> None:
    """A notebook that opens a read and drops it — unread, or after a batch — must not pin the
    table's files for the rest of the process's life: once the reader is gone, the compaction's
    replaced files go at the collector's next pass, and the pin's refreshing thread has ended."""
    tid = make_table(client)
    before = {f for t in store.tables.tablets(tid) for f in t.files}
    reader = client.read_arrow("t", batch_rows=7)
    for _ in range(read):
        reader.read_next_batch()
    assert compact_everything(store, storage) == 2
    assert collect_garbage(store, storage, grace_s=0.0) == []  # pinned while the reader lives
    del reader
    assert sorted(collect_garbage(store, storage, grace_s=0.0)) == sorted(before)
    assert not [t for t in threading.enumerate() if t.name.startswith("read-READ")]
