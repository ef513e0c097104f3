"""Deletes stay deleted, whatever order files arrive in (issue 33 §1; docs/file-format.md).

A model-based test (hypothesis stateful) on a real redis-server: random interleavings of flushes,
imports (timestamps older and newer than earlier deletes, with and without ``--set-time``),
partial and full compactions (Arrow engine; Spark in its own run), a full compaction racing a new
file, splits and merges. After every step the table's scan must equal an independent reference of
the visible view, computed here from every write the system accepted — never with Kompaktor's
iterators. A refused write must change nothing and must have a reason: it holds a put no newer
than a delete marker that a full compaction committed since may have dropped (the check is on
bounds, not keys: docs/file-format.md, "Deletes stay deleted"). A conflict the model does not
expect fails the run, and the run must show progress: compactions committed (full and partial),
writes refused, a full compaction refused for a file that arrived (docs/verification.md).
Hypothesis prints the shortest failing sequence.
"""

from __future__ import annotations

import itertools
import os
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from kompaktor import client as client_module
from kompaktor.client import Client
from kompaktor.engines import make_engine
from kompaktor.engines.api import MergeRequest
from kompaktor.metadata import compactions
from kompaktor.metadata import tablet_ops as tabletops
from kompaktor.metadata.store import files as files_module
from kompaktor.model.errors import ConditionFailed
from kompaktor.model.job import Job
from kompaktor.model.keys import Entry
from kompaktor.policy.deletes import DeleteHorizonError

pytestmark = pytest.mark.redis

ROWS = [b"a", b"b", b"c", b"d", b"e", b"f"]
CQS = [b"x", b"y"]
# (row, cq, ts, deleted); ts 1..12 lands older and newer than earlier deletes
WRITE = st.tuples(st.sampled_from(ROWS), st.sampled_from(CQS), st.integers(1, 12), st.booleans())
BATCH = st.lists(WRITE, min_size=1, max_size=8, unique_by=lambda w: (w[0], w[1], w[2]))

Write = tuple[bytes, bytes, int, bool]


def value(row: bytes, cq: bytes, ts: int) -> bytes:
    """A value that is a function of the key: files holding the same key agree on it, so which
    identical key wins never matters to the view."""
    return b"%s/%s@%d" % (row, cq, ts)


def entry(w: Write) -> Entry:
    row, cq, ts, deleted = w
    return Entry(row, b"f", cq, b"", ts, deleted, b"" if deleted else value(row, cq, ts))


# -- the reference: written for the test, from the documented rules only ----------------------------
Stored = tuple[bytes, bytes, int, bool, bytes]  # an accepted entry: row, cq, time stored, deleted, value


def stored(w: Write, ts: int | None = None) -> Stored:
    row, cq, orig, deleted = w
    return (row, cq, orig if ts is None else ts, deleted, b"" if deleted else value(row, cq, orig))


def reference_view(accepted: Iterable[Stored]) -> list[tuple[bytes, bytes, int, bytes]]:
    """Per key the newest put not hidden by a delete marker of the same or a newer timestamp
    (table.iterator.versions = 1), in row, cq order."""
    by_key: dict[tuple[bytes, bytes], list[tuple[int, bool, bytes]]] = defaultdict(list)
    for row, cq, ts, deleted, val in accepted:
        by_key[(row, cq)].append((ts, deleted, val))
    out = []
    for (row, cq), writes in sorted(by_key.items()):
        newest_delete = max((ts for ts, d, _ in writes if d), default=None)
        puts = [(ts, val) for ts, d, val in writes if not d and (newest_delete is None or ts > newest_delete)]
        if puts:
            ts, val = max(puts)
            out.append((row, cq, ts, val))
    return out


def own_newest(batch: list[Write]) -> list[Write]:
    """What ``--set-time`` promises to import (at the import's time): each key's newest entry, a
    delete marker before a put of the same time, with the value of the entry it came from."""
    best: dict[tuple[bytes, bytes], Write] = {}
    for w in batch:
        have = best.get((w[0], w[1]))
        if have is None or (w[2], w[3]) > (have[2], have[3]):
            best[(w[0], w[1])] = w
    return list(best.values())


