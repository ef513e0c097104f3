"""Day two: restarting on its own data, the metadata's format version, the installation's id.

Real redis-server and real `kompaktor` processes; the expected data is the test's own record of
what it wrote, never the product's scan of it (docs/upgrading.md)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from kompaktor import keyspace as C
from kompaktor.client import Client
from kompaktor.coordinator import Coordinator, CoordinatorSettings
from kompaktor.files.storage import Storage
from kompaktor.local.config import DEMO_CONFIG
from kompaktor.metadata import backup
from kompaktor.metadata import format as metaformat
from kompaktor.metadata.store import MetadataStore
from kompaktor.model.keys import Entry
from tests.support.entries import entries
from tests.support.rawredis import raw_redis
from tests.support.wait import poll

pytestmark = [pytest.mark.redis]

ARROW_ONLY = DEMO_CONFIG.replace(
    'spark: {master: "local[1]", conf: {spark.sql.shuffle.partitions: "2"}}', "spark: {engine: arrow}"
)


def _reference(*batches: list[Entry]) -> set[tuple[bytes, bytes, bytes, bytes, int, bytes]]:
    """What a scan must return for batches of distinct puts: every entry, as written."""
    return {(e.row, e.cf, e.cq, e.vis, e.ts, e.value) for b in batches for e in b if not e.deleted}


def _scanned(client: Client, table: str) -> set[tuple[bytes, bytes, bytes, bytes, int, bytes]]:
    return {(e.row, e.cf, e.cq, e.vis, e.ts, e.value) for e in client.scan(table)}


def _dump(url: str) -> dict[bytes, bytes | None]:
    """Every key of the database, serialized (DUMP), to show that nothing was written."""
    r = redis.Redis.from_url(url)
    try:
        return {k: r.dump(k) for k in sorted(r.keys("*"))}
    finally:
        r.close()


# -- `kompaktor up` restarts on its own data -------------------------------------------------------


class Up:
    """`kompaktor up --redis URL --storage DIR` as a user runs it, stopped with Ctrl-C."""

    def __init__(self, tmp: Path, redis_url: str, storage: Path) -> None:
        self.cfg = tmp / "local.yaml"
        self.cfg.write_text(ARROW_ONLY)
        self.args = [sys.executable, "-m", "kompaktor", "up", "--config", str(self.cfg), "--redis", redis_url]
        self.args += ["--storage", str(storage), "--data-dir", str(tmp / "up"), "--status-port", "-1"]

    def start(self) -> subprocess.Popen[str]:
        return subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def run_until_up(self) -> str:
        """Start it, wait for its first line, stop it with Ctrl-C; its first line."""
        p = self.start()
        try:
            assert p.stdout is not None
            line = poll(p.stdout.readline, "kompaktor up's first line", timeout=120)
            if "kompaktor is up" in line:
                p.send_signal(signal.SIGINT)
                assert p.wait(timeout=120) == 0
            else:
                assert p.wait(timeout=60) != 0
            return line.strip()
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture
def up_env(tmp_path: Path, redis_url: str) -> Iterator[tuple[Up, Client]]:
    storage = tmp_path / "storage"
    store = MetadataStore.from_url(redis_url)
    yield Up(tmp_path, redis_url, storage), Client(store, Storage.from_uri(str(storage)))
    store.close()


def test_up_starts_again_on_its_own_data(up_env: tuple[Up, Client], tmp_path: Path) -> None:
    up, client = up_env
    assert "kompaktor is up" in up.run_until_up()
    client.store.tables.create_table("t", [b"row00030"])
    first, second = entries(range(0, 50), 1), entries(range(50, 90), 2)
    client.flush("t", first)
    client.flush("t", second)
    # what failed before: "storage DIR: already holds 2 file(s) under tables/; give an empty prefix"
    line = up.run_until_up()
    assert "kompaktor is up" in line, line
    assert _scanned(client, "t") == _reference(first, second)


def test_up_starts_again_after_a_restore(up_env: tuple[Up, Client], redis_url: str) -> None:
    up, client = up_env
    assert "kompaktor is up" in up.run_until_up()
    client.store.tables.create_table("t", [b"row00030"])
    batch = entries(range(0, 40), 1)
    client.flush("t", batch)
    backup.create(client.store, client.storage)
    raw = raw_redis(client.store)
    raw.flushall()  # every Redis node lost
    # a new Redis beside this storage's data: refused, in one line, before anything starts
    line = up.run_until_up()
    assert line.startswith("error: refused: storage ") and "restore its metadata first" in line, line
    assert raw.dbsize() == 0, "the refusal wrote nothing"
    backup.restore(client.store, client.storage, "latest")
    assert "kompaktor is up" in up.run_until_up()
    assert _scanned(client, "t") == _reference(batch)


# -- the installation's id ---------------------------------------------------------------------------


def test_a_redis_and_a_storage_of_two_installations_are_refused(store: MetadataStore, tmp_path: Path) -> None:
    mine, other = Storage.from_uri(str(tmp_path / "mine")), Storage.from_uri(str(tmp_path / "other"))
    ours = metaformat.claim_installation(store, mine)
    assert metaformat.read_format(store).installation == ours == metaformat.read_storage_installation(mine)
    assert metaformat.claim_installation(store, mine) == ours, "a restart claims nothing new"
    theirs = "f" * 32
    (tmp_path / "other" / metaformat.INSTALLATION_FILE).write_text(json.dumps({"installation": theirs}))
    before = _dump(store.url)
    with pytest.raises(metaformat.FormatError, match=f"installation {ours}.*installation {theirs}"):
        metaformat.check_installation(store, other)
    with pytest.raises(metaformat.FormatError, match="one installation"):
        metaformat.claim_installation(store, other)
    assert _dump(store.url) == before
    assert metaformat.read_storage_installation(other) == theirs


@pytest.mark.parametrize(
    ("ours", "tables", "theirs", "data", "expect"),
    [
        (None, False, None, False, "new both"),
        ("a", True, None, True, "storage"),  # an upgrade from 0.2.0: its Redis migrated, storage not
        (None, True, None, True, "new both"),  # 0.2.0's store and storage, never claimed
        (None, True, "b", True, "redis"),  # a restore: the storage's id
        (None, False, "b", False, "redis"),  # an empty storage that was claimed once
        ("a", True, "a", True, "none"),
        (None, False, None, True, "refused"),  # a new Redis beside data files
        (None, False, "b", True, "refused"),
        ("a", True, "b", True, "refused"),
    ],
)
def test_which_installation_ids_are_written(
    ours: str | None, tables: bool, theirs: str | None, data: bool, expect: str
) -> None:
    decide = metaformat.decide_installation
    if expect == "refused":
        with pytest.raises(metaformat.FormatError, match=r"^refused: "):
            decide(ours, tables, theirs, data, where="R", uri="S")
        return
    claim = decide(ours, tables, theirs, data, where="R", uri="S")
    written = {"new both": (True, True), "storage": (False, True), "redis": (True, False), "none": (False, False)}
    assert (claim.write_redis, claim.write_storage) == written[expect]
    assert claim.installation == (ours or theirs or claim.installation) and len(claim.installation) >= 1


# -- the format version ------------------------------------------------------------------------------


def _old_store(client: Client) -> list[Entry]:
    """A store as 0.2.0 leaves it: tables and data, no format record."""
    client.store.tables.create_table("t", [b"row00030"])
    batch = entries(range(0, 30), 1)
    client.flush("t", batch)
    assert metaformat.read_format(client.store).version is None
    return batch


def test_the_leader_records_the_format_and_installation_of_an_old_store(client: Client) -> None:
    batch = _old_store(client)
    coord = Coordinator(client.store, client.storage, CoordinatorSettings(plan_workers=0))
    try:
        assert coord.tick()
    finally:
        coord.resign()
    fmt = metaformat.read_format(client.store)
    assert fmt.version == metaformat.FORMAT_VERSION
    assert fmt.installation and fmt.installation == metaformat.read_storage_installation(client.storage)
    assert _scanned(client, "t") == _reference(batch)


def test_a_store_newer_than_the_code_is_refused_by_every_role_in_one_line(
    client: Client, redis_url: str, tmp_path: Path
) -> None:
    _old_store(client)
    raw = raw_redis(client.store)
    raw.hset(C.FORMAT, "version", str(metaformat.FORMAT_VERSION + 1))
    before = _dump(redis_url)
    env = {"KOMPAKTOR_REDIS_URL": redis_url, "KOMPAKTOR_STORAGE": client.storage.uri, "PATH": "/usr/bin:/bin"}
    for role, args in {
        "coordinator": ["coordinator", "--metrics-port", "-1"],
        "compactor": ["compactor", "--group", "small"],
        "kompaktor command": ["scan", "t"],
    }.items():
        p = subprocess.run(
            [sys.executable, "-m", "kompaktor", *args], env=env, capture_output=True, text=True, timeout=120
        )
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert p.returncode != 0 and lines, (role, p.stdout, p.stderr)
        assert f"is format {metaformat.FORMAT_VERSION + 1}, newer than this {role}" in lines[-1], (role, p.stderr)
    assert _dump(redis_url) == before, "nothing written"


def _steps(log: list[str], crash_at: str | None) -> list[metaformat.Step]:
    def step(name: str) -> metaformat.Step:
        def run(store: MetadataStore) -> None:
            log.append(name)
            raw_redis(store).hset("kz:test:migrated", name, "1")  # idempotent
            if name == crash_at:
                raise KeyboardInterrupt(f"killed in {name}")

        return metaformat.Step(2, name, run)

    return [step("a"), step("b"), step("c")]


@pytest.mark.parametrize("crash_at", ["a", "b", "c"])
def test_a_migration_killed_at_any_step_resumes_from_that_step(client: Client, crash_at: str) -> None:
    _old_store(client)
    ran: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        metaformat.migrate(client.store, _steps(ran, crash_at))
    fmt = metaformat.read_format(client.store)
    assert fmt.effective == metaformat.UNRECORDED, "the version moves only once every step is done"
    done_before = {"a": set(), "b": {"a"}, "c": {"a", "b"}}[crash_at]
    assert fmt.steps == done_before
    resumed: list[str] = []
    assert metaformat.migrate(client.store, _steps(resumed, None)) == [s for s in "abc" if s not in done_before]
    assert resumed[0] == crash_at, "the step killed runs again (it is idempotent)"
    assert metaformat.read_format(client.store).version == metaformat.FORMAT_VERSION
    again: list[str] = []
    assert metaformat.migrate(client.store, _steps(again, None)) == [] and again == []
