"""Tables and their tablets in the metadata store: create, name, configure, take offline, delete
a table; read its tablets (by id, in row order, by row range, in bounded chunks and batches).

Every change is one conditional mutation (:meth:`StoreCore.mutate
<kompaktor.metadata.store.base.StoreCore.mutate>`). Splitting and merging tablets is
:mod:`kompaktor.metadata.tablet_ops`; registering files with tablets is
:mod:`~kompaktor.metadata.store.files`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, cast

import orjson
import redis

from kompaktor import keyspace
from kompaktor.connection import SentCommand, pack_command, text
from kompaktor.metadata.store.mutation import Mutation
from kompaktor.model.errors import ConditionFailed, TableExistsError, UnknownTableError
from kompaktor.model.keys import encode_row, span_overlaps
from kompaktor.model.names import check_table_name
from kompaktor.model.tablet import (
    DELETED,
    OFFLINE,
    ONLINE,
    TableInfo,
    Tablet,
    decode_tablets,
    end_token,
    tablet_id,
)

if TYPE_CHECKING:
    from kompaktor.metadata.store.base import StoreCore


class TableStore:
    """Tables (``kz:tables``, ``kz:table:<tid>``) and tablets (``kz:table:<tid>:tablets``,
    ``kz:tablet:<id>``)."""

    def __init__(self, core: StoreCore) -> None:
        self._core = core
        self._r = core.client

    # -- tables ---------------------------------------------------------------------------
    def create_table(self, name: str, splits: Iterable[bytes] = (), props: dict[str, str] | None = None) -> str:
        check_table_name(name)
        rows = sorted(set(splits))
        if any(not r for r in rows):
            raise ValueError("split rows must not be empty")
        if self._core.call(self._r.hexists, keyspace.TABLES, name):
            raise TableExistsError(f"table {name!r} already exists")
        tid = format(self._core.next_seq("table"), "x")
        m = Mutation(table=tid, table_conds=[["absent", name]], table_ops=[["create", name, json.dumps(props or {})]])
        prev: bytes | None = None
        for end in [*rows, None]:
            doc: dict[str, Any] = {
                "table": tid,
                "prev": encode_row(prev),
                "end": encode_row(end),
                "files": {},
                "running": {},
            }
            m.tablet(tablet_id(tid, end)).require("absent").do("create", doc, end_token(end))
            prev = end
        try:
            self._core.mutate(m)
        except ConditionFailed as exc:
            raise TableExistsError(f"table {name!r} already exists") from exc
        return tid

    def table_id(self, name: str) -> str:
        tid = self._core.call(self._r.hget, keyspace.TABLES, name)
        if tid is None:
            raise UnknownTableError(f"unknown table {name!r}")
        return text(tid)

    def table_info(self, tid: str) -> TableInfo:
        h = self._core.call(self._r.hgetall, keyspace.table_key(tid))
        if not h:
            raise UnknownTableError(f"unknown table id {tid!r}")
        return TableInfo(tid, text(h[b"name"]), text(h[b"state"]), json.loads(h[b"props"]))

    def table(self, name: str) -> TableInfo:
        return self.table_info(self.table_id(name))

    def tables(self) -> list[TableInfo]:
        out = []
        for _name, tid in sorted(self._core.call(self._r.hgetall, keyspace.TABLES).items()):
            out.append(self.table_info(text(tid)))
        return out

    def set_props(self, name: str, props: dict[str, str | None]) -> None:
        tid = self.table_id(name)
        m = Mutation(table=tid).require_table(ONLINE, OFFLINE)
        m.table_ops = [["set_prop", k, v] for k, v in props.items()]
        self._core.mutate(m)

    def set_state(self, name: str, state: str) -> None:
        if state not in (ONLINE, OFFLINE):
            raise ValueError(f"state must be ONLINE or OFFLINE, got {state!r}")
        tid = self.table_id(name)
        self._core.mutate(Mutation(table=tid, table_ops=[["set_state", state]]).require_table(ONLINE, OFFLINE))

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
        self._core.mutate(m)
        return sorted(files)

    # -- tablets --------------------------------------------------------------------------
    def tablet_ids(self, tid: str, chunk: int | None = None) -> list[str]:
        """The table's tablet ids in row order, read ``chunk`` (:data:`SCAN_CHUNK`) at a time: one
        table may have a million tablets, and one ZRANGE over all would hold Redis that long."""
        chunk = chunk or self._core.scan_chunk
        out: list[str] = []
        start = 0
        while True:
            part = cast(
                "list[bytes]", self._core.call(self._r.zrange, keyspace.tablets_key(tid), start, start + chunk - 1)
            )
            out.extend(f"{tid};{text(e)}" for e in part)
            if len(part) < chunk:
                return out
            start += chunk

    def tablet(self, tablet_id: str) -> Tablet | None:
        raw = self._core.call(self._r.get, keyspace.tablet_key(tablet_id))
        return None if raw is None else Tablet.from_json(tablet_id, orjson.loads(raw))

    def get_tablets(self, tablet_ids: list[str], chunk: int = 1000) -> list[Tablet]:
        return decode_tablets(self.tablet_docs(tablet_ids, chunk))

    def tablet_batches(self, tablet_ids: list[str], size: int = 1000) -> Iterator[list[Tablet]]:
        """These tablets in batches of ``size`` (missing ones left out), decoded; read as
        :meth:`tablet_doc_batches` reads them."""
        for docs in self.tablet_doc_batches(tablet_ids, size):
            yield decode_tablets(docs)

    def tablet_doc_batches(self, tablet_ids: list[str], size: int = 1000) -> Iterator[list[tuple[str, bytes]]]:
        """The stored documents of these tablets (:meth:`tablet_docs`) in batches of ``size``, one
        MGET each. The MGET of batch k+1 is sent before batch k is handed out and its reply read
        when batch k+1 is asked for: Redis reads and the reply travels while the caller works on
        batch k (one MGET in flight, on a connection of its own)."""
        parts = [tablet_ids[i : i + size] for i in range(0, len(tablet_ids), size)]
        if not parts:
            return
        ahead = _Mget(self._core, parts[0])
        try:
            for k in range(len(parts)):
                docs = ahead.result()
                if k + 1 < len(parts):
                    ahead = _Mget(self._core, parts[k + 1])
                yield docs
        finally:
            ahead.abandon()

    def tablet_docs(self, tablet_ids: list[str], chunk: int = 1000) -> list[tuple[str, bytes]]:
        """The stored documents of these tablets, not decoded (:func:`decode_tablets`); tablets
        that do not exist are left out."""
        out: list[tuple[str, bytes]] = []
        for i in range(0, len(tablet_ids), chunk):
            part = tablet_ids[i : i + chunk]
            raws = cast("list[bytes | None]", self._core.call(self._r.mget, [keyspace.tablet_key(t) for t in part]))
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

    # -- what a reservation reads besides the tablet --------------------------------------------
    def tablet_and_props(self, tablet_id: str, table_id: str) -> tuple[Tablet | None, dict[str, str] | None]:
        """A tablet and its table's properties, in one round trip."""
        p = self._r.pipeline(transaction=False)
        p.get(keyspace.tablet_key(tablet_id))
        p.hget(keyspace.table_key(table_id), "props")
        raw_tablet, raw_props = self._core.call(p.execute)
        tablet = None if raw_tablet is None else Tablet.from_json(tablet_id, orjson.loads(raw_tablet))
        return tablet, (None if raw_props is None else json.loads(raw_props))


