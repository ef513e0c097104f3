"""Issue 17 §1 and §4: planning and reading do not depend on the inputs' row-group layout, and
inputs that lie or do not fit are refused in one line with nothing left behind.

The same entries are written as many small row groups, as one row group per file and without
row statistics; every engine's output must equal ``merged_view`` of the entries for each layout,
and a big single row group must still be cut into several key ranges (sampled from its ``row``
column) and read batch by batch."""

from __future__ import annotations

import dataclasses
import itertools
import threading
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from kompaktor.engines.api import MergeEngine, MergeRequest
from kompaktor.engines.arrow import ArrowMergeEngine
from kompaktor.engines.ranges import InputCursor, TaskMemoryExceeded, inspect_inputs, plan
from kompaktor.files.arrowstack import merge_tables
from kompaktor.files.sortedfile import SortedFileWriter, entries_to_table, read_info, read_table, table_to_entries
from kompaktor.files.storage import Storage
from kompaktor.model.errors import BadFileError, UnsortedError
from kompaktor.model.iterators import IteratorSettings, merged_view
from kompaktor.model.keys import Entry, sort_key

ENGINES = ["arrow", pytest.param("spark", marks=pytest.mark.spark)]
N_FILES = 3
PER_FILE = 6000


@pytest.fixture(params=ENGINES)
def engine(request) -> MergeEngine:
    if request.param == "spark":
        return request.getfixturevalue("spark_engine")
    return ArrowMergeEngine(range_entries=2000)


def sources() -> list[list[Entry]]:
    """Overlapping sorted inputs: rows r00000..r09999, later files overwrite and delete."""
    rng = np.random.default_rng(17)
    out = []
    for f in range(N_FILES):
        rows = rng.choice(10_000, size=PER_FILE, replace=False)
        es = [
            Entry(b"r%05d" % r, b"f", b"q%d" % (r % 3), b"", f + 1, bool(f and r % 17 == 0), b"v%d" % f) for r in rows
        ]
        out.append(sorted(es, key=sort_key))
    return out


LAYOUTS = {
    "small_row_groups": {"row_group_size": 500},
    "one_row_group": {"row_group_size": PER_FILE},
    "no_statistics": {"row_group_size": 1000, "write_statistics": False},
}


def write(storage: Storage, srcs: list[list[Entry]], **opts) -> list[str]:
    paths = []
    storage.ensure_dir("t1")
    for i, src in enumerate(srcs):
        path = f"t1/I{i:06d}.parquet"
        pq.write_table(entries_to_table(src), storage.path(path), **opts)
        paths.append(path)
    return paths


def request(paths: list[str], **kw) -> MergeRequest:
    return MergeRequest(
        inputs=tuple(paths),
        output="t1/A000001.parquet",
        prev=kw.get("prev"),
        end=kw.get("end"),
        settings=IteratorSettings(max_versions=1, full=True),
        tmp_tag="ECID-17",
    )


def files(storage: Storage) -> list[str]:
    return sorted(p for p, _ in storage.list_files(""))


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("bounds", [(None, None), (b"r02500", b"r07777")])
def test_every_layout_merges_to_the_reference(engine, storage, layout, bounds):
    srcs = sources()
    paths = write(storage, srcs, **LAYOUTS[layout])
    prev, end = bounds
    engine.merge(storage, request(paths, prev=prev, end=end))
    got = list(table_to_entries(read_table(storage, "t1/A000001.parquet")))
    inside = [[e for e in src if (prev is None or e.row > prev) and (end is None or e.row <= end)] for src in srcs]
    want = list(merged_view(inside, IteratorSettings(max_versions=1, full=True)))
    assert got == want
    assert files(storage) == sorted([*paths, "t1/A000001.parquet"])


def sequential_reference(storage: Storage, paths: list[str], out: str, req: MergeRequest, range_entries: int) -> bytes:
    """The bytes the Arrow engine wrote before it ran ranges in parallel: every range read by one
    set of cursors, merged and written by one SortedFileWriter, one after the other."""
    ranges = plan(storage, inspect_inputs(storage, paths), req.prev, req.end, range_entries)
    cursors = [InputCursor(storage, p, req.prev, req.end) for p in paths]
    w = SortedFileWriter(storage, out)
    for _, hi in ranges:
        w.write_table(merge_tables([c.take(hi) for c in cursors], req.settings), checked=True)
    w.commit()
    for c in cursors:
        c.close()
    return Path(storage.path(out)).read_bytes()


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize(
    "settings",
    [IteratorSettings(max_versions=1, full=True), IteratorSettings(max_versions=2, full=False)],
    ids=["full", "partial"],
)
def test_ranges_merged_in_parallel_write_the_sequential_bytes(storage, layout, workers, settings):
    """Issue 23 §1: ranges merged and encoded on several threads and spliced in order give the
    file's very bytes that merging them one after the other gives, in every layout, with a
    tablet's bounds and without, and an empty output too."""
    paths = write(storage, sources(), **LAYOUTS[layout])
    for k, (prev, end) in enumerate([(None, None), (b"r02500", b"r07777"), (b"r99999", None)]):
        req = dataclasses.replace(request(paths, prev=prev, end=end), settings=settings, output=f"t1/A{k}.parquet")
        ref = sequential_reference(storage, paths, f"ref/A{k}.parquet", req, 2000)
        res = ArrowMergeEngine(range_entries=2000, workers=workers).merge(storage, req)
        assert Path(storage.path(req.output)).read_bytes() == ref
        assert res.info == read_info(storage, req.output)
        assert res.entries_written == res.info.entries == (0 if k == 2 else res.entries_written)


