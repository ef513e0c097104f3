"""Resumable merges through the compactor and the coordinator (issue 23 §2), on a real
redis-server: a released job resumes on another compactor; a job that changed or was cancelled
discards its progress; the garbage collector keeps a live job's parts and collects the parts of
a job that will never resume after the temp-file grace period; and the chaos case — a
``kompaktor compactor`` process SIGKILLed at 30/60/90% of a merge — finishes on retry having read
only the unfinished share, nothing lost, nothing stray."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from prometheus_client import generate_latest

from kompaktor import keyspace as C
from kompaktor.client import Client
from kompaktor.coordinator import Coordinator, CoordinatorSettings
from kompaktor.engines.arrow import ArrowMergeEngine
from kompaktor.files.sortedfile import entries_to_table
from kompaktor.files.storage import Storage
from kompaktor.local.procs import kill_group, spawn, stop_popen
from kompaktor.metadata import broker_messages as m
from kompaktor.metadata import progress as records
from kompaktor.metadata import user_compactions as usercompaction
from kompaktor.metadata.brokered import BrokeredJobs
from kompaktor.metadata.store import MetadataStore
from kompaktor.model.keys import Entry, sort_key
from kompaktor.model.names import TMP_PREFIX
from kompaktor.model.tablet import FileMeta
from kompaktor.worker import Compactor, WorkerSettings
from tests.integration.gated_engine import GatedEngine
from tests.support.broker import running_broker
from tests.support.procs import python_env
from tests.support.rawredis import raw_redis
from tests.support.wait import poll

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]

GROUP = "default"
RANGE_ENTRIES = 500
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(Path(__file__).parent / "resume_worker.py")


def wait_for(pred: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    return poll(pred, what, timeout=timeout, every=0.02)


def source(seed: int, n: int) -> list[Entry]:
    rng = np.random.default_rng(seed)
    out = {}
    for _ in range(n):
        row = b"r" + bytes(rng.integers(0, 256, size=5, dtype=np.uint8))
        ts = int(rng.integers(1, 1000))
        deleted = bool(rng.random() < 0.05)
        out[(row, ts)] = Entry(row, b"f", b"q", b"", ts, deleted, b"" if deleted else b"v%d-%d" % (seed, ts))
    return sorted(out.values(), key=sort_key)


def make_table(store: MetadataStore, storage: Storage, files: int = 4, n: int = 3000) -> tuple[str, int]:
    """One tablet with ``files`` input files written in small row groups (so that a key range
    decodes only its share of an input). Returns the table id and the inputs' compressed bytes."""
    store.tables.create_table("t")
    tid = store.tables.table_id("t")
    os.makedirs(storage.path(f"tables/{tid}"), exist_ok=True)
    metas, compressed = {}, 0
    for i in range(files):
        src = source(i, n)
        rel = f"tables/{tid}/F{i + 1:010x}-{i + 1:016x}.parquet"
        pq.write_table(entries_to_table(src), storage.path(rel), row_group_size=200, compression="zstd")
        md = pq.ParquetFile(storage.path(rel)).metadata
        compressed += sum(
            md.row_group(g).column(c).total_compressed_size
            for g in range(md.num_row_groups)
            for c in range(md.num_columns)
        )
        deletes = sum(e.deleted for e in src)
        metas[rel] = FileMeta(storage.size(rel), len(src), deletes, src[0].row, src[-1].row)
    store.files.add_files("t", metas)
    return tid, compressed


def engine() -> ArrowMergeEngine:
    return ArrowMergeEngine(range_entries=RANGE_ENTRIES, resume_min_bytes=0)


