"""Each role's Redis rights are what its code issues (issue 34 §3), for the compactor, the
coordinator and the operator: a real redis-server with the users `kompaktor up` and the chart create, each role's
representative runs (a compactor that commits a merge, fails one whose input is gone, waits idle
for work and drains; a coordinator that loads the functions, plans, scans, reaps and collects
garbage; an operator that reconciles a service, a group and a user compaction on a server that
lost the functions), and Redis's own per-command counters (``INFO commandstats``, which count the commands
Kompaktor's functions run too, and the calls the ACL refused) between ``CONFIG RESETSTAT``s.

A command a role's code sends and its user may not run fails the test; so does a right no code
uses: a right a role has beyond the compactor's (``FUNCTION LOAD``, ``CONFIG GET``, …) that the
role's runs do not send, or any right neither seen in the runs nor named anywhere in the
package's code (a redis-py method, the command as a string in capitals, or ``redis.call('CMD'``
in a function library) — the shared code paths a run does not reach (splits, failover) still
name their commands there. The admin role (the CLI) is not covered yet."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import redis

from kompaktor.client import Client
from kompaktor.coordinator import Coordinator, statuspage
from kompaktor.coordinator.broker import Answer, Broker
from kompaktor.files.storage import Storage
from kompaktor.local.redis_server import RedisProcess
from kompaktor.metadata import acl
from kompaktor.metadata import broker_messages as m
from kompaktor.metadata.brokered import BrokeredJobs
from kompaktor.metadata.store import MetadataStore
from kompaktor.worker import Compactor, WorkerSettings
from tests.support.broker import running_broker
from tests.support.entries import entries
from tests.support.rawredis import raw_redis

pytestmark = pytest.mark.redis

PACKAGE = Path(__file__).parents[2] / "compactor" / "kompaktor"
#: commands a role's code tries and goes on without when refused: CONFIG GET appendfsync (the
#: durability plan) — CONFIG GET would also read requirepass and masterauth, and Redis cannot
#: allow it for one parameter ("Allowing first-arg of a subcommand is not supported")
REFUSED_PROBES = {"compactor": {"config|get"}}
#: what the harness itself sends between the runs
HARNESS = {"config|resetstat"}
#: what the coordinator's broker sends while it serves a compactor's run outside the commands it
#: runs for a request (those are not counted, :meth:`Recorder.excluded`): waiting, answering
BROKER_LOOP = {"blmpop", "rpush", "expire"}


@pytest.fixture
def users(tmp_path: Path) -> Iterator[RedisProcess]:
    server = RedisProcess(tmp_path / "redis", users=acl.new_passwords()).start()
    yield server
    server.stop()


class Recorder:
    """The commands Redis ran (calls, refused calls) per role, from ``INFO commandstats``."""

    def __init__(self, server: RedisProcess) -> None:
        self.raw = redis.Redis.from_url(server.url)
        self.seen: dict[str, dict[str, list[int]]] = {}
        #: commands run while :meth:`excluded` (another role's, during this role's run)
        self.skip: dict[str, list[int]] = {}

    def stats(self) -> dict[str, list[int]]:
        return {
            key.removeprefix("cmdstat_"): [int(st["calls"]), int(st.get("rejected_calls", 0))]
            for key, st in self.raw.info("commandstats").items()
        }

    @contextmanager
    def excluded(self, sign: int = 1) -> Iterator[None]:
        """What Redis runs inside the block is not the recorded role's (another role's work)."""
        before = self.stats()
        yield
        for name, (calls, rejected) in self.stats().items():
            was = before.get(name, [0, 0])
            skip = self.skip.setdefault(name, [0, 0])
            skip[0] += sign * (calls - was[0])
            skip[1] += sign * (rejected - was[1])

    def included(self) -> AbstractContextManager[None]:
        """Inside an :meth:`excluded` block: what Redis runs here is the recorded role's again."""
        return self.excluded(-1)

    def run(self, role: str, work: Callable[[], object]) -> None:
        """``work`` alone against Redis, its commands counted as ``role``'s."""
        self.raw.config_resetstat()
        self.skip = {}
        work()
        ignore = HARNESS | (BROKER_LOOP if role == "compactor" else set())
        for name, (total, rejected) in self.stats().items():
            skip = self.skip.get(name, [0, 0])
            total, rejected = total - skip[0], rejected - skip[1]
            if name not in ignore and total > 0:
                calls = self.seen.setdefault(role, {}).setdefault(name, [0, 0])
                calls[0] += total
                calls[1] += rejected

    def commands(self, role: str) -> set[str]:
        return set(self.seen.get(role, {}))

    def refused(self, role: str) -> set[str]:
        return {name for name, (_calls, rejected) in self.seen.get(role, {}).items() if rejected}