def scanned(c: Client, table: str) -> list[tuple[bytes, bytes, int, bytes]]:
    return [(e.row, e.cq, e.ts, e.value) for e in c.scan(table)]


def write_import_file(path: Path, batch: list[Write]) -> str:
    es = [entry(w) for w in batch]
    t = pa.table(
        {
            "row": pa.array([e.row for e in es], pa.binary()),
            "cf": pa.array([e.cf for e in es], pa.binary()),
            "cq": pa.array([e.cq for e in es], pa.binary()),
            "vis": pa.array([e.vis for e in es], pa.binary()),
            "ts": pa.array([e.ts for e in es], pa.int64()),
            "deleted": pa.array([e.deleted for e in es], pa.bool_()),
            "value": pa.array([e.value for e in es], pa.binary()),
        }
    )
    order = [("row", "ascending"), ("cf", "ascending"), ("cq", "ascending"), ("vis", "ascending")]
    pq.write_table(t.sort_by([*order, ("ts", "descending"), ("deleted", "descending")]), path)
    return str(path)


class Deletes(RuleBasedStateMachine):
    """One table; every rule is something a user or the system does to it."""

    client: Client
    engines: dict[str, object]
    tmp: Path
    clock: list[int]
    #: what happened over the whole run (every example): the run's progress, asserted by _run
    seen: Counter[str]
    names = itertools.count()

    def __init__(self) -> None:
        super().__init__()
        self.table = f"d{next(self.names)}"
        self.client.store.tables.create_table(self.table, [b"c"])
        self.accepted: list[Stored] = []  # every entry the table acknowledged, with its stored time
        self.refused = 0
        #: the newest delete marker accepted before a full compaction committed: the most a
        #: horizon can be (a full compaction drops only markers it holds)
        self.droppable: int | None = None

    # -- writes --------------------------------------------------------------------------------
    def _refusal_is_justified(self, batch: list[Write], exc: DeleteHorizonError) -> None:
        """A refusal names a horizon no newer than a marker a committed full compaction may have
        dropped, and a put of the batch at or before it."""
        msg = str(exc)
        assert "delete horizon" in msg and "--set-time" in msg and "\n" not in msg
        horizon = int(msg.split("delete horizon ", 1)[1].split(" ", 1)[0])
        assert self.droppable is not None and horizon <= self.droppable, (
            f"refused at horizon {horizon}, but no full compaction dropped a delete marker that new "
            f"(newest droppable: {self.droppable})"
        )
        oldest_put = min((ts for _, _, ts, d in batch if not d), default=None)
        assert oldest_put is not None and oldest_put <= horizon, f"refused a batch whose puts are newer than {horizon}"
        self.refused += 1
        self.seen["writes refused"] += 1

    @rule(batch=BATCH)
    def flush(self, batch: list[Write]) -> None:
        try:
            self.client.flush(self.table, [entry(w) for w in batch])
        except DeleteHorizonError as exc:
            self._refusal_is_justified(batch, exc)
        else:
            self.accepted.extend(stored(w) for w in batch)

    @rule(batch=BATCH, set_time=st.booleans())
    def bulk_import(self, batch: list[Write], set_time: bool) -> None:
        path = write_import_file(self.tmp / f"{self.table}-{len(self.accepted)}-{self.refused}.parquet", batch)
        stamp = self.clock[0] = self.clock[0] + 1  # the import's time (the test's clock, see below)
        try:
            self.client.import_files(self.table, [path], set_time=set_time)
        except DeleteHorizonError as exc:
            assert not set_time, "an import with --set-time was refused"
            self._refusal_is_justified(batch, exc)
        else:
            if set_time:
                self.accepted.extend(stored(w, stamp) for w in own_newest(batch))
            else:
                self.accepted.extend(stored(w) for w in batch)

    # -- compactions -----------------------------------------------------------------------------
    def _tablet(self, row: bytes):
        return next(
            t
            for t in self.client.store.tables.tablets(self.client.store.tables.table_id(self.table))
            if t.contains_row(row)
        )

    def _reserve(self, row: bytes, pick: list[bool] | None):
        t = self._tablet(row)
        files = sorted(t.files)
        if pick is not None:
            files = [f for f, keep in zip(files, itertools.cycle(pick)) if keep]
        if not files:
            return None
        job = Job(t.id, "SYSTEM", 1, "test", {f: t.files[f].size for f in files})
        return compactions.try_reserve(self.client.store, job, "model-test", "test")

    def _finish(self, res, engine: str, arrived: list[Stored] | None = None) -> None:
        """Merge and commit ``res``. The one conflict expected: a full compaction refused because
        a file that arrived since it reserved (``arrived``: its entries) holds a put its inputs'
        delete markers may hide; any other conflict fails the run."""
        deletes_before = max((ts for _, _, ts, d, _ in self.accepted if d), default=None)
        result = self.engines[engine].merge(  # type: ignore[attr-defined]
            self.client.storage, MergeRequest(res.inputs, res.output, res.prev, res.end, res.settings, res.ecid)
        )
        try:
            compactions.commit(self.client.store, res, result.info)
        except ConditionFailed as exc:
            oldest = min((ts for _, _, ts, d, _ in arrived or [] if not d), default=None)
            assert exc.condition == "deletes hide a new file" and res.full, f"unexpected conflict: {exc}"
            assert oldest is not None and deletes_before is not None and oldest <= deletes_before, (
                f"a full compaction was refused for a file no marker of it could hide: {exc}"
            )
            compactions.release(self.client.store, self.client.storage, res)
            assert not self.client.storage.exists(res.output)
            self.seen["full compactions refused (a file arrived)"] += 1
            return
        self.seen["full compactions committed" if res.full else "partial compactions committed"] += 1
        if res.full:
            self.droppable = max((ts for _, _, ts, d, _ in self.accepted if d), default=self.droppable)

    @rule(row=st.sampled_from(ROWS), pick=st.one_of(st.none(), st.lists(st.booleans(), min_size=1, max_size=3)))
    def compact(self, row: bytes, pick: list[bool] | None) -> None:
        """A full (all the tablet's files) or partial (a subset) compaction, run to its commit."""
        res = self._reserve(row, pick)
        if res is not None:
            self._finish(res, self.engine)

    @rule(row=st.sampled_from(ROWS), leave=st.integers(0, 7))
    def compact_all_but_one(self, row: bytes, leave: int) -> None:
        """A partial compaction for certain: every file of the tablet but one (of two or more)."""
        files = sorted(self._tablet(row).files)
        if len(files) > 1:
            del files[leave % len(files)]
            self.compact(row, [f in files for f in sorted(self._tablet(row).files)])

    @rule(row=st.sampled_from(ROWS), batch=BATCH, via_import=st.booleans())
    def compact_while_a_file_arrives(self, row: bytes, batch: list[Write], via_import: bool) -> None:
        """The race: a full compaction reserved, then a flush or import lands in its tablet before
        it commits (its delete markers were read without the new file)."""
        res = self._reserve(row, None)
        before = len(self.accepted)
        if via_import:
            self.bulk_import(batch, False)
        else:
            self.flush(batch)
        if res is not None:
            self._finish(res, self.engine, self.accepted[before:])

    # -- tablets -----------------------------------------------------------------------------------
    @rule(row=st.sampled_from(ROWS[1:]))
    def split(self, row: bytes) -> None:
        """Nothing runs between the model's steps: a split is never refused."""
        tabletops.split(self.client.store, self.table, [row])

    @rule(start=st.sampled_from([None, *ROWS]))
    def merge(self, start: bytes | None) -> None:
        """Refused only as unsafe (nothing runs between the model's steps)."""
        try:
            tabletops.merge(self.client.store, self.table, start, None)
        except tabletops.TabletOpRefused as exc:
            assert "safely" in str(exc), f"unexpected refusal: {exc}"

    @invariant()
    def scan_matches_the_reference(self) -> None:
        assert scanned(self.client, self.table) == reference_view(self.accepted)


