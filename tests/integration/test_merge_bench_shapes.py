"""The merge bench's key shapes (issue 37 §1): each one generates sorted inputs of its kind,
and the engine's output equals the peers' on it (the bench's own equality check, on small data)."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kompaktor.engines.api import MergeRequest
from kompaktor.engines.arrow import ArrowMergeEngine
from kompaktor.files.sortedfile import check_sorted
from kompaktor.files.storage import Storage
from kompaktor.model.iterators import IteratorSettings
from tests.support.mergeinputs import SHAPES, generate, parse_shapes, pyarrow_sort, same_entries


@pytest.mark.parametrize("name", list(SHAPES))
def test_each_shape_generates_sorted_inputs_the_engine_merges_as_the_peer(tmp_path, name):
    storage = Storage.from_uri(str(tmp_path))
    shape = SHAPES[name]
    paths = generate(storage, 4_000 // shape.entries_div, 4, shape=shape)
    tables = [pq.read_table(storage.path(p)) for p in paths]
    for p, t in zip(paths, tables, strict=True):
        check_sorted(t, p)
    rows = [(t.column("row")[0].as_py(), t.column("row")[-1].as_py()) for t in tables]
    if shape.disjoint:  # each file a key range of its own
        assert all(a[1] < b[0] for a, b in itertools.pairwise(rows))
    else:
        assert any(a[1] > b[0] for a, b in itertools.pairwise(rows))
    req = MergeRequest(
        inputs=tuple(paths),
        output="out/arrow.parquet",
        prev=None,
        end=None,
        settings=IteratorSettings(max_versions=1, full=True),
        tmp_tag="t",
    )
    ArrowMergeEngine(range_entries=500).merge(storage, req)
    pyarrow_sort(storage, paths, "out/pyarrow.parquet")
    assert same_entries(storage, "out/arrow.parquet", "out/pyarrow.parquet")


ROOT = Path(__file__).resolve().parents[2]


def test_an_unknown_shape_is_refused_in_one_line():
    with pytest.raises(SystemExit, match=r"unknown shape.*nope; known: base"):
        parse_shapes("base,nope")
    assert [s.name for s in parse_shapes("all")] == list(SHAPES)


def test_merge_kernels_agree_on_every_shape():
    """``bench.merge_kernels`` (issue 37 §2) on small data: every candidate's merged order is
    Arrow's sort's, and the merge step's output before and after the merge is the same. Run as
    the command it is (the tests never import the benchmarks)."""
    args = ["--entries", "4000", "--range", "1000", "--repeat", "1", "--no-datafusion"]
    run = subprocess.run(
        [sys.executable, "-m", "bench.merge_kernels", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-2000:]
    out = run.stdout
    assert "| deletes |" in out
    assert "WRONG" not in out and "DIFFERS" not in out


def test_the_issue_46_shapes_look_as_described(tmp_path):
    """hexonerg: 16 hex digits, 4 families x 16 qualifiers; timeseries: ``sensor/NNNNNN/HHMMSS``
    with 24 qualifiers of 8-byte values, every file across the whole row space; edges: each file
    the next stretch of keys, overlapping the one before; uuiddocs: 36-byte UUIDs, 200-byte values."""
    storage = Storage.from_uri(str(tmp_path))

    def files(name: str) -> list:
        return [pq.read_table(storage.path(p)) for p in generate(storage, 8_000, 4, shape=SHAPES[name])]

    hexes = pa_concat(files("hexonerg"))
    assert all(len(r) == 16 and all(c in b"0123456789abcdef" for c in r) for r in hexes.column("row").to_pylist())
    assert len(set(hexes.column("cf").to_pylist())) == 4 and len(set(hexes.column("cq").to_pylist())) == 16
    series = files("timeseries")
    for t in series:
        rows = t.column("row").to_pylist()
        assert all(len(r) == 20 and r.startswith(b"sensor/") and r[13:14] == b"/" for r in rows)
        assert int(rows[-1][14:16]) < 24 and int(rows[-1][16:18]) < 60
    assert len({t.column("row")[0].as_py() for t in series}) <= 2  # each file starts at the space's start
    assert max(len(v) for v in series[0].column("value").to_pylist()) == 8
    edges = files("edges")
    spans = [(t.column("row")[0].as_py(), t.column("row")[-1].as_py()) for t in edges]
    assert all(a[0] < b[0] <= a[1] < b[1] for a, b in itertools.pairwise(spans))
    docs = pa_concat(files("uuiddocs"))
    assert all(len(r) == 36 and r.count(b"-") == 4 for r in docs.column("row").to_pylist())
    assert max(len(v) for v in docs.column("value").to_pylist()) == 200


def pa_concat(tables: list):
    import pyarrow as pa

    return pa.concat_tables(tables)


def test_a_profiled_merge_times_every_phase_and_an_unprofiled_one_nothing(tmp_path):
    """Issue 46: under ``profiling()`` the Arrow engine's merge adds thread and CPU seconds to each
    of its phases (on every thread); outside it, ``phase`` is a no-op and nothing is recorded.
    The output is the same either way."""
    from kompaktor.files.phases import phase, profiling

    storage = Storage.from_uri(str(tmp_path))
    paths = generate(storage, 20_000, 4, shape=SHAPES["timeseries"])

    def merge(out: str) -> None:
        req = MergeRequest(
            inputs=tuple(paths),
            output=out,
            prev=None,
            end=None,
            settings=IteratorSettings(max_versions=1, full=True),
            tmp_tag="t",
        )
        ArrowMergeEngine(range_entries=4_000, copy_through=False).merge(storage, req)

    with profiling() as clock:
        merge("out/profiled.parquet")
    assert {"plan", "read", "merge", "take", "encode", "write", "wait"} <= set(clock.seconds)
    assert set(clock.cpu) == set(clock.seconds) and all(v >= 0 for v in clock.cpu.values())
    assert clock.calls["encode"] >= 5  # one per range
    before = dict(clock.seconds)
    merge("out/plain.parquet")  # no longer profiling: the clock of the block is left alone
    assert clock.seconds == before
    assert phase("read") is phase("merge")  # the shared no-op context, nothing timed
    assert same_entries(storage, "out/profiled.parquet", "out/plain.parquet")


def test_the_bench_profiles_a_shape():
    """``bench.merge_bench --profile`` on small data prints each phase beside its floor and
    Polars' steps. Run as the command it is (the tests never import the benchmarks)."""
    args = ["--profile", "--entries", "20000", "--shapes", "edges"]
    run = subprocess.run(
        [sys.executable, "-m", "bench.merge_bench", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-2000:]
    out = run.stdout
    assert "profile edges x small" in out
    for text in ("read", "merge", "encode", "decode all columns", "encode output", "I/O floor", "sort+unique", "load"):
        assert text in out
