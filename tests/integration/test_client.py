"""Client operations on a real redis-server and a local storage directory (issue 3 §5): bulk
import across tablets, refusals that change nothing, merged scans with versions and deletes, row
ranges, unknown tables, and Redis being unreachable."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kompaktor import keyspace as C
from kompaktor.client import Client
from kompaktor.files.sortedfile import entries_to_table
from kompaktor.metadata.store import MetadataStore
from kompaktor.model.errors import BadFileError, KompaktorError, StoreUnavailable, UnknownTableError, UnsortedError
from kompaktor.model.iterators import IteratorSettings, merged_view
from kompaktor.model.keys import Entry, sort_key
from tests.support.rawredis import raw_redis

pytestmark = pytest.mark.redis


def E(row: bytes, ts: int = 1, value: bytes = b"", deleted: bool = False, cq: bytes = b"q") -> Entry:
    return Entry(row, b"f", cq, b"", ts, deleted, b"" if deleted else (value or row + b"@%d" % ts))


def write_parquet(path: Path, entries: list[Entry]) -> str:
    pq.write_table(entries_to_table(entries), path)
    return str(path)


def metadata(store: MetadataStore) -> dict:
    """Everything in Redis except the id/name counters (a refused import may draw a name)."""
    out = {}
    for k in raw_redis(store).keys("*"):
        if k == C.SEQ.encode():
            continue
        t = raw_redis(store).type(k).decode()
        out[k] = {
            "string": raw_redis(store).get,
            "hash": raw_redis(store).hgetall,
            "set": raw_redis(store).smembers,
            "zset": lambda k: raw_redis(store).zrange(k, 0, -1),
        }[t](k)
    return out


def stored_files(client: Client) -> list[str]:
    return [p for p, _ in client.storage.list_files("")]


# -- bulk import ---------------------------------------------------------------------------------
def test_import_spanning_tablets_is_registered_with_each_and_scanned_once(client: Client, tmp_path: Path) -> None:
    client.store.tables.create_table("t", [b"d", b"m", b"\x80"])
    rows = [bytes([c]) for c in b"abcdefghijklmnopqrstuvwxyz"] + [b"\x7f", b"\x80", b"\x80\x00", b"\xff"]
    entries = sorted((E(r) for r in rows), key=sort_key)
    src = write_parquet(tmp_path / "in.parquet", entries)
    (path,) = client.import_files("t", [src])
    assert os.path.basename(path).startswith("I")
    tablets = client.store.tables.tablets(client.store.tables.table_id("t"))
    assert [list(t.files) for t in tablets] == [[path]] * 4  # a..d, e..m, n..\x80, \x80\x00..
    assert list(client.scan("t")) == entries  # each row exactly once
    # the file's own rows, read through each tablet, partition it
    per_tablet = [list(merged_view(client.tablet_sources(t))) for t in tablets]
    assert [len(p) for p in per_tablet] == [4, 9, 15, 2]
    assert [e for p in per_tablet for e in p] == entries


def test_import_only_registers_overlapping_tablets(client: Client, tmp_path: Path) -> None:
    tid = client.store.tables.create_table("t", [b"d", b"m"])
    src = write_parquet(tmp_path / "in.parquet", [E(b"e"), E(b"m")])  # exactly the middle tablet
    (path,) = client.import_files("t", [src])
    assert [list(t.files) for t in client.store.tables.tablets(tid)] == [[], [path], []]


def test_import_several_files_in_one_step(client: Client, tmp_path: Path) -> None:
    client.store.tables.create_table("t", [b"m"])
    a = write_parquet(tmp_path / "a.parquet", [E(b"a"), E(b"z")])
    b = write_parquet(tmp_path / "b.parquet", [E(b"b", ts=2), E(b"n")])
    paths = client.import_files("t", [a, b])
    assert len(paths) == 2
    assert [e.row for e in client.scan("t")] == [b"a", b"b", b"n", b"z"]


def test_import_accepts_files_written_by_users_with_pyarrow(client: Client, tmp_path: Path) -> None:
    """The documented recipe (docs/file-format.md): plain pyarrow, strings allowed, sorted by
    ARROW_SORT_KEYS."""
    from kompaktor.model.keys import ARROW_SORT_KEYS

    table = pa.table(
        {
            "row": ["b", "a", "a"],
            "cf": ["f", "f", "f"],
            "cq": ["q", "q", "q"],
            "vis": ["", "", ""],
            "ts": pa.array([1, 1, 2], pa.int64()),
            "deleted": [False, False, False],
            "value": [b"1", b"2", b"3"],
        }
    ).sort_by(ARROW_SORT_KEYS)
    pq.write_table(table, tmp_path / "user.parquet")
    client.store.tables.create_table("t")
    client.store.tables.set_props("t", {"table.iterator.versions": "5"})
    client.import_files("t", [str(tmp_path / "user.parquet")])
    assert [(e.row, e.ts, e.value) for e in client.scan("t")] == [(b"a", 2, b"3"), (b"a", 1, b"2"), (b"b", 1, b"1")]


def _unsorted(tmp_path: Path) -> str:
    return write_parquet(tmp_path / "unsorted.parquet", [E(b"a"), E(b"c"), E(b"b")])


def _wrong_schema(tmp_path: Path) -> str:
    pq.write_table(pa.table({"row": [b"a"], "value": [b"v"]}), tmp_path / "wrong.parquet")
    return str(tmp_path / "wrong.parquet")


def _corrupt(tmp_path: Path) -> str:
    (tmp_path / "corrupt.parquet").write_bytes(b"PAR1 not really")
    return str(tmp_path / "corrupt.parquet")


def _missing(tmp_path: Path) -> str:
    return str(tmp_path / "does-not-exist.parquet")


def _unsorted_across_batches(tmp_path: Path) -> str:
    # sorted within each row group (batch) but the second starts before the first ends
    t = entries_to_table([E(b"a"), E(b"m"), E(b"b"), E(b"z")])
    pq.write_table(t, tmp_path / "batches.parquet", row_group_size=2)
    return str(tmp_path / "batches.parquet")


@pytest.mark.parametrize(
    "make_bad, error, message",
    [
        (_unsorted, UnsortedError, r"unsorted.parquet: entries are not in key order at row 2"),
        (_unsorted_across_batches, UnsortedError, r"batches.parquet: entries are not in key order at row 2"),
        (_wrong_schema, BadFileError, r"wrong.parquet: wrong schema: missing columns \['cf', 'cq', 'vis', 'ts'"),
        (_corrupt, BadFileError, r"corrupt.parquet"),
        (_missing, BadFileError, r"does-not-exist.parquet: cannot open"),
    ],
)
def test_refused_import_changes_nothing(client: Client, tmp_path: Path, make_bad, error, message: str) -> None:
    client.store.tables.create_table("t", [b"m"])
    client.import_files("t", [write_parquet(tmp_path / "first.parquet", [E(b"x")])])
    before_meta, before_files = metadata(client.store), stored_files(client)
    good = write_parquet(tmp_path / "good.parquet", [E(b"a"), E(b"z")])
    bad = make_bad(tmp_path)
    for order in ([good, bad], [bad, good]):
        with pytest.raises(error, match=message):
            client.import_files("t", order)
        assert metadata(client.store) == before_meta
        assert stored_files(client) == before_files
    assert [e.row for e in client.scan("t")] == [b"x"]


def test_import_refusals_without_files_or_table(client: Client, tmp_path: Path) -> None:
    client.store.tables.create_table("t")
    with pytest.raises(KompaktorError, match="no files to import"):
        client.import_files("t", [])
    with pytest.raises(UnknownTableError, match="unknown table 'nope'"):
        client.import_files("nope", [write_parquet(tmp_path / "a.parquet", [E(b"a")])])
    assert stored_files(client) == []


# -- merged scans ----------------------------------------------------------------------------------
def test_scan_versions_and_deletes_across_files(client: Client, tmp_path: Path) -> None:
    client.store.tables.create_table("t", [b"m"])
    client.flush("t", [E(b"a", 1), E(b"a", 2), E(b"b", 1), E(b"n", 1), E(b"z", 5)])
    client.import_files(
        "t",
        [
            write_parquet(
                tmp_path / "i.parquet", [E(b"a", 3), E(b"b", 1, deleted=True), E(b"n", 4), E(b"z", 5, b"newer")]
            )
        ],
    )
    client.flush("t", [E(b"z", 2, deleted=True)])  # older than the z put: hides nothing visible
    assert list(client.scan("t")) == [E(b"a", 3), E(b"n", 4), E(b"z", 5, b"newer")]
    client.store.tables.set_props("t", {"table.iterator.versions": "3"})
    assert list(client.scan("t")) == [
        E(b"a", 3),
        E(b"a", 2),
        E(b"a", 1),
        E(b"n", 4),
        E(b"n", 1),
        E(b"z", 5, b"newer"),
        E(b"z", 5),
    ]
    client.flush("t", [E(b"a", 2, deleted=True), E(b"n", 9, deleted=True)])
    assert list(client.scan("t")) == [E(b"a", 3), E(b"z", 5, b"newer"), E(b"z", 5)]


def test_scan_by_row_range(client: Client) -> None:
    client.store.tables.create_table("t", [b"c", b"f", b"\x80"])
    rows = [b"a", b"b", b"c", b"c\x00", b"d", b"f", b"g", b"\x7f", b"\x80", b"\x81", b"\xff"]
    client.flush("t", [E(r) for r in rows])
    scan = lambda s, e: [x.row for x in client.scan("t", s, e)]  # noqa: E731
    assert scan(None, None) == rows
    assert scan(b"c", b"f") == [b"c", b"c\x00", b"d", b"f"]  # inclusive at both ends, across tablets
    assert scan(b"b", b"b") == [b"b"]
    assert scan(b"c\x00", None) == rows[3:]
    assert scan(None, b"\x80") == rows[:9]
    assert scan(b"\x80", b"\x80") == [b"\x80"]
    assert scan(b"zz", b"a") == []
    assert scan(b"h", b"h") == []


field = st.sampled_from([b"", b"a", b"b", b"c", b"\x80", b"\xff", b"b\x00"])
entry = st.builds(E, field, st.integers(0, 3), st.binary(max_size=2), st.booleans(), st.sampled_from([b"q", b"r"]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    splits=st.lists(field.filter(bool), max_size=3),
    batches=st.lists(st.lists(entry, max_size=8), max_size=4),
    start=st.one_of(st.none(), field),
    end=st.one_of(st.none(), field),
    versions=st.integers(1, 3),
)
def test_scan_equals_the_merge_of_everything_written(client: Client, splits, batches, start, end, versions) -> None:
    """Whatever the splits and flushes, a scan of [start, end] is the merged view of all flushed
    entries in that range (flushes in order, later ones newer)."""
    raw_redis(client.store).flushdb()
    client.store.tables.create_table("t", splits, props={"table.iterator.versions": str(versions)})
    for b in batches:
        if b:
            client.flush("t", b)
    in_range = [
        [e for e in sorted(b, key=sort_key) if (start is None or e.row >= start) and (end is None or e.row <= end)]
        for b in batches
    ]
    expected = list(merged_view(in_range, IteratorSettings(max_versions=versions)))
    assert list(client.scan("t", start, end)) == expected


def test_unknown_table(client: Client) -> None:
    with pytest.raises(UnknownTableError, match="unknown table 'nope'"):
        client.scan("nope")  # at the call, not at the first entry
    with pytest.raises(UnknownTableError, match="unknown table 'nope'"):
        client.flush("nope", [E(b"a")])


def test_deleted_table_is_unknown(client: Client) -> None:
    client.store.tables.create_table("t")
    client.flush("t", [E(b"a")])
    client.store.tables.delete_table("t")
    with pytest.raises(UnknownTableError):
        list(client.scan("t"))


def test_flush_to_an_offline_table_is_refused_and_leaves_no_files(client: Client) -> None:
    client.store.tables.create_table("t", [b"m"])
    client.store.tables.set_state("t", "OFFLINE")
    with pytest.raises(KompaktorError, match="table state"):
        client.flush("t", [E(b"a"), E(b"z")])
    assert stored_files(client) == []


# -- Redis unreachable ----------------------------------------------------------------------------
def test_unreachable_redis_is_a_clear_error_within_bounded_time() -> None:
    from tests.support.ports import free_port

    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    store = MetadataStore.from_url(url)
    t0 = time.monotonic()
    with pytest.raises(StoreUnavailable, match=rf"Redis at {url} is unreachable"):
        store.ping()
    assert time.monotonic() - t0 < 15


def test_invalid_redis_url_is_a_clear_error() -> None:
    with pytest.raises(StoreUnavailable, match="invalid Redis URL"):
        MetadataStore.from_url("http://example.invalid/")


def test_redis_going_away_and_coming_back(redis_server, client: Client, tmp_path: Path) -> None:
    client.store.tables.create_table("t", [b"m"])
    client.flush("t", [E(b"a"), E(b"z")])
    redis_server.stop()
    try:
        t0 = time.monotonic()
        with pytest.raises(StoreUnavailable, match="unreachable"):
            list(client.scan("t"))
        with pytest.raises(StoreUnavailable):
            client.flush("t", [E(b"b")])
        assert time.monotonic() - t0 < 30
    finally:
        redis_server.start()
    # AOF kept the metadata; the script cache is empty after the restart and is reloaded
    assert [e.row for e in client.scan("t")] == [b"a", b"z"]
    client.flush("t", [E(b"b")])
    assert [e.row for e in client.scan("t")] == [b"a", b"b", b"z"]
