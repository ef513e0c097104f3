"""Long merges resume instead of restarting (issue 23 §2), on a real redis-server, with both
engines (Arrow in-process, Spark local mode).

A merge interrupted after k of its n key ranges leaves k recorded, verified parts; a retry of the
same job (new ECID, new output name) reuses them, merges only the other n−k ranges (the entries
and input bytes it re-read are asserted from its report), and writes an output whose merged view
is identical — and whose bytes are identical — to an uninterrupted merge's. A recorded part that
no longer verifies is merged again, never trusted.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kompaktor.engines.api import MergeCancelled, MergeRequest, MergeResult
from kompaktor.engines.arrow import ArrowMergeEngine
from kompaktor.files.sortedfile import entries_to_table, read_table, write_sorted
from kompaktor.files.storage import Storage
from kompaktor.metadata import progress as records
from kompaktor.metadata.store import MetadataStore
from kompaktor.model.iterators import IteratorSettings, merged_view
from kompaktor.model.keys import Entry, sort_key
from kompaktor.model.names import TMP_PREFIX
from kompaktor.model.resume import job_fingerprint
from kompaktor.policy.services import DEFAULT_RESUME_MIN_BYTES

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]

ENGINES = ["arrow", pytest.param("spark", marks=pytest.mark.spark)]
RANGE_ENTRIES = 1500
ROW_GROUP = 200
TABLE_DIR = "tables/t1"
SETTINGS = IteratorSettings(max_versions=2, full=False, now_ms=1_000)


@pytest.fixture(params=ENGINES)
def engine(request):
    if request.param == "spark":
        request.getfixturevalue("spark_session")
        from kompaktor.engines.spark import SparkMergeEngine

        from .conftest import SPARK_MASTER

        return SparkMergeEngine(SPARK_MASTER, task_entries=RANGE_ENTRIES, warm=False, resume_min_bytes=0)
    return ArrowMergeEngine(range_entries=RANGE_ENTRIES, resume_min_bytes=0)


def source(seed: int, n: int = 3000) -> list[Entry]:
    """Random rows of 6 bytes (some >= 0x80), versions across files, 5% delete markers."""
    rng = np.random.default_rng(seed)
    out = {}
    for _ in range(n):
        row = b"r" + bytes(rng.integers(0, 256, size=5, dtype=np.uint8))
        cq = bytes([int(rng.integers(0, 3))])
        ts = int(rng.integers(0, 1000))
        deleted = bool(rng.random() < 0.05)
        out[(row, cq, ts)] = Entry(row, b"f", cq, b"", ts, deleted, b"" if deleted else b"v%d" % seed)
    return sorted(out.values(), key=sort_key)


@pytest.fixture
def inputs(storage: Storage) -> tuple[list[str], list[list[Entry]]]:
    srcs = [source(i) for i in range(4)]
    paths = []
    os.makedirs(storage.path(TABLE_DIR), exist_ok=True)
    for i, src in enumerate(srcs):
        p = f"{TABLE_DIR}/F{i:010x}-{i:016x}.parquet"
        # small row groups, so that a key range decodes only its share of an input
        pq.write_table(entries_to_table(src), storage.path(p), row_group_size=ROW_GROUP, compression="zstd")
        paths.append(p)
    return paths, srcs


def fingerprint(storage: Storage, paths: list[str], settings: IteratorSettings = SETTINGS) -> str:
    return job_fingerprint("t1;", None, None, {p: storage.size(p) for p in paths}, "SYSTEM", None, settings)


def req(paths: list[str], out: str, tag: str, log=None, settings: IteratorSettings = SETTINGS) -> MergeRequest:
    return MergeRequest(tuple(paths), f"{TABLE_DIR}/{out}", None, None, settings, tag, resume=log)


def digest(storage: Storage, rel: str) -> str:
    with storage.open_input(rel) as f:
        return hashlib.sha256(f.read()).hexdigest()


def view(storage: Storage, rel: str) -> pa.Table:
    return read_table(storage, rel)


def temp_files(storage: Storage) -> list[str]:
    return sorted(rel for rel, _ in storage.list_files("tables") if rel.rsplit("/", 1)[-1].startswith(TMP_PREFIX))


def interrupt(engine, storage: Storage, paths: list[str], log, k: int, tag: str = "ECID-00000000000000a1") -> None:
    """Run the merge and cancel it once k parts are done (recorded)."""
    import threading

    cancel = threading.Event()

    def on_progress(p: dict) -> None:
        if p["parts_done"] >= min(k, p["parts"]):
            cancel.set()

    with pytest.raises(MergeCancelled):
        engine.merge(storage, req(paths, "A01.parquet", tag, log), progress=on_progress, cancel=cancel)


def uninterrupted(engine, store, storage, paths) -> MergeResult:
    """The reference: the same job merged in one go, resumable (parts, then concatenated)."""
    fp = fingerprint(storage, paths)
    log = records.RedisResumeLog(store, "ref" + fp[3:], "t1;", tuple(paths))
    result = engine.merge(storage, req(paths, "A00.parquet", "ECID-00000000000000f0", log))
    assert result.resumable and result.parts_reused == 0
    records.finish(store, storage, log.fingerprint, result.parts)
    return result


@pytest.mark.parametrize("k", [1, 3])
def test_interrupted_merge_resumes_only_the_unfinished_ranges(
    engine, store: MetadataStore, storage: Storage, inputs, k: int
) -> None:
    paths, srcs = inputs
    ref = uninterrupted(engine, store, storage, paths)
    assert temp_files(storage) == []
    fp = fingerprint(storage, paths)
    log = records.RedisResumeLog(store, fp, "t1;", tuple(paths))
    interrupt(engine, storage, paths, log, k)
    state = records.RedisResumeLog(store, fp, "t1;", tuple(paths)).load()
    assert state is not None and sorted(state.parts) == list(range(k))
    n = len(state.cuts)
    assert n >= 5, f"the test wants several ranges, got {n}"
    # the interrupted attempt left its recorded parts and nothing else (no output, no temp output)
    assert temp_files(storage) == sorted(p.path for p in state.parts.values())
    assert not storage.exists(f"{TABLE_DIR}/A01.parquet")

    reports: list[dict] = []
    retry = records.RedisResumeLog(store, fp, "t1;", tuple(paths))
    got = engine.merge(storage, req(paths, "A02.parquet", "ECID-00000000000000b2", retry), progress=reports.append)

    # only n - k ranges merged: k parts reused, their entries and input bytes not read again
    assert got.parts_reused == k and reports[0]["parts_done"] == k and reports[0]["parts_reused"] == k
    reused_entries = sum(p.entries_read for p in state.parts.values())
    assert got.entries_reused == reused_entries > 0
    assert got.entries_read + got.entries_reused == ref.entries_read
    assert got.bytes_reused == sum(p.input_bytes for p in state.parts.values()) > 0
    # re-read: at most the unfinished share, plus the row groups that straddle the first cut
    share = (n - k) / n
    assert got.input_bytes_reread < ref.input_bytes_reread
    assert got.input_bytes_reread <= ref.input_bytes_reread * share * 1.5
    print(
        f"\n{engine.name} k={k}/{n}: input bytes re-read {got.input_bytes_reread} of {ref.input_bytes_reread} "
        f"({got.input_bytes_reread / ref.input_bytes_reread:.0%}; unfinished share {share:.0%}), "
        f"entries re-read {got.entries_read} of {ref.entries_read}"
    )
    # identical output: the merged view, the file's bytes, and the merged view of the inputs
    assert view(storage, got.info.path).equals(view(storage, ref.info.path))
    assert digest(storage, got.info.path) == digest(storage, ref.info.path)
    expected = entries_to_table(list(merged_view(srcs, SETTINGS)))
    assert view(storage, got.info.path).equals(expected)
    # after the commit (here: finish) nothing of the job is left
    records.finish(store, storage, fp, got.parts)
    assert temp_files(storage) == []
    assert records.RedisResumeLog(store, fp, "t1;", tuple(paths)).load() is None
    assert records.records(store) == {}


def test_a_merge_stopped_after_its_last_part_resumes_without_merging(
    engine, store: MetadataStore, storage: Storage, inputs
) -> None:
    """Every range recorded, the process stopped before the output was complete: the retry only
    appends the parts (no range merged, no input row group decoded)."""
    paths, _srcs = inputs
    ref = uninterrupted(engine, store, storage, paths)
    fp = fingerprint(storage, paths)
    interrupt(engine, storage, paths, records.RedisResumeLog(store, fp, "t1;", tuple(paths)), 10**6)
    state = records.RedisResumeLog(store, fp, "t1;", tuple(paths)).load()
    assert state is not None and len(state.parts) == len(state.cuts)
    retry = records.RedisResumeLog(store, fp, "t1;", tuple(paths))
    got = engine.merge(storage, req(paths, "A02.parquet", "ECID-00000000000000b2", retry))
    assert got.parts_reused == len(state.cuts) and got.entries_read == 0 and got.input_bytes_reread == 0
    assert digest(storage, got.info.path) == digest(storage, ref.info.path)
    records.finish(store, storage, fp, got.parts)
    assert temp_files(storage) == []


def test_a_corrupted_recorded_part_is_merged_again(engine, store: MetadataStore, storage: Storage, inputs) -> None:
    paths, _srcs = inputs
    ref = uninterrupted(engine, store, storage, paths)
    fp = fingerprint(storage, paths)
    interrupt(engine, storage, paths, records.RedisResumeLog(store, fp, "t1;", tuple(paths)), 3)
    state = records.RedisResumeLog(store, fp, "t1;", tuple(paths)).load()
    assert state is not None and len(state.parts) == 3
    bad = state.parts[1].path
    part = Path(storage.path(bad))
    raw = bytearray(part.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # one flipped byte in the column data: same size, wrong checksum
    part.write_bytes(bytes(raw))

    reports: list[dict] = []
    retry = records.RedisResumeLog(store, fp, "t1;", tuple(paths))
    got = engine.merge(storage, req(paths, "A02.parquet", "ECID-00000000000000b2", retry), progress=reports.append)
    assert got.parts_reused == 2 and reports[-1]["parts_rejected"] == 1
    assert not storage.exists(bad)  # the damaged part is gone, its range merged again
    assert digest(storage, got.info.path) == digest(storage, ref.info.path)
    state2 = records.RedisResumeLog(store, fp, "t1;", tuple(paths)).load()
    assert state2 is not None and state2.parts[1].path != bad and len(state2.parts) == len(state2.cuts)
    records.finish(store, storage, fp, got.parts)
    assert temp_files(storage) == []


def test_a_changed_job_does_not_match_the_recorded_progress(
    engine, store: MetadataStore, storage: Storage, inputs
) -> None:
    """An input replaced (another file, or the same name with other bytes) or other iterator
    settings give another fingerprint: the retry merges every range."""
    paths, _srcs = inputs
    fp = fingerprint(storage, paths)
    interrupt(engine, storage, paths, records.RedisResumeLog(store, fp, "t1;", tuple(paths)), 2)
    # the newest input rewritten under the same name (a different size)
    storage.delete(paths[-1])
    write_sorted(storage, paths[-1], entries_to_table(source(99, 2000)))
    fp2 = fingerprint(storage, paths)
    assert fp2 != fp
    assert fingerprint(storage, paths, IteratorSettings(max_versions=1, full=False, now_ms=1_000)) != fp2
    assert fingerprint(storage, paths, IteratorSettings(max_versions=2, full=False, now_ms=9_999)) == fp2
    got = engine.merge(
        storage,
        req(paths, "A02.parquet", "ECID-00000000000000b2", records.RedisResumeLog(store, fp2, "t1;", tuple(paths))),
    )
    assert got.parts_reused == 0 and got.entries_reused == 0
    records.finish(store, storage, fp2, got.parts)
    # the old record is still there (its job is gone: the coordinator's prune drops it, see
    # test_worker_resume); discarding it removes its parts
    assert records.discard(store, storage, fp) and temp_files(storage) == []


@pytest.mark.parametrize("kind", ENGINES)
def test_a_small_merge_is_not_resumable(request, kind: str, store: MetadataStore, storage: Storage, inputs) -> None:
    """Below its group's resume_min_bytes (the 1 GiB default) an engine runs as before (Arrow
    streams into the output, Spark deletes each part once appended): no record, no part left."""
    paths, _srcs = inputs
    if kind == "spark":
        request.getfixturevalue("spark_session")
        from kompaktor.engines.spark import SparkMergeEngine

        from .conftest import SPARK_MASTER

        eng = SparkMergeEngine(
            SPARK_MASTER, task_entries=RANGE_ENTRIES, warm=False, resume_min_bytes=DEFAULT_RESUME_MIN_BYTES
        )
    else:
        eng = ArrowMergeEngine(range_entries=RANGE_ENTRIES, resume_min_bytes=DEFAULT_RESUME_MIN_BYTES)
    fp = fingerprint(storage, paths)
    got = eng.merge(
        storage, req(paths, "A02.parquet", "ECID-00000000000000b2", records.RedisResumeLog(store, fp, "t1;", ()))
    )
    assert not got.resumable and got.parts == () and got.parts_reused == 0
    assert records.records(store) == {} and temp_files(storage) == []


def test_a_spark_task_run_again_after_publishing_its_part_leaves_it_as_it_was(storage: Storage, inputs) -> None:
    """A resumable merge keeps its parts until the commit: a task Spark runs a second time (a
    retry after its result was lost) finds its part published — the same range, the same bytes —
    and succeeds without touching it."""
    from kompaktor.engines.spark import _run_ranges

    paths, _srcs = inputs
    name = f"{TABLE_DIR}/{TMP_PREFIX}RES-{'0' * 32}_ECID-00000000000000c3.p00000.parquet"
    task = (0, None, b"r\x80", name)
    [first] = _run_ranges(storage, tuple(paths), SETTINGS, "ECID-00000000000000c3", 1 << 30, (task,))
    before = digest(storage, name)
    [again] = _run_ranges(storage, tuple(paths), SETTINGS, "ECID-00000000000000c3", 1 << 30, (task,))
    assert again == first and "error" not in again
    assert digest(storage, name) == before and temp_files(storage) == [name]
