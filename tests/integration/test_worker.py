"""The compactor worker on a real redis-server (issue 5 §1, §3, §4): reserve -> merge -> heartbeat
-> commit; rejected commits (seed 000 scenarios 3, 5 and 6); bad input files; cancellation when
the job is no longer wanted; drain (SIGTERM, HTTP, Redis flag) of real ``kompaktor compactor``
processes; HTTP probes and metrics.

Merges are real (Arrow engine, and the Spark engine once). Where a test needs a merge to be in
progress at a given moment, :class:`gated_engine.GatedEngine` holds the real merge after its
first part until the test opens the gate (timing only). Nothing sleeps to synchronise: every
wait polls a condition with a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kompaktor import keyspace as C
from kompaktor.client import Client
from kompaktor.coordinator import Coordinator
from kompaktor.engines.api import MergeRequest
from kompaktor.engines.arrow import ArrowMergeEngine
from kompaktor.files.storage import Storage
from kompaktor.metadata import compactions, failures, history
from kompaktor.metadata import user_compactions as usercompaction
from kompaktor.metadata.store import MetadataStore, Mutation
from kompaktor.model.job import fingerprint
from kompaktor.model.keys import Entry
from kompaktor.model.names import TMP_PREFIX
from kompaktor.model.tablet import OFFLINE, end_token
from kompaktor.worker import BUSY, DRAINING, IDLE, Compactor, WorkerSettings
from kompaktor.worker.http import request_drain
from tests.integration.gated_engine import GatedEngine
from tests.support.rawredis import raw_redis
from tests.support.wait import poll

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

GROUP = "default"  # the default service's only group
GATED_SCRIPT = str(Path(__file__).parent / "gated_engine.py")
ROOT = Path(__file__).resolve().parents[2]


# -- helpers -------------------------------------------------------------------------------------
def entries(seed: int, rows: list[bytes], ts: int) -> list[Entry]:
    """Versions of every row; every third row of an odd seed is a delete marker."""
    out = []
    for i, row in enumerate(rows):
        deleted = seed % 2 == 1 and i % 3 == 0
        out.append(Entry(row, b"f", b"q%d" % (i % 2), b"", ts, deleted, b"" if deleted else b"v%d-%d" % (seed, i)))
    return out


ROWS = [b"a%03d" % i for i in range(40)] + [b"n%03d" % i for i in range(40)] + [b"\x90\xff%02d" % i for i in range(20)]


def make_table(client: Client, name: str = "t", files: int = 4, splits: tuple[bytes, ...] = (b"m",)) -> str:
    """A table whose tablets each get ``files`` flushed files (versions, deletes, bytes >= 0x80);
    queued jobs are planned by a real coordinator."""
    client.store.tables.create_table(name, list(splits))
    for k in range(files):
        client.flush(name, entries(k, ROWS, 1000 + k))
    return client.store.tables.table_id(name)


def plan(store: MetadataStore, storage: Storage) -> int:
    return Coordinator(store, storage).full_scan()


def scan(client: Client, table: str = "t") -> list[Entry]:
    return list(client.scan(table))


def tablet_files(store: MetadataStore, tid: str) -> dict[str, set[str]]:
    return {t.id: set(t.files) for t in store.tables.tablets(tid)}


def leftovers(storage: Storage, ecid: str) -> list[str]:
    """Temporary files of a compaction (output, parts) still in storage."""
    return [rel for rel, _ in storage.list_files("tables") if rel.rsplit("/", 1)[-1].startswith(TMP_PREFIX + ecid)]


def assert_no_trace(store: MetadataStore, storage: Storage, res_or_ecid: Any, output: str | None = None) -> None:
    """The compaction left nothing: ECID not registered anywhere, no heartbeat, no output."""
    ecid = getattr(res_or_ecid, "ecid", res_or_ecid)
    output = output or getattr(res_or_ecid, "output", None)
    assert raw_redis(store).hget(C.RUNNING, ecid) is None
    assert not raw_redis(store).exists(C.heartbeat_key(ecid))
    for t in store.tables.iter_all_tablets():
        assert ecid not in t.running
    assert leftovers(storage, ecid) == []
    if output is not None:
        assert not storage.exists(output)


def arrow_gated(gate: threading.Event | None = None, **kw: Any) -> GatedEngine:
    # small key ranges so that a merge has several parts and reports progress between them
    return GatedEngine(ArrowMergeEngine(range_entries=60), gate or threading.Event(), **kw)


def settings(cid: str = "c1", **kw: Any) -> WorkerSettings:
    kw.setdefault("engine", "arrow")
    kw.setdefault("heartbeat_s", 0.1)
    kw.setdefault("idle_max_s", 0.2)
    return WorkerSettings(GROUP, cid, **kw)


class Running:
    """``run_one`` (or ``run``) of a compactor in a thread, its result collected."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None

        def target() -> None:
            try:
                self.result = fn()
            except BaseException as exc:
                self.error = exc

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()

    def join(self, timeout: float = 30.0) -> Any:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "compactor did not finish in time"
        if self.error is not None:
            raise self.error
        return self.result


