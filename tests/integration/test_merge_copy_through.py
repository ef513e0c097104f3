"""Issue 37 §2, the copy-through: row groups of an input whose rows no other row group of the job
shares, and that the iterator stack keeps unchanged, are copied into the output as column-chunk
bytes, without decoding their values (:mod:`kompaktor.engines.ranges.copies`).

The inputs here are written with Snappy, the merge encodes with Zstandard: an output row group
compressed with Snappy is a copied one, and its column chunks are the input's bytes. Every merge
is held to the reference merge (``merged_view``), and its footer to what it holds.
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kompaktor.engines.api import MergeRequest, MergeResult
from kompaktor.engines.arrow import ArrowMergeEngine
from kompaktor.engines.ranges import inspect_inputs, plan, plan_copies
from kompaktor.files.sortedfile import check_sorted, entries_to_table, read_info, table_to_entries
from kompaktor.files.storage import Storage
from kompaktor.metadata import progress as records
from kompaktor.metadata.store import MetadataStore
from kompaktor.model.iterators import IteratorSettings, merged_view
from kompaktor.model.keys import Entry, row_in_range, sort_key
from kompaktor.model.resume import job_fingerprint
from tests.integration.test_merge_conformance import REGEXES, ROWS, column_keys, entries, tablet_ranges, timestamps
from tests.support.strategies import iterator_settings

FULL = IteratorSettings(max_versions=1, full=True)
PARTIAL = IteratorSettings(max_versions=1, full=False)


def write(storage: Storage, name: str, src: list[Entry], row_group_size: int, table: pa.Table | None = None) -> str:
    """``src`` as a Parquet file written by pyarrow with Snappy (the merge writes Zstandard)."""
    storage.ensure_dir("in")
    path = f"in/{name}.parquet"
    t = entries_to_table(src) if table is None else table
    pq.write_table(t, storage.path(path), row_group_size=row_group_size, compression="snappy")
    return path


def merge(
    storage: Storage,
    paths: list[str],
    cfg: IteratorSettings,
    out: str = "out/A.parquet",
    tablet: tuple[bytes | None, bytes | None] = (None, None),
    engine: ArrowMergeEngine | None = None,
) -> MergeResult:
    req = MergeRequest(inputs=tuple(paths), output=out, prev=tablet[0], end=tablet[1], settings=cfg, tmp_tag="ecid1")
    return (engine or ArrowMergeEngine(range_entries=4, copy_min_bytes=0)).merge(storage, req)


def codecs(storage: Storage, path: str) -> list[str]:
    """The compression of each row group of a file (of its first column chunk)."""
    md = pq.ParquetFile(storage.path(path)).metadata
    return [md.row_group(g).column(0).compression for g in range(md.num_row_groups)]


def chunk_bytes(storage: Storage, path: str, g: int) -> list[bytes]:
    """The bytes of row group ``g``'s column chunks, as stored."""
    md = pq.ParquetFile(storage.path(path)).metadata
    data = Path(storage.path(path)).read_bytes()
    out = []
    for c in range(md.num_columns):
        col = md.row_group(g).column(c)
        start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
        out.append(data[start : start + col.total_compressed_size])
    return out


def check(storage: Storage, srcs: list[list[Entry]], paths: list[str], res: MergeResult, cfg, tablet) -> list[Entry]:
    """The output is the reference merge's, entry for entry, in key order; its footer and the
    result's counts say what it holds."""
    prev, end = tablet
    inside = [[e for e in s if row_in_range(e.row, prev, end)] for s in srcs]
    want = list(merged_view(inside, cfg))
    table = pq.read_table(storage.path(res.info.path))
    assert list(table_to_entries(table)) == want
    check_sorted(table)
    assert res.info == read_info(storage, res.info.path)
    assert res.info.entries == res.entries_written == len(want)
    assert res.info.deletes == sum(e.deleted for e in want)
    assert res.info.first == (sort_key(want[0]) if want else None)
    assert res.info.last == (sort_key(want[-1]) if want else None)
    assert res.entries_read == sum(len(s) for s in inside)
    assert res.deletes_dropped == sum(e.deleted for s in inside for e in s) - res.info.deletes
    return want


