"""The metadata store on Redis: tables, tablets, their files, running compactions, selections.

Every change to a tablet is a :class:`Mutation` — conditions plus operations — evaluated
atomically inside Redis by one Lua script (``lua/mutate.lua``); a rejected mutation raises
:class:`ConditionFailed` naming the condition. This package is the only code that writes metadata.

:class:`MetadataStore` is the one object callers hold. It is a composition of named parts, each a
class of its own module with a narrow interface, reached as an attribute of the store
(``store.tables.tablet(tid)``, ``store.fleet.put_group(cfg)``). No part inherits from another:
all hold the store's one :class:`~.base.StoreCore` (the connection and the write paths), and a
part that needs another receives it when it is made (``files`` and ``fleet`` get ``tables``,
``fleet`` gets ``bookkeeping``).

===============  ==============================================  ======================================
attribute        class (module)                                  owns
===============  ==============================================  ======================================
``tables``       :class:`.tables.TableStore`                     tables and tablets: create, configure,
                                                                 delete; read tablets
``files``        :class:`.files.FileStore`                       files registered with tablets, bulk
                 (gets ``tables``)                               imports and backups in progress, GC
``running``      :class:`.running.RunningStore`                  running compactions: ECID index,
                                                                 heartbeats, dead log, failed jobs
``ucomps``       :class:`.ucomps.UserCompactionStore`            user compactions' records
``bookkeeping``  :class:`.bookkeeping.BookkeepingStore`          the dirty set, counters, commits, the
                                                                 split check's clock
``lease``        :class:`.lease.LeaseStore`                      the coordinator's lease, when a leader
                                                                 was last seen
``fleet``        :class:`.fleet.FleetStore`                      services, groups, the compactor
                 (gets ``tables``, ``bookkeeping``)              registry, drain requests
``queues``       :class:`~kompaktor.queues.jobqueue.JobQueues`   the job queues
===============  ==============================================  ======================================

The core (:class:`.base.StoreCore`, :mod:`.base`) owns the connection, the mapping of Redis errors,
durability, the function library (its own ``SCRIPTS`` and every part's: :data:`LIBRARY`), the
fencing token, plain writes (fenced inside Redis) and the conditional mutation.

What a mutation says is :mod:`.mutation` (:class:`Mutation`, :class:`TabletChange`; no I/O). The
store itself keeps what is about all of it: making one (:meth:`MetadataStore.from_url`),
:meth:`~MetadataStore.close`, :meth:`~MetadataStore.ping`, :meth:`~MetadataStore.load_scripts`,
:meth:`~MetadataStore.fenced` (a store whose every part writes with a fencing token),
:meth:`~MetadataStore.apply` / :meth:`~MetadataStore.mutate`, :meth:`~MetadataStore.durable`,
:meth:`~MetadataStore.call`, :meth:`~MetadataStore.reserve_next`, :meth:`~MetadataStore.next_seq`,
:attr:`~MetadataStore.url` and :attr:`~MetadataStore.durability`.

The protocols built on it live beside it in :mod:`kompaktor.metadata`: ``compactions`` (reserve,
commit, release), ``user_compactions``, ``tablet_ops`` (split, merge), ``failures``, ``progress``,
``status``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import ParamSpec, TypeVar

import redis

from kompaktor.connection import Durability, connect
from kompaktor.metadata.store.base import (
    DEFAULT_REDIS_URL,
    RESERVE_MAX_STALE,
    SCAN_CHUNK,
    MutationOutcome,
    ReserveOutcome,
    StoreCore,
    library,
)
from kompaktor.metadata.store.bookkeeping import BookkeepingStore
from kompaktor.metadata.store.files import FileStore
from kompaktor.metadata.store.fleet import FleetStore
from kompaktor.metadata.store.lease import LeaseStore
from kompaktor.metadata.store.mutation import Mutation, TabletChange
from kompaktor.metadata.store.running import DEADLOG_LENGTH, RunningStore
from kompaktor.metadata.store.tables import TableStore
from kompaktor.metadata.store.ucomps import UserCompactionStore
from kompaktor.queues.jobqueue import JobQueues

__all__ = [
    "DEADLOG_LENGTH",
    "DEFAULT_REDIS_URL",
    "LIBRARY",
    "PARTS",
    "SCAN_CHUNK",
    "MetadataStore",
    "Mutation",
    "MutationOutcome",
    "ReserveOutcome",
    "StoreCore",
    "TabletChange",
]

P = ParamSpec("P")
R = TypeVar("R")

#: the store's parts: attribute -> class (``queues``, from :mod:`kompaktor.queues`, besides)
PARTS: dict[str, type] = {
    "tables": TableStore,
    "files": FileStore,
    "running": RunningStore,
    "ucomps": UserCompactionStore,
    "bookkeeping": BookkeepingStore,
    "lease": LeaseStore,
    "fleet": FleetStore,
}
#: the metadata's Redis function library: the core's scripts and every part's
LIBRARY = library(*PARTS.values())


class MetadataStore:
    """Typed access to Kompaktor's metadata in Redis: its parts, on one connection."""

    def __init__(
        self,
        client: redis.Redis,
        url: str = "",
        *,
        fence: Callable[[], int | None] | None = None,
        durability: Durability | None = None,
    ) -> None:
        self._assemble(StoreCore(client, url, LIBRARY, fence=fence, durability=durability))

    def _assemble(self, core: StoreCore) -> None:
        self._core = core
        #: the connection, for the protocols of :mod:`kompaktor.metadata` (nothing outside it)
        self._r = core.client
        self.tables = TableStore(core)
        self.files = FileStore(core, self.tables)
        self.running = RunningStore(core)
        self.ucomps = UserCompactionStore(core)
        self.bookkeeping = BookkeepingStore(core)
        self.lease = LeaseStore(core)
        self.fleet = FleetStore(core, self.tables, self.bookkeeping)
        self.queues = JobQueues(core.client, fence=core.fence)

    @classmethod
    def from_url(cls, url: str | None = None) -> MetadataStore:
        url = url or os.environ.get("KOMPAKTOR_REDIS_URL") or DEFAULT_REDIS_URL
        return cls(connect(url), url)

    @property
    def url(self) -> str:
        return self._core.url

    @property
    def durability(self) -> Durability:
        """How an acknowledged write is made durable (docs/architecture.md "Durability: what an
        acknowledgment means", :mod:`kompaktor.connection`)."""
        return self._core.durability

    def fenced(self, token: Callable[[], int | None]) -> MetadataStore:
        """A store on the same connection whose every part's writes (mutations, queue scripts,
        sets, counters) carry the fencing token ``token()`` and are refused atomically, inside
        Redis, with :class:`~kompaktor.model.errors.Fenced` once a newer token exists. The
        coordinator's store. While ``token()`` is None (a coordinator that never led) the writes
        are not fenced."""
        view = object.__new__(MetadataStore)
        view._assemble(self._core.fenced(token))
        return view

    def close(self) -> None:
        self._core.close()

    def ping(self) -> None:
        """:meth:`StoreCore.ping`: a primary running Redis >= 7.0 answers, or one line says why not."""
        self._core.ping()

    def load_scripts(self) -> int:
        """:meth:`StoreCore.load_scripts`: the store's and the queues' libraries, where missing."""
        return self._core.load_scripts()

    def call(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """:meth:`StoreCore.call`: a Redis call, its failures raised as what they mean."""
        return self._core.call(fn, *args, **kwargs)

    def durable(self) -> None:
        """:meth:`StoreCore.durable`: every write so far is durable as :attr:`durability` asks."""
        self._core.durable()

    def mutate(self, m: Mutation) -> list[int]:
        """:meth:`StoreCore.mutate`: a conditional mutation, atomically; the tablets' new versions."""
        return self._core.mutate(m)

    def apply(self, m: Mutation) -> MutationOutcome:
        """:meth:`StoreCore.apply`: :meth:`mutate`, returning the script's whole outcome."""
        return self._core.apply(m)

    def reserve_next(
        self, group: str, ecid: str, now: int, templates: Mapping[str, str], max_stale: int = RESERVE_MAX_STALE
    ) -> ReserveOutcome:
        """:meth:`StoreCore.reserve_next`: poll ``group``'s queue and reserve its job in one call."""
        return self._core.reserve_next(group, ecid, now, templates, max_stale)

    def next_seq(self, name: str) -> int:
        """The next number of the sequence ``name`` (tables, files), from 1."""
        return self._core.next_seq(name)
