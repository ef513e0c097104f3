"""Sorted files (issue 3 §3): round trip, footer metadata, refusal of unsorted input (also across
batches), atomic visibility (no partial file under the final name, no temp left after abort),
wrong schema and corrupt files."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kompaktor.files import sortedfile as sf
from kompaktor.files.storage import Storage
from kompaktor.model.errors import BadFileError, UnsortedError
from kompaktor.model.keys import Entry, sort_key
from kompaktor.model.names import TMP_PREFIX
from tests.support.entries import entries as make_entries

field = st.one_of(st.sampled_from([b"", b"\x00", b"\x80", b"\xff", b"a"]), st.binary(max_size=5))
entry = st.builds(
    Entry, field, field, field, field, st.integers(-(2**63), 2**63 - 1), st.booleans(), st.binary(max_size=8)
)


def E(row: bytes, ts: int = 1, deleted: bool = False, value: bytes = b"v") -> Entry:
    return Entry(row, b"f", b"q", b"", ts, deleted, b"" if deleted else value)


def files_under(root: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


@pytest.fixture
def store_dir(tmp_path: Path) -> Storage:
    return Storage.from_uri(str(tmp_path / "files"))


# -- round trip and metadata --------------------------------------------------------------------
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(entry, max_size=40))
def test_round_trip_and_metadata(store_dir: Storage, entries: list[Entry]) -> None:
    entries = sorted(entries, key=sort_key)
    store_dir.delete("t/F1.parquet")
    info = sf.write_sorted(store_dir, "t/F1.parquet", entries)
    assert list(sf.iter_entries(store_dir, "t/F1.parquet", batch_rows=7)) == entries
    assert list(sf.table_to_entries(sf.read_table(store_dir, "t/F1.parquet"))) == entries
    assert info.path == "t/F1.parquet"
    assert info.entries == len(entries)
    assert info.deletes == sum(e.deleted for e in entries)
    assert info.size == os.path.getsize(store_dir.path("t/F1.parquet")) == store_dir.size("t/F1.parquet")
    assert info.first == (sort_key(entries[0]) if entries else None)
    assert info.last == (sort_key(entries[-1]) if entries else None)
    assert info.first_row == (entries[0].row if entries else None)
    assert info.last_row == (entries[-1].row if entries else None)
    assert sf.read_info(store_dir, "t/F1.parquet") == info
    assert not [f for f in files_under(store_dir.root) if TMP_PREFIX in f]


def test_metadata_is_in_the_footer(store_dir: Storage, monkeypatch: pytest.MonkeyPatch) -> None:
    entries = [E(b"a", deleted=True), E(b"b"), E(b"\xff", ts=-5)]
    info = sf.write_sorted(store_dir, "F1.parquet", entries)
    meta = pq.ParquetFile(store_dir.path("F1.parquet")).metadata.metadata
    assert meta[b"kompaktor.entries"] == b"3"
    assert meta[b"kompaktor.deletes"] == b"1"
    # read_info answers from the footer without reading the data ...
    with monkeypatch.context() as m:
        m.setattr(sf, "check_sorted", lambda *a, **k: pytest.fail("read_info re-read the data"))
        assert sf.read_info(store_dir, "F1.parquet") == info
    # ... and computes the same for a foreign file without the footer entries
    table = pq.read_table(store_dir.path("F1.parquet")).replace_schema_metadata(None)
    pq.write_table(table, store_dir.path("foreign.parquet"))
    foreign = sf.read_info(store_dir, "foreign.parquet")
    assert (foreign.entries, foreign.deletes, foreign.first, foreign.last) == (
        info.entries,
        info.deletes,
        info.first,
        info.last,
    )


def test_streaming_writer_across_batches(store_dir: Storage) -> None:
    entries = [E(bytes([i])) for i in range(200)]
    w = sf.SortedFileWriter(store_dir, "t/A1.parquet")
    for i in range(0, 200, 30):
        w.write_entries(entries[i : i + 30])
    w.write_entries([])  # empty batches are fine
    info = w.commit()
    assert info.entries == 200 and info.first == sort_key(entries[0]) and info.last == sort_key(entries[-1])
    assert list(sf.iter_entries(store_dir, "t/A1.parquet", batch_rows=17)) == entries


def test_empty_file(store_dir: Storage) -> None:
    info = sf.write_sorted(store_dir, "F0.parquet", [])
    assert (info.entries, info.first, info.last, info.first_row) == (0, None, None, None)
    assert sf.read_info(store_dir, "F0.parquet") == info
    assert list(sf.iter_entries(store_dir, "F0.parquet")) == []


def test_range_reads_are_exclusive_start_inclusive_end(store_dir: Storage) -> None:
    entries = [E(r) for r in (b"a", b"b", b"c", b"\x80", b"\xff")]
    sf.write_sorted(store_dir, "F.parquet", entries)
    rows = lambda lo, hi: [e.row for e in sf.iter_entries(store_dir, "F.parquet", lo, hi)]  # noqa: E731
    assert rows(b"a", b"c") == [b"b", b"c"]
    assert rows(None, b"b") == [b"a", b"b"]
    assert rows(b"c", None) == [b"\x80", b"\xff"]
    assert rows(b"\x7f", b"\x80") == [b"\x80"]  # unsigned comparison in the Arrow filter
    assert [e.row for e in sf.table_to_entries(sf.read_table(store_dir, "F.parquet", b"b", b"\x80"))] == [b"c", b"\x80"]


# -- refusal of unsorted input, atomic visibility -------------------------------------------------
@pytest.mark.parametrize(
    "bad",
    [
        [E(b"b"), E(b"a")],  # rows
        [E(b"a", ts=1), E(b"a", ts=2)],  # timestamps must descend
        [E(b"a", ts=1), E(b"a", ts=1, deleted=True)],  # the marker comes first
        [E(b"\x80"), E(b"\x7f")],  # unsigned bytes
        [E(b"a"), E(b"b"), E(b"c"), E(b"b")],
    ],
)
def test_unsorted_input_is_refused_and_leaves_nothing(store_dir: Storage, bad: list[Entry]) -> None:
    with pytest.raises(UnsortedError, match="not in key order"):
        sf.write_sorted(store_dir, "t/F1.parquet", bad)
    assert not store_dir.exists("t/F1.parquet")
    assert files_under(store_dir.root) == []


def test_unsorted_error_names_the_first_bad_row(store_dir: Storage) -> None:
    bad = [E(b"a"), E(b"c"), E(b"d"), E(b"b"), E(b"e")]
    with pytest.raises(UnsortedError, match=r"at row 3: \(row=b'd'.*then \(row=b'b'"):
        sf.write_sorted(store_dir, "F1.parquet", bad)


def test_unsorted_across_batches_is_refused(store_dir: Storage) -> None:
    w = sf.SortedFileWriter(store_dir, "t/F1.parquet", source="my-input.parquet")
    w.write_entries([E(b"a"), E(b"m")])
    with pytest.raises(UnsortedError, match=r"my-input.parquet: entries are not in key order at row 2"):
        w.write_entries([E(b"c"), E(b"z")])
    w.abort()
    assert files_under(store_dir.root) == []


def test_final_name_never_exists_before_commit(store_dir: Storage) -> None:
    w = sf.SortedFileWriter(store_dir, "t/F1.parquet")
    assert not store_dir.exists("t/F1.parquet")
    w.write_entries([E(b"a"), E(b"b")])
    assert not store_dir.exists("t/F1.parquet")
    assert store_dir.exists(w.tmp_rel) and os.path.basename(w.tmp_rel).startswith(TMP_PREFIX)
    w.commit()
    assert store_dir.exists("t/F1.parquet") and not store_dir.exists(w.tmp_rel)
    assert files_under(store_dir.root) == ["t/F1.parquet"]


def test_abort_and_context_manager_remove_the_temp_file(store_dir: Storage) -> None:
    w = sf.SortedFileWriter(store_dir, "t/F1.parquet")
    w.write_entries([E(b"a")])
    w.abort()
    w.abort()  # idempotent
    assert files_under(store_dir.root) == []
    with pytest.raises(RuntimeError), sf.SortedFileWriter(store_dir, "t/F2.parquet") as w2:
        w2.write_entries([E(b"a")])
        raise RuntimeError("writer died")
    assert files_under(store_dir.root) == []


# -- schema ------------------------------------------------------------------------------------
def good_columns(n: int = 2) -> dict:
    return {
        "row": [b"a", b"b"][:n],
        "cf": [b"f"] * n,
        "cq": [b"q"] * n,
        "vis": [b""] * n,
        "ts": [1] * n,
        "deleted": [False] * n,
        "value": [b"v"] * n,
    }


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d.pop("vis"), r"missing columns \['vis'\]"),
        (lambda d: d.update(extra=[1, 2]), r"unexpected \['extra'\]"),
        (lambda d: d.update(ts=pa.array([1, 2], pa.int32())), "column 'ts' has type int32, expected int64"),
        (lambda d: d.update(ts=["1", "2"]), "column 'ts' has type string"),
        (lambda d: d.update(deleted=[0, 1]), "column 'deleted' has type int64, expected bool"),
        (lambda d: d.update(row=[b"a", None]), "column 'row' has null values"),
    ],
)
def test_wrong_schema_is_refused(store_dir: Storage, change, message: str) -> None:
    cols = good_columns()
    change(cols)
    with pytest.raises(BadFileError, match=message):
        sf.write_sorted(store_dir, "F1.parquet", pa.table(cols))
    assert files_under(store_dir.root) == []
    # a foreign file in that shape is refused by read_info too
    pq.write_table(pa.table(cols), store_dir.path("foreign.parquet"))
    with pytest.raises(BadFileError, match=message):
        sf.read_info(store_dir, "foreign.parquet")


def test_conform_accepts_strings_for_binary_and_any_column_order(store_dir: Storage) -> None:
    cols = good_columns()
    cols["row"] = ["a", "b"]
    cols["value"] = pa.array(["x", "y"], pa.large_string())
    table = pa.table(dict(reversed(list(cols.items()))))
    out = sf.conform(table)
    assert out.schema == sf.SCHEMA
    info = sf.write_sorted(store_dir, "F1.parquet", table)
    assert [e.row for e in sf.iter_entries(store_dir, "F1.parquet")] == [b"a", b"b"] and info.entries == 2


def test_foreign_unsorted_file_is_refused_by_read_info(store_dir: Storage) -> None:
    pq.write_table(sf.entries_to_table([E(b"b"), E(b"a")]), store_dir.path("foreign.parquet"))
    with pytest.raises(UnsortedError):
        sf.read_info(store_dir, "foreign.parquet")


# -- corrupt files -----------------------------------------------------------------------------
def test_corrupt_files_give_bad_file_errors(store_dir: Storage) -> None:
    Path(store_dir.path("garbage.parquet")).write_bytes(b"this is not parquet at all" * 10)
    sf.write_sorted(store_dir, "good.parquet", [E(bytes([i])) for i in range(100)])
    data = Path(store_dir.path("good.parquet")).read_bytes()
    Path(store_dir.path("truncated.parquet")).write_bytes(data[: len(data) // 2])
    Path(store_dir.path("empty.parquet")).write_bytes(b"")
    for name in ("garbage.parquet", "truncated.parquet", "empty.parquet"):
        with pytest.raises(BadFileError, match=name):
            sf.read_info(store_dir, name)
        with pytest.raises(BadFileError, match=name):
            sf.read_table(store_dir, name)
        with pytest.raises(BadFileError, match=name):
            list(sf.iter_entries(store_dir, name))


def test_missing_file_is_file_not_found(store_dir: Storage) -> None:
    with pytest.raises(FileNotFoundError):
        sf.read_info(store_dir, "nope.parquet")
    with pytest.raises(FileNotFoundError):
        list(sf.iter_entries(store_dir, "nope.parquet"))


# -- storage -------------------------------------------------------------------------------------
def test_storage_uris_and_operations(tmp_path: Path) -> None:
    plain = Storage.from_uri(str(tmp_path / "a"))
    uri = Storage.from_uri((tmp_path / "b").as_uri())
    for s in (plain, uri):
        sf.write_sorted(s, "x/y/F1.parquet", [E(b"a")])
        assert s.exists("x/y/F1.parquet") and s.size("x/y/F1.parquet") > 0
        assert [p for p, _ in s.list_files("x")] == ["x/y/F1.parquet"]
        assert s.list_files("missing") == []
        assert s.delete("x/y/F1.parquet") and not s.delete("x/y/F1.parquet")
        with pytest.raises(FileNotFoundError):
            s.size("x/y/F1.parquet")


def test_commit_does_not_read_back_a_file_someone_may_consume_at_once(
    store_dir: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found in CI under load: a Spark task's part was consumed and deleted by the driver right
    after the task published it, and the task's read-back of its size then failed the merge.
    The size is the bytes written; nothing is read after publishing."""
    published = Storage.publish

    def publish_then_consume(self: Storage, staged: str, rel: str) -> None:
        published(self, staged, rel)
        self.delete(rel)  # the consumer, as fast as it can be

    monkeypatch.setattr(Storage, "publish", publish_then_consume)
    with sf.SortedFileWriter(store_dir, "t/F0001.parquet") as w:
        w.write_entries(make_entries(50, prefix="r", width=3, ts=1, value=lambda r: b"v"))
        info = w.commit()
    assert info.entries == 50 and info.size > 0
    monkeypatch.setattr(Storage, "publish", published)
    with sf.SortedFileWriter(store_dir, "t/F0002.parquet") as w:
        w.write_entries(make_entries(50, prefix="r", width=3, ts=1, value=lambda r: b"v"))
        again = w.commit()
    assert again.size == store_dir.size("t/F0002.parquet") == info.size  # the same bytes as written


def test_only_the_key_columns_get_dictionary_pages(store_dir: Storage) -> None:
    """Issue 46: values and timestamps are mostly distinct, so they are written as plain pages
    (a dictionary built and dropped for each row group cost the encode 10-20%); the key columns,
    which repeat, keep theirs. The entries read back are the ones written, by both writers."""
    entries = [Entry(b"r%03d" % (i // 8), b"f", b"q%d" % (i % 8), b"", 1000 - i, False, b"v%d" % i) for i in range(400)]
    table = sf.entries_to_table(entries)
    sf.write_sorted(store_dir, "a.parquet", table)
    sf.write_encoded(store_dir, "b.parquet", sf.encode_table(table))
    for name in ("a.parquet", "b.parquet"):
        rg = pq.ParquetFile(store_dir.path(name)).metadata.row_group(0)
        dictionary = {rg.column(c).path_in_schema: rg.column(c).has_dictionary_page for c in range(rg.num_columns)}
        assert dictionary == {
            "row": True,
            "cf": True,
            "cq": True,
            "vis": True,
            "ts": False,
            "deleted": False,
            "value": False,
        }
        assert list(sf.table_to_entries(pq.read_table(store_dir.path(name)))) == entries
