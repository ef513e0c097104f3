"""The demo's and soak's workload mix (kompaktor.local.mix, issue 33 §4) on a real redis-server:
its actions interleaved with full compactions keep its reference view, and its check is one that
can fail — under Accumulo's semantics (opted into) an old import after a full compaction shows
a deleted key again, and the check counts it."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from kompaktor.client import Client
from kompaktor.engines import make_engine
from kompaktor.engines.api import MergeRequest
from kompaktor.local.mix import MixedWorkload, now_ms
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


# -- the check fails on each planted anomaly (docs/verification.md) --------------------------------
@pytest.fixture
def mixed(client: Client, tmp_path: Path) -> MixedWorkload:
    """A real mix run with full compactions committed, checked clean before anything is planted."""
    mix = MixedWorkload(client, "mix", tmp_path, seed=3, keys=60)
    mix.ucomp = "none"
    mix._user_compaction = lambda: None  # type: ignore[method-assign]
    for i in range(40):
        mix.step()
        if i % 4 == 3:
            compact_all(client, "mix")
    check = mix.check()
    assert check.ok and not check.findings and check.keys > 3, check
    return mix


def _visible(mix: MixedWorkload) -> tuple[bytes, tuple[int, bytes]]:
    row, want = sorted(mix.reference().items())[0]
    return row, want


def _rewrite(client: Client, row: bytes, ts: int, change) -> str:  # type: ignore[no-untyped-def]
    """Rewrite in storage the file holding ``row``'s put at ``ts`` (a bug's doing); its name."""
    for t in client.store.tables.tablets(client.store.tables.table_id("mix")):
        for f in sorted(t.files):
            path = client.storage.path(f)
            table = pq.read_table(path)
            hit = pc.and_(pc.equal(table.column("row"), pa.scalar(row, pa.binary())), pc.equal(table.column("ts"), ts))
            if pc.any(hit).as_py():
                pq.write_table(change(table, hit), path)
                return f
    raise AssertionError(f"no file holds {row!r} at {ts}")


def _set(table: pa.Table, hit: pa.Array, column: str, new: object) -> pa.Table:
    col = table.column(column)
    values = [new if h else v for h, v in zip(hit.to_pylist(), col.to_pylist(), strict=True)]
    return table.set_column(table.schema.get_field_index(column), column, pa.array(values, col.type))


def test_the_check_sees_a_lost_write(mixed: MixedWorkload) -> None:
    row, (ts, _v) = _visible(mixed)
    _rewrite(mixed.client, row, ts, lambda t, hit: t.filter(pc.invert(hit)))
    c = mixed.check()
    assert not c.ok and c.missing >= 1
    assert any(f.startswith(f"key {row.decode()}: expected ts {ts}") for f in c.findings), c.findings


def test_the_check_sees_a_changed_value(mixed: MixedWorkload) -> None:
    row, (ts, _v) = _visible(mixed)
    _rewrite(mixed.client, row, ts, lambda t, hit: _set(t, hit, "value", b"changed"))
    c = mixed.check()
    assert not c.ok and c.wrong == 1 and f"scan shows ts {ts} value b'changed'" in " ".join(c.findings)


def test_the_check_sees_an_older_version_shown_as_newest(mixed: MixedWorkload) -> None:
    """The newest put's file shows it older than an older put of the key (written here first)."""
    row, (ts, _v) = _visible(mixed)
    newer = now_ms() + 1000  # past every delete horizon
    mixed._write([(row, newer, False)], "flush")  # acknowledged: now the newest
    assert mixed.check().ok and mixed.reference()[row][0] == newer
    _rewrite(mixed.client, row, newer, lambda t, hit: _set(t, hit, "ts", ts - 1))
    c = mixed.check()
    assert not c.ok and c.wrong == 1 and f"key {row.decode()}: expected ts {newer}" in " ".join(c.findings)


def test_the_check_sees_a_referenced_file_deleted(mixed: MixedWorkload) -> None:
    t = next(t for t in mixed.client.store.tables.tablets(mixed.client.store.tables.table_id("mix")) if t.files)
    gone = sorted(t.files)[0]
    mixed.client.storage.delete(gone)
    c = mixed.check()
    assert (
        not c.ok and c.missing_files == 1 and c.findings[0] == f"file {gone} of tablet {t.id} is referenced but missing"
    )


def test_an_uncertain_key_is_settled_by_the_next_write_that_decides_it(client: Client, tmp_path: Path) -> None:
    """Uncertain only until an acknowledged write decides the key's view: a delete as new as every
    unknown write, or a newer put when no unknown write was a delete; the rest stays uncertain and
    counts against the soak's bound."""
    mix = MixedWorkload(client, "mix", tmp_path, seed=3, keys=10)
    a, b, c = mix.pool[:3]
    for row, deleted in ((a, False), (b, True), (c, False)):
        mix._unknown(row, 100, deleted)
    mix._write([(a, 101, False)], "flush")  # decides a: the newest put whatever happened at 100
    mix._write([(b, 101, False)], "flush")  # not b: an unknown delete at 100 may hide an old put
    assert set(mix.uncertain) == {b, c}
    mix._write([(b, 100, True), (c, 100, True)], "flush")  # deletes at 100 hide every unknown write
    check = mix.check()
    assert not mix.uncertain and check.ok and check.uncertain == 0 and check.uncertain_ok
    mix._unknown(a, 200, False)
    check = mix.check()
    assert check.uncertain == 1 and check.checked == 3 and not check.uncertain_ok
