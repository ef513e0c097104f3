"""A compactor's credentials can do exactly its own job (issue 34 §1), on a real redis-server with
the users `kompaktor up` and the chart create: as the compactor user, with its real password,
rewriting a group's settings, dropping a file from a tablet, committing or releasing a compaction
another compactor holds, changing a table property and starting a user compaction are each refused
and change nothing; its own job, asked of the coordinator's broker, commits."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from kompaktor import keyspace as C
from kompaktor.client import Client
from kompaktor.coordinator import Coordinator
from kompaktor.coordinator.broker import Broker
from kompaktor.files.storage import Storage
from kompaktor.local.redis_server import RedisProcess
from kompaktor.metadata import acl, user_compactions
from kompaktor.metadata import broker_messages as m
from kompaktor.metadata.brokered import BrokeredJobs, Refused
from kompaktor.metadata.compactions import Reservation
from kompaktor.metadata.store import MetadataStore
from kompaktor.model import grouptoken
from kompaktor.model.errors import StoreUnavailable
from kompaktor.model.tablet import FileInfo, FileMeta
from kompaktor.policy.services import GroupConfig
from kompaktor.worker import Compactor, WorkerSettings
from tests.support.broker import ask_raw, brokered, running_broker, send_raw
from tests.support.entries import entries
from tests.support.procs import python_env
from tests.support.snapshot import snapshot
from tests.support.wait import poll

pytestmark = pytest.mark.redis

DENIED = r"permission|not allowed"


@pytest.fixture
def users(tmp_path: Path) -> Iterator[RedisProcess]:
    server = RedisProcess(tmp_path / "redis", users=acl.new_passwords()).start()
    yield server
    server.stop()


@pytest.fixture
def system(users: RedisProcess, tmp_path: Path) -> Iterator[tuple[MetadataStore, Client]]:
    """Two tables of four files each, planned into the default group's queue; a broker serving."""
    storage = Storage.from_uri(str(tmp_path / "files"))
    admin = MetadataStore.from_url(users.role_url("admin"))
    client = Client(admin, storage)
    admin.fleet.put_group(GroupConfig("default"))
    for name in ("t", "u"):
        admin.tables.create_table(name, [])
        for k in range(4):
            client.flush(name, entries(30, k, value=lambda r, k=k: b"v%d" % k))
    coordinator = Coordinator(MetadataStore.from_url(users.role_url("coordinator")), storage)
    assert coordinator.tick()
    with running_broker(users.role_url("coordinator")):
        yield admin, client
    coordinator.resign()


def look(users: RedisProcess) -> dict[bytes, object]:
    """Kompaktor's keys, read as the default user (the broker's answers and requests aside)."""
    raw = redis.Redis.from_url(users.url)
    return snapshot(raw, "kz:*")


def test_the_compactor_user_cannot_write_settings_tablets_tables_or_user_compactions(
    users: RedisProcess, system: tuple[MetadataStore, Client]
) -> None:
    admin, _client = system
    tid = admin.tables.table_id("t")
    (tablet,) = admin.tables.tablets(tid)
    before = look(users)
    raw = redis.Redis.from_url(users.role_url("compactor"))
    evil = json.dumps({"name": "default", "engine": "spark", "spark_conf": {"spark.jars": "http://evil/x.jar"}})
    attempts = [
        ("HSET", C.GROUPS, "default", evil),  # a group's settings: the next compactors' code
        ("HDEL", C.GROUPS, "default"),
        ("HSET", C.SERVICES, "default", "{}"),
        ("SET", C.tablet_key(tablet.id), json.dumps({"files": {}})),  # a tablet without its files
        ("DEL", C.tablet_key(tablet.id)),
        ("HSET", C.table_key(tid), "props", json.dumps({"table.compaction.ratio": "1"})),  # a table property
        ("HDEL", C.RUNNING, "x"),
        ("SADD", C.UCOMPS, "uc-1"),  # a user compaction
        ("FCALL", "kz_mutate", "0", "{}"),  # the functions run with the caller's rights: none for it
        ("FCALL_RO", "kz_mutate", "0", "{}"),
        ("SET", C.reservation_key("ECID-0000000000000000"), "{}"),  # a reservation of its own making
        ("LRANGE", C.BROKER, "0", "-1"),  # other compactors' requests: where their answers go
        ("LPOP", C.BROKER),
        ("LLEN", C.BROKER),
        ("LRANGE", C.reply_key("0" * 32), "0", "-1"),
        ("RPUSH", C.reply_key("0" * 32), "{}"),  # an answer to another compactor
    ]
    for cmd in attempts:
        with pytest.raises(redis.ResponseError, match=DENIED):
            raw.execute_command(*cmd)
            pytest.fail(f"the compactor's user ran {cmd}")
    # ... and through Kompaktor's own code, on the compactor's store: one line, nothing written
    store = MetadataStore.from_url(users.role_url("compactor"))
    for attempt in (
        lambda: store.fleet.put_group(GroupConfig("default", engine="spark", spark_conf={"spark.jars": "http://evil"})),
        lambda: store.tables.set_props("t", {"table.compaction.ratio": "1"}),
        lambda: user_compactions.start(store, "t"),
    ):
        with pytest.raises(StoreUnavailable, match="denied a command to this user"):
            attempt()
    assert look(users) == before


