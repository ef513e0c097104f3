"""Issue 17 §2: sorted Parquet parts concatenated into one file without decoding them — the
result reads back (pyarrow, statistics, row-group pruning, kompaktor footer metadata) exactly as
if one writer had written every entry; the Thrift footer codec round-trips byte for byte."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kompaktor.files import parquetconcat as pc
from kompaktor.files.sortedfile import (
    SortedFileWriter,
    encode_table,
    entries_to_table,
    read_info,
    read_table,
    write_encoded,
    write_sorted,
)
from kompaktor.files.storage import Storage
from kompaktor.model.errors import BadFileError, UnsortedError
from kompaktor.model.keys import Entry


def E(i: int, deleted: bool = False) -> Entry:
    return Entry(b"r%07d" % i, b"f", b"q", b"", 5, deleted, b"" if deleted else b"v" * (i % 50))


def parts(storage: Storage, bounds: list[tuple[int, int]]) -> list[str]:
    out = []
    for k, (a, b) in enumerate(bounds):
        w = SortedFileWriter(storage, f"p/part{k}.parquet")
        w.write_entries([E(i, i % 7 == 0) for i in range(a, b)])
        w.commit({b"kompaktor.entries_read": str(b - a).encode()})
        out.append(f"p/part{k}.parquet")
    return out


def test_footer_codec_round_trips(storage: Storage) -> None:
    write_sorted(storage, "x.parquet", [E(i) for i in range(1000)])
    data = Path(storage.path("x.parquet")).read_bytes()
    n = int.from_bytes(data[-8:-4], "little")
    footer = data[-8 - n : -8]
    assert pc.encode(pc.decode(footer)) == footer


@pytest.mark.parametrize(
    "bounds", [[(0, 300_000), (300_000, 300_001), (300_001, 300_001), (300_001, 450_000)], [(0, 10)], [(0, 0)]]
)
def test_concatenated_parts_read_as_one_file(storage: Storage, bounds) -> None:
    ps = parts(storage, bounds)
    w = pc.ConcatWriter(storage, "out/A.parquet", tmp_tag="ECID-1")
    read = sum(int(w.append(p)[b"kompaktor.entries_read"]) for p in ps)
    info = w.commit()
    n = bounds[-1][1] - bounds[0][0]
    assert read == n and info.entries == n
    whole = entries_to_table([E(i, i % 7 == 0) for i in range(bounds[0][0], bounds[-1][1])])
    assert read_table(storage, "out/A.parquet").equals(whole)
    assert read_info(storage, "out/A.parquet") == info
    md = pq.ParquetFile(storage.path("out/A.parquet")).metadata
    assert md.num_rows == n
    if n:
        rg = md.row_group(md.num_row_groups - 1)
        assert rg.column(0).statistics.max == b"r%07d" % (n - 1)
        # row-group pruning by statistics still reads the right rows
        want = sum(1 for i in range(bounds[0][0], bounds[-1][1]) if 299_990 < i <= 300_005)
        assert read_table(storage, "out/A.parquet", b"r0299990", b"r0300005").num_rows == want
    assert sorted(p for p, _ in storage.list_files("out")) == ["out/A.parquet"]


def test_parts_out_of_order_or_foreign_are_refused_and_abort_leaves_nothing(storage: Storage) -> None:
    ps = parts(storage, [(100, 200), (0, 100)])
    w = pc.ConcatWriter(storage, "out/A.parquet", tmp_tag="ECID-2")
    w.append(ps[0])
    with pytest.raises(UnsortedError):
        w.append(ps[1])
    Path(storage.path("p/junk")).write_bytes(b"PAR1 not really PAR1")
    with pytest.raises(BadFileError):
        w.append("p/junk")
    w.abort()
    assert list(storage.list_files("out")) == []


@pytest.mark.parametrize("bounds", [[(0, 2000), (2000, 2000), (2000, 5000)]])
def test_append_feeds_the_parts_bytes_to_a_digest(storage: Storage, bounds) -> None:
    """A resumable merge records each part's SHA-256 as it appends it (one read): the digest is
    the file's, also for a part without entries (whose data is not copied)."""
    import hashlib

    ps = parts(storage, bounds)
    w = pc.ConcatWriter(storage, "out/A.parquet", tmp_tag="ECID-1")
    for p in ps:
        h = hashlib.sha256()
        w.append(p, h)
        assert h.hexdigest() == hashlib.sha256(Path(storage.path(p)).read_bytes()).hexdigest()
    info = w.commit()
    assert info.entries == 5000


@pytest.mark.parametrize(
    "bounds", [[(0, 300_000), (300_000, 300_001), (300_001, 300_001), (300_001, 450_000)], [(0, 10)], [(0, 3), (3, 3)]]
)
def test_spliced_ranges_are_the_bytes_one_writer_writes(storage: Storage, bounds) -> None:
    """Issue 23 §1: ranges encoded apart (in parallel, by the Arrow engine) and spliced in order
    make the very file one SortedFileWriter makes from the same tables, one write_table each."""
    tables = [entries_to_table([E(i, i % 7 == 0) for i in range(a, b)]) for a, b in bounds]
    w = SortedFileWriter(storage, "out/ref.parquet")
    for t in tables:
        w.write_table(t)
    ref = w.commit()
    s = pc.SpliceWriter(storage, "out/A.parquet", tmp_tag="ECID-1")
    for t in tables:
        s.append(*encode_table(t))
    info = s.commit()
    assert Path(storage.path("out/A.parquet")).read_bytes() == Path(storage.path("out/ref.parquet")).read_bytes()
    assert dataclasses.replace(ref, path="out/A.parquet") == info
    assert sorted(p for p, _ in storage.list_files("out")) == ["out/A.parquet", "out/ref.parquet"]


