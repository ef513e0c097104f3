"""The metadata store on Redis: tables, tablets, their files, running compactions, selections.

Every change to a tablet is a :class:`Mutation` — conditions plus operations — evaluated
atomically inside Redis by one Lua script (``lua/mutate.lua``); a rejected mutation raises
:class:`ConditionFailed` naming the condition. This is the only module that writes metadata.
"""

from __future__ import annotations

import gc
import json
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, NamedTuple

import orjson
import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from kompaktor import contract as C
from kompaktor.errors import ConditionFailed, StoreUnavailable, TableExistsError, UnknownTableError
from kompaktor.keys import decode_row, encode_row
from kompaktor.tableprops import SELECTION_EXPIRY

ONLINE, OFFLINE, DELETED = "ONLINE", "OFFLINE", "DELETED"
STATES = (ONLINE, OFFLINE, DELETED)
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_SELECTION_EXPIRY_MS = 120_000  # table.compaction.selection.expiration.ms
_LUA = resources.files("kompaktor").joinpath("lua/mutate.lua").read_text()
_new_tuple = tuple.__new__  # builds a named tuple without its argument-checking __new__


def now_ms() -> int:
    return int(time.time() * 1000)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for a bulk decode or plan (nesting is fine).

    Decoding 100,000 tablets makes millions of small acyclic objects (freed by reference counting
    alone); with the collector on, each young-generation pass re-traverses the survivors, which
    made decoding them 3-4x slower (5.2 s instead of 1.3 s, measured)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def connect(url: str, *, retries: int = 6, socket_timeout: float = 5.0) -> redis.Redis:
    """A Redis client that retries connection errors with exponential backoff, a bounded number
    of times (about 3 s in all by default), then fails. ``rediss://`` URLs use TLS; passwords
    come in the URL (``redis://:pw@host:port/0``)."""
    try:
        return redis.Redis.from_url(
            url,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_timeout,
            retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), retries),
            retry_on_error=[redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError],
            health_check_interval=30,
        )
    except ValueError as exc:
        raise StoreUnavailable(f"invalid Redis URL {url!r}: {exc}") from exc