@cache
def code_text() -> tuple[str, str]:
    """(the package's Python, its Lua function libraries)."""
    py = "\n".join(p.read_text() for p in PACKAGE.rglob("*.py"))
    lua = "\n".join(p.read_text() for p in PACKAGE.rglob("*.lua"))
    return py, lua


def named_in_code(command: str) -> bool:
    """The package's code names ``command``: a redis-py method (``.hgetall(``, ``self._r.mget``),
    the command in capitals as a string (``("SPOP", key)``, ``pack_command(c, "MGET", …)``), or a
    ``redis.call('CMD'`` in a function library."""
    py, lua = code_text()
    top, _, sub = command.partition("|")
    method = f"{top}_{sub}" if sub else top
    return bool(
        re.search(rf"\.{method}\b(?!\w)", py)
        or re.search(rf"""["']{top.upper()}["']""", py)
        or re.search(rf"""redis\.p?call\(\s*["']{top}["']""", lua, re.IGNORECASE)
    )


def rights_of(rules) -> set[str]:
    """The commands named in ``rules``, those of selectors ``(~keys +cmd …)`` included."""
    out = set()
    for r in rules:
        for token in r.strip("()").split() if r.startswith("(") else [r]:
            if token.startswith("+") and not token.startswith("+@"):
                out.add(token[1:])
    return out


def explicit_rights(role: str) -> set[str]:
    return rights_of(acl.RIGHTS[role])


def category_members(raw: redis.Redis, role: str) -> dict[str, set[str]]:
    out = {}
    for r in acl.RIGHTS[role]:
        if r.startswith("+@"):
            out[r[1:]] = {c.decode() if isinstance(c, bytes) else c for c in raw.acl_cat(r[2:])}
    return out


def tables(users: RedisProcess, storage: Storage, names: tuple[str, ...]) -> MetadataStore:
    admin = MetadataStore.from_url(users.role_url("admin"))
    client = Client(admin, storage)
    for name in names:
        admin.tables.create_table(name, [])
        for k in range(4):
            client.flush(name, entries(40, k, value=lambda r, k=k: b"v%d" % k))
    return admin


class UncountedBroker(Broker):
    """The coordinator's broker, whose work for a request is not counted as the asker's."""

    def __init__(self, store: MetadataStore, rec: Recorder) -> None:
        super().__init__(store)
        self.rec = rec

    def respond(self, raw: bytes | str) -> Answer | None:
        with self.rec.excluded():
            return super().respond(raw)

    def send(self, answers: list[Answer]) -> None:
        with self.rec.excluded():  # the records; the answers themselves are BROKER_LOOP's
            for a in answers:
                for key, doc in a.records:
                    raw_redis(self.store).set(key, doc)
                for key in a.done:
                    raw_redis(self.store).expire(key, 600)
                a.records, a.done = [], []
        super().send(answers)


class InlineJobs(BrokeredJobs):
    """A compactor's requests, each served at once by ``broker`` in the asker's thread, where only
    the broker's commands are counted (the compactor's run is excluded around it)."""

    def __init__(self, store: MetadataStore, broker: Broker, rec: Recorder) -> None:
        super().__init__(store)
        self.broker, self.rec = broker, rec

    def ask(self, req: m.Request, timeout_s: float | None = None) -> Any:
        env = self.send(req, 10.0)
        with self.rec.included():
            assert self.broker.serve_one(1.0)
        return self.answer(req.op, env, 10.0)


def brokered_compactor(users: RedisProcess, storage: Storage, name: str, **kw: Any) -> Compactor:
    store = MetadataStore.from_url(users.role_url("compactor"))
    return Compactor(store, storage, WorkerSettings("default", name, engine="arrow", **kw), jobs=BrokeredJobs(store))


def compactor_runs(users: RedisProcess, storage: Storage, rec: Recorder) -> None:
    admin = tables(users, storage, ("t", "gone"))
    coordinator = Coordinator(MetadataStore.from_url(users.role_url("coordinator")), storage)
    assert coordinator.tick()
    (tablet,) = admin.tables.tablets(admin.tables.table_id("gone"))
    storage.fs.delete_file(storage.path(sorted(tablet.files)[0]))  # a merge that fails
    worker = brokered_compactor(users, storage, "c-rights", idle_wake_poll_s=0.2)
    broker = UncountedBroker(MetadataStore.from_url(users.role_url("coordinator")), rec)

    def work() -> None:
        worker.store.ping()  # as `kompaktor compactor` does first
        outcomes = sorted(o.status for o in (worker.run_one(), worker.run_one()) if o is not None)
        assert outcomes[0] == "committed" and outcomes[-1] != "committed", outcomes
        # idle: it waits for a wake-up, then drains
        threading.Timer(0.5, worker.request_drain).start()
        assert worker.run() == 0
        worker.close()

    stop = threading.Event()
    serving = broker.start(stop, threads=1, wait_s=0.1)
    try:
        rec.run("compactor", work)
    finally:
        stop.set()
        for th in serving:
            th.join(10)


