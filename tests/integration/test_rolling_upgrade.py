"""A rolling upgrade's middle: the previous release's compactor still running beside this
release's coordinator, on a store this release has migrated (docs/upgrading.md, "During a
rollout").

What was decided: a compactor of the previous release writes nothing itself (its Redis user may
not); its reservation, heartbeats and commit are asked of the broker, which runs this release's
code and writes this release's records. So an old compactor's job commits exactly once, or is
refused and re-queued, and no record the new format cannot read is ever written. Its jobs'
history records are missing: it appended them itself, which this release's compactor user may
no longer do. The test runs the previous release's own code (its tree, from docs/upgrading.md)
as a real process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from kompaktor import keyspace as C
from kompaktor.client import Client
from kompaktor.coordinator import Coordinator
from kompaktor.files.storage import Storage
from kompaktor.local.redis_server import RedisProcess
from kompaktor.metadata import acl, history
from kompaktor.metadata import format as metaformat
from kompaktor.metadata.store import MetadataStore
from kompaktor.policy.services import GroupConfig
from tests.support import releases
from tests.support.broker import running_broker
from tests.support.entries import entries
from tests.support.wait import poll

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.fixture(scope="module")
def previous_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's source tree, as its tag (or docs/upgrading.md) names it."""
    return releases.checkout(releases.previous(), tmp_path_factory.mktemp("previous"))


@pytest.fixture
def users(tmp_path: Path) -> Iterator[RedisProcess]:
    server = RedisProcess(tmp_path / "redis", users=acl.new_passwords()).start()
    yield server
    server.stop()


def _old_compactor(tree: Path, users: RedisProcess, storage: str, log: Path) -> subprocess.Popen[bytes]:
    """`kompaktor compactor --broker` of the previous release, on the compactor's Redis user."""
    env = {
        **os.environ,
        "PYTHONPATH": str(tree / "compactor"),
        "KOMPAKTOR_REDIS_URL": users.role_url("compactor"),
        "KOMPAKTOR_STORAGE": storage,
        "PYTHONUNBUFFERED": "1",
    }
    cmd = [sys.executable, "-m", "kompaktor", "compactor", "--group", "default", "--broker", "--engine", "arrow"]
    with log.open("wb") as out:
        return subprocess.Popen([*cmd, "--http-port", "-1"], env=env, stdout=out, stderr=subprocess.STDOUT)


def test_the_previous_releases_compactor_commits_once_through_the_new_broker(
    previous_tree: Path, users: RedisProcess, tmp_path: Path
) -> None:
    old_version = releases.previous().version
    version_line = (previous_tree / "compactor" / "kompaktor" / "__init__.py").read_text()
    assert f'"{old_version}"' in version_line, "the tree is the previous release's"
    storage = Storage.from_uri(str(tmp_path / "files"))
    admin = MetadataStore.from_url(users.role_url("admin"))
    client = Client(admin, storage)
    admin.fleet.put_group(GroupConfig("default"))
    written = []
    for name in ("t", "u"):
        admin.tables.create_table(name, [])
        for k in range(4):  # four versions of each row: the merge keeps the newest
            batch = entries(30, k, value=lambda r, k=k: b"v%d-%d" % (k, r))
            client.flush(name, batch)
            written += [(name, e) for e in batch]
    want = {
        name: {(e.row, e.cf, e.cq): (e.ts, e.value) for n, e in written if n == name and e.ts == 1003}
        for name in ("t", "u")
    }
    coordinator = Coordinator(MetadataStore.from_url(users.role_url("coordinator")), storage)
    assert coordinator.tick()  # this release leads: the store is migrated, jobs queued
    assert metaformat.read_format(admin).version == metaformat.FORMAT_VERSION
    raw = redis.Redis.from_url(users.url)
    proc = None
    try:
        with running_broker(users.role_url("coordinator")):
            proc = _old_compactor(previous_tree, users, storage.uri, tmp_path / "old-compactor.log")

            def compacted() -> bool:
                tids = [admin.tables.table_id(n) for n in ("t", "u")]
                return all(len(t.files) == 1 and not t.running for tid in tids for t in admin.tables.tablets(tid))

            poll(compacted, "the old compactor's two jobs committed", timeout=180, alive=(proc,))
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0, (tmp_path / "old-compactor.log").read_text()
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        coordinator.resign()
    commits = [e.decode() for e in raw.lrange(C.COMMITLOG, 0, -1)]
    assert len(commits) == 2 and len(set(commits)) == 2, f"each job committed exactly once: {commits}"
    for name in ("t", "u"):
        got = {(e.row, e.cf, e.cq): (e.ts, e.value) for e in client.scan(name)}
        assert got == want[name], f"table {name}: the newest version of every row, as written"
    # 0.2.0's compactor appended its jobs' history records itself; this release's compactor user
    # may not touch the history (the broker writes it): the old compactor's records are missing,
    # each said at WARNING in its log, and nothing else is affected (docs/upgrading.md)
    log_text = (tmp_path / "old-compactor.log").read_text()
    assert log_text.count("not recorded in the history of default") >= 2, log_text
    assert history.read(admin, ["default"]) == []
    # the records the old compactor's jobs left are this release's, and read as such
    assert metaformat.read_format(admin).version == metaformat.FORMAT_VERSION
    coordinator2 = Coordinator(MetadataStore.from_url(users.role_url("coordinator")), storage)
    try:
        assert coordinator2.tick()
    finally:
        coordinator2.resign()
    raw.close()