def test_a_failed_range_stops_the_parallel_merge_and_leaves_nothing(storage, monkeypatch):
    """A range that fails while others are in flight (here: its merge) fails the merge with that
    error; no thread is left behind, no temp output stays."""
    import kompaktor.engines.arrow as arrow_mod

    paths = write(storage, sources(), row_group_size=500)
    calls = []

    def merge_fails_on_the_third(tables, settings):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("boom")
        return merge_tables(tables, settings)

    monkeypatch.setattr(arrow_mod, "merge_tables_once", merge_fails_on_the_third)
    with pytest.raises(RuntimeError, match="boom"):
        ArrowMergeEngine(range_entries=2000, workers=3).merge(storage, request(paths))
    assert files(storage) == sorted(paths)
    assert not [t for t in threading.enumerate() if t.name.startswith("arrowmerge")]


@pytest.mark.parametrize("layout", ["one_row_group", "no_statistics"])
def test_big_row_groups_are_cut_into_several_ranges(storage, layout):
    paths = write(storage, sources(), **LAYOUTS[layout])
    metas = inspect_inputs(storage, paths)
    ranges = plan(storage, metas, None, None, 2000)
    assert len(ranges) >= N_FILES * PER_FILE // 2000 - 1
    assert ranges[0][0] is None and ranges[-1][1] is None
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))


def test_a_row_group_of_few_big_entries_is_cut_by_its_bytes(storage):
    """A row group of fewer entries than a sampled segment holds but of many bytes (big values,
    one row group per file) is sampled too, and the plan's ranges hold about the range size, not
    every file whole. Found at 16M entries of the bench's value4k shape: 8 files of one 62,500-row
    row group of 4 KiB values each made one range of 2 GB, and the merge failed."""
    rng = np.random.default_rng(5)
    srcs = []
    for f in range(4):
        rows = np.sort(rng.choice(100_000, size=4096, replace=False))
        srcs.append([Entry(b"r%06d" % r, b"f", b"q", b"", f + 1, False, rng.bytes(4096)) for r in rows])
    paths = write(storage, srcs, row_group_size=4096)  # 16 MiB of values per file, one row group
    target = 8 << 20
    ranges = plan(storage, inspect_inputs(storage, paths), None, None, 1_000_000, target)
    rows = [e.row for src in srcs for e in src]
    held = [4096 * sum(1 for r in rows if (lo is None or r > lo) and (hi is None or r <= hi)) for lo, hi in ranges]
    assert sum(held) == 4 * 4096 * 4096
    assert len(ranges) >= 4 and max(held) <= 3 * target, [h >> 20 for h in held]


def test_a_cursor_holds_one_range_plus_one_batch_of_a_big_row_group(storage):
    paths = write(storage, sources(), row_group_size=PER_FILE)
    cur = InputCursor(storage, paths[0], None, None, batch_rows=256)
    try:
        first = cur.take(b"r00100")
        assert 0 < first.num_rows < 256 and first.column("row")[-1].as_py() <= b"r00100"
        pending = cur._pending  # the rest of the one decoded batch, not the row group
        assert pending is not None and pending.num_rows <= 256
        rest = cur.take(None)
        assert first.num_rows + rest.num_rows == PER_FILE
    finally:
        cur.close()


def test_input_larger_than_task_memory_is_one_line_and_leaves_nothing(storage):
    srcs = sources()
    paths = write(storage, srcs, row_group_size=PER_FILE)
    # one range holds everything (the planner is asked for huge ranges): 64 KiB of task memory
    # cannot hold it; the cursor stops after one batch over the budget, not after the file
    eng = ArrowMergeEngine(range_entries=10**9, task_memory=64 << 10)
    with pytest.raises(TaskMemoryExceeded) as err:
        eng.merge(storage, request(paths))
    line = str(err.value)
    assert "\n" not in line and "task memory" in line and paths[0] in line
    assert files(storage) == sorted(paths)


def _patch_footer(path: str, old: bytes, new: bytes) -> None:
    """Replace ``old`` by ``new`` (same length) in the Parquet footer only (the statistics)."""
    data = bytearray(Path(path).read_bytes())
    footer_len = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - footer_len
    footer = bytes(data[start:-8])
    assert old in footer and len(old) == len(new)
    data[start:-8] = footer.replace(old, new)
    Path(path).write_bytes(bytes(data))


