"""What the chaos run's verdict counts (``local.chaoscheck.check_chaos``), on a real redis-server.

A compactor frozen by chaos may already have sent its commit: Redis applies it all the same
(commands from different connections have no order), so the kill came after the commit landed.
Such a kill killed no merge: it must not be counted as one (CI once failed on it: 5 kills, 4 dead
compactions, the fifth in the commit log), while a kill mid-merge still must be detected dead and
its job re-run."""

from __future__ import annotations

import pytest

from kompaktor import keyspace as C
from kompaktor.files.storage import Storage
from kompaktor.local.chaos import ChaosLog
from kompaktor.local.chaoscheck import check_chaos
from kompaktor.metadata import compactions
from kompaktor.metadata.store import MetadataStore, Mutation
from kompaktor.model.job import Job
from kompaktor.model.tablet import FileInfo, FileMeta
from tests.support.rawredis import raw_redis

pytestmark = pytest.mark.redis


def _tablet_with_files(store: MetadataStore, storage: Storage, n: int) -> tuple[str, list[str]]:
    tid = store.tables.create_table("t", [])
    tablet = store.tables.tablet_ids(tid)[0]
    files = [f"tables/{tid}/F{i:010x}.parquet" for i in range(n)]
    m = Mutation(table=tid)
    m.tablet(tablet).do("add_files", {f: FileMeta(100 + i, 1).to_json() for i, f in enumerate(files)})
    store.mutate(m)
    for f in files:
        _write(storage, f)
    return tablet, files


def _write(storage: Storage, rel: str) -> None:
    storage.ensure_dir(rel.rsplit("/", 1)[0])
    with storage.open_output(rel) as out:
        out.write(b"x")


def _compact(store: MetadataStore, storage: Storage, tablet: str, files: list[str]) -> compactions.Reservation:
    res = compactions.try_reserve(store, Job(tablet, "SYSTEM", 1, "g", {f: 100 for f in files}), "c1", "g")
    _write(storage, res.output)
    compactions.commit(store, res, FileInfo(res.output, 1000, 10, 0, (b"a",), (b"b",)))
    return res


def test_a_kill_after_the_commit_landed_is_not_a_merge_killed(store: MetadataStore, storage: Storage) -> None:
    tablet, files = _tablet_with_files(store, storage, 4)
    log = ChaosLog(coordinator_restarts=1, redis_restarts=1)
    # killed mid-merge: reserved, never committed, found dead, its tablet compacted again
    res = compactions.try_reserve(store, Job(tablet, "SYSTEM", 1, "g", {f: 100 for f in files[:2]}), "c1", "g")
    log.killed.append((res.ecid, tablet))
    log.commits_at_kill[tablet] = store.bookkeeping.commits_on(tablet)
    store.running.log_dead(res.ecid, "g")
    compactions.release(store, storage, res)
    first = _compact(store, storage, tablet, files[:2])
    # "killed" with its commit already sent: the commit was applied
    late = compactions.try_reserve(store, Job(tablet, "SYSTEM", 1, "g", {f: 100 for f in files[2:]}), "c2", "g")
    log.killed.append((late.ecid, tablet))
    _write(storage, late.output)
    compactions.commit(store, late, FileInfo(late.output, 1000, 10, 0, (b"a",), (b"b",)))
    for f in files:  # the inputs the commits replaced (the garbage collector's part in the run)
        storage.delete(f)

    summary, ok = check_chaos(log, store, storage)

    assert ok, summary
    assert summary["chaos: compactors SIGKILLed mid-merge"] == 1
    assert summary["chaos: kills that came after the commit landed"] == 1
    assert summary["chaos: dead compactions detected (of the killed)"] == 1
    assert summary["chaos: killed jobs re-run"] == 1
    assert first.ecid in store.bookkeeping.commit_log() and late.ecid in store.bookkeeping.commit_log()


def test_a_merge_killed_and_never_found_dead_fails_the_verdict(store: MetadataStore, storage: Storage) -> None:
    tablet, files = _tablet_with_files(store, storage, 2)
    log = ChaosLog(coordinator_restarts=1, redis_restarts=1)
    res = compactions.try_reserve(store, Job(tablet, "SYSTEM", 1, "g", {f: 100 for f in files}), "c1", "g")
    log.killed.append((res.ecid, tablet))
    log.commits_at_kill[tablet] = store.bookkeeping.commits_on(tablet)
    compactions.release(store, storage, res)  # gone, but never logged dead nor re-run

    summary, ok = check_chaos(log, store, storage)

    assert not ok
    assert summary["chaos: compactors SIGKILLed mid-merge"] == 1
    assert summary["chaos: dead compactions detected (of the killed)"] == 0
    assert "chaos: kills that came after the commit landed" not in summary


def _clean_run(store: MetadataStore, storage: Storage) -> tuple[ChaosLog, compactions.Reservation]:
    """A verdict that holds: one compaction committed, its inputs collected, no kill."""
    tablet, files = _tablet_with_files(store, storage, 2)
    log = ChaosLog(coordinator_restarts=1, redis_restarts=1)
    res = _compact(store, storage, tablet, files)
    for f in files:
        storage.delete(f)
    summary, ok = check_chaos(log, store, storage)
    assert ok and summary["chaos: commits applied twice"] == 0, summary
    return log, res


def test_a_commit_applied_twice_fails_the_verdict(store: MetadataStore, storage: Storage) -> None:
    """Planted: the commit log shows one ECID twice, as a commit applied twice leaves it (also
    without an HA Redis: docs/verification.md)."""
    log, res = _clean_run(store, storage)
    raw_redis(store).rpush(C.COMMITLOG, res.ecid)
    summary, ok = check_chaos(log, store, storage)
    assert not ok and summary["chaos: commits applied twice"] == 1
    assert f"{res.ecid} applied twice" in summary["chaos: found"]


def test_a_referenced_file_deleted_fails_the_verdict(store: MetadataStore, storage: Storage) -> None:
    log, res = _clean_run(store, storage)
    storage.delete(res.output)
    summary, ok = check_chaos(log, store, storage)
    assert not ok and summary["chaos: referenced files missing"] == 1
    assert f"{res.output} referenced but missing" in summary["chaos: found"]