def metric(text: str, name: str, group: str = GROUP) -> float:
    for line in text.splitlines():
        if line.startswith(f'{name}{{group="{group}"}} '):
            return float(line.split()[-1])
    raise AssertionError(f"{name}{{group={group!r}}} not in metrics")


def http(port: int, path: str, method: str = "GET") -> tuple[int, str]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def compactor_state(store: MetadataStore, cid: str) -> str | None:
    return next((c.state for c in store.fleet.compactors(GROUP) if c.id == cid), None)


# -- §1 the worker -------------------------------------------------------------------------------
def test_arrow_compactor_compacts_and_scan_is_unchanged(store, storage, client) -> None:
    tid = make_table(client)
    before = scan(client)
    files_before = tablet_files(store, tid)
    assert plan(store, storage) == 2
    w = Compactor(store, storage, settings(max_jobs=2))
    assert w.run() == 0
    assert w.jobs_done == 2
    after = tablet_files(store, tid)
    for t_id, files in after.items():
        assert len(files) == 1 and not files & files_before[t_id], (t_id, files)
    assert scan(client) == before
    for t in store.tables.tablets(tid):
        assert t.running == {}
    assert raw_redis(store).hlen(C.RUNNING) == 0
    assert store.bookkeeping.counters()["compactions_committed"] == 2
    text = w.metrics.registry
    from prometheus_client import generate_latest

    m = generate_latest(text).decode()
    assert metric(m, "kompaktor_compactions_completed_total") == 2
    assert metric(m, "kompaktor_compactions_failed_total") == 0
    assert metric(m, "kompaktor_entries_read_total") == 4 * len(ROWS)
    assert metric(m, "kompaktor_entries_written_total") == sum(
        t.files[f].entries for t in store.tables.tablets(tid) for f in t.files
    )
    assert metric(m, "kompaktor_compaction_duration_seconds_count") == 2
    assert store.fleet.compactors(GROUP) == []  # unregistered when it stopped


@pytest.mark.spark
def test_spark_compactor_reuses_the_process_session(store, storage, client, spark_session) -> None:
    tid = make_table(client)
    before = scan(client)
    assert plan(store, storage) == 2
    w = Compactor(store, storage, settings(engine="spark", spark_master="local[2]", max_jobs=2))
    assert w.run() == 0
    assert w.engine.name == "spark" and w.engine.session is spark_session
    assert all(len(f) == 1 for f in tablet_files(store, tid).values())
    assert scan(client) == before
    assert store.bookkeeping.counters()["compactions_committed"] == 2


def test_heartbeat_carries_progress_and_state(store, storage, client) -> None:
    make_table(client, files=4, splits=())
    plan(store, storage)
    gate = threading.Event()
    eng = arrow_gated(gate)
    w = Compactor(store, storage, settings(heartbeat_s=0.05), engine=eng)
    run = Running(w.run_one)
    poll(eng.held.is_set, "the merge to hold after its first part")
    ecid = poll(lambda: w.current and w.current.ecid, "a reservation")
    hb = poll(
        lambda: (h := store.running.heartbeat(ecid)).parts_done is not None and h.parts_done >= 1 and h,
        "a heartbeat with progress",
    )
    assert hb.compactor == "c1"
    assert (hb.entries_read or 0) > 0 and (hb.entries_written or 0) > 0
    assert (hb.bytes_read or 0) > 0 and (hb.parts or 0) > 1
    assert hb.updated is not None and abs(hb.updated - time.time()) < 10
    # the seconds the job still needs (what the operator's scale-down ranks busy compactors by)
    assert hb.remaining_s is not None and 0 <= hb.remaining_s < 60
    info = poll(lambda: [c for c in store.fleet.compactors(GROUP) if c.state == BUSY], "compactor registered busy")
    assert info[0].ecid == ecid
    gate.set()
    outcome = run.join()
    assert outcome.status == "committed"
    assert not raw_redis(store).exists(C.heartbeat_key(ecid))
    assert compactor_state(store, "c1") == BUSY  # run_one alone does not publish idle; run() does