class Recording:
    """The real engine; keeps every progress report (what the compactor heartbeats)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name = inner, inner.name
        self.reports: list[dict] = []

    def merge(self, storage, req, *, progress=None, cancel=None):
        def on_progress(p: dict) -> None:
            self.reports.append(dict(p))
            if progress is not None:
                progress(p)

        return self.inner.merge(storage, req, progress=on_progress, cancel=cancel)


def settings(cid: str, **kw: Any) -> WorkerSettings:
    kw.setdefault("engine", "arrow")
    kw.setdefault("heartbeat_s", 0.05)
    return WorkerSettings(GROUP, cid, **kw)


def plan(store: MetadataStore, storage: Storage) -> None:
    Coordinator(store, storage).full_scan()
    assert store.queues.stats(GROUP).queued == 1


def temp_files(storage: Storage) -> list[str]:
    return sorted(rel for rel, _ in storage.list_files("tables") if rel.rsplit("/", 1)[-1].startswith(TMP_PREFIX))


def only_record(store: MetadataStore) -> tuple[str, int, int]:
    """(fingerprint, parts recorded, ranges) of the one progress record."""
    (fp,) = records.records(store)
    raw = raw_redis(store).hgetall(C.progress_key(fp))
    import json

    cuts = json.loads(raw[b"job"])["cuts"]
    return fp, sum(1 for k in raw if k.startswith(b"p:")), len(cuts)


def metric(w: Compactor, name: str) -> float:
    for line in generate_latest(w.metrics.registry).decode().splitlines():
        if line.startswith(f'{name}{{group="{GROUP}"}} '):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not exported")


def interrupted_by_drain(store: MetadataStore, storage: Storage, hold_after: int = 3, queued: bool = False) -> None:
    """A compactor drained (grace period too short) while merging: it releases the job after
    ``hold_after`` recorded parts; the progress stays. ``queued``: the job is already queued."""
    if not queued:
        plan(store, storage)
    gated = GatedEngine(engine(), threading.Event(), hold_after_parts=hold_after)
    w = Compactor(store, storage, settings("c1", drain_grace_s=60.0, default_throughput_bps=1.0), engine=gated)
    out: list[Any] = []
    th = threading.Thread(target=lambda: out.append(w.run_one()), daemon=True)
    th.start()
    wait_for(gated.held.is_set, "the merge to hold")
    w.request_drain("test")
    th.join(30)
    assert out and out[0].status == "cancelled" and "draining" in out[0].reason, out


@pytest.fixture(params=["direct", "broker"])
def writes(request: pytest.FixtureRequest, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The compactors' writes made by themselves, or asked of the coordinator's broker (what a
    compactor pod does): a resumable merge's progress records go through it too."""
    if request.param == "direct":
        yield "direct"
        return
    asked: list[str] = []

    class Asking(BrokeredJobs):
        def ask(self, req: m.Request, timeout_s: float | None = None) -> Any:
            asked.append(req.op)
            return super().ask(req, timeout_s)

    monkeypatch.setattr("kompaktor.worker.compactor.DirectJobs", lambda s: Asking(s, timeout_s=10.0))
    with running_broker(redis_url):
        yield "broker"
    assert {"reserve", "history"} <= set(asked), asked  # the broker made the writes


def test_a_released_job_resumes_on_another_compactor(store: MetadataStore, storage: Storage, writes: str) -> None:
    client = Client(store, storage)
    make_table(store, storage)
    before = list(client.scan("t"))
    interrupted_by_drain(store, storage)
    fp, recorded, n = only_record(store)
    assert recorded == 3 and n >= 10
    assert len(temp_files(storage)) == 3  # the recorded parts, nothing else
    plan(store, storage)
    rec = Recording(engine())
    w = Compactor(store, storage, settings("c2"), engine=rec)
    outcome = w.run_one()
    assert outcome.status == "committed", outcome
    last = rec.reports[-1]
    assert last["parts_reused"] == 3 and rec.reports[0]["parts_done"] == 3
    assert metric(w, "kompaktor_resume_parts_reused_total") == 3
    assert metric(w, "kompaktor_resume_bytes_reused_total") == last["bytes_reused"] > 0
    assert list(client.scan("t")) == before
    # committed: the record and every part are gone
    assert records.records(store) == {} and not raw_redis(store).exists(C.progress_key(fp))
    # the broker's records of its reservations went with the jobs' history records
    assert not raw_redis(store).keys(C.reservation_key("*"))
    assert temp_files(storage) == []


