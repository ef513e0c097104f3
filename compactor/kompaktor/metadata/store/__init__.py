"""The metadata store on Redis: tables, tablets, their files, running compactions, selections.

Every change to a tablet is a :class:`Mutation` — conditions plus operations — evaluated
atomically inside Redis by one Lua script (``lua/mutate.lua``); a rejected mutation raises
:class:`ConditionFailed` naming the condition. This package is the only code that writes metadata.

:class:`MetadataStore` is the one object callers hold; it is made of parts, one module each, all
on one connection (:mod:`.base`):

=====================  ==========================================================================
module                 owns
=====================  ==========================================================================
:mod:`.base`           the connection, Redis error mapping, durability, scripts, fencing, plain
                       writes and :meth:`~StoreBase.apply` (the conditional mutation)
:mod:`.mutation`       :class:`Mutation` and :class:`TabletChange`: what a mutation says (no I/O)
:mod:`.tables`         tables and tablets: create, configure, delete; read tablets
:mod:`.files`          files registered with tablets, bulk imports in progress, GC counts
:mod:`.running`        running compactions: ECID index, heartbeats, dead log, failed jobs
:mod:`.ucomps`         user compactions' records
:mod:`.bookkeeping`    the dirty set, counters, the automatic split check's clock
:mod:`.lease`          the coordinator's lease and fencing token
:mod:`.fleet`          services, groups, the compactor registry, drain requests
=====================  ==========================================================================

The protocols built on it live beside it in :mod:`kompaktor.metadata`: ``compactions`` (reserve,
commit, release), ``user_compactions``, ``tablet_ops`` (split, merge), ``failures``, ``progress``,
``status``.
"""

from __future__ import annotations

from kompaktor.metadata.store.base import DEFAULT_REDIS_URL, SCAN_CHUNK, StoreBase
from kompaktor.metadata.store.bookkeeping import BookkeepingStore
from kompaktor.metadata.store.files import FileStore
from kompaktor.metadata.store.fleet import FleetStore
from kompaktor.metadata.store.lease import LeaseStore
from kompaktor.metadata.store.mutation import Mutation, TabletChange
from kompaktor.metadata.store.running import DEADLOG_LENGTH, RunningStore
from kompaktor.metadata.store.tables import TableStore
from kompaktor.metadata.store.ucomps import UserCompactionStore

__all__ = [
    "DEADLOG_LENGTH",
    "DEFAULT_REDIS_URL",
    "SCAN_CHUNK",
    "MetadataStore",
    "Mutation",
    "StoreBase",
    "TabletChange",
]


class MetadataStore(
    FileStore,
    FleetStore,
    RunningStore,
    UserCompactionStore,
    LeaseStore,
    BookkeepingStore,
    TableStore,
    StoreBase,
):
    """Typed access to Kompaktor's metadata in Redis: every part's operations on one connection."""
