"""Merge engines: bad inputs, cancellation, progress, session reuse and `kompaktor merge`.

Every failure must leave nothing behind: neither the output nor any temporary file (the
temporary output and the Spark engine's parts carry the tmp_tag, i.e. the ECID).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from kompaktor.engines import make_engine
from kompaktor.engines.api import MergeCancelled, MergeEngine, MergeRequest
from kompaktor.files.sortedfile import entries_to_table, read_table, table_to_entries, write_sorted
from kompaktor.files.storage import Storage
from kompaktor.model.errors import BadFileError, UnsortedError
from kompaktor.model.iterators import IteratorSettings, merged_view
from kompaktor.model.keys import Entry, sort_key
from tests.support.mergeinputs import generate

ENGINES = ["arrow", pytest.param("spark", marks=pytest.mark.spark)]


@pytest.fixture(params=ENGINES)
def engine(request) -> MergeEngine:
    if request.param == "spark":
        return request.getfixturevalue("spark_engine")
    return make_engine("arrow")


def entries(seed: int, n: int = 200) -> list[Entry]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        row = bytes(rng.integers(0, 256, size=int(rng.integers(0, 4)), dtype=np.uint8))
        deleted = bool(rng.random() < 0.1)
        out.append(
            Entry(
                row,
                b"f",
                bytes([int(rng.integers(0, 3))]),
                b"",
                int(rng.integers(0, 5)),
                deleted,
                b"" if deleted else bytes([seed]),
            )
        )
    return sorted(out, key=sort_key)


def good_inputs(storage: Storage, k: int = 3) -> tuple[list[str], list[list[Entry]]]:
    srcs = [entries(i) for i in range(k)]
    paths = []
    for i, src in enumerate(srcs):
        write_sorted(storage, f"t1/F{i:06d}.parquet", src)
        paths.append(f"t1/F{i:06d}.parquet")
    return paths, srcs


def request(paths: list[str], settings: IteratorSettings | None = None, **kw) -> MergeRequest:
    return MergeRequest(
        inputs=tuple(paths),
        output="t1/A000099.parquet",
        prev=kw.get("prev"),
        end=kw.get("end"),
        settings=settings or IteratorSettings(),
        tmp_tag="ECID-42",
    )


def files(storage: Storage) -> list[str]:
    return [p for p, _ in storage.list_files("")]


def assert_nothing_left(storage: Storage, inputs: list[str]) -> None:
    assert files(storage) == sorted(inputs)


def corrupt_pages(storage: Storage, path: str) -> None:
    """Keep the footer, overwrite the data pages with garbage."""
    full = Path(storage.path(path))
    data = bytearray(full.read_bytes())
    footer_len = int.from_bytes(data[-8:-4], "little")
    for i in range(8, len(data) - footer_len - 8):
        data[i] = (data[i] * 31 + 7) % 256
    full.write_bytes(bytes(data))


def truncate(storage: Storage, path: str) -> None:
    with open(storage.path(path), "r+b") as f:
        f.truncate(storage.size(path) // 2)


BAD_FILES = {
    "garbage": lambda s, p: Path(s.path(p)).write_bytes(b"this is not parquet at all" * 10),
    "truncated": truncate,
    "empty": lambda s, p: Path(s.path(p)).write_bytes(b""),
    "wrong_schema": lambda s, p: pq.write_table(pa.table({"a": [1, 2], "b": ["x", "y"]}), s.path(p)),
    "wrong_type": lambda s, p: pq.write_table(
        entries_to_table([]).cast(entries_to_table([]).schema.set(4, pa.field("ts", pa.string()))), s.path(p)
    ),
    "corrupt_pages": corrupt_pages,
    "unsorted": lambda s, p: pq.write_table(entries_to_table(list(reversed(entries(5)))), s.path(p)),
    "missing": lambda s, p: os.remove(s.path(p)),
}


@pytest.mark.parametrize("kind", sorted(BAD_FILES))
def test_bad_input_raises_bad_file_error_and_leaves_nothing(engine, storage, kind):
    paths, _ = good_inputs(storage)
    BAD_FILES[kind](storage, paths[1])
    with pytest.raises(BadFileError) as err:
        engine.merge(storage, request(paths))
    assert paths[1] in str(err.value)
    if kind == "unsorted":
        assert isinstance(err.value, UnsortedError)
    left = [p for p in paths if storage.exists(p)]
    assert_nothing_left(storage, left)


def test_engine_output_matches_reference_and_reports_progress(engine, storage):
    paths, srcs = good_inputs(storage, 4)
    seen: list[dict] = []
    res = engine.merge(storage, request(paths, IteratorSettings(max_versions=2, full=False)), progress=seen.append)
    expected = list(merged_view(srcs, IteratorSettings(max_versions=2, full=False)))
    assert list(table_to_entries(read_table(storage, "t1/A000099.parquet"))) == expected
    assert res.entries_read == sum(map(len, srcs)) and res.entries_written == len(expected)
    assert res.bytes_read == sum(storage.size(p) for p in paths)
    assert res.bytes_written == storage.size("t1/A000099.parquet") == res.info.size
    assert seen[0]["entries_read"] == 0 and seen[-1]["entries_written"] == len(expected)
    assert {"entries_read", "entries_written", "bytes_read", "bytes_written"} <= set(seen[-1])
    assert len(seen) >= 3  # start, at least one part, end
    assert_nothing_left(storage, [*paths, "t1/A000099.parquet"])


def test_empty_result_writes_an_empty_file(engine, storage):
    srcs = [[Entry(b"r", b"f", b"q", b"", 5, True, b"")], [Entry(b"r", b"f", b"q", b"", 3, False, b"v")]]
    paths = []
    for i, src in enumerate(srcs):
        write_sorted(storage, f"t1/F{i:06d}.parquet", src)
        paths.append(f"t1/F{i:06d}.parquet")
    res = engine.merge(storage, request(paths))
    assert res.entries_written == 0 and res.info.entries == 0 and res.info.first is None
    assert read_table(storage, "t1/A000099.parquet").num_rows == 0


def test_cancel_before_start_leaves_nothing(engine, storage):
    paths, _ = good_inputs(storage)
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(MergeCancelled):
        engine.merge(storage, request(paths), cancel=cancel)
    assert_nothing_left(storage, paths)


def test_cancel_at_first_progress_leaves_nothing(engine, storage):
    paths, _ = good_inputs(storage)
    cancel = threading.Event()
    with pytest.raises(MergeCancelled):
        engine.merge(storage, request(paths), cancel=cancel, progress=lambda d: cancel.set())
    assert_nothing_left(storage, paths)
    # the engine (and its SparkSession) still works afterwards
    res = engine.merge(storage, request(paths))
    assert res.entries_written > 0


@pytest.mark.spark
def test_cancel_stops_a_running_spark_job(spark_session, storage):
    """A merge big enough that its Spark task runs for a while is cancelled mid-task: the job
    group is cancelled, the merge returns promptly, and no part or temp file remains."""
    from kompaktor.engines.spark import SparkMergeEngine

    paths = generate(storage, 400_000, files=4)
    eng = SparkMergeEngine("local[2]", task_entries=10_000_000)  # one long task
    req = MergeRequest(
        inputs=tuple(paths),
        output="bench/A000001.parquet",
        prev=None,
        end=None,
        settings=IteratorSettings(),
        tmp_tag="ECID-cancel",
    )
    cancel = threading.Event()
    timer = threading.Timer(0.4, cancel.set)
    timer.start()
    t0 = time.monotonic()
    with pytest.raises(MergeCancelled):
        eng.merge(storage, req, cancel=cancel)
    took = time.monotonic() - t0
    timer.cancel()
    assert took < 30
    assert_nothing_left(storage, paths)
    tracker = spark_session.sparkContext.statusTracker()
    assert tracker.getActiveJobsIds() == []
    time.sleep(1.0)  # a killed task must not write a part after the cleanup
    assert_nothing_left(storage, paths)


@pytest.mark.spark
def test_spark_session_is_reused_across_merges(spark_session, storage):
    from kompaktor.engines import session as spark

    paths, _ = good_inputs(storage)
    a = make_engine("spark", spark_master="local[2]")
    app = spark_session.sparkContext.applicationId
    a.merge(storage, request(paths))
    b = make_engine("spark", spark_master="local[2]")
    storage.delete("t1/A000099.parquet")
    b.merge(storage, request(paths))
    assert a.session is b.session is spark.get_session("local[2]") is spark_session
    assert spark_session.sparkContext.applicationId == app


@pytest.mark.spark
def test_spark_merge_collects_nothing_but_summaries(spark_engine, storage, monkeypatch):
    """The driver sees one small dict per task from collect(), and never decodes or encodes an
    entry: the tasks' Parquet parts are copied into the output as they are (checked by spying on
    the driver's writer, which must not be called, and on the output's row groups: one or more
    per non-empty part)."""
    from kompaktor.engines import spark as sparkmerge
    from kompaktor.files.sortedfile import SortedFileWriter

    paths, _ = good_inputs(storage, 4)
    sizes: list[int] = []
    real = SortedFileWriter.write_table

    def spy(self, table, *, checked=False):
        sizes.append(table.num_rows)
        return real(self, table, checked=checked)

    monkeypatch.setattr(sparkmerge.SortedFileWriter, "write_table", spy)
    eng = sparkmerge.SparkMergeEngine("local[2]", task_entries=100)
    res = eng.merge(storage, request(paths))
    assert sizes == []  # the executors (other processes) wrote the parts; the driver only copied
    md = pq.ParquetFile(storage.path("t1/A000099.parquet")).metadata
    assert md.num_rows == res.entries_written and md.num_row_groups > 1


def test_the_spark_executors_storage_requests_are_in_the_compactors_count(spark_engine, storage):
    """``kompaktor_storage_requests_total`` of a compactor on the Spark engine (issue 38 §4): the
    executors (other processes) write the parts; their writes, opens and existence checks are in
    the driver's count, beside its own: the output written once and every part deleted."""
    from kompaktor.engines import spark as sparkmerge
    from kompaktor.files.storage import REQUESTS

    paths, _ = good_inputs(storage, 4)
    eng = sparkmerge.SparkMergeEngine("local[2]", task_entries=100)
    before = REQUESTS.snapshot()
    res = eng.merge(storage, request(paths))
    counted = {op: n - before[op] for op, n in REQUESTS.snapshot().items()}
    assert res.entries_written > 0
    # the driver writes the output alone: every other put is a part an executor wrote
    assert counted["put"] >= 3, counted
    assert counted["delete"] >= counted["put"] - 1, counted  # every part, deleted by the driver
    assert counted["get"] >= 2 * len(paths), counted  # the driver's footers and the executors' reads