def run(n: int, start: int, *, ts: int = 5, deleted: set[int] = frozenset(), versions: int = 1) -> list[Entry]:
    """Entries of rows ``start`` .. ``start + n - 1`` (one column key each, ``versions`` versions)."""
    out = []
    for i in range(start, start + n):
        for v in range(versions):
            d = i in deleted
            out.append(Entry(b"r%05d" % i, b"f", b"q", b"", ts + versions - v, d, b"" if d else b"v%d" % i))
    return out


def test_inputs_that_do_not_overlap_are_copied_as_they_are(storage: Storage) -> None:
    """Three files with disjoint rows, in no key order among them: every output row group is an
    input row group, its column chunks the input's very bytes; the output is the reference's."""
    srcs = [run(50, 100), run(30, 0), run(40, 200)]
    paths = [write(storage, f"F{i}", s, 20) for i, s in enumerate(srcs)]
    res = merge(storage, paths, FULL)
    check(storage, srcs, paths, res, FULL, (None, None))
    assert codecs(storage, res.info.path) == ["SNAPPY"] * 7
    inputs_in_key_order = [(paths[1], g) for g in range(2)] + [(paths[0], g) for g in range(3)]
    inputs_in_key_order += [(paths[2], g) for g in range(2)]
    for k, (path, g) in enumerate(inputs_in_key_order):
        assert chunk_bytes(storage, res.info.path, k) == chunk_bytes(storage, path, g)
    # without the copy-through every row group is merged and encoded again
    again = merge(storage, paths, FULL, "out/B.parquet", engine=ArrowMergeEngine(range_entries=4, copy_through=False))
    assert set(codecs(storage, again.info.path)) == {"ZSTD"}
    assert pq.read_table(storage.path(again.info.path)).equals(pq.read_table(storage.path(res.info.path)))


def test_row_groups_smaller_than_the_copy_minimum_are_merged(storage: Storage) -> None:
    """By default row groups under COPY_MIN_BYTES are merged: the output of many small disjoint
    files (flushes) is not made of their many tiny row groups. Bigger ones are still copied."""
    small = [run(50, 100), run(30, 0), run(40, 200)]
    paths = [write(storage, f"S{i}", s, 20) for i, s in enumerate(small)]
    res = ArrowMergeEngine(range_entries=4).merge(
        storage, MergeRequest(tuple(paths), "out/S.parquet", None, None, FULL, "ecid1")
    )
    check(storage, small, paths, res, FULL, (None, None))
    assert set(codecs(storage, res.info.path)) == {"ZSTD"}  # merged and encoded, not copied
    rnd = random.Random(5)  # values that neither a dictionary nor compression makes small
    big = [
        [Entry(b"r%05d" % i, b"f", b"q", b"", 1, False, rnd.randbytes(4096)) for i in range(k, k + 400)]
        for k in (0, 1000)
    ]
    paths = [write(storage, f"B{i}", s, 400) for i, s in enumerate(big)]  # ~1.6 MB per row group
    res = ArrowMergeEngine(range_entries=4).merge(
        storage, MergeRequest(tuple(paths), "out/B.parquet", None, None, FULL, "ecid2")
    )
    check(storage, big, paths, res, FULL, (None, None))
    assert codecs(storage, res.info.path) == ["SNAPPY", "SNAPPY"]


def test_only_the_row_groups_no_other_input_overlaps_are_copied(storage: Storage) -> None:
    """Two files whose key ranges overlap in the middle: their row groups outside the overlap are
    copied, those sharing rows with the other file are merged."""
    a = run(60, 0)  # rows 0..59: row groups 0-19, 20-39, 40-59
    b = run(60, 45, ts=9)  # rows 45..104: row groups 45-64, 65-84, 85-104
    paths = [write(storage, "F0", a, 20), write(storage, "F1", b, 20)]
    res = merge(storage, paths, FULL)
    check(storage, [a, b], paths, res, FULL, (None, None))
    got = codecs(storage, res.info.path)
    assert got[:2] == ["SNAPPY", "SNAPPY"] and got[-2:] == ["SNAPPY", "SNAPPY"]
    assert "ZSTD" in got[2:-2]