class FileMeta(NamedTuple):
    """A file of a tablet. A named tuple, not a dataclass: a full scan decodes 20 of them per
    tablet, and a tuple is built several times faster than a frozen dataclass."""

    size: int
    entries: int
    deletes: int = 0
    first_row: bytes | None = None
    last_row: bytes | None = None

    def to_json(self) -> dict[str, Any]:
        return {"size": self.size, "entries": self.entries, "deletes": self.deletes,
                "first": encode_row(self.first_row), "last": encode_row(self.last_row)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> FileMeta:
        first, last = d.get("first"), d.get("last")
        return _new_tuple(cls, (d["size"], d["entries"], d.get("deletes", 0),
                                None if first is None else bytes.fromhex(first),
                                None if last is None else bytes.fromhex(last)))


@dataclass(frozen=True)
class RunningCompaction:
    ecid: str
    kind: str
    files: tuple[str, ...]
    group: str
    priority: int
    compactor: str
    selection: str | None
    started_ms: int
    output: str  # relative path of the (temporary, then final) output

    def to_json(self) -> dict[str, Any]:
        d = {"kind": self.kind, "files": list(self.files), "group": self.group, "priority": self.priority,
             "compactor": self.compactor, "started": self.started_ms, "output": self.output}
        if self.selection is not None:
            d["selection"] = self.selection
        return d


@dataclass(frozen=True)
class Selection:
    id: str
    kind: str  # USER or SELECTOR
    files: tuple[str, ...]
    done: int = 0
    created_ms: int = 0

    def stale(self, props: dict[str, str], now: int) -> bool:
        """PLANNER.md §5: no job of the selection has completed and it is older than the table's
        selection expiry (default 2 minutes); SYSTEM compactions may then take its files."""
        expiry = int(props.get(SELECTION_EXPIRY, DEFAULT_SELECTION_EXPIRY_MS))
        return self.done == 0 and now - self.created_ms > expiry


@dataclass(frozen=True)
class Tablet:
    id: str
    table: str
    prev: bytes | None
    end: bytes | None
    files: dict[str, FileMeta]
    running: dict[str, RunningCompaction]
    selection: Selection | None
    hold: str | None
    op: str | None
    version: int

    @classmethod
    def from_json(cls, tablet_id: str, d: dict[str, Any]) -> Tablet:
        file_meta = FileMeta.from_json
        running = {}
        for ecid, r in (d.get("running") or {}).items():
            running[ecid] = RunningCompaction(ecid, r["kind"], tuple(r["files"]), r["group"], r["priority"],
                                              r["compactor"], r.get("selection"), r["started"], r["output"])
        sel = d.get("sel")
        selection = None
        if sel:
            selection = Selection(sel["id"], sel["kind"], tuple(sel["files"] or ()), sel.get("done", 0),
                                  sel.get("created", 0))
        return cls(tablet_id, d["table"], decode_row(d.get("prev")), decode_row(d.get("end")),
                   {f: file_meta(m) for f, m in (d.get("files") or {}).items()}, running,
                   selection, d.get("hold"), d.get("op"), d.get("v", 0))

    def running_files(self) -> set[str]:
        return {f for r in self.running.values() for f in r.files}

    def contains_row(self, row: bytes) -> bool:
        return (self.prev is None or row > self.prev) and (self.end is None or row <= self.end)


def decode_tablets(docs: Iterable[tuple[str, bytes]]) -> list[Tablet]:
    """Tablets from their stored documents (:meth:`MetadataStore.tablet_docs`)."""
    decode, loads = Tablet.from_json, orjson.loads
    with gc_paused():
        return [decode(t, loads(raw)) for t, raw in docs]


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

    def to_json(self, mutation_id: str | None = None) -> str:
        return json.dumps({
            "id": mutation_id, "now": now_ms(), "table": self.table, "table_conds": self.table_conds,
            "table_ops": self.table_ops, "table_reads": self.table_reads,
            "tablets": [{"id": t.tablet_id, "conds": t.conds, "ops": t.ops} for t in self.tablets],
        })


@dataclass(frozen=True)
class TableInfo:
    id: str
    name: str
    state: str
    props: dict[str, str]


class MetadataStore:
    """Typed access to Kompaktor's metadata in Redis."""

    def __init__(self, client: redis.Redis, url: str = "") -> None:
        self.r = client
        self.url = url
        self._mutate = client.register_script(_LUA)

    @classmethod
    def from_url(cls, url: str | None = None) -> MetadataStore:
        import os

        url = url or os.environ.get("KOMPAKTOR_REDIS_URL") or DEFAULT_REDIS_URL
        return cls(connect(url), url)

    # -- plumbing -------------------------------------------------------------------------
    def call(self, fn, *args, **kwargs):
        """Run a Redis call; connection failures (after the client's bounded retries) become
        :class:`StoreUnavailable` with the URL in the message."""
        try:
            return fn(*args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise StoreUnavailable(f"Redis at {self.url or 'the given URL'} is unreachable: {exc}") from exc

    def ping(self) -> None:
        self.call(self.r.ping)

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
        res = json.loads(self.call(self._mutate, args=[m.to_json(uuid.uuid4().hex)]))
        if not res["ok"]:
            detail = res.get("detail") or ""
            if res.get("tablet"):
                detail = f"{detail} on tablet {res['tablet']}".strip()
            raise ConditionFailed(res["cond"], detail)
        return res

    def next_seq(self, name: str) -> int:
        return int(self.call(self.r.hincrby, C.SEQ, name, 1))

    # -- tables ---------------------------------------------------------------------------
    def create_table(self, name: str, splits: Iterable[bytes] = (), props: dict[str, str] | None = None) -> str:
        if not name or any(c in name for c in " \t\n;/"):
            raise ValueError(f"invalid table name {name!r}: use letters, digits, '-', '_' or '.'")
        rows = sorted(set(splits))
        if any(not r for r in rows):
            raise ValueError("split rows must not be empty")
        if self.call(self.r.hexists, C.TABLES, name):
            raise TableExistsError(f"table {name!r} already exists")
        tid = format(self.next_seq("table"), "x")
        m = Mutation(table=tid, table_conds=[["absent", name]],
                     table_ops=[["create", name, json.dumps(props or {})]])
        prev: bytes | None = None
        for end in [*rows, None]:
            doc = {"table": tid, "prev": encode_row(prev), "end": encode_row(end), "files": {},
                   "running": {}}
            m.tablet(C.tablet_id(tid, end)).require("absent").do("create", doc, C.end_token(end))
            prev = end
        try:
            self.mutate(m)
        except ConditionFailed as exc:
            raise TableExistsError(f"table {name!r} already exists") from exc
        return tid

    def table_id(self, name: str) -> str:
        tid = self.call(self.r.hget, C.TABLES, name)
        if tid is None:
            raise UnknownTableError(f"unknown table {name!r}")
        return tid.decode()

    def table_info(self, tid: str) -> TableInfo:
        h = self.call(self.r.hgetall, C.table_key(tid))
        if not h:
            raise UnknownTableError(f"unknown table id {tid!r}")
        return TableInfo(tid, h[b"name"].decode(), h[b"state"].decode(), json.loads(h[b"props"]))

    def table(self, name: str) -> TableInfo:
        return self.table_info(self.table_id(name))

    def tables(self) -> list[TableInfo]:
        out = []
        for _name, tid in sorted(self.call(self.r.hgetall, C.TABLES).items()):
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
        m = Mutation(table=tid, table_ops=[["set_state", DELETED], ["unname", name]]).require_table(
            ONLINE, OFFLINE)
        files: set[str] = set()
        for t in tablets:
            files.update(t.files)
            m.tablet(t.id).require("version", t.version).do("delete", C.end_token(t.end))
        self.mutate(m)
        return sorted(files)

    # -- tablets --------------------------------------------------------------------------
    def tablet_ids(self, tid: str) -> list[str]:
        return [f"{tid};{e.decode()}" for e in self.call(self.r.zrange, C.tablets_key(tid), 0, -1)]

    def tablet(self, tablet_id: str) -> Tablet | None:
        raw = self.call(self.r.get, C.tablet_key(tablet_id))
        return None if raw is None else Tablet.from_json(tablet_id, orjson.loads(raw))

    def get_tablets(self, tablet_ids: list[str], chunk: int = 1000) -> list[Tablet]:
        return decode_tablets(self.tablet_docs(tablet_ids, chunk))

    def tablet_batches(self, tablet_ids: list[str], size: int = 1000) -> Iterator[list[Tablet]]:
        """These tablets in batches of ``size`` (missing ones left out). The documents of batch k+1
        are fetched before batch k is handed out: Redis work that the caller starts with batch k
        (a queue add) then runs while batch k+1 is decoded instead of delaying its fetch."""
        parts = [tablet_ids[i:i + size] for i in range(0, len(tablet_ids), size)]
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
            part = tablet_ids[i:i + chunk]
            raws = self.call(self.r.mget, [C.tablet_key(t) for t in part])
            out.extend((t, raw) for t, raw in zip(part, raws, strict=True) if raw)
        return out

    def tablets(self, tid: str) -> list[Tablet]:
        return self.get_tablets(self.tablet_ids(tid))

    def tablets_in_range(self, tid: str, start: bytes | None, end: bytes | None) -> list[Tablet]:
        """Tablets overlapping the inclusive row range [start, end] (None = unbounded)."""
        return [t for t in self.tablets(tid)
                if (start is None or t.end is None or t.end >= start)
                and (end is None or t.prev is None or t.prev < end)]

    def all_tablet_ids(self) -> list[str]:
        ids: list[str] = []
        for t in self.tables():
            ids.extend(self.tablet_ids(t.id))
        return ids

    def iter_all_tablets(self) -> Iterator[Tablet]:
        yield from self.get_tablets(self.all_tablet_ids())

    def add_files(self, table_name: str, files: dict[str, FileMeta], *,
                  allow_offline: bool = True) -> list[str]:
        """Register files with every tablet their row span overlaps, in one mutation (Accumulo's
        bulk import v2). Returns the tablet ids that received files."""
        tid = self.table_id(table_name)
        tablets = self.tablets(tid)
        m = Mutation(table=tid).require_table(ONLINE, *([OFFLINE] if allow_offline else []))
        touched = []
        for t in tablets:
            mine = {}
            for path, fm in files.items():
                if fm.entries == 0:
                    continue
                lo, hi = fm.first_row, fm.last_row
                if (t.prev is None or hi is None or hi > t.prev) and (t.end is None or lo is None or lo <= t.end):
                    mine[path] = fm.to_json()
            if mine:
                m.tablet(t.id).require("exists").require("no_op").do("add_files", mine)
                touched.append(t.id)
        if touched:
            self.mutate(m)
        return touched

    # -- dirty tablets (for the coordinator) ----------------------------------------------
    def pop_dirty(self, count: int = 10000) -> list[str]:
        raw = self.call(self.r.spop, C.DIRTY, count) or []
        return sorted(r.decode() for r in raw)

    def mark_dirty(self, tablet_ids: Iterable[str]) -> None:
        ids = list(tablet_ids)
        if ids:
            self.call(self.r.sadd, C.DIRTY, *ids)

    # -- counters -------------------------------------------------------------------------
    def incr(self, name: str, by: int = 1) -> int:
        return int(self.call(self.r.hincrby, C.COUNTERS, name, by))

    def counters(self) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in self.call(self.r.hgetall, C.COUNTERS).items()}

    # -- services, groups, compactors (written by the operator or `kompaktor up`) ------------
    def put_service(self, cfg) -> None:
        """Store a compaction service; every tablet is re-planned against the new settings."""
        self.call(self.r.hset, C.SERVICES, cfg.name, cfg.to_json())
        self.mark_dirty(self.all_tablet_ids())

    def delete_service(self, name: str) -> None:
        self.call(self.r.hdel, C.SERVICES, name)
        self.mark_dirty(self.all_tablet_ids())

    def services(self) -> dict:
        from kompaktor.services import DEFAULT, ServiceConfig

        out = {DEFAULT.name: DEFAULT}
        for name, raw in self.call(self.r.hgetall, C.SERVICES).items():
            out[name.decode()] = ServiceConfig.from_json(raw)
        return out

    def put_group(self, cfg) -> None:
        self.call(self.r.hset, C.GROUPS, cfg.name, cfg.to_json())

    def delete_group(self, name: str) -> None:
        self.call(self.r.hdel, C.GROUPS, name)

    def groups(self) -> dict:
        from kompaktor.services import GroupConfig

        return {n.decode(): GroupConfig.from_json(raw) for n, raw in self.call(self.r.hgetall, C.GROUPS).items()}

    def register_compactor(self, group: str, compactor_id: str, state: str, ecid: str | None = None) -> None:
        doc = json.dumps({"state": state, "ecid": ecid, "last_seen": time.time()})
        self.call(self.r.hset, C.compactors_key(group), compactor_id, doc)

    def unregister_compactor(self, group: str, compactor_id: str) -> None:
        self.call(self.r.hdel, C.compactors_key(group), compactor_id)
        self.call(self.r.delete, C.drain_key(compactor_id))

    def compactors(self, group: str) -> list[CompactorInfo]:
        out = []
        for cid, raw in sorted(self.call(self.r.hgetall, C.compactors_key(group)).items()):
            d = json.loads(raw)
            out.append(CompactorInfo(cid.decode(), group, d["state"], d.get("ecid"), float(d["last_seen"])))
        return out

    def request_drain(self, compactor_id: str) -> None:
        self.call(self.r.set, C.drain_key(compactor_id), "1", ex=3600)

    def drain_requested(self, compactor_id: str) -> bool:
        return bool(self.call(self.r.exists, C.drain_key(compactor_id)))


@dataclass(frozen=True)
class CompactorInfo:
    id: str
    group: str
    state: str  # idle, busy or draining
    ecid: str | None
    last_seen: float
