"""Backups that restore (issue 35 §1, §2, §4): a workload of flushes, imports, deletes, partial and
full compactions, splits and garbage collection with no grace takes backups as it goes; then the
Redis server is SIGKILLed and its data (AOF, RDB) deleted, an empty one started, and the latest
backup restored with `kompaktor restore`. The scan must equal a reference view computed here from
the writes acknowledged before that backup: nothing lost, nothing deleted come back, no key twice.
Every retained backup must still verify (the collector spared their files), a restore refuses a
Redis that holds metadata, and compactions running at the backup are gone after it."""

from __future__ import annotations

import json
import random
import shutil
from collections import defaultdict
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from kompaktor.cli import main
from kompaktor.client import Client
from kompaktor.coordinator.gc import collect_garbage
from kompaktor.engines import make_engine
from kompaktor.engines.api import MergeRequest
from kompaktor.files.storage import Storage
from kompaktor.local.redis_server import RedisProcess
from kompaktor.metadata import backup, compactions
from kompaktor.metadata import tablet_ops as tabletops
from kompaktor.metadata.store import MetadataStore
from kompaktor.model.errors import ConditionFailed
from kompaktor.model.job import Job
from kompaktor.model.keys import Entry
from kompaktor.model.names import tmp_tag

pytestmark = pytest.mark.redis
ENGINE = make_engine("arrow")
ROWS = [b"%03d" % i for i in range(40)]


def reference(accepted: list[tuple[bytes, int, bool]]) -> list[tuple[bytes, int]]:
    """Per row the newest put not hidden by a delete of the same or a newer time."""
    by_row: dict[bytes, list[tuple[int, bool]]] = defaultdict(list)
    for row, ts, d in accepted:
        by_row[row].append((ts, d))
    out = []
    for row, ws in sorted(by_row.items()):
        dmax = max((ts for ts, d in ws if d), default=None)
        puts = [ts for ts, d in ws if not d and (dmax is None or ts > dmax)]
        if puts:
            out.append((row, max(puts)))
    return out