def test_a_row_group_with_a_delete_marker_is_not_copied_in_a_full_compaction(storage: Storage) -> None:
    """A full compaction drops delete markers: a row group that holds one is merged (the marker
    dropped, the footer's counts say so); the other row groups are copied. A partial compaction
    keeps a marker that hides nothing: there the same row group is copied."""
    a = run(60, 0, deleted={25})  # the marker in the second row group
    b = run(20, 100)
    paths = [write(storage, "F0", a, 20), write(storage, "F1", b, 20)]
    res = merge(storage, paths, FULL)
    want = check(storage, [a, b], paths, res, FULL, (None, None))
    assert all(not e.deleted for e in want) and res.deletes_dropped == 1
    assert codecs(storage, res.info.path) == ["SNAPPY", "ZSTD", "SNAPPY", "SNAPPY"]
    partial = merge(storage, paths, PARTIAL, "out/B.parquet")
    check(storage, [a, b], paths, partial, PARTIAL, (None, None))
    assert partial.deletes_dropped == 0 and partial.info.deletes == 1
    assert codecs(storage, partial.info.path) == ["SNAPPY"] * 4


def test_a_marker_that_hides_a_put_is_not_copied_in_a_partial_compaction(storage: Storage) -> None:
    """A marker above a put of its column key in the same row group hides the put even in a
    partial compaction: that row group is merged."""
    hides = [Entry(b"r00020", b"f", b"q", b"", 9, True, b""), Entry(b"r00020", b"f", b"q", b"", 3, False, b"x")]
    a = [*run(20, 0), *hides]
    paths = [write(storage, "F0", sorted(a, key=sort_key), 1000)]
    res = merge(storage, paths, PARTIAL)
    want = check(storage, [sorted(a, key=sort_key)], paths, res, PARTIAL, (None, None))
    assert len(want) == 21 and codecs(storage, res.info.path) == ["ZSTD"]


@pytest.mark.parametrize(("max_versions", "copied"), [(1, False), (2, False), (3, True), (4, True)])
def test_a_row_group_with_more_versions_than_kept_is_not_copied(storage: Storage, max_versions, copied) -> None:
    """Three versions of every key: copied only where the compaction keeps them all."""
    src = run(30, 0, versions=3)
    cfg = IteratorSettings(max_versions=max_versions, full=True)
    paths = [write(storage, "F0", src, 1000)]
    res = merge(storage, paths, cfg)
    check(storage, [src], paths, res, cfg, (None, None))
    assert codecs(storage, res.info.path) == (["SNAPPY"] if copied else ["ZSTD"])


@pytest.mark.parametrize(
    "cfg",
    [
        IteratorSettings(max_versions=1, full=True, ageoff_ttl_ms=10, now_ms=17),  # ts 6 < cutoff 7
        IteratorSettings(max_versions=1, full=True, row_regex="r0001"),
        IteratorSettings(max_versions=1, full=True, row_start=b"r00015", row_end=b"r00016"),
    ],
    ids=["ageoff", "regex", "row-range"],
)
def test_a_row_group_the_filters_change_is_not_copied(storage: Storage, cfg: IteratorSettings) -> None:
    src = run(30, 0)
    paths = [write(storage, "F0", src, 1000)]
    res = merge(storage, paths, cfg)
    want = check(storage, [src], paths, res, cfg, (None, None))
    assert len(want) < len(src) and "SNAPPY" not in codecs(storage, res.info.path)


def test_filters_that_change_nothing_leave_the_row_groups_copied(storage: Storage) -> None:
    """Age-off below every put, a row range outside the rows: nothing is dropped, all is copied."""
    src = run(30, 0)
    cfg = IteratorSettings(max_versions=1, full=True, ageoff_ttl_ms=10, now_ms=15, row_start=b"s", row_end=b"t")
    paths = [write(storage, "F0", src, 10)]
    res = merge(storage, paths, cfg)
    check(storage, [src], paths, res, cfg, (None, None))
    assert codecs(storage, res.info.path) == ["SNAPPY"] * 3


def test_a_row_group_across_the_tablet_bound_is_merged(storage: Storage) -> None:
    """Only the row groups wholly inside the tablet's range are copied; the one across a bound
    is merged (its rows outside the tablet left out)."""
    src = run(60, 0)
    paths = [write(storage, "F0", src, 20)]
    tablet = (b"r00005", b"r00039")
    res = merge(storage, paths, FULL, tablet=tablet)
    check(storage, [src], paths, res, FULL, tablet)
    assert codecs(storage, res.info.path) == ["ZSTD", "SNAPPY"]