def _run(
    client: Client, tmp_path: Path, monkeypatch, engine: str, engines: dict, examples: int, progress: tuple[str, ...]
) -> None:
    """Run the model; the run must have seen each of ``progress`` at least once (a run in which
    every commit failed, or nothing was refused, proves nothing)."""
    # the import's time: a clock the test owns (after every timestamp the writes use), so the
    # reference knows the time --set-time gave each entry
    clock = [1_000_000]
    monkeypatch.setattr(client_module, "now_ms", lambda: clock[0])
    seen: Counter[str] = Counter()
    machine = type(
        "DeletesRun",
        (Deletes,),
        {"client": client, "engines": engines, "engine": engine, "tmp": tmp_path, "clock": clock, "seen": seen},
    )
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=14,
            deadline=None,
            # make mutation only needs to see it fail: no shrinking (minutes on a failing run)
            phases=[p for p in Phase if p != Phase.shrink or not os.environ.get("KOMPAKTOR_NO_SHRINK")],
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        ),
    )
    missing = [what for what in progress if not seen[what]]
    assert not missing, f"the run never saw: {', '.join(missing)} (it saw {dict(seen)})"


#: what the long run must show (the Spark run, 8 examples, at least commits)
PROGRESS = (
    "full compactions committed",
    "partial compactions committed",
    "writes refused",
    "full compactions refused (a file arrived)",
)