class Workload:
    def __init__(self, client: Client, seed: int) -> None:
        self.client, self.rng = client, random.Random(seed)
        self.accepted: list[tuple[bytes, int, bool]] = []
        self.flushed: list[str] = []  # every file a flush wrote, in order
        self.ts = 0
        client.store.tables.create_table("t", [b"010", b"025"])

    def write(self) -> None:
        self.ts += 1
        rows = self.rng.sample(ROWS, 6)
        ws = [(r, self.ts, self.rng.random() < 0.3) for r in rows]
        self.flushed += self.client.flush("t", [Entry(r, b"f", b"q", b"", ts, d, b"" if d else r) for r, ts, d in ws])
        self.accepted.extend(ws)

    def reserve(self, full: bool):
        ts = self.client.store.tables.tablets(self.client.store.tables.table_id("t"))
        t = self.rng.choice([t for t in ts if t.files and not t.running] or [None])
        if t is None:
            return None
        files = sorted(t.files) if full else sorted(t.files)[: max(1, len(t.files) // 2)]
        job = Job(t.id, "SYSTEM", 1, "test", {f: t.files[f].size for f in files})
        try:
            return compactions.try_reserve(self.client.store, job, "bk", "test")
        except ConditionFailed:
            return None

    def compact(self) -> None:
        res = self.reserve(self.rng.random() < 0.6)
        if res is None:
            return
        out = ENGINE.merge(
            self.client.storage, MergeRequest(res.inputs, res.output, res.prev, res.end, res.settings, res.ecid)
        )
        try:
            compactions.commit(self.client.store, res, out.info)
        except ConditionFailed:
            compactions.release(self.client.store, self.client.storage, res)

    def step_without_splits(self) -> None:
        if self.rng.random() < 0.5:
            self.write()
        else:
            self.compact()

    def step(self) -> None:
        r = self.rng.random()
        if r < 0.55:
            self.write()
        elif r < 0.9:
            self.compact()
        elif r < 0.95:
            try:
                tabletops.split(self.client.store, "t", [self.rng.choice(ROWS)])
            except tabletops.TabletOpRefused:
                pass
        else:
            collect_garbage(self.client.store, self.client.storage, grace_s=0)


@pytest.mark.parametrize("adopt", [False, True], ids=["backup", "adopt-newer"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_restore_after_losing_every_redis_node(tmp_path: Path, seed: int, adopt: bool) -> None:
    """Restored: every write acknowledged before the backup; with --adopt-newer, every write."""
    storage = Storage.from_uri(str(tmp_path / "data"))
    server = RedisProcess(tmp_path / "redis-a")
    server.start()
    try:
        store = MetadataStore.from_url(server.url)
        w = Workload(Client(store, storage), seed)
        taken: list[tuple[backup.Manifest, list[tuple[bytes, int, bool]]]] = []
        for i in range(90):
            w.step()
            if i % 30 == 29:
                taken.append((backup.create(store, storage), list(w.accepted)))
        running = w.reserve(True)  # a compaction running when the last backup is taken
        last, acked = backup.create(store, storage), list(w.accepted)
        for _ in range(30):  # acknowledged after the last backup: only --adopt-newer brings them back
            w.step()
        collect_garbage(store, storage, grace_s=0)
        everything = list(w.accepted)
        store.close()
    finally:
        server.stop(kill=True)  # every Redis node lost: SIGKILL, then its AOF and RDB deleted
    shutil.rmtree(tmp_path / "redis-a")

    for m, _ in [*taken, (last, acked)]:  # the collector spared every retained backup's files
        assert backup.verify(storage, m.id).ok
    assert [m.id for m in backup.list_backups(storage)] == [m.id for m, _ in [*taken, (last, acked)]]

    empty = RedisProcess(tmp_path / "redis-b")
    empty.start()
    try:
        args = ["--redis", empty.url, "--storage", storage.uri]
        r = CliRunner().invoke(main, ["restore", last.id, *args, *(["--adopt-newer"] if adopt else [])])
        assert r.exit_code == 0, r.output
        assert f"restored backup {last.id}" in r.output
        store = MetadataStore.from_url(empty.url)
        client = Client(store, storage)
        got = [(e.row, e.ts) for e in client.scan("t")]
        assert len({row for row, _ in got}) == len(got)  # no key twice
        # nothing lost, nothing deleted come back
        assert got == reference(everything if adopt else acked)
        if adopt:
            assert "adopted" in r.output or everything == acked
        # the compaction that was running is gone: its files can be compacted again
        if running is not None:
            t = store.tables.tablet(running.tablet)
            assert not t.running and set(running.inputs) <= set(t.files)
        # a second restore into the now non-empty Redis is refused in one line, nothing changed
        r = CliRunner().invoke(main, ["restore", taken[0][0].id, *args])
        assert r.exit_code != 0 and "already holds Kompaktor metadata" in r.output
        assert len(r.output.strip().splitlines()) == 1
        assert [(e.row, e.ts) for e in client.scan("t")] == got
        # and the restored table works: a compaction commits
        w2 = Workload.__new__(Workload)
        w2.client, w2.rng = client, random.Random(seed)
        w2.compact()
        assert [(e.row, e.ts) for e in client.scan("t")] == got
        store.close()
    finally:
        empty.stop()


def test_adopt_newer_lists_nothing_when_nothing_is_lost(tmp_path: Path) -> None:
    """Before the backup, flushes compacted (fully too: delete horizons raised) and not yet
    collected (the collector spares recent flushes); after it, more flushes and compactions. The
    restore with --adopt-newer must list nothing: it adopts exactly the flushes written after the
    backup and counts the other unreferenced files (compaction inputs from before it, compaction
    outputs from after it) as superseded (docs/backup.md "What a restore reports")."""
    storage = Storage.from_uri(str(tmp_path / "data"))
    server = RedisProcess(tmp_path / "redis-a")
    server.start()
    try:
        store = MetadataStore.from_url(server.url)
        w = Workload(Client(store, storage), 7)
        for i in range(60):
            w.step_without_splits()
            if i == 20:
                backup.create(store, storage)  # from now on the collector spares recent flushes
        collect_garbage(store, storage, grace_s=0)
        last = backup.create(store, storage)
        before = len(w.flushed)
        for _ in range(30):
            w.step_without_splits()
        store.close()
    finally:
        server.stop(kill=True)
    shutil.rmtree(tmp_path / "redis-a")
    # the reference: what the backup references, what storage holds, which flushes came after it
    stored = {f for f in backup.data_files(storage) if tmp_tag(f) is None}
    unreferenced = stored - set(backup.files_of(storage, last))
    after = set(w.flushed[before:])
    assert after <= unreferenced
    assert (unreferenced - after) & set(w.flushed[:before])  # flushes compacted before the backup
    empty = RedisProcess(tmp_path / "redis-b")
    empty.start()
    try:
        args = ["restore", "latest", "--adopt-newer", "--redis", empty.url, "--storage", storage.uri]
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 0, r.output
        assert "not brought back" not in r.output and "refused" not in r.output, r.output
        assert f"adopted {len(after)} flushes" in r.output, r.output
        assert f"{len(unreferenced - after)} more files in storage hold nothing" in r.output, r.output
        assert len(r.output.splitlines()) == 3, r.output
        store = MetadataStore.from_url(empty.url)
        assert [(e.row, e.ts) for e in Client(store, storage).scan("t")] == reference(w.accepted)
        store.close()
    finally:
        empty.stop()


def test_a_restore_lists_what_it_cannot_bring_back_one_line_each(tmp_path: Path, redis_url: str) -> None:
    """Two files whose content no restore of the first backup can bring back: the output of a
    compaction whose input, a flush written after that backup, was collected once a second
    backup referenced the output; and a flush into a table created after the backup."""
    import os

    storage = Storage.from_uri(str(tmp_path / "data"))
    store = MetadataStore.from_url(redis_url)
    c = Client(store, storage)
    store.tables.create_table("t")
    c.flush("t", [Entry(b"a", b"f", b"q", b"", 1, False, b"v")])
    first = backup.create(store, storage)
    (gone,) = c.flush("t", [Entry(b"b", b"f", b"q", b"", 2, False, b"v")])
    (tablet,) = store.tables.tablets(store.tables.table_id("t"))
    res = compactions.try_reserve(
        store, Job(tablet.id, "SYSTEM", 1, "test", {f: m.size for f, m in tablet.files.items()}), "bk", "test"
    )
    out = ENGINE.merge(storage, MergeRequest(res.inputs, res.output, res.prev, res.end, res.settings, res.ecid))
    compactions.commit(store, res, out.info)
    store.tables.create_table("late")
    (late,) = c.flush("late", [Entry(b"a", b"f", b"q", b"", 1, False, b"v")])
    backup.create(store, storage)
    old = os.stat(storage.root + "/" + gone).st_mtime - backup.WRITE_SLACK_S - 60  # as if that long ago
    os.utime(storage.root + "/" + gone, (old, old))
    assert gone in collect_garbage(store, storage, grace_s=0)  # no backup references it any more
    redis.Redis.from_url(redis_url).flushall()  # every Redis node lost

    r = CliRunner().invoke(main, ["restore", first.id, "--adopt-newer", "--redis", redis_url, "--storage", storage.uri])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    at = lines.index("not brought back: 2 files:")
    assert sorted(lines[at + 1 :]) == sorted(
        [
            f"  {res.output}: a compaction's output holding entries the restored view lacks",
            f"  {late}: its table was created after the backup",
        ]
    ), r.output
    redis.Redis.from_url(redis_url).flushall()
    r = CliRunner().invoke(main, ["restore", first.id, "--json", "--redis", redis_url, "--storage", storage.uri])
    got = json.loads(r.output)
    assert set(got["not_adopted"]) == {res.output, late} and got["adopted"] == []
    assert got["counts"] == {"unreferenced": 2, "adopted": 0, "superseded": 0, "not_brought_back": 2}


def test_backup_commands(tmp_path: Path, redis_url: str, client: Client) -> None:
    args = ["--redis", redis_url, "--storage", client.storage.uri]
    client.store.tables.create_table("x")
    client.flush("x", [Entry(b"a", b"f", b"q", b"", 1, False, b"v")])
    r = CliRunner().invoke(main, ["backup", "create", *args])
    assert r.exit_code == 0 and "1 tables, 1 tablets, 1 files referenced" in r.output, r.output
    bid = r.output.split()[1].rstrip(":")
    r = CliRunner().invoke(main, ["backup", "list", "--storage", client.storage.uri])
    assert bid in r.output
    r = CliRunner().invoke(main, ["backup", "verify", bid, "--storage", client.storage.uri])
    assert r.exit_code == 0 and "all 1 files present" in r.output
    # a referenced file gone: verify says so and fails
    (f,) = client.store.tables.tablets(client.store.tables.table_id("x"))[0].files
    client.storage.delete(f)
    r = CliRunner().invoke(main, ["backup", "verify", bid, "--storage", client.storage.uri])
    assert r.exit_code != 0 and "1 referenced files are missing" in r.output
    # a half-written backup (no manifest) is never listed; bad ids are refused in one line
    client.storage.ensure_dir("backups/B0000000000001-deadbeef")
    assert [m.id for m in backup.list_backups(client.storage)] == [bid]
    r = CliRunner().invoke(main, ["backup", "verify", "../etc", "--storage", client.storage.uri])
    assert r.exit_code != 0 and "is not a backup id" in r.output
    r = CliRunner().invoke(main, ["backup", "delete", bid, "--storage", client.storage.uri])
    assert r.exit_code == 0 and backup.list_backups(client.storage) == []


def test_no_garbage_collected_while_a_backup_is_taken(client: Client) -> None:
    client.store.tables.create_table("g")
    client.flush("g", [Entry(b"a", b"f", b"q", b"", 1, False, b"v")])
    client.storage.ensure_dir("tables/zz")
    orphan = "tables/zz/F0000000001-0123456789abcdef.parquet"
    out = client.storage.open_output(orphan)
    out.write(b"x")
    out.close()
    client.store.files.begin_backup("B0000000000002-00000000", 60)
    assert collect_garbage(client.store, client.storage, grace_s=0) == []
    client.store.files.end_backup("B0000000000002-00000000")
    assert collect_garbage(client.store, client.storage, grace_s=0) == [orphan]


def test_the_coordinator_takes_backups_on_its_schedule_and_keeps_the_newest(client: Client) -> None:
    from kompaktor.coordinator import Coordinator
    from tests.support.coordinator import settings

    client.store.tables.create_table("s")
    client.flush("s", [Entry(b"a", b"f", b"q", b"", 1, False, b"v")])
    c = Coordinator(client.store, client.storage, settings(backup_interval_s=3600, backup_keep=2))
    assert c.tick()
    (first,) = backup.list_backups(client.storage)
    assert c.metrics.registry.get_sample_value("kompaktor_backup_last_success_timestamp_seconds") == pytest.approx(
        first.created_ms / 1000
    )
    assert c.tick() and len(backup.list_backups(client.storage)) == 1  # not due again for an hour
    # a new leader reads when the last one was taken: not due either
    c2 = Coordinator(client.store, client.storage, settings(backup_interval_s=3600, backup_keep=2))
    assert not c2.backup_due()
    for _ in range(3):
        c.take_backup()
    kept = backup.list_backups(client.storage)
    assert len(kept) == 2 and first.id not in {m.id for m in kept}
    assert c.metrics.registry.get_sample_value("kompaktor_backup_failures_total") == 0


def test_a_new_install_bootstraps_from_the_latest_backup_once(tmp_path: Path, client: Client, redis_url: str) -> None:
    """What the chart's coordinator.backup.bootstrapFrom does at the coordinator's start."""
    client.store.tables.create_table("boot")
    client.flush("boot", [Entry(b"a", b"f", b"q", b"", 1, False, b"v")])
    m = backup.create(client.store, client.storage)
    redis.Redis.from_url(redis_url).flushall()  # the Redis PersistentVolumeClaim deleted
    fresh = MetadataStore.from_url(redis_url)
    got = backup.bootstrap(fresh, client.storage, "latest")
    assert got is not None and got.manifest.id == m.id
    c = Client(fresh, client.storage)
    assert [(e.row, e.value) for e in c.scan("boot")] == [(b"a", b"v")]
    # a restart of the coordinator (or a second one) restores nothing again, whatever it holds
    assert backup.bootstrap(fresh, client.storage, "latest") is None
    c.store.tables.set_props("boot", {"table.custom.x": "1"})
    assert backup.bootstrap(fresh, client.storage, m.id) is None
    assert fresh.tables.table("boot").props == {"table.custom.x": "1"}


def test_restore_latest_without_backups_says_so(tmp_path: Path, redis_url: str) -> None:
    storage = Storage.from_uri(str(tmp_path / "empty"))
    r = CliRunner().invoke(main, ["restore", "latest", "--redis", redis_url, "--storage", storage.uri])
    assert r.exit_code != 0 and "no backups in" in r.output
