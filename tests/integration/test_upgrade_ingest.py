"""The upgrade test's ingest and its record (tests/k8s/upgrade_ingest.py) on a real redis-server:
a clean run checks clean, and each planted violation — an acknowledged write lost, a deleted row
back, a row nobody wrote — is reported as such."""

from __future__ import annotations

from typing import Any

import pytest

from kompaktor.model.keys import Entry
from tests.k8s.upgrade_ingest import SPLITS, Ingest, Reference, row
from tests.support.wait import poll

pytestmark = pytest.mark.redis


@pytest.fixture
def ingest(store: Any, storage: Any) -> Ingest:
    from kompaktor.client import Client

    client = Client(store, storage)
    client.store.tables.create_table("t", [s.encode() for s in SPLITS])
    return Ingest(lambda e: client.flush("t", e), lambda: {e.row: e.value for e in client.scan("t")}, pace=0.01)


def test_a_clean_run_checks_clean_with_deletes_and_a_failed_flush(ingest: Ingest) -> None:
    real, failing = ingest.flush, [3]

    def flaky(entries: list[Entry]) -> object:
        if ingest.batches in failing:
            raise ConnectionError("planted: outcome unknown")
        return real(entries)

    ingest.flush = flaky
    ingest.start()
    poll(lambda: ingest.batches >= 30, "30 batches", timeout=60)
    ingest.stop()
    verdict = ingest.verify()
    assert verdict.clean, verdict
    assert ingest.ref.deletes and ingest.ref.unsure == {row(j, 3) for j in range(len(SPLITS) + 1)}
    assert len(ingest.verdicts) >= 2 and all(v.clean for v in ingest.verdicts)


def test_each_planted_violation_is_reported() -> None:
    ref = Reference(puts={b"a": b"1", b"b": b"2", b"c": b"3"}, deletes={b"b"}, unsure={b"u"})
    assert ref.check({b"a": b"1", b"c": b"3", b"u": b"x"}).clean
    assert ref.check({b"a": b"1"}).lost == [b"c"]
    assert ref.check({b"a": b"1", b"c": b"other"}).lost == [b"c"]
    assert ref.check({b"a": b"1", b"b": b"2", b"c": b"3"}).resurrected == [b"b"]
    assert ref.check({b"a": b"1", b"c": b"3", b"z": b"?"}).unknown == [b"z"]
    assert ref.check({b"a": b"1", b"c": b"3", b"z": b"?"}, later=[b"z"]).clean