def lying_footer(storage: Storage, paths: list[str]) -> None:
    """Row group 1 of the second file claims it ends at row r04000; it holds rows beyond."""
    t = pq.read_table(storage.path(paths[1]))
    pq.write_table(t, storage.path(paths[1]), row_group_size=2000, compression="none")
    md = pq.ParquetFile(storage.path(paths[1])).metadata
    st = md.row_group(1).column(0).statistics
    inside = t.column("row")[2000 + 1000].as_py()  # a row in the middle of row group 1
    assert st.min < inside < st.max and len(inside) == len(st.max)
    _patch_footer(storage.path(paths[1]), st.max, inside)


def groups_out_of_order(storage: Storage, paths: list[str]) -> None:
    """The second file's row groups are written in the wrong order (each one sorted)."""
    t = pq.read_table(storage.path(paths[1]))
    half = t.num_rows // 2
    with pq.ParquetWriter(storage.path(paths[1]), t.schema) as w:
        w.write_table(t.slice(half))
        w.write_table(t.slice(0, half))


@pytest.mark.parametrize("damage", [lying_footer, groups_out_of_order], ids=lambda f: f.__name__)
def test_inputs_that_lie_are_one_line_and_leave_nothing(engine, storage, damage):
    paths = write(storage, sources(), row_group_size=1000)
    damage(storage, paths)
    with pytest.raises(BadFileError) as err:
        engine.merge(storage, request(paths))
    line = str(err.value)
    assert "\n" not in line and paths[1] in line
    if damage is groups_out_of_order:
        assert isinstance(err.value, UnsortedError)
    assert files(storage) == sorted(paths)


@pytest.mark.spark
def test_spark_task_bigger_than_task_memory_is_one_line_and_leaves_nothing(spark_session, storage):
    from kompaktor.engines.spark import SparkMergeEngine

    paths = write(storage, sources(), row_group_size=PER_FILE)
    eng = SparkMergeEngine("local[2]", task_entries=10**9, task_memory=64 << 10)
    with pytest.raises(TaskMemoryExceeded) as err:
        eng.merge(storage, request(paths))
    assert "\n" not in str(err.value) and "task memory" in str(err.value)
    assert files(storage) == sorted(paths)


# -- the whole job: a compactor fails it in one line and leaves the tablet as it was -----------------
def _flush_sources(client) -> str:
    client.store.tables.create_table("t", [], {"table.compaction.major.ratio": "1"})
    for src in sources():
        client.flush("t", src)
    return client.store.tables.table_id("t")


@pytest.mark.redis
@pytest.mark.parametrize("case", ["task_memory", "lying_footer", "groups_out_of_order"])
def test_compactor_fails_the_job_in_one_line_and_leaves_the_tablet(store, storage, client, case):
    from kompaktor.coordinator import Coordinator
    from kompaktor.worker import Compactor, WorkerSettings

    tid = _flush_sources(client)
    (tablet,) = store.tables.tablets(tid)
    before = set(tablet.files)
    engine = ArrowMergeEngine(range_entries=2000)
    bad = sorted(before)[1]
    if case == "task_memory":
        engine = ArrowMergeEngine(range_entries=10**9, task_memory=64 << 10)
    elif case == "lying_footer":
        lying_footer(storage, sorted(before))
    else:
        groups_out_of_order(storage, sorted(before))
    assert Coordinator(store, storage).full_scan() == 1
    w = Compactor(store, storage, WorkerSettings("default", "c1", engine="arrow"), engine=engine)
    outcome = w.run_one()
    assert outcome.status == "failed", outcome
    assert "\n" not in outcome.reason
    assert ("task memory" in outcome.reason) if case == "task_memory" else (bad in outcome.reason), outcome.reason
    (after,) = store.tables.tablets(tid)
    assert set(after.files) == before and after.running == {}
    assert sorted(p for p, _ in storage.list_files("")) == sorted(before)


def test_a_cursor_cuts_a_row_group_of_big_values_into_batches_of_bounded_bytes(storage):
    """Issue 46: a batch holds at most about ``BATCH_BYTES`` of the row group's entries (64K
    entries of 4 KiB values made 256 MiB batches, every input decoded whole at its first range);
    the entries read are the ones written, in order."""
    from kompaktor.engines.ranges.cursor import BATCH_BYTES

    rng = np.random.default_rng(5)
    src = [Entry(b"r%06d" % r, b"f", b"q", b"", 1, False, rng.bytes(8192)) for r in range(6000)]
    paths = write(storage, [src], row_group_size=6000)  # 47 MiB of values, one row group
    cur = InputCursor(storage, paths[0], None, None)
    try:
        got = cur.take(None)
    finally:
        cur.close()
    assert list(table_to_entries(got)) == src
    sizes = [c.nbytes for c in got.column("value").chunks]
    assert len(sizes) >= 3 and max(sizes) <= 1.2 * BATCH_BYTES, [s >> 20 for s in sizes]