def coordinator_runs(users: RedisProcess, storage: Storage, rec: Recorder) -> None:
    tables(users, storage, ("t",))
    coordinator = Coordinator(MetadataStore.from_url(users.role_url("coordinator")), storage)
    # `kompaktor coordinator` checks the server first (a primary, its durability), then leads,
    # loads the functions and plans
    rec.run("coordinator", lambda: (coordinator.store.ping(), coordinator.tick()))
    worker = brokered_compactor(users, storage, "c")
    with running_broker(users.role_url("coordinator")):
        assert (outcome := worker.run_one()) is not None and outcome.status == "committed"
    rec.run("coordinator", lambda: (coordinator.tick(), coordinator.full_scan(), coordinator.detect_dead()))
    rec.run("coordinator", lambda: coordinator.collect_garbage(grace_s=0))
    rec.run("coordinator", lambda: statuspage.collect(coordinator.store))  # its /status page
    # its broker, serving a compactor's run (the compactor's own commands not counted)
    tables(users, storage, ("t2",))
    assert coordinator.tick()
    served = brokered_compactor(users, storage, "c2")
    served.jobs = InlineJobs(served.store, Broker(MetadataStore.from_url(users.role_url("coordinator"))), rec)

    def serve() -> None:
        with rec.excluded():
            assert (outcome := served.run_one()) is not None and outcome.status == "committed"

    rec.run("coordinator", serve)
    rec.run("coordinator", lambda: coordinator.take_backup())  # a scheduled backup
    worker.close()
    rec.run("coordinator", coordinator.resign)


def operator_runs(users: RedisProcess, storage: Storage, rec: Recorder) -> None:
    from kompaktor.policy.services import GroupConfig, ServiceConfig
    from kompaktor_operator.backend import RedisBackend

    tables(users, storage, ("t",))
    coordinator = Coordinator(MetadataStore.from_url(users.role_url("coordinator")), storage)
    assert coordinator.tick()  # loads the functions
    worker = brokered_compactor(users, storage, "c")
    with running_broker(users.role_url("coordinator")):
        assert worker.run_one() is not None  # a compactor registered, with a heartbeat
    backend = RedisBackend(users.role_url("operator"))
    redis.Redis.from_url(users.url).function_flush()  # a new server: the operator's write loads them

    def reconcile() -> None:  # what the handlers and timers call
        backend.store.ping()
        backend.put_service(ServiceConfig("svc"))
        backend.put_group(GroupConfig("g"))
        assert "g" in backend.groups()
        backend.queue_figures("default")
        for cid in backend.compactors("default"):
            backend.request_drain(cid)
        cid = backend.start_compaction("uid-1", "t", None, None, {})
        backend.compaction_progress(cid)
        backend.cancel_compaction(cid)
        backend.delete_group("g")
        backend.delete_service("svc")

    rec.run("operator", reconcile)
    worker.close()


RUNS = {"compactor": compactor_runs, "coordinator": coordinator_runs, "operator": operator_runs}


@pytest.mark.parametrize("role", sorted(RUNS))
def test_a_roles_rights_are_what_its_code_sends(users: RedisProcess, tmp_path: Path, role: str) -> None:
    rec = Recorder(users)
    RUNS[role](users, Storage.from_uri(str(tmp_path / "files")), rec)
    sent = rec.commands(role)
    assert len(sent) > 5, sent  # the runs did reach Redis
    assert ("fcall" in sent) == (role != "compactor"), sent  # only the broker runs the compactor's writes
    lacks = rec.refused(role) - REFUSED_PROBES.get(role, set())
    assert not lacks, f"the {role} sends commands its user may not run: {sorted(lacks)}"
    # the writes of Kompaktor's structures are shared by the roles that write (the functions'
    # commands: paths a run does not reach need them too); the compactor reads and asks
    shared = rights_of(acl.SHARED_READS + (() if role == "compactor" else (*acl.SHARED_WRITES, acl.HISTORY_APPEND)))
    not_sent = explicit_rights(role) - shared - sent
    assert not not_sent, f"the {role}'s user has rights of its own that it never sends: {sorted(not_sent)}"
    unused = {r for r in explicit_rights(role) - sent if not named_in_code(r)}
    assert not unused, f"the {role}'s user may run commands no code sends: {sorted(unused)}"
    for category, members in category_members(rec.raw, role).items():
        used = members & sent or {m for m in members if named_in_code(m)}
        assert used, f"the {role}'s user has {category}, of which its code sends nothing"
    # ... and every command it sends is one of its explicit rights or of a category it holds
    granted = explicit_rights(role) | {c for m in category_members(rec.raw, role).values() for c in m}
    missing = {
        c for c in sent - REFUSED_PROBES.get(role, set()) if c.partition("|")[0] not in granted and c not in granted
    }
    assert not missing, f"the {role} sends commands outside its rights: {sorted(missing)}"