def test_a_cancelled_user_compaction_discards_its_progress(store: MetadataStore, storage: Storage, writes: str) -> None:
    client = Client(store, storage)
    make_table(store, storage)
    before = list(client.scan("t"))
    cid = usercompaction.start(store, "t")
    Coordinator(store, storage).tick()
    assert store.queues.stats(GROUP).queued == 1
    gated = GatedEngine(engine(), threading.Event(), hold_after_parts=2)
    w = Compactor(store, storage, settings("c1"), engine=gated)
    out: list[Any] = []
    th = threading.Thread(target=lambda: out.append(w.run_one()), daemon=True)
    th.start()
    wait_for(gated.held.is_set, "the merge to hold")
    assert only_record(store)[1] == 2 and len(temp_files(storage)) == 2
    usercompaction.cancel(store, cid)
    th.join(30)
    assert out[0].status == "cancelled" and "user compaction cancelled" in out[0].reason, out
    # discarded by the compactor at once: no record, no part
    assert records.records(store) == {} and temp_files(storage) == []
    assert list(client.scan("t")) == before


def test_a_user_compaction_cancelled_between_attempts_discards_its_progress(
    store: MetadataStore, storage: Storage
) -> None:
    """Drained mid-merge (progress kept for the retry), then cancelled while no compactor runs it:
    the coordinator's next pass prunes the record (its selection is gone), and its parts go after
    the grace period."""
    client = Client(store, storage)
    make_table(store, storage)
    before = list(client.scan("t"))
    cid = usercompaction.start(store, "t")
    Coordinator(store, storage).tick()
    interrupted_by_drain(store, storage, queued=True)
    fp, recorded, _n = only_record(store)
    parts = temp_files(storage)
    assert recorded == 3 and len(parts) == 3
    coord = Coordinator(store, storage)
    assert coord.collect_garbage(0.0) == [] and records.records(store) != {}  # live: kept
    usercompaction.cancel(store, cid)
    assert coord.collect_garbage(1e9) == []
    assert records.records(store) == {} and not raw_redis(store).exists(C.progress_key(fp))
    assert sorted(coord.collect_garbage(0.0)) == parts
    assert list(client.scan("t")) == before


def test_a_split_tablet_discards_the_progress_of_its_interrupted_job(store: MetadataStore, storage: Storage) -> None:
    """A tablet split after its merge was interrupted: the job (tablet id, range) no longer exists;
    the coordinator's next pass prunes the record and its parts go after the grace period; the new
    tablets' jobs merge from scratch (other fingerprints)."""
    from kompaktor.metadata import tablet_ops

    client = Client(store, storage)
    make_table(store, storage)
    before = list(client.scan("t"))
    interrupted_by_drain(store, storage)
    fp, _recorded, _n = only_record(store)
    parts = temp_files(storage)
    tablet_ops.split(store, "t", [b"r\x80"])
    coord = Coordinator(store, storage)
    assert coord.collect_garbage(1e9) == []  # pruned, but the parts are young: left for now
    assert records.records(store) == {} and not raw_redis(store).exists(C.progress_key(fp))
    assert temp_files(storage) == parts
    assert sorted(coord.collect_garbage(0.0)) == parts
    coord.full_scan()
    rec = Recording(engine())
    w = Compactor(store, storage, settings("c2"), engine=rec)
    while (outcome := w.run_one()) is not None:
        assert outcome.status == "committed", outcome
    assert sum(r["parts_reused"] for r in rec.reports if r["parts_done"] == r["parts"]) == 0
    assert list(client.scan("t")) == before
    assert temp_files(storage) == [] and records.records(store) == {}


def test_gc_keeps_a_live_jobs_parts_and_collects_those_of_a_job_that_changed(
    store: MetadataStore, storage: Storage
) -> None:
    client = Client(store, storage)
    tid, _ = make_table(store, storage)
    before = list(client.scan("t"))
    interrupted_by_drain(store, storage)
    fp, _recorded, _n = only_record(store)
    parts = temp_files(storage)
    assert len(parts) == 3
    # live (the job can run again as it was): kept whatever their age, grace 0
    coord = Coordinator(store, storage, CoordinatorSettings(gc_grace_s=0.0))
    assert coord.collect_garbage(0.0) == []
    assert temp_files(storage) == parts and records.records(store) == {fp: f"{tid};~"}
    # the job changes: another compaction (without resume) takes its inputs away
    plan(store, storage)
    w = Compactor(store, storage, settings("c2", resume=False), engine=engine())
    assert w.run_one().status == "committed"
    assert temp_files(storage) == parts  # not resumable: nobody discarded the old record
    # the next pass prunes the record; its parts are then temp files, left until the grace passes
    assert coord.collect_garbage(1e9) == []
    assert records.records(store) == {} and not raw_redis(store).exists(C.progress_key(fp))
    assert temp_files(storage) == parts
    assert set(parts) <= set(coord.collect_garbage(0.0))  # with the compacted-away inputs
    assert temp_files(storage) == []
    assert list(client.scan("t")) == before


