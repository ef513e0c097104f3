"""The fleet in the metadata store: compaction services and compactor groups (written by the
operator or ``kompaktor up``; ``kz:services``, ``kz:groups``), the registry of compactors
(``kz:compactors:<group>``) and drain requests (``kz:drain:<id>``).

What a service or group means is :mod:`kompaktor.policy.services`.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

from kompaktor import keyspace
from kompaktor.connection import text
from kompaktor.model.tablet import CompactorInfo

if TYPE_CHECKING:
    from kompaktor.metadata.store.base import StoreCore
    from kompaktor.metadata.store.bookkeeping import BookkeepingStore
    from kompaktor.metadata.store.tables import TableStore
    from kompaktor.policy.services import GroupConfig, ServiceConfig


class FleetStore:
    """Services, groups, compactors, drains."""

    def __init__(self, core: StoreCore, tables: TableStore, bookkeeping: BookkeepingStore) -> None:
        self._core = core
        self._r = core.client
        self._tables = tables
        self._bookkeeping = bookkeeping

    # -- services, groups, compactors (written by the operator or `kompaktor up`) ------------
    def put_service(self, cfg: ServiceConfig) -> None:
        """Store a compaction service; every tablet is re-planned against the new settings."""
        self._core.call(self._r.hset, keyspace.SERVICES, cfg.name, cfg.to_json())
        self._bookkeeping.mark_dirty(self._tables.all_tablet_ids())

    def delete_service(self, name: str) -> None:
        self._core.call(self._r.hdel, keyspace.SERVICES, name)
        self._bookkeeping.mark_dirty(self._tables.all_tablet_ids())

    def services(self) -> dict[str, ServiceConfig]:
        from kompaktor.policy.services import DEFAULT, ServiceConfig

        out: dict[str, ServiceConfig] = {DEFAULT.name: DEFAULT}
        for name, raw in self._core.call(self._r.hgetall, keyspace.SERVICES).items():
            out[text(name)] = ServiceConfig.from_json(raw)
        return out

    def put_group(self, cfg: GroupConfig) -> None:
        self._core.call(self._r.hset, keyspace.GROUPS, cfg.name, cfg.to_json())

    def delete_group(self, name: str) -> None:
        self._core.call(self._r.hdel, keyspace.GROUPS, name)

    def groups(self) -> dict[str, GroupConfig]:
        from kompaktor.policy.services import GroupConfig

        return {
            text(n): GroupConfig.from_json(raw) for n, raw in self._core.call(self._r.hgetall, keyspace.GROUPS).items()
        }

    def register_compactor(self, group: str, compactor_id: str, state: str, ecid: str | None = None) -> None:
        doc = json.dumps({"state": state, "ecid": ecid, "last_seen": time.time()})
        self._core.call(self._r.hset, keyspace.compactors_key(group), compactor_id, doc)

    def unregister_compactor(self, group: str, compactor_id: str, keep_drain_mark: bool = False) -> None:
        """Forget a compactor that ends; its drain request too, unless ``keep_drain_mark`` (a
        drained compactor pod: a restarted container must find it, until it expires)."""
        self._core.call(self._r.hdel, keyspace.compactors_key(group), compactor_id)
        if not keep_drain_mark:
            self._core.call(self._r.delete, keyspace.drain_key(compactor_id))

    def compactors(self, group: str) -> list[CompactorInfo]:
        out = []
        for cid, raw in sorted(self._core.call(self._r.hgetall, keyspace.compactors_key(group)).items()):
            d = json.loads(raw)
            out.append(CompactorInfo(text(cid), group, d["state"], d.get("ecid"), float(d["last_seen"])))
        return out

    def request_drain(self, compactor_id: str) -> None:
        """Ask compactor ``compactor_id`` to drain: it takes no new job (an hour; a drained
        compactor pod renews it while it lives)."""
        self._core.call(self._r.set, keyspace.drain_key(compactor_id), "1", ex=3600)

    def drain_requested(self, compactor_id: str) -> bool:
        return bool(self._core.call(self._r.exists, keyspace.drain_key(compactor_id)))
