"""Issue 23 §1: the Arrow engine's range pipeline (:mod:`kompaktor.engines.pipeline`) reads
ranges in order and one at a time, works on them in parallel, hands them back in order, keeps
at most ``workers`` in flight, and stops at the first failure."""

from __future__ import annotations

import random
import threading
import time

import pytest

from kompaktor.engines.pipeline import run_ordered


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_read_in_order_results_in_order_bounded_in_flight(workers: int) -> None:
    lock = threading.Lock()
    reads: list[int] = []
    state = {"reading": 0, "in_flight": 0, "max_in_flight": 0, "max_working": 0, "working": 0}

    def read(i: int) -> int:
        with lock:
            state["reading"] += 1
            assert state["reading"] == 1, "two reads at once"
            state["in_flight"] += 1
            state["max_in_flight"] = max(state["max_in_flight"], state["in_flight"])
        time.sleep(random.random() / 500)
        reads.append(i)
        with lock:
            state["reading"] -= 1
        return i * 10

    def work(i: int, data: int) -> int:
        with lock:
            state["working"] += 1
            state["max_working"] = max(state["max_working"], state["working"])
        time.sleep(random.random() / 100)
        with lock:
            state["working"] -= 1
        return data + 1

    got = []
    for r in run_ordered(20, read, work, workers):
        got.append(r)
        with lock:
            state["in_flight"] -= 1  # consumed: no longer in flight
    assert got == [i * 10 + 1 for i in range(20)]
    assert reads == list(range(20))
    assert state["max_in_flight"] <= workers
    if workers > 1:
        assert state["max_working"] > 1, "never worked on two ranges at once"


def test_the_first_failure_in_range_order_is_raised_and_the_rest_stop() -> None:
    started: list[int] = []

    def read(i: int) -> int:
        started.append(i)
        if i == 3:
            raise ValueError("bad input at range 3")
        return i

    def work(i: int, data: int) -> int:
        if i == 5:
            raise RuntimeError("never reached: range 5 is not read after 3 failed")
        return data

    got = []
    with pytest.raises(ValueError, match="range 3"):
        for r in run_ordered(10, read, work, 3):
            got.append(r)
    assert got == [0, 1, 2]
    assert max(started) == 3


def test_closing_early_stops_the_threads() -> None:
    gen = run_ordered(100, lambda i: i, lambda i, d: d, 3, name="pipetest")
    assert next(gen) == 0
    gen.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("pipetest")]


def test_no_ranges() -> None:
    assert list(run_ordered(0, lambda i: i, lambda i, d: d, 2)) == []


def test_the_arrow_engine_runs_a_range_per_core_within_its_task_memory(monkeypatch) -> None:
    """One range in flight per core, at least 2, at most what the task memory holds (a planned
    range: RANGE_BYTES of data, held MERGE_FACTOR times)."""
    import os

    from kompaktor.engines import arrow
    from kompaktor.engines.ranges import MERGE_FACTOR, RANGE_BYTES

    one_range = MERGE_FACTOR * RANGE_BYTES
    for cores, memory, want in [(1, 4 << 30, 2), (2, 4 << 30, 2), (8, 4 << 30, 4), (8, 64 << 30, 8), (8, 1, 2)]:
        monkeypatch.setattr(os, "sched_getaffinity", lambda _pid, n=cores: set(range(n)), raising=False)
        assert arrow.default_workers(memory) == want, (cores, memory)
        assert arrow.ArrowMergeEngine(task_memory=memory).workers == want
    assert arrow.default_workers(4 * one_range) == 4