def test_only_the_holder_may_commit_release_or_heartbeat_a_compaction(
    users: RedisProcess, system: tuple[MetadataStore, Client], tmp_path: Path
) -> None:
    admin, client = system
    store_a, a = brokered(users.role_url("compactor"))
    _store_b, b = brokered(users.role_url("compactor"))
    held = a.reserve("default", "compactor-a")
    assert held is not None and held.cap
    before = look(users)
    info = FileInfo(held.output, 10, 1, 0, (b"a",), (b"b",))
    # another compactor (the same Redis user) knows the ECID and reads the broker's record of it
    # (only a digest of the holder's secret is there) — it cannot act for the holder
    recorded = json.loads(redis.Redis.from_url(users.role_url("compactor")).get(C.reservation_key(held.ecid)))
    for cap in ("", "guess", recorded["cap"]):
        forged = dataclasses.replace(held, cap=cap)
        for act in (
            lambda r=forged: b.commit(r, info.meta),
            lambda r=forged: b.release(Storage.from_uri(str(tmp_path / "files")), r),
            lambda r=forged: b.heartbeat(r, {"bytes_read": 1}),
            lambda r=forged: b.record_failure(r, "x"),
            lambda r=forged: b.drop_heartbeat(r),
        ):
            with pytest.raises(Refused):
                act()
    for op in ("set_group", "mutate", "start_user_compaction"):  # no such request
        with pytest.raises(Refused, match="unknown request"):
            ask_raw(b, op, name="default")
    assert look(users) == before
    # the holder commits its own, on the reservation the broker recorded: a reservation it
    # rewrote (another tablet, a partial compaction) changes neither the tablet nor the kind
    want = list(client.scan("t"))
    other = next(t for t in admin.tables.tablets(admin.tables.table_id("u")))
    rewritten = dataclasses.replace(held, job=dataclasses.replace(held.job, tablet=other.id), full=False)

    class Rewriting(BrokeredJobs):
        """A compactor that merges its job, then commits naming a reservation it rewrote."""

        def commit(self, res: Reservation, meta: FileMeta) -> None:
            super().commit(rewritten, meta)

    settings = WorkerSettings("default", "a", engine="arrow", heartbeat_s=3600)
    liar = Rewriting(store_a, timeout_s=10.0)
    outcome = Compactor(store_a, Storage.from_uri(str(tmp_path / "files")), settings, jobs=liar)._execute(held)
    assert outcome.status == "committed", outcome
    assert admin.tables.tablet(other.id) == other
    assert list(admin.tables.tablet(held.tablet).files) == [held.output]
    assert list(client.scan("t")) == want


def test_a_compactor_on_its_user_compacts_through_the_broker(
    users: RedisProcess, system: tuple[MetadataStore, Client], tmp_path: Path
) -> None:
    admin, client = system
    want = {name: list(client.scan(name)) for name in ("t", "u")}
    store, jobs = brokered(users.role_url("compactor"))
    worker = Compactor(
        store, Storage.from_uri(str(tmp_path / "files")), WorkerSettings("default", "c", engine="arrow"), jobs=jobs
    )
    outcomes = [worker.run_one(), worker.run_one()]
    assert [o.status for o in outcomes if o is not None] == ["committed", "committed"]
    assert worker.run_one() is None  # the queue is empty
    for name in ("t", "u"):
        assert list(client.scan(name)) == want[name]
        (tablet,) = admin.tables.tablets(admin.tables.table_id(name))
        assert len(tablet.files) == 1 and not tablet.running
    assert [(c.id, c.state) for c in admin.fleet.compactors("default")] == [("c", "busy")]  # its last word


