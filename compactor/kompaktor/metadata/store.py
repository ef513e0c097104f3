"""The metadata store on Redis: tables, tablets, their files, running compactions, selections.

Every change to a tablet is a :class:`Mutation` — conditions plus operations — evaluated
atomically inside Redis by one Lua script (``lua/mutate.lua``); a rejected mutation raises
:class:`ConditionFailed` naming the condition. This is the only module that writes metadata.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import orjson
import redis

from kompaktor import keyspace as C
from kompaktor.connection import Durability, connect, durable_pipeline, explain, is_sentinel_url, translate
from kompaktor.model.errors import ConditionFailed, Fenced, StoreUnavailable, TableExistsError, UnknownTableError
from kompaktor.model.keys import encode_row, span_overlaps
from kompaktor.model.names import check_table_name
from kompaktor.model.tablet import (
    DELETED,
    OFFLINE,
    ONLINE,
    CompactorInfo,
    FileMeta,
    TableInfo,
    Tablet,
    decode_tablets,
    end_token,
    now_ms,
    tablet_id,
)
from kompaktor.queues.jobqueue import JobQueues

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEADLOG_LENGTH = 10_000  # ECIDs of the last dead compactions kept
_LEASE_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
_LEASE_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
_LEASE_ACQUIRE = (
    C.lua_prelude()
    + """