def test_an_input_with_another_schema_is_merged(storage: Storage) -> None:
    """A file written with string columns (a schema the merge accepts) is not copied: its row
    groups would not match the output's schema."""
    src = run(30, 0)
    t = entries_to_table(src)
    t = t.set_column(0, pa.field("row", pa.string(), nullable=False), t.column("row").cast(pa.string()))
    paths = [write(storage, "F0", src, 10, table=t)]
    res = merge(storage, paths, FULL)
    check(storage, [src], paths, res, FULL, (None, None))
    assert set(codecs(storage, res.info.path)) == {"ZSTD"}


def test_a_row_group_out_of_key_order_within_a_row_is_not_copied(storage: Storage) -> None:
    """The cursors only ask an input's rows never to decrease. A row group out of key order
    within a row is not copied: it goes the way it went before the copy-through."""
    src = run(10, 0)
    bad = [Entry(b"r00010", b"g", b"q", b"", 1, False, b"x"), Entry(b"r00010", b"f", b"q", b"", 1, False, b"y")]
    paths = [write(storage, "F0", src + bad, 1000)]
    res = merge(storage, paths, FULL)
    assert codecs(storage, res.info.path) == ["ZSTD"]
    before = merge(storage, paths, FULL, "out/B.parquet", engine=ArrowMergeEngine(range_entries=4, copy_through=False))
    assert pq.read_table(storage.path(res.info.path)).equals(pq.read_table(storage.path(before.info.path)))


def test_an_empty_input_leaves_the_others_copied(storage: Storage) -> None:
    """An empty input (pyarrow writes it one row group without statistics) holds no row to
    overlap: the other inputs are still copied."""
    srcs = [run(30, 0), [], run(30, 100)]
    paths = [write(storage, f"F{i}", s, 10) for i, s in enumerate(srcs)]
    assert pq.ParquetFile(storage.path(paths[1])).metadata.num_row_groups == 1
    res = merge(storage, paths, FULL)
    check(storage, srcs, paths, res, FULL, (None, None))
    assert codecs(storage, res.info.path) == ["SNAPPY"] * 6


def test_a_resumable_merge_does_not_copy(storage: Storage, store: MetadataStore) -> None:
    """A resumable merge writes every range as a part (its resume log's unit): it merges as
    before, copies nothing, and writes the same entries."""
    srcs = [run(50, 100), run(30, 0)]
    paths = [write(storage, f"F{i}", s, 20) for i, s in enumerate(srcs)]
    fp = job_fingerprint("t1;", None, None, {p: storage.size(p) for p in paths}, "SYSTEM", None, FULL)
    log = records.RedisResumeLog(store, fp, "t1;", tuple(paths))
    req = MergeRequest(tuple(paths), "out/A.parquet", None, None, FULL, "ecid1", resume=log)
    res = ArrowMergeEngine(range_entries=4, resume_min_bytes=0).merge(storage, req)
    assert res.resumable
    check(storage, srcs, paths, res, FULL, (None, None))
    assert set(codecs(storage, res.info.path)) == {"ZSTD"}
    records.finish(store, storage, fp, res.parts)


# --- random inputs: disjoint files, disjoint row groups inside overlapping files, markers,
# versions, every setting, tablet ranges; held to the reference merge

KEYS_FEW = st.lists(column_keys, min_size=1, max_size=6)
#: rows of their own mostly: long stretches no other source shares a row with
KEYS_MANY = st.lists(
    st.tuples(
        st.sampled_from([b"%02d" % k for k in range(40)]), st.sampled_from([b"", b"f"]), st.just(b"q"), st.just(b"")
    ),
    min_size=1,
    max_size=40,
)


@st.composite
def mixed_sources(draw) -> list[list[Entry]]:
    """One sorted run of entries (versions and markers common, or none of either) cut into pieces; each piece goes
    to one of a few sources, so a source holds stretches that other sources' rows fall between
    (row groups of overlapping files that no other file overlaps) or a whole stretch (a file
    that overlaps none); sometimes one more source overlaps at random."""
    keys = draw(st.one_of(KEYS_FEW, KEYS_MANY))
    pooled = st.builds(
        lambda k, ts, d, val: Entry(*k, ts, d, b"" if d else val),
        st.sampled_from(keys),
        timestamps,
        st.sampled_from([False, False, False, True]),
        st.binary(max_size=2),
    )
    plain = draw(st.booleans())  # plain puts, one version each: what a compaction copies
    entry_run = sorted(draw(st.lists(pooled if plain else st.one_of(pooled, entries), max_size=60)), key=sort_key)
    if plain:
        entry_run = [e for e in entry_run if not e.deleted]
        entry_run = [next(g) for _k, g in itertools.groupby(entry_run, key=lambda e: e[:4])]
    cuts = sorted(draw(st.lists(st.integers(0, len(entry_run)), max_size=8)))
    pieces = [entry_run[a:b] for a, b in itertools.pairwise([0, *cuts, len(entry_run)])]
    n = draw(st.integers(1, 4))
    srcs: list[list[Entry]] = [[] for _ in range(n)]
    for piece in pieces:
        srcs[draw(st.integers(0, n - 1))].extend(piece)
    if draw(st.integers(0, 2)) == 0:
        srcs.append(sorted(draw(st.lists(pooled, max_size=4)), key=sort_key))
    return draw(st.permutations(srcs))


