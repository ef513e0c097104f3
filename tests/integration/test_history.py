"""The compaction history (issue 36 §1) on a real redis-server: every finished job leaves a record
— committed, failed, dead-lettered, cancelled, retried, killed — written by the real compactor
(Arrow engine) or the coordinator's dead-compaction detection; bounded per group by count and age;
read by `kompaktor history` and shown as the last failures in `kompaktor status`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kompaktor import keyspace as C
from kompaktor.client import Client
from kompaktor.coordinator.dead import detect_dead
from kompaktor.files.storage import Storage
from kompaktor.metadata import compactions, failures, history
from kompaktor.metadata.brokered import BrokeredJobs
from kompaktor.metadata.store import MetadataStore
from kompaktor.worker import Compactor, WorkerSettings
from tests.integration.test_worker import ROWS, entries, make_table, plan
from tests.support.broker import running_broker
from tests.support.procs import python_env
from tests.support.rawredis import raw_redis

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

GROUP = "default"


def worker(store: MetadataStore, storage: Storage, engine: object = None, **kw: object) -> Compactor:
    settings = WorkerSettings(GROUP, "c-hist", engine="arrow", heartbeat_s=0.2, **kw)  # type: ignore[arg-type]
    return Compactor(store, storage, settings, engine=engine)


def records(store: MetadataStore, **kw) -> list[history.Record]:
    return history.read(store, [GROUP], **kw)


def cli(redis_url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = python_env(KOMPAKTOR_REDIS_URL=redis_url, KOMPAKTOR_STORAGE=str(tmp_path / "files"), COLUMNS="200")
    return subprocess.run(
        [sys.executable, "-m", "kompaktor", *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_a_committed_job_leaves_its_record(store: MetadataStore, storage: Storage, client: Client) -> None:
    tid = make_table(client, splits=())
    plan(store, storage)
    (tablet,) = store.tables.tablets(tid)
    sizes = {f: m.size for f, m in tablet.files.items()}
    outcome = worker(store, storage).run_one()
    assert outcome is not None and outcome.status == "committed"
    (rec,) = records(store)
    (after,) = store.tables.tablets(tid)
    ((_output, meta),) = after.files.items()
    assert rec.ecid == outcome.ecid and rec.outcome == history.COMMITTED and not rec.failed
    assert (rec.group, rec.table, rec.tablet, rec.kind, rec.compactor, rec.engine) == (
        GROUP,
        tid,
        tablet.id,
        "SYSTEM",
        "c-hist",
        "arrow",
    )
    assert (rec.input_files, rec.input_bytes) == (len(sizes), sum(sizes.values()))
    assert rec.input_entries == sum(m.entries for m in tablet.files.values())
    assert (rec.output_bytes, rec.output_entries) == (meta.size, meta.entries)
    assert rec.merge_s is not None and rec.merge_s >= 0 and rec.commit_s is not None and rec.commit_s >= 0
    assert rec.reason == "" and rec.resumed_parts == 0 and abs(rec.finished - time.time()) < 60


#: the delete markers make_table's four flushes hold (every third row of the odd ones), counted
#: from the entries written, not by the engines
DELETES_WRITTEN = sum(e.deleted for k in range(4) for e in entries(k, ROWS, 1000 + k))


class Later:
    """The compactor's clock, ``ahead`` seconds ahead of the coordinator's that queued the job."""

    def __init__(self, ahead: float) -> None:
        self.ahead = ahead

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)

    def time(self) -> float:
        return time.time() + self.ahead


def check_queued_and_deletes(store: MetadataStore, storage: Storage, client: Client, w: Compactor) -> None:
    """A full compaction of make_table's tablet, reserved 120 s (on the compactor's clock) after it
    was queued: its record says it waited that long and dropped every delete marker written."""
    from kompaktor.worker import compactor as compactor_module

    tid = make_table(client, splits=())
    assert DELETES_WRITTEN > 0
    queued_from = time.time()
    plan(store, storage)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(compactor_module, "time", Later(120.0))
        outcome = w.run_one()
    waited = time.time() - queued_from
    assert outcome is not None and outcome.status == "committed", outcome
    (rec,) = records(store)
    (after,) = store.tables.tablets(tid)
    ((_output, meta),) = after.files.items()
    assert rec.input_files == 4 and meta.deletes == 0  # all the tablet's files: a full compaction
    assert rec.deletes_dropped == DELETES_WRITTEN
    assert rec.queued_s is not None and 120.0 <= rec.queued_s <= 120.0 + waited


@pytest.mark.parametrize("resumable", [False, True], ids=["plain", "resumable"])
def test_a_record_says_how_long_the_job_was_queued_and_the_deletes_it_dropped(
    store: MetadataStore, storage: Storage, client: Client, resumable: bool
) -> None:
    kw = {"resume": True, "resume_min_bytes": 0} if resumable else {"resume": False}
    check_queued_and_deletes(store, storage, client, worker(store, storage, **kw))


def test_a_job_reserved_through_the_broker_records_how_long_it_was_queued(
    store: MetadataStore, storage: Storage, client: Client, redis_url: str
) -> None:
    """A compactor pod reserves through the coordinator's broker: the reservation it is handed
    keeps when its tablet was queued."""
    settings = WorkerSettings(GROUP, "c-hist", engine="arrow", heartbeat_s=0.2, resume=False)
    with running_broker(redis_url):
        w = Compactor(store, storage, settings, jobs=BrokeredJobs(store, timeout_s=10.0))
        check_queued_and_deletes(store, storage, client, w)
    # reserved by the broker, which wrote the record too: its record of the reservation went with it
    assert not raw_redis(store).keys(C.reservation_key("*"))


@pytest.mark.spark
@pytest.mark.timeout(300)
@pytest.mark.parametrize("resumable", [False, True], ids=["plain", "resumable"])
def test_the_spark_engine_counts_the_deletes_it_dropped(
    store: MetadataStore, storage: Storage, client: Client, spark_engine, resumable: bool
) -> None:
    from kompaktor.engines.spark import SparkMergeEngine
    from tests.integration.conftest import SPARK_MASTER

    engine = spark_engine
    if resumable:  # another engine on the same session, whose merges are all resumable
        engine = SparkMergeEngine(SPARK_MASTER, task_entries=8, warm=False, resume_min_bytes=0)
    w = worker(store, storage, engine=engine, resume=resumable)
    check_queued_and_deletes(store, storage, client, w)


def test_failures_then_the_dead_letter_are_recorded_with_their_reason(
    store: MetadataStore, storage: Storage, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    tid = make_table(client, splits=())
    (tablet,) = store.tables.tablets(tid)
    bad = sorted(tablet.files)[1]
    with storage.fs.open_output_stream(storage.path(bad)) as f:
        f.write(b"PAR1 this is not parquet at all PAR1")
    plan(store, storage)
    w = worker(store, storage)
    assert w.run_one().status == "failed"
    now = [time.time()]

    class Clock:
        @staticmethod
        def time() -> float:
            return now[0]

    monkeypatch.setattr(failures, "time", Clock)
    for _attempt in (2, 3):  # each later attempt, once its backoff has passed
        now[0] += failures.MAX_BACKOFF_S + 1
        assert plan(store, storage) == 1
        assert w.run_one().status == "failed"
    recs = records(store)
    assert [r.outcome for r in recs] == [history.DEAD_LETTERED, history.FAILED, history.FAILED]
    assert all(r.failed and bad in r.reason and r.tablet == tablet.id for r in recs)
    assert all(r.output_bytes is None and r.commit_s is None and r.deletes_dropped is None for r in recs)
    # each attempt waited in the queue from its (re-)queuing to its reservation
    assert all(r.queued_s is not None and 0 <= r.queued_s < 60 for r in recs)
    assert records(store, failed=True) == recs


def test_a_dead_compaction_is_recorded_as_killed(
    store: MetadataStore, storage: Storage, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    tid = make_table(client, splits=())
    plan(store, storage)
    res = compactions.reserve(store, store.queues, GROUP, "c-gone")
    assert res is not None
    compactions.heartbeat(store, res, {"entries_read": 7, "bytes_read": 10})
    raw_redis(store).hset(C.heartbeat_key(res.ecid), "updated", time.time() - 100)  # its compactor went silent
    assert detect_dead(store, storage, dead_after_s=30, max_attempts=3) == [res.ecid]
    (rec,) = records(store)
    assert (rec.ecid, rec.outcome, rec.compactor, rec.table, rec.input_files) == (
        res.ecid,
        history.KILLED,
        "c-gone",
        tid,
        len(res.inputs),
    )
    assert rec.reason.startswith("compactor died: no heartbeat for 1") and rec.input_entries == 7
    # one dead compaction too many (once the backoff has passed): dead-lettered
    later = time.time() + failures.MAX_BACKOFF_S + 1

    class Clock:
        @staticmethod
        def time() -> float:
            return later

    monkeypatch.setattr(failures, "time", Clock)
    plan(store, storage)
    res2 = compactions.reserve(store, store.queues, GROUP, "c-gone")
    assert res2 is not None
    raw_redis(store).hset(C.heartbeat_key(res2.ecid), "updated", time.time() - 100)
    assert detect_dead(store, storage, dead_after_s=30, max_attempts=2) == [res2.ecid]
    assert [r.outcome for r in records(store)] == [history.DEAD_LETTERED, history.KILLED]


def test_the_history_is_bounded_by_count_and_by_age(store: MetadataStore) -> None:
    key = C.history_key(GROUP)

    def rec(i: int) -> history.Record:
        return history.Record(f"ECID-{i:016x}", history.COMMITTED, GROUP, "1", "1;", "SYSTEM", "c", time.time())

    for i in range(1000):
        assert history.append(store, rec(i), history.HistoryLimits(max_records=100))
    # approximate trimming (whole stream nodes of 100 entries): about the bound, never all
    assert 100 <= raw_redis(store).xlen(key) < 300
    assert records(store, limit=1)[0].ecid == rec(999).ecid
    # records older than the age bound go: entries written a day ago (ids from then)
    raw_redis(store).delete(key)
    old = int((time.time() - 86_400) * 1000)
    for i in range(250):
        raw_redis(store).xadd(key, {"r": json.dumps(rec(i).to_json())}, id=f"{old + i}-0")
    assert history.append(store, rec(1000), history.HistoryLimits(max_age_s=3600))
    assert raw_redis(store).xlen(key) <= 100  # the two full nodes of day-old records went
    assert records(store, limit=1)[0].ecid == rec(1000).ecid
    with pytest.raises(ValueError, match="at least 1 record"):
        history.HistoryLimits(max_records=0)


def test_compactors_and_the_coordinator_trim_to_the_groups_bounds(
    store: MetadataStore, storage: Storage, client: Client
) -> None:
    """A CompactorGroup's spec.history, stored with the group's configuration: its compactors trim
    the group's history to it when they record a job, and the coordinator when it records a dead
    one (its own bounds, the defaults here, are for groups with no configuration)."""
    from kompaktor.resources import models as m

    key = C.history_key(GROUP)
    spec = m.CompactorGroupSpec.model_validate({"spark": {"engine": "arrow"}, "history": {"maxRecords": 100}})
    store.fleet.put_group(m.to_group_config(GROUP, spec))
    settings = WorkerSettings.for_group(store.fleet.groups()[GROUP], "c-bounded", heartbeat_s=0.2)
    assert settings.history_limits == history.HistoryLimits(100, 7 * 86_400.0)

    def fill(n: int, at: float) -> None:
        start = int(at * 1000)
        for i in range(n):
            rec = history.Record(f"ECID-{i:016x}", history.COMMITTED, GROUP, "1", "1;", "SYSTEM", "c", at)
            raw_redis(store).xadd(key, {"r": json.dumps(rec.to_json())}, id=f"{start + i}-0")

    fill(1000, time.time() - 60)
    make_table(client, splits=(b"m",))
    plan(store, storage)
    assert Compactor(store, storage, settings).run_one().status == "committed"
    assert 100 <= raw_redis(store).xlen(key) < 300  # about the group's 100, not the default 10,000
    assert records(store, limit=1)[0].compactor == "c-bounded"

    # the age bound: an hour; records a day old go when the coordinator records a dead compaction
    spec = m.CompactorGroupSpec.model_validate({"history": {"maxAgeSeconds": 3600}})
    store.fleet.put_group(m.to_group_config(GROUP, spec))
    raw_redis(store).delete(key)
    fill(250, time.time() - 86_400)
    res = compactions.reserve(store, store.queues, GROUP, "c-gone")
    assert res is not None
    raw_redis(store).hset(C.heartbeat_key(res.ecid), "updated", time.time() - 100)
    assert detect_dead(store, storage, dead_after_s=30, max_attempts=3) == [res.ecid]
    assert raw_redis(store).xlen(key) <= 100  # the two full nodes of day-old records went
    assert records(store, limit=1)[0].ecid == res.ecid


def test_a_reason_is_kept_redacted_on_one_line(store: MetadataStore) -> None:
    reason = "storage unavailable: cannot reach\n  s3://key:SECRET@host/b?token=T0KEN " + "x" * 600
    r = history.Record("ECID-1", history.RETRIED, GROUP, "1", "1;", "SYSTEM", "c", time.time(), reason=reason)
    assert history.append(store, r)
    (got,) = records(store)
    assert "SECRET" not in got.reason and "T0KEN" not in got.reason and "\n" not in got.reason
    assert got.reason.startswith("storage unavailable: cannot reach s3://***@host/b?token=***")
    assert len(got.reason) == history.REASON_MAX


def test_history_and_status_commands(
    redis_url: str, store: MetadataStore, storage: Storage, client: Client, tmp_path: Path
) -> None:
    tid = make_table(client, splits=(b"m",))
    plan(store, storage)
    w = worker(store, storage)
    assert w.run_one().status == "committed"
    res = compactions.reserve(store, store.queues, GROUP, "c-gone")
    assert res is not None
    raw_redis(store).hset(C.heartbeat_key(res.ecid), "updated", time.time() - 100)
    assert detect_dead(store, storage, dead_after_s=30, max_attempts=3) == [res.ecid]

    out = cli(redis_url, tmp_path, "history", "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [r["outcome"] for r in rows] == ["killed", "committed"] and {r["table"] for r in rows} == {"t"}
    failed = json.loads(cli(redis_url, tmp_path, "history", "--json", "--failed", "--table", "t").stdout)
    assert [r["ecid"] for r in failed] == [res.ecid]
    assert json.loads(cli(redis_url, tmp_path, "history", "--json", "--group", "other").stdout) == []
    assert len(json.loads(cli(redis_url, tmp_path, "history", "--json", "--since", "1h").stdout)) == 2
    future = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() + 3600))
    assert json.loads(cli(redis_url, tmp_path, "history", "--json", "--since", future).stdout) == []
    text = cli(redis_url, tmp_path, "history").stdout
    assert "killed" in text and "committed" in text and "compactor died" in text

    st = json.loads(cli(redis_url, tmp_path, "status", "--json").stdout)
    ((rec,),) = st["last_failures"].values()
    assert (rec["ecid"], rec["outcome"], rec["table"]) == (res.ecid, "killed", "t")
    assert "last failures of group default" in cli(redis_url, tmp_path, "status").stdout
    del tid

    # bad input: one line, exit 1
    for args, msg in (
        (("--since", "yesterday"), "--since 'yesterday'"),
        (("--table", "nope"), "no table named 'nope'"),
    ):
        bad = cli(redis_url, tmp_path, "history", *args)
        assert bad.returncode == 1 and msg in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_a_filtered_read_goes_back_in_bounded_calls_until_it_has_enough(store: MetadataStore) -> None:
    def rec(i: int, outcome: str = history.COMMITTED) -> history.Record:
        return history.Record(f"ECID-{i:016x}", outcome, GROUP, "1", "1;", "SYSTEM", "c", 1000.0 + i)

    assert history.append(store, rec(0, history.FAILED))
    for i in range(1, 2 * history.READ_CHUNK + 10):  # the failure is more than two calls back
        assert history.append(store, rec(i))
    r = raw_redis(store)
    slower_than = r.config_get("slowlog-log-slower-than")["slowlog-log-slower-than"]
    r.config_set("slowlog-log-slower-than", 0)  # the server logs every command with its arguments
    r.slowlog_reset()
    try:
        (got,) = history.read(store, [GROUP], failed=True, limit=3)
        calls = [e["command"].split() for e in r.slowlog_get(1000) if e["command"].startswith(b"XREVRANGE")]
    finally:
        r.config_set("slowlog-log-slower-than", slower_than)
    assert got.ecid == rec(0).ecid
    assert len(calls) == 3 and all(c[-1] == str(history.READ_CHUNK).encode() for c in calls)
    assert [r.ecid for r in history.read(store, [GROUP], limit=2)] == [
        rec(2 * history.READ_CHUNK + 9).ecid,
        rec(2 * history.READ_CHUNK + 8).ecid,
    ]