def test_deletes_stay_deleted_arrow(client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _run(client, tmp_path, monkeypatch, "arrow", {"arrow": make_engine("arrow")}, examples=60, progress=PROGRESS)


@pytest.mark.spark
def test_deletes_stay_deleted_spark(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark_engine
) -> None:
    _run(client, tmp_path, monkeypatch, "spark", {"spark": spark_engine}, examples=8, progress=PROGRESS[:1])


# -- the user's path, step by step ------------------------------------------------------------------
def _full_compaction(client: Client, table: str) -> None:
    t = client.store.tables.tablets(client.store.tables.table_id(table))[0]
    res = compactions.try_reserve(
        client.store, Job(t.id, "SYSTEM", 1, "test", {f: m.size for f, m in t.files.items()}), "c", "test"
    )
    assert res.full
    result = make_engine("arrow").merge(
        client.storage, MergeRequest(res.inputs, res.output, res.prev, res.end, res.settings, res.ecid)
    )
    compactions.commit(client.store, res, result.info)


def _story(client: Client, tmp_path: Path, table: str) -> str:
    """Import a put and, later, its delete; compact fully (the marker is dropped); return a file
    with an older put of the same key, as a later batch of the same import job would bring it."""
    client.store.tables.create_table(table)
    client.import_files(table, [write_import_file(tmp_path / "1.parquet", [(b"k", b"x", 100, False)])])
    client.import_files(table, [write_import_file(tmp_path / "2.parquet", [(b"k", b"x", 200, True)])])
    _full_compaction(client, table)
    assert scanned(client, table) == []
    return write_import_file(tmp_path / "3.parquet", [(b"k", b"x", 150, False), (b"m", b"x", 150, False)])


def test_an_older_put_imported_after_a_full_compaction_is_refused(client: Client, tmp_path: Path, redis_url) -> None:
    old = _story(client, tmp_path, "users")
    files = sorted(client.store.tables.tablets(client.store.tables.table_id("users"))[0].files)
    from click.testing import CliRunner

    from kompaktor.cli import main

    r = CliRunner().invoke(main, ["import", "users", old, "--redis", redis_url, "--storage", client.storage.uri])
    assert r.exit_code != 0
    line = r.output.strip()
    assert "\n" not in line and "delete horizon 200" in line and "'users'" in line and "--set-time" in line
    assert (
        sorted(client.store.tables.tablets(client.store.tables.table_id("users"))[0].files) == files
    )  # nothing changed
    assert scanned(client, "users") == []
    # the way out: --set-time gives the entries the import's time, after the horizon
    r = CliRunner().invoke(
        main, ["import", "users", old, "--set-time", "--redis", redis_url, "--storage", client.storage.uri]
    )
    assert r.exit_code == 0, r.output
    got = scanned(client, "users")
    assert [(row, v) for row, _, _, v in got] == [(b"k", b"k/x@150"), (b"m", b"m/x@150")]
    assert all(ts > 200 for _, _, ts, _ in got)


def test_accumulo_semantics_are_an_explicit_per_table_opt_in(client: Client, tmp_path: Path) -> None:
    old = _story(client, tmp_path, "acc")
    client.store.tables.set_props("acc", {"table.delete.semantics": "accumulo"})
    client.import_files("acc", [old])
    # what Accumulo does, and what the user asked for: the older put shows again
    assert [(row, ts) for row, _, ts, _ in scanned(client, "acc")] == [(b"k", 150), (b"m", 150)]


def test_the_horizon_survives_split_and_merge(client: Client, tmp_path: Path) -> None:
    old = _story(client, tmp_path, "sm")
    tabletops.split(client.store, "sm", [b"g"])
    with pytest.raises(DeleteHorizonError, match="delete horizon 200"):
        client.import_files("sm", [old])
    tabletops.merge(client.store, "sm")
    with pytest.raises(DeleteHorizonError, match="delete horizon 200"):
        client.import_files("sm", [old])
    assert scanned(client, "sm") == []


def test_a_full_compaction_does_not_commit_over_a_file_it_would_hide(client: Client, tmp_path: Path) -> None:
    """The race: the full compaction read the delete marker; an older put arrives before it
    commits. Committing would drop the marker and show the put: the commit is refused and its
    output removed; the re-planned compaction (over every file) hides it."""
    client.store.tables.create_table("race")
    client.import_files("race", [write_import_file(tmp_path / "1.parquet", [(b"k", b"x", 200, True)])])
    t = client.store.tables.tablets(client.store.tables.table_id("race"))[0]
    res = compactions.try_reserve(
        client.store, Job(t.id, "SYSTEM", 1, "test", {f: m.size for f, m in t.files.items()}), "c", "test"
    )
    client.import_files("race", [write_import_file(tmp_path / "2.parquet", [(b"k", b"x", 150, False)])])
    result = make_engine("arrow").merge(
        client.storage, MergeRequest(res.inputs, res.output, res.prev, res.end, res.settings, res.ecid)
    )
    with pytest.raises(ConditionFailed, match="deletes hide a new file"):
        compactions.commit(client.store, res, result.info)
    compactions.release(client.store, client.storage, res)
    assert not client.storage.exists(res.output)
    assert scanned(client, "race") == []
    _full_compaction(client, "race")
    assert scanned(client, "race") == []


def test_redis_refuses_a_put_below_a_horizon_raised_after_the_python_check(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interleaving the Python check cannot see (docs/verification.md, "Guards"): a full
    compaction that drops a delete marker commits after ``add_files`` read the tablet (no horizon
    yet) and before its mutation runs. Only ``above_horizon`` inside Redis stands between the
    older put and a deleted entry come back; the retry then refuses it by name. Deterministic:
    the compaction commits from inside the Python check, not by timing."""
    client.store.tables.create_table("late")
    client.import_files("late", [write_import_file(tmp_path / "1.parquet", [(b"k", b"x", 200, True)])])
    t = client.store.tables.tablets(client.store.tables.table_id("late"))[0]
    res = compactions.try_reserve(
        client.store, Job(t.id, "SYSTEM", 1, "test", {f: m.size for f, m in t.files.items()}), "c", "test"
    )
    assert res.full
    result = make_engine("arrow").merge(
        client.storage, MergeRequest(res.inputs, res.output, res.prev, res.end, res.settings, res.ecid)
    )
    checks: list[str | None] = []
    real_refusal = files_module.refusal

    def check_then_compaction_commits(table, tablet, files):  # type: ignore[no-untyped-def]
        why = real_refusal(table, tablet, files)
        if not checks:  # the Python check passed on a stale read: now the compaction commits
            assert why is None and tablet.horizon is None
            compactions.commit(client.store, res, result.info)
        checks.append(why)
        return why

    monkeypatch.setattr(files_module, "refusal", check_then_compaction_commits)
    old = write_import_file(tmp_path / "2.parquet", [(b"k", b"x", 150, False)])
    with pytest.raises(DeleteHorizonError, match="delete horizon 200"):
        client.import_files("late", [old])
    # two checks: the stale one Redis overruled ('delete horizon'), then the re-read that names it
    assert len(checks) == 2 and checks[0] is None and checks[1] is not None
    tablet = client.store.tables.tablets(client.store.tables.table_id("late"))[0]
    assert tablet.horizon == 200 and tablet.files == {}, "the refused import changed the tablet"
    assert scanned(client, "late") == []
