"""Every verifier is shown to fail (docs/verification.md): one anomaly of each kind is planted into
a real run — continuous ingest on a real redis-server, real Arrow compactions committed — and the
demo's scan verification must say no and name what it found. Planted by hand, the way a bug would
leave them: a row taken out of a stored file (a lost acknowledged write), a value changed into
another existing row or emptied into a chain's head, an acknowledged newer version whose file
shows an older one, a deleted row put back behind the horizon's back, a referenced file deleted.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from kompaktor.client import Client
from kompaktor.engines import make_engine
from kompaktor.engines.api import MergeRequest
from kompaktor.local.ingest import CF, CQ, EPHEMERAL_CF, ContinuousIngest, split_points, verify
from kompaktor.metadata import compactions
from kompaktor.model.job import Job
from kompaktor.model.keys import Entry

pytestmark = pytest.mark.redis

TABLE = "ci"


def _compact_all(client: Client) -> int:
    """A full compaction of every tablet with files, committed; how many committed."""
    n = 0
    for t in client.store.tables.tablets(client.store.tables.table_id(TABLE)):
        if not t.files:
            continue
        job = Job(t.id, "SYSTEM", 1, "test", {f: m.size for f, m in t.files.items()})
        res = compactions.try_reserve(client.store, job, "verifier-test", "test")
        result = make_engine("arrow").merge(
            client.storage, MergeRequest(res.inputs, res.output, res.prev, res.end, res.settings, res.ecid)
        )
        compactions.commit(client.store, res, result.info)
        n += 1
    return n


@pytest.fixture
def run(client: Client, tmp_path: Path) -> ContinuousIngest:
    """A real run: flushes (with ephemeral rows written and deleted), a bulk import, compactions
    committed, more flushes; verified clean before anything is planted."""
    client.store.tables.create_table(TABLE, split_points(2))
    ing = ContinuousIngest(client, TABLE, batch=60, chain=7, ephemeral=5)
    for _ in range(6):
        ing.flush_once()
    ing.import_burst(40, 2, tmp_path / "burst")
    #: rows whose delete markers the compactions drop: only the horizon keeps them deleted
    ing.dropped = set(ing.stats.ephemeral_deleted)  # type: ignore[attr-defined]
    assert _compact_all(client) == 2
    for _ in range(5):
        ing.flush_once()
    v = verify(client, TABLE, ing.stats)
    assert v.ok and not v.findings, v
    assert ing.stats.ephemeral_deleted and ing.stats.ephemeral_live
    return ing


def _rewrite(client: Client, match: Callable[[pa.Table], pa.Array], change: Callable[[pa.Table], pa.Table]) -> str:
    """Rewrite, in place in storage, the first referenced file holding a row ``match`` selects,
    as ``change`` makes it (the bug under test); returns the file."""
    for t in client.store.tables.tablets(client.store.tables.table_id(TABLE)):
        for f in sorted(t.files):
            path = client.storage.path(f)
            table = pq.read_table(path)
            if pc.any(match(table)).as_py():
                pq.write_table(change(table), path)
                return f
    raise AssertionError("no file holds the row to plant the anomaly on")


def _linked(ing: ContinuousIngest, value: Callable[[bytes], bool]) -> bytes:
    """A linked row acknowledged with a value ``value`` accepts."""
    return next(r for r in sorted(ing.stats.written) if value(_value_of(ing, r)))


def _value_of(ing: ContinuousIngest, row: bytes) -> bytes:
    got = [e.value for e in ing.client.scan(TABLE, row, row) if e.cf == CF]
    return got[0]


def _set(table: pa.Table, row: bytes, column: str, new: object) -> pa.Table:
    idx = table.schema.get_field_index(column)
    values = table.column(column).to_pylist()
    rows = table.column("row").to_pylist()
    cf = table.column("cf").to_pylist()
    values = [new if r == row and c == CF else v for r, c, v in zip(rows, cf, values, strict=True)]
    return table.set_column(idx, column, pa.array(values, table.schema.field(column).type))


def _is_row(row: bytes) -> Callable[[pa.Table], pa.Array]:
    return lambda t: pc.and_(
        pc.equal(t.column("row"), pa.scalar(row, pa.binary())), pc.equal(t.column("cf"), pa.scalar(CF, pa.binary()))
    )


def test_a_clean_run_verifies(run: ContinuousIngest) -> None:
    v = verify(run.client, TABLE, run.stats)
    assert v.ok and v.entries == v.expected == len(run.stats.written) > 500


def test_a_lost_acknowledged_write_is_found(run: ContinuousIngest) -> None:
    row = _linked(run, lambda v: v == b"")  # a chain's head: no other row names it
    _rewrite(run.client, _is_row(row), lambda t: t.filter(pc.invert(_is_row(row)(t))))
    v = verify(run.client, TABLE, run.stats)
    assert not v.ok and f"row {row.decode()} acknowledged, not found" in v.findings


@pytest.mark.parametrize("into", ["another existing row", "a chain's head"])
def test_a_changed_value_is_found(run: ContinuousIngest, into: str) -> None:
    row = _linked(run, lambda v: v != b"")
    new = b"" if into == "a chain's head" else next(r for r in sorted(run.stats.written) if r != _value_of(run, row))
    _rewrite(run.client, _is_row(row), lambda t: _set(t, row, "value", new))
    v = verify(run.client, TABLE, run.stats)
    assert not v.ok and v.changed == 1 and v.undefined == 0, v
    assert any(f.startswith(f"row {row.decode()} shown with") for f in v.findings), v.findings


def test_an_older_version_shown_as_newest_is_found(run: ContinuousIngest) -> None:
    """A newer version of a row is acknowledged; its file then shows it older than the first one,
    so the scan shows the first (older) version as the newest."""
    row = _linked(run, lambda v: v != b"")
    old = next(e for e in run.client.scan(TABLE, row, row) if e.cf == CF)
    newer = Entry(row, CF, CQ, b"", old.ts + 1000, False, old.value)  # the same link, a newer time
    run.client.flush(TABLE, [newer])
    run.stats.acknowledged([newer])
    assert verify(run.client, TABLE, run.stats).ok
    match = _is_row(row)
    _rewrite(
        run.client,
        lambda t: pc.and_(match(t), pc.equal(t.column("ts"), newer.ts)),
        lambda t: _set(t, row, "ts", old.ts - 1),
    )
    v = verify(run.client, TABLE, run.stats)
    assert not v.ok and v.changed == 1 and f"row {row.decode()} shown with ts {old.ts}" in " ".join(v.findings)


def test_a_resurrected_deleted_row_is_found(run: ContinuousIngest) -> None:
    """A put of a deleted ephemeral row, as old as the row, let in past the delete horizon (the
    bug: here the table's opt-in to Accumulo's semantics, for this one write)."""
    row = sorted(run.dropped)[0]  # type: ignore[attr-defined]
    run.client.store.tables.set_props(TABLE, {"table.delete.semantics": "accumulo"})
    run.client.flush(TABLE, [Entry(row, EPHEMERAL_CF, CQ, b"", 1, False, b"x")])
    run.client.store.tables.set_props(TABLE, {"table.delete.semantics": None})
    v = verify(run.client, TABLE, run.stats)
    assert not v.ok and v.resurrected == 1 and f"deleted row {row.decode()} visible again" in v.findings


def test_a_referenced_file_deleted_is_found(run: ContinuousIngest) -> None:
    t = run.client.store.tables.tablets(run.client.store.tables.table_id(TABLE))[0]
    gone = sorted(t.files)[0]
    run.client.storage.delete(gone)
    v = verify(run.client, TABLE, run.stats)
    assert not v.ok and v.missing_files == 1
    assert v.findings == [f"file {gone} of tablet {t.id} is referenced but missing"]
