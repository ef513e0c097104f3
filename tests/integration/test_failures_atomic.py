"""Failure bookkeeping is atomic (issue 15 §7), against a real redis-server: concurrent failures
of the same job each count, and crossing the dead-letter threshold happens exactly once per
threshold's worth of failures."""

from __future__ import annotations

import threading

import pytest

from kompaktor.metadata import failures
from kompaktor.metadata.store import MetadataStore
from kompaktor.model.job import fingerprint

pytestmark = pytest.mark.redis


def hammer(redis_url: str, clients: int, each: int, max_attempts: int) -> list[bool]:
    out: list[bool] = []
    gate = threading.Barrier(clients)

    def one() -> None:
        s = MetadataStore.from_url(redis_url)
        gate.wait()
        for _ in range(each):
            out.append(failures.record_failure(s, "1;~", ["a", "b"], "g", "boom", max_attempts=max_attempts))
        s.close()

    threads = [threading.Thread(target=one) for _ in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    return out


def test_concurrent_failures_all_count(store: MetadataStore, redis_url: str) -> None:
    hammer(redis_url, 8, 50, max_attempts=10_000)
    rec = store.running.failure(fingerprint("1;~", ["a", "b"]))
    assert rec is not None and rec.count == 400 and rec.redirtied is False


def test_dead_letter_threshold_crossed_once_per_threshold(store: MetadataStore, redis_url: str) -> None:
    results = hammer(redis_url, 8, 25, max_attempts=50)  # 200 failures = 4 times the threshold
    assert sum(results) == 4 and store.bookkeeping.counters()["dead_lettered"] == 4
    assert store.running.failure(fingerprint("1;~", ["a", "b"])) is None
    (dl,) = store.running.dead_letters().values()
    assert dl.count == 50 and dl.group == "g"
    # due retries are marked dirty once, atomically
    failures.record_failure(store, "1;~", ["c"], "g", "x", base_backoff_s=0.0)
    assert failures.redirty_due(store) == ["1;~"] and failures.redirty_due(store) == []