def test_with_a_group_key_a_compactor_reserves_and_speaks_for_its_own_group_only(
    users: RedisProcess, tmp_path: Path
) -> None:
    storage = Storage.from_uri(str(tmp_path / "files"))
    admin = MetadataStore.from_url(users.role_url("admin"))
    admin.fleet.put_group(GroupConfig("default"))
    admin.tables.create_table("t", [])
    for k in range(4):
        Client(admin, storage).flush("t", entries(30, k, value=lambda r, k=k: b"v%d" % k))
    coordinator = Coordinator(MetadataStore.from_url(users.role_url("coordinator")), storage)
    assert coordinator.tick()
    key = "k" * 48
    store = MetadataStore.from_url(users.role_url("compactor"))
    other = BrokeredJobs(store, timeout_s=10.0, group_token=grouptoken.group_token(key, "other"))
    none = BrokeredJobs(store, timeout_s=10.0)
    own = BrokeredJobs(store, timeout_s=10.0, group_token=grouptoken.group_token(key, "default"))
    with running_broker(users.role_url("coordinator"), group_key=key):
        before = look(users)
        for jobs in (other, none):  # another group's compactor; one without a token
            with pytest.raises(Refused, match="not a compactor of group default"):
                jobs.reserve("default", "c")
            for act in (
                lambda j=jobs: j.register("default", "c", "idle", None),
                lambda j=jobs: j.unregister("default", "c", False),
                lambda j=jobs: j.mark_drained("default", "c"),
            ):
                with pytest.raises(Refused, match="not a compactor of group default"):
                    act()
        assert look(users) == before
        held = own.reserve("default", "c")
        assert held is not None and held.job.group == "default"
        own.mark_drained("default", "c")
    coordinator.resign()


def test_the_broker_drops_requests_nobody_waits_for_and_refuses_bad_ones(
    users: RedisProcess, system: tuple[MetadataStore, Client]
) -> None:
    _store, jobs = brokered(users.role_url("compactor"))
    with pytest.raises(Refused, match="bad group name"):
        jobs.reserve("../other", "c")
    with pytest.raises(Refused, match="bad compactor state"):
        jobs.register("default", "c", "root", None)
    # a request past its deadline is not served: nothing reserved for it, no answer
    before = look(users)
    reply = send_raw(jobs, "reserve", -1.0, group="default", compactor="late").reply
    raw = redis.Redis.from_url(users.url)
    raw.lpush(C.BROKER, b"not json")
    poll(lambda: raw.llen(C.BROKER) == 0, what="the broker took both requests")
    assert jobs.ask(m.Register("default", "c", "idle", None)) is None  # it still serves
    after = look(users)
    after.pop(C.compactors_key("default").encode())
    assert after == before
    assert raw.llen(C.reply_key(reply)) == 0
    assert Broker(MetadataStore.from_url(users.role_url("coordinator"))).respond(b'{"reply": 1}') is None


def test_a_reservation_travels_whole(users: RedisProcess, system: tuple[MetadataStore, Client]) -> None:
    _store, jobs = brokered(users.role_url("compactor"))
    held = jobs.reserve("default", "c")
    assert held is not None
    assert Reservation.from_json(json.loads(json.dumps(held.to_json())), held.cap) == held


def test_without_a_broker_a_compactor_waits_and_says_why(users: RedisProcess, tmp_path: Path) -> None:
    store = MetadataStore.from_url(users.role_url("compactor"))
    jobs = BrokeredJobs(store, timeout_s=0.5)
    with pytest.raises(StoreUnavailable, match="no answer from the coordinator to reserve"):
        jobs.reserve("default", "c")


def test_a_compactor_on_its_user_without_the_broker_says_so_in_one_line(
    users: RedisProcess, system: tuple[MetadataStore, Client], tmp_path: Path
) -> None:
    env = python_env(KOMPAKTOR_REDIS_URL=users.role_url("compactor"), KOMPAKTOR_STORAGE=str(tmp_path / "files"))
    args = ["compactor", "--group", "default", "--id", "by-hand", "--http-port", "-1", "--engine", "arrow"]
    out = subprocess.run(
        [sys.executable, "-m", "kompaktor", *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode != 0
    assert "may not write Kompaktor's metadata" in out.stderr and "run it with --broker" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_a_reservations_record_goes_soon_after_its_compaction_ends(
    users: RedisProcess, system: tuple[MetadataStore, Client], tmp_path: Path
) -> None:
    """The broker's records do not pile up: once committed or released, a record lives minutes,
    and it goes at once with the job's record in the history (the holder's last request)."""
    store, jobs = brokered(users.role_url("compactor"))
    raw = redis.Redis.from_url(users.url)
    worker = Compactor(
        store, Storage.from_uri(str(tmp_path / "files")), WorkerSettings("default", "c", engine="arrow"), jobs=jobs
    )
    committed = worker.run_one()
    released = jobs.reserve("default", "c")
    assert committed is not None and committed.status == "committed" and released is not None
    assert raw.ttl(C.reservation_key(released.ecid)) > 3600  # while it runs: days
    jobs.release(Storage.from_uri(str(tmp_path / "files")), released)
    assert 0 < raw.ttl(C.reservation_key(released.ecid)) <= 600
    assert not raw.exists(C.reservation_key(committed.ecid))  # run_one recorded it in the history