# -- §3 commit and failure -----------------------------------------------------------------------
def _delete_table(store: MetadataStore, storage: Storage, res: Any) -> None:
    store.tables.delete_table("t")


def _take_offline(store: MetadataStore, storage: Storage, res: Any) -> None:
    store.tables.set_state("t", OFFLINE)


def _input_removed(store: MetadataStore, storage: Storage, res: Any) -> None:
    m = Mutation()
    m.tablet(res.tablet).do("remove_files", [res.inputs[0]])
    store.mutate(m)


def _declared_dead(store: MetadataStore, storage: Storage, res: Any) -> None:
    """The coordinator declares the compaction dead (no heartbeat for too long)."""
    from kompaktor.coordinator import CoordinatorSettings

    assert Coordinator(store, storage, CoordinatorSettings(dead_after_s=-1)).detect_dead() == [res.ecid]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        pytest.param(_delete_table, "table 1 is DELETED", id="seed000-scenario3-table-deleted"),
        pytest.param(_take_offline, "table 1 is OFFLINE", id="seed000-scenario6-table-offline"),
        pytest.param(_input_removed, "files present", id="input-file-removed"),
        pytest.param(_declared_dead, "compaction registered", id="declared-dead"),
    ],
)
def test_commit_rejected_when_things_changed_under_it(store, storage, client, change, reason) -> None:
    """The change lands after the merge finished, before the commit: the conditional commit is
    rejected, the output is deleted, the job fails with the reason, the tablet keeps its files."""
    tid = make_table(client, splits=())
    before = tablet_files(store, tid)
    plan(store, storage)
    box: dict[str, Any] = {}

    def after_merge(req: MergeRequest) -> None:
        assert storage.exists(req.output)  # the merge wrote its output...
        box["output"] = req.output
        change(store, storage, w.current)

    w = Compactor(
        store,
        storage,
        settings(heartbeat_s=3600),
        engine=GatedEngine(ArrowMergeEngine(), threading.Event(), hold_after_parts=10**9, after_merge=after_merge),
    )
    outcome = w.run_one()
    assert outcome.status == "failed"
    assert reason in outcome.reason and outcome.reason.startswith("commit")
    assert_no_trace(store, storage, outcome.ecid, box["output"])  # ...and it is gone
    after = tablet_files(store, tid)
    if change is _delete_table:
        assert after == {}
    elif change is _input_removed:
        (t_id,) = before
        assert len(after[t_id]) == len(before[t_id]) - 1 and after[t_id] < before[t_id]
    else:
        assert after == before
    assert store.bookkeeping.counters().get("compactions_committed", 0) == 0
    from prometheus_client import generate_latest

    assert metric(generate_latest(w.metrics.registry).decode(), "kompaktor_compactions_failed_total") == 1


def test_seed000_scenario3_table_deleted_while_queued(store, storage, client) -> None:
    """The job is queued, the table is deleted, a compactor takes the job: it fails cleanly to
    start (nothing reserved, nothing written) and the queue is left empty."""
    make_table(client, splits=())
    plan(store, storage)
    queues = store.queues
    assert queues.stats(GROUP).queued == 1
    store.tables.delete_table("t")
    eng = arrow_gated()
    w = Compactor(store, storage, settings(), engine=eng)
    assert w.run_one() is None
    assert not eng.held.is_set()
    assert queues.stats(GROUP).queued == 0
    assert raw_redis(store).hlen(C.RUNNING) == 0
    assert [rel for rel, _ in storage.list_files("tables") if "/A" in rel or "/C" in rel or TMP_PREFIX in rel] == []