def test_splicing_refuses_ranges_out_of_order_and_nothing(storage: Storage) -> None:
    s = pc.SpliceWriter(storage, "out/A.parquet", tmp_tag="ECID-1")
    with pytest.raises(ValueError, match="no range appended"):
        s.commit()
    s.abort()
    s = pc.SpliceWriter(storage, "out/B.parquet", tmp_tag="ECID-1")
    s.append(*encode_table(entries_to_table([E(i) for i in range(10, 20)])))
    with pytest.raises(UnsortedError):
        s.append(*encode_table(entries_to_table([E(i) for i in range(0, 5)])))
    s.abort()
    assert storage.list_files("out") == []


@pytest.mark.parametrize("n", [0, 5, 300_000])
def test_an_encoded_range_is_the_file_a_sorted_writer_writes(storage: Storage, n: int) -> None:
    """encode_table + write_encoded (a resumable merge's part, encoded on a worker thread, written
    by the engine's thread) make the bytes SortedFileWriter makes, its footer metadata included."""
    table = entries_to_table([E(i, i % 7 == 0) for i in range(n)])
    extra = {b"kompaktor.entries_read": b"12", b"kompaktor.bytes_read": b"34"}
    w = SortedFileWriter(storage, "p/ref.parquet")
    w.write_table(table)
    ref = w.commit(extra)
    info = write_encoded(storage, "p/enc.parquet", encode_table(table, extra), tmp_tag="ECID-1")
    assert Path(storage.path("p/enc.parquet")).read_bytes() == Path(storage.path("p/ref.parquet")).read_bytes()
    assert dataclasses.replace(ref, path="p/enc.parquet") == info
    assert sorted(p for p, _ in storage.list_files("p")) == ["p/enc.parquet", "p/ref.parquet"]


@pytest.mark.parametrize(
    "extras", [{}, {"write_page_index": True, "write_statistics": True}, {"use_dictionary": False}]
)
def test_copied_row_groups_read_back_beside_encoded_ranges(storage: Storage, extras: dict) -> None:
    """Issue 37 §2: row groups copied from another file (page indexes and bloom filters left
    behind), between and before encoded ranges, read back as the entries, with their statistics
    and the footer's kompaktor metadata; their column chunks are the source's bytes."""
    from kompaktor.model.keys import sort_key

    src = [E(i, i % 9 == 0) for i in range(100, 160)]
    storage.ensure_dir("p")
    pq.write_table(
        entries_to_table(src), storage.path("p/src.parquet"), row_group_size=20, compression="snappy", **extras
    )
    s = pc.SpliceWriter(storage, "out/A.parquet", tmp_tag="ECID-1")
    with storage.open_input("p/src.parquet") as f:
        md = pc.read_footer(f, f.size(), "p/src.parquet")
        for g in range(3):
            span = pc.copyable_row_group(md, g)
            assert span is not None
            data = f.read_at(span[1] - span[0], span[0])
            group = src[20 * g : 20 * g + 20]
            dels = sum(e.deleted for e in group)
            s.append_row_groups(
                data, [pc.relocated_row_group(md, g, span[0])], 20, dels, sort_key(group[0]), sort_key(group[-1])
            )
            if g == 1:
                with pytest.raises(UnsortedError):
                    s.append(*encode_table(entries_to_table([E(i) for i in range(0, 5)])))
    s.append(*encode_table(entries_to_table([E(i) for i in range(200, 230)])))
    info = s.commit()
    want = [*src, *(E(i) for i in range(200, 230))]
    assert read_table(storage, "out/A.parquet").equals(entries_to_table(want))
    assert info == read_info(storage, "out/A.parquet")
    assert (info.entries, info.deletes) == (90, sum(e.deleted for e in want))
    got, orig = (
        pq.ParquetFile(storage.path("out/A.parquet")).metadata,
        pq.ParquetFile(storage.path("p/src.parquet")).metadata,
    )
    assert got.num_row_groups == 4
    for g in range(3):
        a, b = got.row_group(g).column(0), orig.row_group(g).column(0)
        assert (a.compression, a.statistics, a.total_compressed_size) == (
            "SNAPPY",
            b.statistics,
            b.total_compressed_size,
        )
        assert not a.has_offset_index and not a.has_column_index


def test_a_file_of_another_schema_has_no_copyable_row_group(storage: Storage) -> None:
    t = entries_to_table([E(i) for i in range(10)])
    storage.ensure_dir("p")
    pq.write_table(t.cast(t.schema.set(0, t.schema.field(0).with_nullable(True))), storage.path("p/x.parquet"))
    with storage.open_input("p/x.parquet") as f:
        assert pc.copyable_row_group(pc.read_footer(f, f.size(), "p/x.parquet"), 0) is None
