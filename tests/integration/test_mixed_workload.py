"""The demo's and soak's workload mix (kompaktor.local.mix, issue 33 §4) on a real redis-server:
its actions interleaved with full compactions keep its reference view, and its check is one that
can fail — under Accumulo's semantics (opted into) an old import after a full compaction shows
a deleted key again, and the check counts it."""

from __future__ import annotations

from pathlib import Path

import pytest

from kompaktor.client import Client
from kompaktor.engines import make_engine
from kompaktor.engines.api import MergeRequest
from kompaktor.local.mix import MixedWorkload
from kompaktor.metadata import compactions
from kompaktor.model.errors import ConditionFailed
from kompaktor.model.job import Job

pytestmark = pytest.mark.redis
ENGINE = make_engine("arrow")


def compact_all(client: Client, table: str) -> None:
    """A full compaction of every tablet with files, run to its commit in this process."""
    for t in client.store.tables.tablets(client.store.tables.table_id(table)):
        if not t.files or t.running or t.selection is not None or t.hold:
            continue
        job = Job(t.id, "SYSTEM", 1, "test", {f: m.size for f, m in t.files.items()})
        try:
            res = compactions.try_reserve(client.store, job, "mix-test", "test")
        except ConditionFailed:
            continue
        out = ENGINE.merge(
            client.storage, MergeRequest(res.inputs, res.output, res.prev, res.end, res.settings, res.ecid)
        )
        try:
            compactions.commit(client.store, res, out.info)
        except ConditionFailed:
            compactions.release(client.store, client.storage, res)


def test_the_mix_keeps_its_reference_view(client: Client, tmp_path: Path) -> None:
    mix = MixedWorkload(client, "mix", tmp_path, seed=3, keys=60)
    mix.ucomp = "none"  # user compactions need a coordinator: not in this test
    mix._user_compaction = lambda: None  # type: ignore[method-assign]
    for i in range(80):
        mix.step()
        if i % 4 == 3:
            compact_all(client, "mix")
    check = mix.check()
    assert check.ok, check
    assert check.keys > 0 and check.uncertain == 0
    assert check.refused > 0, "no write met a delete horizon: the mix did not exercise it"


def test_the_check_sees_a_resurrection(client: Client, tmp_path: Path) -> None:
    client.store.tables.create_table("acc")  # a table that exists is used as it is
    client.store.tables.set_props("acc", {"table.delete.semantics": "accumulo"})
    mix = MixedWorkload(client, "acc", tmp_path, seed=5, keys=20)
    row = mix.pool[0]
    mix._write([(row, 100, False)], "flush")
    mix._write([(row, 200, True)], "flush")
    compact_all(client, "acc")  # the marker is dropped
    mix._write([(row, 150, False)], "import")  # accepted: the table asked for Accumulo's semantics
    assert mix.check().resurrected == 1