def test_seed000_scenario5_metadata_store_restarts_while_merging(store, storage, client, redis_server) -> None:
    """Seed 000 scenario 5, here: the metadata store (which hosts the tablet) goes away while a
    compaction runs, the merge finishes while it is away, the store comes back (AOF): the
    compactor commits."""
    tid = make_table(client, splits=())
    before = scan(client)
    plan(store, storage)
    gate = threading.Event()
    eng = arrow_gated(gate)
    w = Compactor(store, storage, settings(heartbeat_s=0.1, commit_retry_s=60.0), engine=eng)
    run = Running(w.run_one)
    poll(eng.held.is_set, "the merge to hold")
    poll(lambda: raw_redis(store).exists(C.heartbeat_key(w.current.ecid)), "a heartbeat")
    redis_server.stop()
    try:
        gate.set()
        poll(eng.merged.is_set, "the merge to finish while Redis is down")
    finally:
        redis_server.start()
    outcome = run.join(timeout=60)
    assert outcome.status == "committed", outcome
    (files,) = tablet_files(store, tid).values()
    assert len(files) == 1
    assert scan(client) == before


def test_idle_compactor_survives_a_metadata_store_outage(store, storage, client, redis_server, caplog) -> None:
    """Redis goes away while the compactor polls an empty queue: it keeps polling (no crash), and
    once Redis is back it takes and commits the next job."""
    caplog.set_level("WARNING", logger="kompaktor.compactor")
    w = Compactor(store, storage, settings("survivor"))
    run = Running(w.run)
    poll(lambda: compactor_state(store, "survivor") == IDLE, "the compactor to register idle")
    redis_server.stop()
    try:
        poll(lambda: "metadata store unavailable" in caplog.text, "the compactor to meet the outage")
        assert run.thread.is_alive()
    finally:
        redis_server.start()
    make_table(client, splits=())
    plan(store, storage)
    poll(lambda: w.jobs_done == 1, "the next job to be done", timeout=30)
    store.fleet.request_drain("survivor")
    assert run.join() == 0
    assert store.bookkeeping.counters()["compactions_committed"] == 1


def test_commit_whose_reply_was_lost_is_not_undone(store, storage, client, monkeypatch) -> None:
    """The commit lands but its reply is lost (the store becomes unreachable): the compactor
    retries, is rejected because its ECID is gone, and must see that its own commit landed —
    not fail the job and delete the output that the tablet now references."""
    from kompaktor.model.errors import StoreUnavailable
    from kompaktor.worker import compactor as worker_mod

    tid = make_table(client, splits=())
    before = scan(client)
    plan(store, storage)
    real_commit = compactions.commit
    calls = []

    def commit_reply_lost(*args: Any, **kw: Any) -> None:
        real_commit(*args, **kw)
        calls.append(1)
        if len(calls) == 1:
            raise StoreUnavailable("connection reset after the script ran (injected)")

    monkeypatch.setattr(worker_mod.compactions, "commit", commit_reply_lost)
    w = Compactor(store, storage, settings())
    outcome = w.run_one()
    assert outcome.status == "committed", outcome
    (files,) = tablet_files(store, tid).values()
    (output,) = files
    assert storage.exists(output)
    assert scan(client) == before
    assert_no_trace(store, storage, outcome.ecid)


def _corrupt(storage: Storage, path: str) -> None:
    with storage.fs.open_output_stream(storage.path(path)) as f:
        f.write(b"PAR1 this is not parquet at all PAR1")


