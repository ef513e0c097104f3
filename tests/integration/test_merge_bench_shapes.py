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