@pytest.mark.parametrize(
    ("kind", "at"),
    [("arrow", 0.3), ("arrow", 0.6), ("arrow", 0.9), pytest.param("spark", 0.6, marks=pytest.mark.spark)],
)
def test_chaos_sigkill_mid_merge_then_the_retry_reads_only_the_unfinished_share(
    store: MetadataStore, storage: Storage, redis_url: str, tmp_path: Path, kind: str, at: float
) -> None:
    """The whole compactor (its process group: with Spark, the JVM and Python workers too) is
    SIGKILLed once the merge has finished ``at`` of its key ranges; the retry runs on an Arrow
    compactor (any engine resumes any engine's record: the cuts are recorded)."""
    client = Client(store, storage)
    tid, compressed = make_table(store, storage, files=4, n=5000)
    before = list(client.scan("t"))
    total_entries = sum(t.files[f].entries for t in store.tables.tablets(tid) for f in t.files)
    plan(store, storage)
    held = tmp_path / "held"
    env = python_env(
        KOMPAKTOR_REDIS_URL=redis_url,
        KOMPAKTOR_STORAGE=storage.uri,
        KOMPAKTOR_TEST_HOLD_AT=str(at),
        KOMPAKTOR_TEST_HELD=str(held),
        KOMPAKTOR_TEST_RANGE_ENTRIES=str(RANGE_ENTRIES),
        KOMPAKTOR_TEST_ENGINE=kind,
        POD_NAME="victim",
        PYTHONUNBUFFERED="1",
    )
    proc = spawn(
        [sys.executable, SCRIPT, "compactor", "--group", GROUP, "--engine", kind, "--http-port", "-1"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(held.exists, "the compactor to reach the kill point", timeout=90)
        done, n = map(int, held.read_text().split())
        assert done == math.ceil(at * n)
        kill_group(proc.pid)  # SIGKILL to the whole process group: no cleanup of any kind
        proc.wait(10)
    finally:
        stop_popen(proc, 5)
    _fp, recorded, n2 = only_record(store)
    assert (recorded, n2) == (done, n)

    # the coordinator finds the compaction dead, frees the job, and queues it again after its backoff
    coord = Coordinator(store, storage, CoordinatorSettings(dead_after_s=0.5, gc_grace_s=300.0))
    wait_for(lambda: coord.detect_dead(), "dead-compaction detection")
    wait_for(lambda: (coord.tick(), store.queues.stats(GROUP).queued == 1)[1], "the job queued again")
    rec = Recording(engine())
    w = Compactor(store, storage, settings("c2"), engine=rec)
    outcome = w.run_one()
    assert outcome.status == "committed", outcome
    last = rec.reports[-1]
    assert last["parts_reused"] == done and rec.reports[0]["parts_done"] == done
    assert last["entries_read"] + last["entries_reused"] == total_entries
    share = (n - done) / n
    reread = last["input_bytes_reread"]
    # only the unfinished share is read again (plus the row groups straddling the first cut)
    assert reread <= compressed * share + 4 * 2 * (compressed / total_entries * 200) + 1
    print(
        f"\nkilled at {done}/{n} parts: retry re-read {reread} of {compressed} input bytes "
        f"({reread / compressed:.1%}; unfinished share {share:.1%}), entries {last['entries_read']} of "
        f"{total_entries}, reused {last['parts_reused']} parts"
    )
    assert list(client.scan("t")) == before  # nothing lost
    assert records.records(store) == {}
    # nothing stray once the garbage collector has run (what the killed process was writing)
    coord.collect_garbage(0.0)
    assert temp_files(storage) == []
    referenced = {f for t in store.tables.tablets(tid) for f in t.files}
    assert {rel for rel, _ in storage.list_files("tables")} == referenced