#: where the merge runs and how its inputs and ranges are cut (both property tests draw them)
LAYOUTS = {
    "tablet": st.one_of(st.just((None, None)), tablet_ranges),
    "rg_sizes": st.lists(st.sampled_from([1, 2, 3, 7, 1000]), min_size=5, max_size=5),
    "range_entries": st.sampled_from([1, 4, 10_000]),
}
simple_settings = st.builds(IteratorSettings, max_versions=st.integers(1, 3), full=st.booleans())
any_settings = st.one_of(
    simple_settings, simple_settings, iterator_settings(ROWS, REGEXES, max_ttl=6, max_now=8, none_regex_weight=2)
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    srcs=mixed_sources(),
    cfg=any_settings,
    **LAYOUTS,
)
def test_copy_through_conforms(tmp_path_factory, srcs, cfg, tablet, rg_sizes, range_entries) -> None:
    storage = Storage.from_uri(str(tmp_path_factory.mktemp("copy")))
    paths = [write(storage, f"F{i}", s, rg_sizes[i]) for i, s in enumerate(srcs)]
    res = merge(
        storage, paths, cfg, tablet=tablet, engine=ArrowMergeEngine(range_entries=range_entries, copy_min_bytes=0)
    )
    check(storage, srcs, paths, res, cfg, tablet)
    copied = codecs(storage, res.info.path).count("SNAPPY")
    event(f"row groups copied: {'none' if not copied else 'some'}")
    assert sorted(p for p, _ in storage.list_files("out")) == [res.info.path]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    srcs=mixed_sources(),
    cfg=simple_settings,
    **LAYOUTS,
    max_bytes=st.sampled_from([1, 1000, 10**9]),
)
def test_a_copy_range_holds_exactly_its_row_groups(
    tmp_path_factory, srcs, cfg, tablet, rg_sizes, range_entries, max_bytes
) -> None:
    """The plan with copy ranges still tiles the tablet's range, and the rows of every input in a
    copy range are exactly those of the run's row groups (runs of at most ``max_bytes``
    uncompressed: a row group bigger than that is merged)."""
    storage = Storage.from_uri(str(tmp_path_factory.mktemp("plan")))
    paths = [write(storage, f"F{i}", s, rg_sizes[i]) for i, s in enumerate(srcs)]
    prev, end = tablet
    metas = inspect_inputs(storage, paths)
    ranges = plan(storage, metas, prev, end, range_entries)
    new, copies = plan_copies(storage, metas, prev, end, cfg, ranges, max_bytes)
    longest = max((len(r.groups) for r in copies.values()), default=0)
    event(f"copy ranges: {'none' if not longest else 'one row group each' if longest == 1 else 'longer runs'}")
    assert new[0][0] == prev and new[-1][1] == end
    assert all(a[1] == b[0] and (a[1] is not None) for a, b in itertools.pairwise(new))
    assert all(lo is None or hi is None or lo < hi for lo, hi in new)
    for k, run in copies.items():
        lo, hi = new[k]
        md = pq.ParquetFile(storage.path(run.path)).metadata
        assert sum(md.row_group(g).total_byte_size for g in run.groups) <= max_bytes
        for i, path in enumerate(paths):
            got = [e.row for e in srcs[i] if row_in_range(e.row, lo, hi)]
            if i != run.input:
                assert got == []
                continue
            pf = pq.ParquetFile(storage.path(path))
            want = [r for g in run.groups for r in pf.read_row_group(g, columns=["row"]).column(0).to_pylist()]
            assert got == want
