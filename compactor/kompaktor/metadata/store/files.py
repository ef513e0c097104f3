"""Files in the metadata store: registering new files with the tablets their rows overlap (a
flush, a bulk import), the bulk imports in progress (``kz:imports``: files the garbage collector
must spare) and the collector's count of deleted files.

A compaction's files change by its own mutations (:mod:`kompaktor.metadata.compactions`); the
collector itself is :mod:`kompaktor.coordinator.gc`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from kompaktor import keyspace
from kompaktor.connection import text
from kompaktor.metadata.store.mutation import Mutation
from kompaktor.model.errors import ConditionFailed
from kompaktor.model.keys import span_overlaps
from kompaktor.model.tablet import OFFLINE, ONLINE, FileMeta, ts_token
from kompaktor.policy.deletes import DeleteHorizonError, oldest_put, refusal
from kompaktor.policy.tableprops import keeps_deletes

if TYPE_CHECKING:
    from kompaktor.metadata.store.base import StoreCore
    from kompaktor.metadata.store.tables import TableStore

#: reads of the tablets when a full compaction raised a delete horizon between read and write
_HORIZON_ATTEMPTS = 3


class FileStore:
    """New files of tablets, imports in progress, garbage-collection counts."""

    def __init__(self, core: StoreCore, tables: TableStore) -> None:
        self._core = core
        self._r = core.client
        self._tables = tables

    def add_files(
        self, table_name: str, files: dict[str, FileMeta], *, allow_offline: bool = True, write_id: str | None = None
    ) -> list[str]:
        """Register files with every tablet their row span overlaps, in one mutation (Accumulo's
        bulk import v2). Returns the tablet ids that received files. With a ``write_id`` the same
        mutation records it, and refuses (``ConditionFailed`` "write new", nothing registered) a
        write already imported: a retried Spark job or a replayed micro-batch imports once. Raises
        :class:`~kompaktor.policy.deletes.DeleteHorizonError` (nothing registered) when a file
        holds a put that a delete marker dropped by a full compaction of a tablet may have hidden,
        unless the table keeps Accumulo's semantics (:mod:`kompaktor.policy.deletes`)."""
        for attempt in range(_HORIZON_ATTEMPTS):
            info = self._tables.table(table_name)
            guard = keeps_deletes(info.props)
            m = Mutation(table=info.id).require_table(ONLINE, *([OFFLINE] if allow_offline else []))
            if write_id is not None:
                m.table_conds.append(["write_new", write_id])
                m.table_ops.append(["write_done", write_id])
            touched = []
            for t in self._tables.tablets(info.id):
                mine = {
                    p: fm
                    for p, fm in files.items()
                    if fm.entries > 0 and span_overlaps(fm.first_row, fm.last_row, t.prev, t.end)
                }
                if not mine:
                    continue
                tc = m.tablet(t.id).require("exists").require("no_op")
                if guard:
                    if why := refusal(info.name, t, mine):
                        raise DeleteHorizonError(why)
                    tc.require("above_horizon", ts_token(oldest_put(mine.values())))
                tc.do("add_files", {p: fm.to_json() for p, fm in mine.items()})
                touched.append(t.id)
            if not touched and write_id is None:
                return touched
            try:
                self._core.mutate(m)
                return touched
            except ConditionFailed as exc:
                # a full compaction raised a horizon since the read: read again, then refuse by name
                if exc.condition != "delete horizon" or attempt + 1 == _HORIZON_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    def write_imported(self, table_id: str, write_id: str) -> bool:
        """Whether the write ``write_id`` was imported into the table (:meth:`add_files`)."""
        return bool(self._core.call(self._r.hexists, keyspace.writes_key(table_id), write_id))

    # -- backups in progress (kompaktor.metadata.backup) ------------------------------------------
    def begin_backup(self, backup_id: str, ttl_s: float) -> None:
        """Announce (or refresh) a backup being taken: the collector deletes nothing until it
        ends or ``ttl_s`` passes."""
        self._core.call(self._r.hset, keyspace.BACKUPS_RUNNING, backup_id, str(time.time() + ttl_s))

    def end_backup(self, backup_id: str) -> None:
        self._core.call(self._r.hdel, keyspace.BACKUPS_RUNNING, backup_id)

    def backup_running(self) -> bool:
        """Whether a backup is being taken now (one that died stops counting at its expiry)."""
        now = time.time()
        return any(float(v) > now for v in self._core.call(self._r.hvals, keyspace.BACKUPS_RUNNING))

    # -- garbage collection, imports in progress ------------------------------------------------------
    def record_gc(self, n: int) -> None:
        """Record that the collector deletes ``n`` files (fenced: a replaced coordinator is
        refused here, before it deletes anything)."""
        self._core.write(("HINCRBY", keyspace.COUNTERS, "gc_deleted", n))

    def register_import(self, import_id: str, table_id: str, files: Iterable[str], ttl_s: float) -> None:
        """Announce (or refresh) a bulk import in progress: its temporary files (tagged
        ``import_id``) and ``files`` are not garbage until ``ttl_s`` seconds from now."""
        doc = {"table": table_id, "files": sorted(files), "expires": time.time() + ttl_s}
        self._core.call(self._r.hset, keyspace.IMPORTS, import_id, json.dumps(doc))

    def forget_import(self, import_id: str) -> None:
        """Drop the record of an import that failed and removed its files."""
        self._core.call(self._r.hdel, keyspace.IMPORTS, import_id)

    def import_expiry(self, import_id: str) -> float | None:
        """When the record of import ``import_id`` ends (seconds since the epoch, on the clock of
        whoever wrote it); None without a record."""
        raw = self._core.call(self._r.hget, keyspace.IMPORTS, import_id)
        return None if raw is None else float(json.loads(raw)["expires"])

    def import_records(self, prefix: str) -> dict[str, list[str]]:
        """The files of each import in progress whose id starts with ``prefix`` (a Spark write's
        tasks, :mod:`kompaktor.spark.staged`)."""
        out = {}
        for iid, raw in self._core.call(self._r.hgetall, keyspace.IMPORTS).items():
            if text(iid).startswith(prefix):
                out[text(iid)] = list(json.loads(raw)["files"])
        return out

    def imports_since(self, since: float) -> tuple[set[str], set[str]]:
        """The ids and files of the bulk imports in progress at ``since`` or later."""
        ids: set[str] = set()
        files: set[str] = set()
        for iid, raw in self._core.call(self._r.hgetall, keyspace.IMPORTS).items():
            doc = json.loads(raw)
            if float(doc["expires"]) >= since:
                ids.add(text(iid))
                files.update(doc["files"])
        return ids, files

    def forget_imports_before(self, before: float) -> None:
        """Drop the records of imports that ended (or died) before ``before``."""
        old = [
            iid
            for iid, raw in self._core.call(self._r.hgetall, keyspace.IMPORTS).items()
            if float(json.loads(raw)["expires"]) < before
        ]
        if old:
            self._core.write(("HDEL", keyspace.IMPORTS, *[text(i) for i in old]))