def test_merge_request_validation():
    with pytest.raises(ValueError):
        MergeRequest(inputs=("a",), output="a", prev=None, end=None, settings=IteratorSettings(), tmp_tag="x")
    with pytest.raises(ValueError):
        MergeRequest(inputs=("a",), output="b", prev=b"z", end=b"a", settings=IteratorSettings(), tmp_tag="x")
    with pytest.raises(ValueError):
        MergeRequest(inputs=("a",), output="b", prev=None, end=None, settings=IteratorSettings(), tmp_tag="")
    with pytest.raises(ValueError):
        make_engine("polars")


# ---- kompaktor merge --------------------------------------------------------------------------


def _cli(args: list[str]):
    from kompaktor.cli import main

    return CliRunner().invoke(main, args, catch_exceptions=False)


@pytest.mark.parametrize("engine_name", ENGINES)
def test_cli_merge(tmp_path, engine_name, request):
    if engine_name == "spark":
        request.getfixturevalue("spark_session")
    srcs = [entries(i) for i in range(3)]
    store = Storage.from_uri(str(tmp_path))
    ins = []
    for i, src in enumerate(srcs):
        write_sorted(store, f"in{i}/F{i:06d}.parquet", src)
        ins.append(str(tmp_path / f"in{i}/F{i:06d}.parquet"))
    out = tmp_path / "out" / "merged.parquet"
    os.makedirs(out.parent)
    args = ["merge", *ins, "-o", str(out), "--partial", "--max-versions", "2", "--engine", engine_name]
    if engine_name == "spark":
        args += ["--spark-master", "local[2]"]
    r = _cli(args)
    assert r.exit_code == 0, r.output
    assert "entries/s" in r.output and "MB" in r.output
    expected = list(merged_view(srcs, IteratorSettings(max_versions=2, full=False)))
    assert list(table_to_entries(pq.read_table(out))) == expected
    r = _cli(["merge", *ins, "-o", str(out), "--engine", engine_name])
    assert r.exit_code != 0 and "exists" in r.output


@pytest.mark.parametrize("engine_name", ENGINES)
def test_cli_merge_bad_input(tmp_path, engine_name, request):
    if engine_name == "spark":
        request.getfixturevalue("spark_session")
    good = tmp_path / "F000001.parquet"
    bad = tmp_path / "F000002.parquet"
    write_sorted(Storage.from_uri(str(tmp_path)), good.name, entries(1))
    bad.write_bytes(b"PAR1 but not really")
    out = tmp_path / "A000003.parquet"
    r = _cli(["merge", str(good), str(bad), "-o", str(out), "--engine", engine_name, "--spark-master", "local[2]"])
    assert r.exit_code == 1
    assert "error:" in r.output and str(bad) in r.output
    assert sorted(os.listdir(tmp_path)) == ["F000001.parquet", "F000002.parquet"]
    r = _cli(["merge", str(tmp_path / "nope.parquet"), "-o", str(out), "--engine", "arrow"])
    assert r.exit_code == 1 and "not found" in r.output