if redis.call('SET', K.lease, ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', K.fence)
end
return false
"""
)
# A coordinator's plain writes (sets, hashes, counters): applied only while its fencing token
# (ARGV[1]) is the newest, all of them atomically. ARGV[2] = JSON list of commands.
_FENCED_WRITE = (
    C.lua_prelude()
    + """
local tok = tonumber(ARGV[1])
local cur = tonumber(redis.call('GET', K.fence) or '0')
if cur > tok then
  return redis.error_reply('FENCED fencing token ' .. ARGV[1] .. ' is stale: coordinator ' .. cur .. ' took over')
end
local out = {}
for i, c in ipairs(cjson.decode(ARGV[2])) do out[i] = redis.call(unpack(c)) end
return out
"""
)
_LUA = C.lua_prelude() + resources.files("kompaktor.metadata").joinpath("lua/mutate.lua").read_text()
_FAILURES = C.lua_prelude() + resources.files("kompaktor.metadata").joinpath("lua/failures.lua").read_text()


@dataclass
class TabletChange:
    """Conditions and operations on one tablet; build with the fluent methods."""

    tablet_id: str
    conds: list[list[Any]] = field(default_factory=list)
    ops: list[list[Any]] = field(default_factory=list)

    def require(self, name: str, *args: Any) -> TabletChange:
        self.conds.append([name, *args])
        return self

    def do(self, name: str, *args: Any) -> TabletChange:
        self.ops.append([name, *args])
        return self


@dataclass
class Mutation:
    """One atomic conditional mutation over a table and any number of its tablets."""

    table: str | None = None
    table_conds: list[list[Any]] = field(default_factory=list)
    table_ops: list[list[Any]] = field(default_factory=list)
    tablets: list[TabletChange] = field(default_factory=list)
    #: fields of the table's hash to return with the outcome (:meth:`MetadataStore.apply`)
    table_reads: list[str] = field(default_factory=list)

    def tablet(self, tablet_id: str) -> TabletChange:
        tc = TabletChange(tablet_id)
        self.tablets.append(tc)
        return tc

    def require_table(self, *states: str) -> Mutation:
        self.table_conds.append(["exists"])
        if states:
            self.table_conds.append(["state_in", list(states)])
        return self

    def to_json(self, mutation_id: str | None = None, fence: int | None = None) -> str:
        return json.dumps(
            {
                "id": mutation_id,
                "fence": fence,
                "now": now_ms(),
                "table": self.table,
                "table_conds": self.table_conds,
                "table_ops": self.table_ops,
                "table_reads": self.table_reads,
                "tablets": [{"id": t.tablet_id, "conds": t.conds, "ops": t.ops} for t in self.tablets],
            }
        )


#: the most a single call reads or pops of a structure that grows with the instance (a table's
#: tablets, the dirty set): Redis runs one command at a time, so bigger calls hold everyone up
SCAN_CHUNK = 10_000


class MetadataStore:
    """Typed access to Kompaktor's metadata in Redis."""

    def __init__(
        self,
        client: redis.Redis,
        url: str = "",
        *,
        fence: Callable[[], int | None] | None = None,
        durability: Durability | None = None,
    ) -> None:
        self._r = client
        self.url = url
        #: how an acknowledged write is made durable (issue 15 §1, :mod:`kompaktor.connection`)
        self.durability = durability or Durability(sentinel=is_sentinel_url(url))
        #: the fencing token every write of this view carries (:meth:`fenced`), or None
        self._fence = fence
        self._mutate = client.register_script(_LUA)
        self._lease_acquire = client.register_script(_LEASE_ACQUIRE)
        self._lease_renew = client.register_script(_LEASE_RENEW)
        self._lease_release = client.register_script(_LEASE_RELEASE)
        self._fenced_write = client.register_script(_FENCED_WRITE)
        self._failures = client.register_script(_FAILURES)
        self._queues: JobQueues | None = None

    def load_scripts(self) -> int:
        """Load every script of the store and the queues that Redis does not hold (a new server, a
        restart, a failover): compactors run them by hash and may not load them (their Redis user
        has ``EVALSHA`` only, :mod:`kompaktor.metadata.acl`). One round trip when nothing is
        missing; returns how many were loaded. The coordinator calls it on every pass."""
        scripts = [
            self._mutate,
            self._lease_acquire,
            self._lease_renew,
            self._lease_release,
            self._fenced_write,
            self._failures,
            *self.queues.scripts(),
        ]
        held = self.call(self._r.script_exists, *[s.sha for s in scripts])
        missing = [s for s, ok in zip(scripts, held, strict=True) if not ok]
        for s in missing:
            self.call(self._r.script_load, s.script)
        return len(missing)

    def fenced(self, token: Callable[[], int | None]) -> MetadataStore:
        """A view of this store, on the same connection, whose every write (mutations, queue
        scripts, sets, counters) carries the fencing token ``token()`` and is refused atomically,
        inside Redis, with :class:`Fenced` once a newer token exists. The coordinator's store.
        While ``token()`` is None (a coordinator that never led) the writes are not fenced."""
        return MetadataStore(self._r, self.url, fence=token)

    @property
    def queues(self) -> JobQueues:
        """The job queues, on this store's connection (fenced like this store)."""
        if self._queues is None:
            self._queues = JobQueues(self._r, fence=self._fence)
        return self._queues

    def _write(self, *commands: tuple[Any, ...]) -> list[Any]:
        """Run write commands atomically (MULTI/EXEC); through a fenced view, only while its
        fencing token is the newest. Returns their replies."""
        token = None if self._fence is None else self._fence()
        if token is None:
            p = self._r.pipeline(transaction=True)
            for cmd in commands:
                p.execute_command(*cmd)
            return list(self.call(p.execute))
        cmds = json.dumps([[str(a) for a in cmd] for cmd in commands])
        return list(self.call(self._fenced_write, args=[token, cmds]))

    def close(self) -> None:
        self._r.close()

    @classmethod
    def from_url(cls, url: str | None = None) -> MetadataStore:
        import os

        url = url or os.environ.get("KOMPAKTOR_REDIS_URL") or DEFAULT_REDIS_URL
        return cls(connect(url), url)

    # -- plumbing -------------------------------------------------------------------------
    def call(self, fn, *args, **kwargs):
        """Run a Redis call; what Redis failures mean is raised in their place (:func:`translate`):
        :class:`StoreUnavailable` (with the URL, redacted) when Redis cannot be used, including a
        wrong password and a database index the server does not have, :class:`Fenced`."""
        try:
            return fn(*args, **kwargs)
        except redis.RedisError as exc:
            if (mapped := translate(exc, self.url or "the given URL", url=self.url)) is None:
                raise
            raise mapped from exc

    def durable(self) -> None:
        """Return once every write made so far (by anyone) is durable as :attr:`durability` asks
        (one barrier write and the wait); for writes outside :meth:`apply` that a caller
        acknowledges. Raises :class:`~kompaktor.connection.NotDurable` if not confirmed."""
        self.call(durable_pipeline, self._r, self.durability, lambda pipe: None)

    def _eval_durable(self, arg: str) -> Any:
        """mutate.lua on ``arg``, answered only once the write is durable (issue 15 §1): the barrier
        and WAIT / WAITAOF the store's durability asks for follow in the same round trip."""

        def run(pipe: redis.client.Pipeline) -> None:
            pipe.evalsha(self._mutate.sha, 0, arg)

        try:
            return self.call(durable_pipeline, self._r, self.durability, run)[0]
        except redis.exceptions.NoScriptError:
            self.call(self._r.script_load, self._mutate.script)  # a new server (failover, restart)
            return self.call(durable_pipeline, self._r, self.durability, run)[0]

    def ping(self) -> None:
        """The store answers and is a primary: a replica given as the primary is refused in one
        line here, before anything reads stale data from it or tries to write to it."""
        self.call(self._r.ping)
        if self.call(self._r.info, "replication").get("role") != "master":
            raise StoreUnavailable(explain(self.url, redis.ReadOnlyError("READONLY")) or "not a primary")
        self.call(self.durability.plan, self._r)  # a durability the server cannot give: refused now

    def mutate(self, m: Mutation) -> list[int]:
        """Apply a conditional mutation atomically; raise :class:`ConditionFailed` if any condition
        fails (then nothing changed). Returns the new versions of the tablets."""
        return list(self.apply(m).get("versions") or [])

    def apply(self, m: Mutation) -> dict[str, Any]:
        """:meth:`mutate`, returning the script's whole outcome: ``versions``, ``table`` (the
        mutation's ``table_reads``) and ``reserved`` (what ``add_running`` with output naming chose,
        per tablet id)."""
        # One id per call: redis-py resends the same arguments when it retries after a broken
        # connection, and the script then answers with the first attempt's outcome.
        fence = None if self._fence is None else self._fence()
        res = json.loads(self._eval_durable(m.to_json(uuid.uuid4().hex, fence)))
        if not res["ok"] and res["cond"] == "fenced":
            raise Fenced(res.get("detail") or "stale fencing token")
        if not res["ok"]:
            detail = res.get("detail") or ""
            if res.get("tablet"):
                detail = f"{detail} on tablet {res['tablet']}".strip()
            raise ConditionFailed(res["cond"], detail)
        return res

    def next_seq(self, name: str) -> int:
        return int(self.call(self._r.hincrby, C.SEQ, name, 1))

    # -- tables ---------------------------------------------------------------------------
    def create_table(self, name: str, splits: Iterable[bytes] = (), props: dict[str, str] | None = None) -> str:
        check_table_name(name)
        rows = sorted(set(splits))
        if any(not r for r in rows):
            raise ValueError("split rows must not be empty")
        if self.call(self._r.hexists, C.TABLES, name):
            raise TableExistsError(f"table {name!r} already exists")
        tid = format(self.next_seq("table"), "x")
        m = Mutation(table=tid, table_conds=[["absent", name]], table_ops=[["create", name, json.dumps(props or {})]])
        prev: bytes | None = None
        for end in [*rows, None]:
            doc = {"table": tid, "prev": encode_row(prev), "end": encode_row(end), "files": {}, "running": {}}
            m.tablet(tablet_id(tid, end)).require("absent").do("create", doc, end_token(end))
            prev = end
        try:
            self.mutate(m)
        except ConditionFailed as exc:
            raise TableExistsError(f"table {name!r} already exists") from exc
        return tid

    def table_id(self, name: str) -> str:
        tid = self.call(self._r.hget, C.TABLES, name)
        if tid is None:
            raise UnknownTableError(f"unknown table {name!r}")
        return tid.decode()

    def table_info(self, tid: str) -> TableInfo:
        h = self.call(self._r.hgetall, C.table_key(tid))
        if not h:
            raise UnknownTableError(f"unknown table id {tid!r}")
        return TableInfo(tid, h[b"name"].decode(), h[b"state"].decode(), json.loads(h[b"props"]))

    def table(self, name: str) -> TableInfo:
        return self.table_info(self.table_id(name))

    def tables(self) -> list[TableInfo]:
        out = []
        for _name, tid in sorted(self.call(self._r.hgetall, C.TABLES).items()):
            out.append(self.table_info(tid.decode()))
        return out

    def set_props(self, name: str, props: dict[str, str | None]) -> None:
        tid = self.table_id(name)
        m = Mutation(table=tid).require_table(ONLINE, OFFLINE)
        m.table_ops = [["set_prop", k, v] for k, v in props.items()]
        self.mutate(m)

    def set_state(self, name: str, state: str) -> None:
        if state not in (ONLINE, OFFLINE):
            raise ValueError(f"state must be ONLINE or OFFLINE, got {state!r}")
        tid = self.table_id(name)
        self.mutate(Mutation(table=tid, table_ops=[["set_state", state]]).require_table(ONLINE, OFFLINE))

    def delete_table(self, name: str) -> list[str]:
        """Mark the table DELETED, forget its name and remove its tablets (their files become
        garbage for the collector). Running compactions on it then fail to commit. Returns the
        files that were referenced."""
        tid = self.table_id(name)
        tablets = self.tablets(tid)
        m = Mutation(table=tid, table_ops=[["set_state", DELETED], ["unname", name]]).require_table(ONLINE, OFFLINE)
        files: set[str] = set()
        for t in tablets:
            files.update(t.files)
            m.tablet(t.id).require("version", t.version).do("delete", end_token(t.end))
        self.mutate(m)
        return sorted(files)

    # -- tablets --------------------------------------------------------------------------
    def tablet_ids(self, tid: str, chunk: int | None = None) -> list[str]:
        """The table's tablet ids in row order, read ``chunk`` (:data:`SCAN_CHUNK`) at a time: one
        table may have a million tablets, and one ZRANGE over all would hold Redis that long."""
        chunk = chunk or SCAN_CHUNK
        out: list[str] = []
        start = 0
        while True:
            part = self.call(self._r.zrange, C.tablets_key(tid), start, start + chunk - 1)
            out.extend(f"{tid};{e.decode()}" for e in part)
            if len(part) < chunk:
                return out
            start += chunk

    def tablet(self, tablet_id: str) -> Tablet | None:
        raw = self.call(self._r.get, C.tablet_key(tablet_id))
        return None if raw is None else Tablet.from_json(tablet_id, orjson.loads(raw))

    def get_tablets(self, tablet_ids: list[str], chunk: int = 1000) -> list[Tablet]:
        return decode_tablets(self.tablet_docs(tablet_ids, chunk))

    def tablet_batches(self, tablet_ids: list[str], size: int = 1000) -> Iterator[list[Tablet]]:
        """These tablets in batches of ``size`` (missing ones left out). The documents of batch k+1
        are fetched before batch k is handed out: Redis work that the caller starts with batch k
        (a queue add) then runs while batch k+1 is decoded instead of delaying its fetch."""
        parts = [tablet_ids[i : i + size] for i in range(0, len(tablet_ids), size)]
        docs = self.tablet_docs(parts[0]) if parts else []
        for k in range(len(parts)):
            tablets = decode_tablets(docs)
            docs = self.tablet_docs(parts[k + 1]) if k + 1 < len(parts) else []
            yield tablets

    def tablet_docs(self, tablet_ids: list[str], chunk: int = 1000) -> list[tuple[str, bytes]]:
        """The stored documents of these tablets, not decoded (:func:`decode_tablets`); tablets
        that do not exist are left out."""
        out: list[tuple[str, bytes]] = []
        for i in range(0, len(tablet_ids), chunk):
            part = tablet_ids[i : i + chunk]
            raws = self.call(self._r.mget, [C.tablet_key(t) for t in part])
            out.extend((t, raw) for t, raw in zip(part, raws, strict=True) if raw)
        return out

    def tablets(self, tid: str) -> list[Tablet]:
        return self.get_tablets(self.tablet_ids(tid))

    def tablets_in_range(self, tid: str, start: bytes | None, end: bytes | None) -> list[Tablet]:
        """Tablets overlapping the inclusive row range [start, end] (None = unbounded)."""
        return [t for t in self.tablets(tid) if span_overlaps(start, end, t.prev, t.end)]

    def all_tablet_ids(self) -> list[str]:
        ids: list[str] = []
        for t in self.tables():
            ids.extend(self.tablet_ids(t.id))
        return ids

    def iter_all_tablets(self) -> Iterator[Tablet]:
        yield from self.get_tablets(self.all_tablet_ids())

    def add_files(self, table_name: str, files: dict[str, FileMeta], *, allow_offline: bool = True) -> list[str]:
        """Register files with every tablet their row span overlaps, in one mutation (Accumulo's
        bulk import v2). Returns the tablet ids that received files."""
        tid = self.table_id(table_name)
        tablets = self.tablets(tid)
        m = Mutation(table=tid).require_table(ONLINE, *([OFFLINE] if allow_offline else []))
        touched = []
        for t in tablets:
            mine = {}
            for path, fm in files.items():
                if fm.entries > 0 and span_overlaps(fm.first_row, fm.last_row, t.prev, t.end):
                    mine[path] = fm.to_json()
            if mine:
                m.tablet(t.id).require("exists").require("no_op").do("add_files", mine)
                touched.append(t.id)
        if touched:
            self.mutate(m)
        return touched

    # -- dirty tablets (for the coordinator) ----------------------------------------------
    def pop_dirty(self, count: int | None = None) -> list[str]:
        (raw,) = self._write(("SPOP", C.DIRTY, min(count or SCAN_CHUNK, SCAN_CHUNK)))
        return sorted(r.decode() for r in raw or [])

    def clear_dirty(self) -> None:
        """Forget every dirty mark (a full scan plans everything): UNLINK frees a big set in the
        background, where SPOP of a million would hold Redis for the whole pop."""
        self._write(("UNLINK", C.DIRTY))

    def mark_dirty(self, tablet_ids: Iterable[str]) -> None:
        ids = list(tablet_ids)
        for i in range(0, len(ids), 10_000):
            self._write(("SADD", C.DIRTY, *ids[i : i + 10_000]))

    # -- counters -------------------------------------------------------------------------
    def incr(self, name: str, by: int = 1) -> int:
        (n,) = self._write(("HINCRBY", C.COUNTERS, name, by))
        return int(n)

    def counters(self) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in self.call(self._r.hgetall, C.COUNTERS).items()}

    # -- services, groups, compactors (written by the operator or `kompaktor up`) ------------
    def put_service(self, cfg) -> None:
        """Store a compaction service; every tablet is re-planned against the new settings."""
        self.call(self._r.hset, C.SERVICES, cfg.name, cfg.to_json())
        self.mark_dirty(self.all_tablet_ids())

    def delete_service(self, name: str) -> None:
        self.call(self._r.hdel, C.SERVICES, name)
        self.mark_dirty(self.all_tablet_ids())

    def services(self) -> dict:
        from kompaktor.policy.services import DEFAULT, ServiceConfig

        out = {DEFAULT.name: DEFAULT}
        for name, raw in self.call(self._r.hgetall, C.SERVICES).items():
            out[name.decode()] = ServiceConfig.from_json(raw)
        return out

    def put_group(self, cfg) -> None:
        self.call(self._r.hset, C.GROUPS, cfg.name, cfg.to_json())

    def delete_group(self, name: str) -> None:
        self.call(self._r.hdel, C.GROUPS, name)

    def groups(self) -> dict:
        from kompaktor.policy.services import GroupConfig

        return {n.decode(): GroupConfig.from_json(raw) for n, raw in self.call(self._r.hgetall, C.GROUPS).items()}

    def register_compactor(self, group: str, compactor_id: str, state: str, ecid: str | None = None) -> None:
        doc = json.dumps({"state": state, "ecid": ecid, "last_seen": time.time()})
        self.call(self._r.hset, C.compactors_key(group), compactor_id, doc)

    def unregister_compactor(self, group: str, compactor_id: str) -> None:
        self.call(self._r.hdel, C.compactors_key(group), compactor_id)
        self.call(self._r.delete, C.drain_key(compactor_id))

    def compactors(self, group: str) -> list[CompactorInfo]:
        out = []
        for cid, raw in sorted(self.call(self._r.hgetall, C.compactors_key(group)).items()):
            d = json.loads(raw)
            out.append(CompactorInfo(cid.decode(), group, d["state"], d.get("ecid"), float(d["last_seen"])))
        return out

    def request_drain(self, compactor_id: str) -> None:
        self.call(self._r.set, C.drain_key(compactor_id), "1", ex=3600)

    def drain_requested(self, compactor_id: str) -> bool:
        return bool(self.call(self._r.exists, C.drain_key(compactor_id)))

    # -- heartbeats of running compactions -------------------------------------------------
    def put_heartbeat(self, ecid: str, fields: dict[str, Any]) -> None:
        self.call(self._r.hset, C.heartbeat_key(ecid), mapping={k: str(v) for k, v in fields.items()})

    def heartbeat(self, ecid: str) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in self.call(self._r.hgetall, C.heartbeat_key(ecid)).items()}

    def drop_heartbeat(self, ecid: str) -> None:
        self._write(("DEL", C.heartbeat_key(ecid)))

    # -- the index of running compactions (ECID -> tablet, maintained by mutate.lua) ----------
    def running_index(self) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in self.call(self._r.hgetall, C.RUNNING).items()}

    def running_tablet(self, ecid: str) -> str | None:
        raw = self.call(self._r.hget, C.RUNNING, ecid)
        return None if raw is None else raw.decode()

    def running_count(self) -> int:
        return int(self.call(self._r.hlen, C.RUNNING))

    def forget_running(self, ecid: str) -> None:
        """Drop an index entry whose tablet no longer holds the compaction."""
        self._write(("HDEL", C.RUNNING, ecid))

    def log_dead(self, ecid: str, group: str) -> None:
        """Count a dead compaction and remember its ECID (the last DEADLOG_LENGTH are kept)."""
        self._write(
            ("HINCRBY", C.COUNTERS, "dead_compactions", 1),
            ("HINCRBY", C.COUNTERS, f"dead_compactions:{group}", 1),
            ("RPUSH", C.DEADLOG, ecid),
            ("LTRIM", C.DEADLOG, -DEADLOG_LENGTH, -1),
        )

    def dead_log(self) -> set[str]:
        return {e.decode() for e in self.call(self._r.lrange, C.DEADLOG, 0, -1)}

    def commits_on(self, tablet_id: str) -> int:
        """Compactions committed on a tablet (counted by mutate.lua)."""
        return int(self.call(self._r.hget, C.COMMITS_BY_TABLET, tablet_id) or 0)

    # -- what a reservation reads besides the tablet --------------------------------------------
    def tablet_and_props(self, tablet_id: str, table_id: str) -> tuple[Tablet | None, dict[str, str] | None]:
        """A tablet and its table's properties, in one round trip."""
        p = self._r.pipeline(transaction=False)
        p.get(C.tablet_key(tablet_id))
        p.hget(C.table_key(table_id), "props")
        raw_tablet, raw_props = self.call(p.execute)
        tablet = None if raw_tablet is None else Tablet.from_json(tablet_id, orjson.loads(raw_tablet))
        return tablet, (None if raw_props is None else json.loads(raw_props))

    # -- user compactions ------------------------------------------------------------------------
    def put_user_compaction(self, cid: str, fields: dict[str, Any]) -> None:
        self._write(("HSET", C.ucomp_key(cid), *[x for kv in fields.items() for x in kv]))

    def user_compaction(self, cid: str) -> tuple[dict[str, str], int] | None:
        """The record of a user compaction and its number of finished tablets, or None."""
        p = self._r.pipeline(transaction=False)
        p.hgetall(C.ucomp_key(cid))
        p.scard(C.ucomp_done_key(cid))
        h, done = self.call(p.execute)
        if not h:
            return None
        return {k.decode(): v.decode() for k, v in h.items()}, int(done)

    def user_compaction_field(self, cid: str, name: str) -> str | None:
        raw = self.call(self._r.hget, C.ucomp_key(cid), name)
        return None if raw is None else raw.decode()

    def forget_user_compaction(self, cid: str) -> None:
        """Remove a finished user compaction's record, its finished tablets and its id."""
        self._write(("DEL", C.ucomp_key(cid), C.ucomp_done_key(cid)), ("SREM", C.UCOMPS, cid))

    def list_user_compactions(self) -> list[str]:
        return sorted(c.decode() for c in self.call(self._r.smembers, C.UCOMPS))

    def request_claimed(self, request_id: str) -> str | None:
        raw = self.call(self._r.get, C.request_key(request_id))
        return None if raw is None else raw.decode()

    # -- failed jobs ----------------------------------------------------------------------------
    def failure(self, fp: str) -> dict[str, Any] | None:
        raw = self.call(self._r.hget, C.FAILURES, fp)
        return None if raw is None else json.loads(raw)

    def put_failure(self, fp: str, rec: dict[str, Any]) -> None:
        self._write(("HSET", C.FAILURES, fp, json.dumps(rec)))

    def count_failure(
        self, fp: str, rec: dict[str, Any], now: float, base_backoff_s: float, max_backoff_s: float, max_attempts: int
    ) -> tuple[int, bool]:
        """Count one failure of job ``fp`` in one atomic step (``lua/failures.lua``): its count
        goes up, it backs off, and at ``max_attempts`` it moves to the dead letters. Returns the
        count and whether it was dead-lettered."""
        count, dead = self.call(
            self._failures,
            args=[
                self._token(),
                "record",
                fp,
                json.dumps(rec),
                repr(now),
                repr(base_backoff_s),
                repr(max_backoff_s),
                max_attempts,
            ],
        )
        return int(count), bool(dead)

    def redirty_failed(self, now: float) -> list[str]:
        """Mark dirty, once, the tablets whose failed job's backoff has passed (atomically)."""
        return [t.decode() for t in self.call(self._failures, args=[self._token(), "redirty", repr(now)])]

    def _token(self) -> str:
        token = None if self._fence is None else self._fence()
        return "" if token is None else str(token)

    def failures(self) -> dict[str, dict[str, Any]]:
        return {k.decode(): json.loads(v) for k, v in self.call(self._r.hgetall, C.FAILURES).items()}

    def forget_failures(self, fps: list[str]) -> None:
        if fps:
            self._write(("HDEL", C.FAILURES, *fps))

    def dead_letter(self, fp: str, rec: dict[str, Any]) -> None:
        """Move a job from the failures to the dead letters (counted), atomically."""
        self._write(
            ("HSET", C.DEADLETTER, fp, json.dumps(rec)),
            ("HDEL", C.FAILURES, fp),
            ("HINCRBY", C.COUNTERS, "dead_lettered", 1),
        )

    def dead_letters(self) -> dict[str, dict[str, Any]]:
        return {k.decode(): json.loads(v) for k, v in self.call(self._r.hgetall, C.DEADLETTER).items()}

    # -- dirty set, automatic split ---------------------------------------------------------------
    def dirty_ids(self) -> list[str]:
        return sorted(x.decode() for x in self.call(self._r.smembers, C.DIRTY))

    def dirty_count(self) -> int:
        return int(self.call(self._r.scard, C.DIRTY))

    def claim_split_check(self, every_s: float) -> bool:
        """True for at most one caller per ``every_s`` seconds: time for a split check of every tablet."""
        (ok,) = self._write(("SET", C.SPLIT_CHECK, time.time(), "NX", "EX", max(1, int(every_s))))
        return bool(ok)

    # -- garbage collection, imports in progress ------------------------------------------------------
    def record_gc(self, n: int) -> None:
        """Record that the collector deletes ``n`` files (fenced: a replaced coordinator is
        refused here, before it deletes anything)."""
        self._write(("HINCRBY", C.COUNTERS, "gc_deleted", n))

    def register_import(self, import_id: str, table_id: str, files: Iterable[str], ttl_s: float) -> None:
        """Announce (or refresh) a bulk import in progress: its temporary files (tagged
        ``import_id``) and ``files`` are not garbage until ``ttl_s`` seconds from now."""
        doc = {"table": table_id, "files": sorted(files), "expires": time.time() + ttl_s}
        self.call(self._r.hset, C.IMPORTS, import_id, json.dumps(doc))

    def forget_import(self, import_id: str) -> None:
        """Drop the record of an import that failed and removed its files."""
        self.call(self._r.hdel, C.IMPORTS, import_id)

    def imports_since(self, since: float) -> tuple[set[str], set[str]]:
        """The ids and files of the bulk imports in progress at ``since`` or later."""
        ids: set[str] = set()
        files: set[str] = set()
        for iid, raw in self.call(self._r.hgetall, C.IMPORTS).items():
            doc = json.loads(raw)
            if float(doc["expires"]) >= since:
                ids.add(iid.decode())
                files.update(doc["files"])
        return ids, files

    def forget_imports_before(self, before: float) -> None:
        """Drop the records of imports that ended (or died) before ``before``."""
        old = [
            iid
            for iid, raw in self.call(self._r.hgetall, C.IMPORTS).items()
            if float(json.loads(raw)["expires"]) < before
        ]
        if old:
            self._write(("HDEL", C.IMPORTS, *[i.decode() for i in old]))

    # -- the coordinator's lease ------------------------------------------------------------------
    def coordinator_seen(self) -> float | None:
        """When a leading coordinator last completed a pass (epoch seconds), or None."""
        raw = self.call(self._r.get, C.COORDINATOR_SEEN)
        return None if raw is None else float(raw)

    def mark_coordinator_seen(self) -> None:
        self._write(("SET", C.COORDINATOR_SEEN, repr(time.time())))

    def acquire_lease(self, holder: str, lease_ms: int) -> int | None:
        """Take the coordinator lease if nobody holds it; returns the new fencing token, or None."""
        fence = self.call(self._lease_acquire, args=[holder, lease_ms])  # SET NX and INCR, atomically
        return None if fence is None else int(fence)

    def renew_lease(self, holder: str, lease_ms: int) -> bool:
        """Extend the lease if ``holder`` still holds it."""
        return bool(int(self.call(self._lease_renew, keys=[C.LEASE], args=[holder, lease_ms])))

    def release_lease(self, holder: str) -> None:
        """Give the lease up if ``holder`` holds it (compare and delete in one step: never the next
        leader's lease)."""
        self.call(self._lease_release, keys=[C.LEASE], args=[holder])

    def commit_log(self) -> list[str]:
        """The ECIDs of the last commits applied, oldest first, once per commit applied
        (``keyspace.COMMITLOG``: what a check that no commit was lost or applied twice reads)."""
        return [e.decode() for e in self.call(self._r.lrange, C.COMMITLOG, 0, -1)]
