"""Redis users per role (issue 25 §2), on a real redis-server with the users `kompaktor up` and the
chart create: what a compactor's user cannot do, and that the system works with each component
on its own user — including after Redis lost its scripts, which only the coordinator may load."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from kompaktor.client import Client
from kompaktor.coordinator import Coordinator
from kompaktor.files.storage import Storage
from kompaktor.local.redis_server import RedisProcess
from kompaktor.metadata import acl, history
from kompaktor.metadata.brokered import Refused
from kompaktor.metadata.store import MetadataStore
from kompaktor.worker import Compactor, WorkerSettings
from tests.support.broker import ask_raw, brokered, running_broker
from tests.support.entries import entries
from tests.support.snapshot import snapshot

pytestmark = pytest.mark.redis

#: what a compromised compactor would try, and must not be able to do
DANGEROUS = [
    ("FLUSHALL",),
    ("FLUSHDB",),
    ("CONFIG", "SET", "dir", "/tmp"),
    ("CONFIG", "GET", "requirepass"),
    ("EVAL", "return redis.call('FLUSHALL')", "0"),
    ("SCRIPT", "LOAD", "return 1"),
    ("SCRIPT", "FLUSH"),
    ("FUNCTION", "LOAD", "#!lua name=x\nredis.register_function('x', function() return 1 end)"),
    ("FUNCTION", "FLUSH"),
    ("FUNCTION", "DELETE", "x"),
    ("FUNCTION", "RESTORE", "x"),
    ("KEYS", "*"),
    ("SCAN", "0"),
    ("MODULE", "LOAD", "/tmp/x.so"),
    ("DEBUG", "SLEEP", "0"),
    ("SHUTDOWN",),
    ("ACL", "SETUSER", "compactor", "+@all"),
    ("ACL", "LIST"),
    ("CLIENT", "KILL", "TYPE", "normal"),
    ("SLAVEOF", "127.0.0.1", "9"),
    ("REPLICAOF", "NO", "ONE"),
    ("MIGRATE", "127.0.0.1", "9", "", "0", "5", "KEYS", "kz:tables"),
    ("SET", "not-kompaktor", "1"),
    ("GET", "not-kompaktor"),
    ("PUBLISH", "ch", "x"),
    ("BGSAVE",),
    ("SAVE",),
    ("SWAPDB", "0", "1"),
    ("MONITOR",),
]


@pytest.fixture
def users(tmp_path: Path) -> Iterator[RedisProcess]:
    server = RedisProcess(tmp_path / "redis", users=acl.new_passwords()).start()
    yield server
    server.stop()


def test_the_compactor_user_is_refused_every_dangerous_command_and_nothing_changes(
    users: RedisProcess, tmp_path: Path
) -> None:
    admin = MetadataStore.from_url(users.role_url("admin"))
    client = Client(admin, Storage.from_uri(str(tmp_path / "files")))
    admin.tables.create_table("t", [])
    client.flush("t", entries(10, 0, value=lambda r: b"v0"))
    raw = redis.Redis.from_url(users.url)  # the default user, to look
    before = snapshot(raw)
    compactor = redis.Redis.from_url(users.role_url("compactor"))
    assert compactor.ping()
    for cmd in DANGEROUS:
        with pytest.raises(redis.ResponseError) as exc:
            compactor.execute_command(*cmd)
        assert "permission" in str(exc.value) or "not allowed" in str(exc.value), cmd
    assert snapshot(raw) == before
    assert raw.get("not-kompaktor") is None
    # what it needs works: its keys, by the scripts' hashes
    assert compactor.hgetall("kz:tables")


def test_the_acl_file_holds_no_password_and_urls_carry_the_role(users: RedisProcess) -> None:
    conf = (users.data_dir / "redis.conf").read_text()
    for role, password in users.role_passwords.items():
        assert password not in conf
        assert f"user {role} reset on #" in conf
        url = users.role_url(role)
        assert url.startswith(f"redis://{role}:") and redis.Redis.from_url(url).client_info()["user"] == role
    assert (
        acl.role_url("redis+sentinel://:old@127.0.0.1:1,127.0.0.1:2/svc/0", "compactor", "p w")
        == "redis+sentinel://compactor:p%20w@127.0.0.1:1,127.0.0.1:2/svc/0"
    )
    with pytest.raises(ValueError, match="unknown Redis role"):
        acl.rule("root", "x")


def test_each_role_on_its_own_user_compacts_and_the_broker_reloads_lost_scripts(
    users: RedisProcess, tmp_path: Path
) -> None:
    storage = Storage.from_uri(str(tmp_path / "files"))
    admin = MetadataStore.from_url(users.role_url("admin"))
    client = Client(admin, storage)
    admin.tables.create_table("t", [])
    for k in range(4):
        client.flush("t", entries(50, k, value=lambda r, k=k: b"v%d" % k))
    before = list(client.scan("t"))
    coordinator = Coordinator(MetadataStore.from_url(users.role_url("coordinator")), storage)
    compactor_store, jobs = brokered(users.role_url("compactor"))
    worker = Compactor(compactor_store, storage, WorkerSettings("default", "c-acl", engine="arrow"), jobs=jobs)

    # Redis lost Kompaktor's functions (a new server, FUNCTION FLUSH): the compactor may not load
    # them, nor run them — it asks the coordinator's broker, which loads them
    assert coordinator.tick()
    redis.Redis.from_url(users.url).function_flush()
    with running_broker(users.role_url("coordinator")):
        outcome = worker.run_one()
    assert outcome is not None and outcome.status == "committed", outcome
    assert list(client.scan("t")) == before
    (tablet,) = admin.tables.tablets(admin.tables.table_id("t"))
    assert len(tablet.files) == 1
    # the compactor, on its user, recorded the job in the history through the broker; admin reads it
    assert [r.ecid for r in history.read(admin, ["default"])] == [outcome.ecid]


def test_the_compactor_may_not_touch_any_history_stream(users: RedisProcess) -> None:
    """The history's commands reach its streams (kz:history:*) and no other key, for the roles
    that hold them: the coordinator (its broker appends the compactors' jobs, its pass the dead
    ones) and admin append and read. The compactor may neither append to, trim nor read any
    group's stream, its own included: its jobs' records go through the broker."""
    coordinator = redis.Redis.from_url(users.role_url("coordinator"))
    assert coordinator.xadd("kz:history:g", {"r": "{}"}, maxlen=10, approximate=True)
    compactor = redis.Redis.from_url(users.role_url("compactor"))
    for cmd in (
        ("XADD", "kz:history:g", "*", "r", "x"),  # a group's history
        ("XADD", "kz:history:default", "MAXLEN", "~", "10", "*", "r", "x"),  # its own group's too
        ("XTRIM", "kz:history:g", "MINID", "~", "0"),
        ("XTRIM", "kz:history:g", "MAXLEN", "0"),
        ("XADD", "kz:tables", "*", "r", "x"),  # another Kompaktor key
        ("XADD", "other:history:g", "*", "r", "x"),  # not Kompaktor's
        ("XREVRANGE", "kz:history:g", "+", "-"),
        ("XDEL", "kz:history:g", "0-1"),
        ("XGROUP", "CREATE", "kz:history:g", "x", "$"),
    ):
        with pytest.raises(redis.ResponseError, match=r"permission|not allowed"):
            compactor.execute_command(*cmd)
    for role in ("coordinator", "admin"):
        reader = redis.Redis.from_url(users.role_url(role))
        assert len(reader.xrevrange("kz:history:g", "+", "-")) == 1
        assert not reader.exists("kz:history:default")
        with pytest.raises(redis.ResponseError, match=r"permission|not allowed"):
            reader.execute_command("XADD", "kz:tables", "*", "r", "x")


def test_a_jobs_history_record_goes_through_the_broker_into_its_groups_stream_only(
    users: RedisProcess, tmp_path: Path
) -> None:
    """A compactor holding a reservation of group `default` asks the broker to record its job, as
    a hostile one would: naming another group, table and compactor, with figures of its own. The
    record lands in `default`'s stream alone, with what the broker's reservation says; the
    figures are the compactor's (only it measured them). Asked again, the broker refuses: one
    record per job. The other group's stream is as it was."""
    storage = Storage.from_uri(str(tmp_path / "files"))
    admin = MetadataStore.from_url(users.role_url("admin"))
    client = Client(admin, storage)
    admin.tables.create_table("t", [])
    for k in range(4):
        client.flush("t", entries(20, k, value=lambda r, k=k: b"v%d" % k))
    tid = admin.tables.table_id("t")
    (tablet,) = admin.tables.tablets(tid)
    coordinator = Coordinator(MetadataStore.from_url(users.role_url("coordinator")), storage)
    assert coordinator.tick()
    other = redis.Redis.from_url(users.role_url("coordinator"))
    other.xadd("kz:history:other", {"r": "{}"})
    before = other.xrevrange("kz:history:other")
    _, jobs = brokered(users.role_url("compactor"))
    hostile = {"group": "other", "table": "x", "tablet": "x;", "compactor": "spoof", "kind": "USER"}
    figures = {"output_bytes": 777, "merge_s": 1.25}
    with running_broker(users.role_url("coordinator")):
        res = jobs.reserve("default", "c-hist")
        assert res is not None
        jobs.release(storage, res)
        held = {"ecid": res.ecid, "cap": res.cap, "reason": "drained", "max_records": 10, "max_age_s": 60.0}
        with pytest.raises(Refused, match="not the holder"):  # another's job: its secret is needed
            ask_raw(jobs, "history", **{**held, "cap": "guess"}, outcome="failed", figures={})
        assert ask_raw(jobs, "history", **held, outcome="cancelled", figures=figures, **hostile) is True
        with pytest.raises(Refused):  # a second record of the same job
            ask_raw(jobs, "history", **held, outcome="committed", figures={})
    coordinator.resign()
    (rec,) = history.read(admin, ["default"])
    assert (rec.ecid, rec.group, rec.table, rec.tablet) == (res.ecid, "default", tid, tablet.id)
    assert rec.compactor == "c-hist"
    assert (rec.outcome, rec.reason, rec.kind, rec.input_files) == ("cancelled", "drained", "SYSTEM", 4)
    assert (rec.output_bytes, rec.merge_s, rec.input_entries) == (777, 1.25, None)
    assert other.xrevrange("kz:history:other") == before