def _wrong_schema(storage: Storage, path: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    with storage.fs.open_output_stream(storage.path(path)) as f:
        pq.write_table(pa.table({"row": [b"a001"], "colour": ["red"]}), f)


@pytest.mark.parametrize("damage", [_corrupt, _wrong_schema], ids=["corrupt", "wrong-schema"])
def test_bad_input_file_fails_the_job_and_leaves_the_tablet(store, storage, client, damage, monkeypatch) -> None:
    tid = make_table(client, splits=())
    before = tablet_files(store, tid)
    ((t_id, files),) = before.items()
    bad = sorted(files)[1]
    damage(storage, bad)
    plan(store, storage)
    w = Compactor(store, storage, settings())
    outcome = w.run_one()
    assert outcome.status == "failed"
    assert bad in outcome.reason, outcome.reason
    assert tablet_files(store, tid) == before
    assert_no_trace(store, storage, outcome.ecid)
    rec = json.loads(raw_redis(store).hget(C.FAILURES, fingerprint(t_id, sorted(files))))
    assert rec["count"] == 1 and bad in rec["last_error"]
    # backing off: not queued again at once
    assert plan(store, storage) == 0
    # each later attempt (once its backoff has passed) fails the same way; the third dead-letters it
    now = [time.time()]

    class Clock:
        @staticmethod
        def time() -> float:
            return now[0]

    monkeypatch.setattr(failures, "time", Clock)
    for attempt in (2, 3):
        now[0] += failures.MAX_BACKOFF_S + 1
        assert plan(store, storage) == 1, attempt
        outcome = w.run_one()
        assert outcome.status == "failed" and bad in outcome.reason
    dead = failures.dead_letters(store)
    assert [(d.tablet, d.count) for d in dead] == [(t_id, 3)] and bad in dead[0].last_error
    now[0] += failures.MAX_BACKOFF_S + 1
    assert plan(store, storage) == 0  # dead-lettered jobs are not queued
    assert tablet_files(store, tid) == before
    from prometheus_client import generate_latest

    assert metric(generate_latest(w.metrics.registry).decode(), "kompaktor_compactions_failed_total") == 3


# -- §4 cancellation -----------------------------------------------------------------------------
def _merge_tablet_away(store: MetadataStore, tablet_id: str) -> None:
    """Merge the tablet into its upper neighbour (what a tablet merge does to the metadata)."""
    t = store.tables.tablet(tablet_id)
    upper = next(u for u in store.tables.tablets(t.table) if u.prev == t.end)
    m = Mutation(table=t.table)
    m.tablet(t.id).require("version", t.version).do("delete", end_token(t.end))
    m.tablet(upper.id).require("version", upper.version).do("set_range", None if t.prev is None else t.prev.hex()).do(
        "add_files", {f: fm.to_json() for f, fm in t.files.items()}
    )
    store.mutate(m)


@pytest.mark.parametrize("why", ["table-offline", "tablet-gone", "table-deleted", "user-compaction-cancelled"])
def test_compactor_stops_a_merge_that_is_no_longer_wanted(store, storage, client, why) -> None:
    tid = make_table(client)
    before = tablet_files(store, tid)
    rows = scan(client)
    if why == "user-compaction-cancelled":
        cid = usercompaction.start(store, "t")
        Coordinator(store, storage).tick()  # selects the held tablets' files, queues their USER jobs
        assert store.queues.stats(GROUP).queued == 2
    else:
        plan(store, storage)
    eng = arrow_gated()  # never opened: only a cancellation ends the hold
    w = Compactor(store, storage, settings(heartbeat_s=0.05), engine=eng)
    run = Running(w.run_one)
    poll(eng.held.is_set, "the merge to hold")
    res = w.current
    if why == "user-compaction-cancelled":
        assert res.job.kind == "USER"
    started = time.monotonic()
    if why == "table-offline":
        store.tables.set_state("t", OFFLINE)
        expected = "table is OFFLINE"
    elif why == "tablet-gone":
        _merge_tablet_away(store, res.tablet)
        expected = "tablet no longer exists"
    elif why == "table-deleted":
        store.tables.delete_table("t")
        expected = "tablet no longer exists"
    else:
        usercompaction.cancel(store, cid)
        expected = "user compaction cancelled"
    outcome = run.join()
    assert time.monotonic() - started < 10
    assert outcome.status == "cancelled" and expected in outcome.reason, outcome
    assert eng.cancelled.is_set() and not eng.merged.is_set()  # the merge itself stopped
    (rec,) = history.read(store, [GROUP])  # the history says so (issue 36 §1)
    assert (rec.ecid, rec.outcome, rec.output_bytes) == (res.ecid, history.CANCELLED, None) and expected in rec.reason
    assert_no_trace(store, storage, res)
    assert raw_redis(store).hlen(C.FAILURES) == 0  # not a failure of the job
    if why in ("table-offline", "user-compaction-cancelled"):
        assert tablet_files(store, tid) == before
        store.tables.set_state("t", "ONLINE")
        assert scan(client) == rows
    if why == "tablet-gone":
        assert scan(client) == rows


# -- §4 drain, in process -------------------------------------------------------------------------
def test_drain_releases_a_job_that_cannot_finish_in_the_grace_period(store, storage, client) -> None:
    """Measured throughput says the job needs far longer than the grace period: it is released at
    once (not at the end of the grace period), back to planning, and run() exits 0."""
    tid = make_table(client, splits=())
    before = tablet_files(store, tid)
    plan(store, storage)
    eng = arrow_gated()
    w = Compactor(store, storage, settings(drain_grace_s=60.0, default_throughput_bps=1.0), engine=eng)
    run = Running(w.run)
    poll(eng.held.is_set, "the merge to hold")
    res = w.current
    started = time.monotonic()
    w.request_drain("test")
    assert run.join() == 0
    assert time.monotonic() - started < 10  # far less than the 60 s grace
    assert eng.cancelled.is_set()
    assert_no_trace(store, storage, res)
    assert tablet_files(store, tid) == before
    assert res.tablet in {m.decode() for m in raw_redis(store).smembers(C.DIRTY)}
    assert Coordinator(store, storage).tick() and store.queues.stats(GROUP).queued == 1
    assert store.fleet.compactors(GROUP) == []
    assert "dead_compactions" not in store.bookkeeping.counters()


def test_drain_flag_in_redis_lets_the_job_finish_however_long(store, storage, client) -> None:
    """The operator's scale-down asks through Redis, and nothing stops the pod before it is
    drained: the job it holds is finished, not released, even far beyond the grace period."""
    tid = make_table(client, splits=())
    before = scan(client)
    plan(store, storage)
    gate = threading.Event()
    eng = arrow_gated(gate)
    w = Compactor(store, storage, settings("victim", drain_grace_s=0.0, default_throughput_bps=1.0), engine=eng)
    run = Running(w.run)
    poll(eng.held.is_set, "the merge to hold")
    store.fleet.request_drain("victim")
    poll(lambda: compactor_state(store, "victim") == DRAINING, "the heartbeat to say draining")
    assert not eng.cancelled.is_set()
    gate.set()
    assert run.join() == 0
    assert not eng.cancelled.is_set() and store.bookkeeping.counters()["compactions_committed"] == 1
    (files,) = tablet_files(store, tid).values()
    assert len(files) == 1 and scan(client) == before


def test_drain_flag_in_redis_stops_an_idle_compactor(store, storage) -> None:
    w = Compactor(store, storage, settings("victim"))
    run = Running(w.run)
    poll(lambda: compactor_state(store, "victim") == IDLE, "the compactor to register idle")
    store.fleet.request_drain("victim")
    assert run.join(timeout=10) == 0
    assert compactor_state(store, "victim") is None
    assert not store.fleet.drain_requested("victim")


def test_http_probes_drain_and_metrics(store, storage, client) -> None:
    make_table(client)
    plan(store, storage)
    gate = threading.Event()
    eng = arrow_gated(gate)
    w = Compactor(store, storage, settings(drain_grace_s=60.0), engine=eng)
    port = w.serve_http(0, host="127.0.0.1")
    try:
        assert http(port, "/healthz") == (200, "ok\n")
        assert http(port, "/readyz")[0] == 503  # not started yet
        run = Running(w.run)
        poll(eng.held.is_set, "the first merge to hold")
        assert http(port, "/readyz") == (200, "ready\n")
        assert http(port, "/state") == (200, "busy\n")
        gate.set()
        poll(lambda: w.jobs_done == 2 and w.state == IDLE, "both jobs to commit")
        status, text = http(port, "/metrics")
        assert status == 200
        assert metric(text, "kompaktor_compactions_completed_total") == 2
        assert metric(text, "kompaktor_compactions_failed_total") == 0
        assert metric(text, "kompaktor_compactions_cancelled_total") == 0
        assert metric(text, "kompaktor_entries_read_total") == 4 * len(ROWS)
        assert metric(text, "kompaktor_bytes_written_total") > 0
        assert metric(text, "kompaktor_compaction_duration_seconds_count") == 2
        assert metric(text, "kompaktor_compactor_running") == 0
        assert http(port, "/nope")[0] == 404
        assert http(port, "/drain")[0] == 405  # a GET never changes state
        assert not w.drain.is_set() and http(port, "/readyz")[0] == 200
        assert request_drain(port) == "draining"  # what the pod's preStop hook runs
        assert w.drain.is_set()
        assert http(port, "/readyz")[0] == 503
        assert http(port, "/healthz")[0] == 200  # alive while draining
        assert run.join(timeout=10) == 0
    finally:
        w.close()


# -- §4 drain, real `kompaktor compactor` processes ----------------------------------------------
class CompactorProcess:
    """``kompaktor compactor`` as a child process (its engine gated, see gated_engine.py)."""

    def __init__(
        self, tmp: Path, redis_url: str, storage_root: str, cid: str, *extra: str, env: dict[str, str] | None = None
    ) -> None:
        self.gate = tmp / f"gate-{cid}"
        self.held = Path(f"{self.gate}.held")
        self.cid = cid
        env = dict(
            os.environ,
            KOMPAKTOR_REDIS_URL=redis_url,
            KOMPAKTOR_STORAGE=storage_root,
            KOMPAKTOR_TEST_GATE=str(self.gate),
            POD_NAME=cid,
            PYTHONUNBUFFERED="1",
            **(env or {}),
        )
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "compactor"), env.get("PYTHONPATH", "")])
        self.proc = subprocess.Popen(
            [
                sys.executable,
                GATED_SCRIPT,
                "compactor",
                "--group",
                GROUP,
                "--engine",
                "arrow",
                "--http-port",
                "0",
                *extra,
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self.port: int | None = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if "serving HTTP on :" in line:
                self.port = int(line.rsplit(":", 1)[1])

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def wait_ready(self) -> int:
        poll(lambda: self.port is not None or self.proc.poll() is not None, "the HTTP port")
        assert self.port is not None, self.log
        poll(lambda: http(self.port, "/readyz")[0] == 200, "readiness")
        return self.port

    def wait_exit(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"compactor did not exit within {timeout}s:\n{self.log}") from None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def spawn(tmp_path: Path, redis_url: str, storage: Storage) -> Iterator[Callable[..., CompactorProcess]]:
    procs: list[CompactorProcess] = []

    def start(cid: str, *extra: str, env: dict[str, str] | None = None) -> CompactorProcess:
        p = CompactorProcess(tmp_path, redis_url, storage.uri, cid, *extra, env=env)
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.stop()


def test_sigterm_idle_compactor_exits_0_quickly_and_unregisters(store, spawn) -> None:
    p = spawn("idle-1")
    port = p.wait_ready()
    assert http(port, "/healthz") == (200, "ok\n")
    poll(lambda: compactor_state(store, "idle-1") == IDLE, "registered idle")
    started = time.monotonic()
    p.proc.send_signal(signal.SIGTERM)
    assert p.wait_exit(10) == 0, p.log
    assert time.monotonic() - started < 5
    assert compactor_state(store, "idle-1") is None


def test_drain_flag_stops_an_idle_compactor_process(store, spawn) -> None:
    p = spawn("idle-2")
    p.wait_ready()
    poll(lambda: compactor_state(store, "idle-2") == IDLE, "registered idle")
    store.fleet.request_drain("idle-2")
    assert p.wait_exit(10) == 0, p.log
    assert compactor_state(store, "idle-2") is None and not store.fleet.drain_requested("idle-2")


@pytest.mark.parametrize("how", ["sigterm", "http"])
def test_drain_while_busy_finishes_the_job_within_the_grace_period(store, storage, client, spawn, how) -> None:
    tid = make_table(client, splits=())
    before = scan(client)
    plan(store, storage)
    p = spawn(f"busy-{how}", "--drain-grace", "60")
    port = p.wait_ready()
    poll(p.held.exists, "the merge to hold")
    assert http(port, "/state") == (200, "busy\n")
    if how == "sigterm":
        p.proc.send_signal(signal.SIGTERM)
    else:
        assert http(port, "/drain", "POST") == (200, "draining\n")
    poll(lambda: compactor_state(store, p.cid) == DRAINING, "the heartbeat to say draining")
    assert http(port, "/readyz")[0] == 503
    assert p.proc.poll() is None  # still finishing its job
    p.gate.touch()
    assert p.wait_exit(30) == 0, p.log
    (files,) = tablet_files(store, tid).values()
    assert len(files) == 1
    assert scan(client) == before
    assert store.bookkeeping.counters()["compactions_committed"] == 1
    assert raw_redis(store).hlen(C.RUNNING) == 0
    assert compactor_state(store, p.cid) is None


#: what a compactor pod's container runs with (the manifests' ``--stay-drained``)
POD = {"KOMPAKTOR_STAY_DRAINED": "1"}
#: the line a compactor pod says once drained (it then waits for SIGTERM)
STAYS = "takes no job until its pod is deleted"


@pytest.mark.parametrize("how", ["redis", "http"])
def test_a_drained_compactor_pod_stays_drained_across_a_container_restart(store, storage, client, spawn, how) -> None:
    """The operator drains a busy compactor pod with more work queued; it finishes its
    job and stays up without taking another. The kubelet restarts its container (killed here, as a
    failed probe or an OOM kill would) before the pod is deleted: the new process, same pod name,
    takes no job either — it says ``draining`` until SIGTERM, then exits 0. The drain comes as the
    operator's flag in Redis, or as the preStop hook's POST /drain: then only the drain mark the
    compactor leaves in Redis tells the restarted container (docs/verification.md, "Guards")."""
    make_table(client)  # two tablets: two jobs
    plan(store, storage)
    first = spawn("pod-a", env=POD)
    port = first.wait_ready()
    poll(first.held.exists, "the first merge to hold")
    if how == "redis":
        store.fleet.request_drain("pod-a")  # the operator's scale-down
    else:
        assert http(port, "/drain", "POST") == (200, "draining\n")  # the pod's preStop hook
    poll(lambda: compactor_state(store, "pod-a") == DRAINING, "the heartbeat to say draining")
    first.gate.touch()
    poll(lambda: STAYS in first.log or first.proc.poll() is not None, "the job to finish")
    assert first.proc.poll() is None, f"a drained compactor pod exited (the kubelet restarts it):\n{first.log}"
    assert store.bookkeeping.counters()["compactions_committed"] == 1 and store.queues.stats(GROUP).queued == 1
    assert compactor_state(store, "pod-a") == DRAINING and http(first.port, "/readyz")[0] == 503
    # the container restarts
    first.proc.kill()
    first.proc.wait(10)
    first.gate.unlink()
    first.held.unlink()
    second = spawn("pod-a", env=POD)
    poll(lambda: STAYS in second.log or second.held.exists() or second.proc.poll() is not None, "the restart")
    assert not second.held.exists() and second.proc.poll() is None, second.log
    stats = store.queues.stats(GROUP)
    assert (stats.queued, stats.running) == (1, 0), "the restarted container of a draining pod reserved a job"
    assert compactor_state(store, "pod-a") == DRAINING
    second.proc.send_signal(signal.SIGTERM)  # the pod is deleted at last
    assert second.wait_exit(10) == 0, second.log
    assert store.queues.stats(GROUP).queued == 1 and store.bookkeeping.counters()["compactions_committed"] == 1
    assert store.fleet.drain_requested("pod-a")  # a third start would find the mark too


def test_sigterm_while_busy_beyond_the_grace_period_releases_the_job_at_once(store, storage, client, spawn) -> None:
    tid = make_table(client, splits=())
    before = tablet_files(store, tid)
    plan(store, storage)
    p = spawn("busy-release", "--drain-grace", "0")
    p.wait_ready()
    poll(p.held.exists, "the merge to hold")
    (t,) = store.tables.tablets(tid)
    (ecid,) = t.running
    output = t.running[ecid].output
    started = time.monotonic()
    p.proc.send_signal(signal.SIGTERM)
    assert p.wait_exit(15) == 0, p.log
    assert time.monotonic() - started < 10
    assert_no_trace(store, storage, ecid, output)  # never a dead compaction
    assert tablet_files(store, tid) == before
    assert compactor_state(store, p.cid) is None
    # the job goes back in the queue
    assert Coordinator(store, storage).tick() and store.queues.stats(GROUP).queued == 1
    assert "dead_compactions" not in store.bookkeeping.counters()
    assert "released" in p.log or "cancelled" in p.log


def test_an_idle_compactor_is_woken_by_a_queued_job_not_by_its_next_poll(store, storage, client) -> None:
    """Issue 27 §3: a job queued for a group with an idle compactor starts at once. The
    compactor polls only every 60 s here, so a job taken within 20 s was a wake-up; and a drain
    still ends an idle wait at once."""
    w = Compactor(store, storage, settings(idle_min_s=60.0, idle_max_s=60.0, max_jobs=1))
    run = Running(w.run)
    poll(lambda: compactor_state(store, "c1") == "idle", "the compactor idle")
    poll(lambda: any(t.name == "wake-up" for t in threading.enumerate()), "the compactor in its idle wait")
    make_table(client, splits=())
    queued_at = time.monotonic()
    assert plan(store, storage) == 1
    assert run.join(timeout=20) == 0, "the queued job was not taken before the next poll"
    assert w.jobs_done == 1 and time.monotonic() - queued_at < 20
    # a drain ends the idle wait at once, as it did before the wake-ups
    w2 = Compactor(store, storage, settings("c2", idle_min_s=60.0, idle_max_s=60.0))
    run2 = Running(w2.run)
    poll(lambda: compactor_state(store, "c2") == "idle", "the second compactor idle")
    w2.request_drain("test")
    assert run2.join(timeout=10) == 0