class _Mget:
    """One MGET of tablet documents sent without waiting for its reply (:meth:`result` reads it).
    A connection error while sending or reading makes :meth:`result` run it again as an ordinary
    call (with the client's retries and the store's error mapping)."""

    def __init__(self, core: StoreCore, ids: list[str]) -> None:
        self._core, self._ids = core, ids
        self._keys = [keyspace.tablet_key(t) for t in ids]
        self._sent: SentCommand | None = None
        pool = core.client.connection_pool
        try:
            conn = pool.get_connection()
        except (redis.ConnectionError, redis.TimeoutError):
            return  # Redis away: result() reads as an ordinary call (retries, the store's error mapping)
        self._sent = SentCommand.send(pool, conn, lambda: pack_command(conn, "MGET", *self._keys))

    def result(self) -> list[tuple[str, bytes]]:
        sent, self._sent = self._sent, None
        raws: list[bytes | None] | None = sent.read() if sent is not None else None
        if raws is None:  # read again: with the client's retries, errors mapped
            raws = cast("list[bytes | None]", self._core.call(self._core.client.mget, self._keys))
        return [(t, raw) for t, raw in zip(self._ids, raws, strict=True) if raw]

    def abandon(self) -> None:
        """Drop the reply if it was never read (the caller stopped early)."""
        sent, self._sent = self._sent, None
        if sent is not None:
            sent.abandon()
