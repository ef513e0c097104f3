"""A big planning pass on more than one core.

Planning a tablet is CPU work in Python (decode its document, run the planner): one thread plans
about 37,000 tablets of 10 files a second, so a full pass over a million tablets would take most
of half a minute on one core while Redis itself needs a fraction of that. A pass over at least
:data:`PARALLEL_MIN_TABLETS` tablets therefore hands a share of them to worker processes
(``spawn``: nothing of the coordinator's threads or connections is inherited), which read and plan
their share and return only the plans (encoded as queue calls); the coordinator plans its own
share meanwhile, then queues everything itself. The workers only read: every write (queue adds,
removals, selections) stays with the coordinator, fenced by its lease. A worker that fails costs
nothing but time: its share is planned by the coordinator.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, cast

import orjson

from kompaktor.model.job import Job
from kompaktor.model.tablet import ONLINE, TableInfo, Tablet, gc_paused
from kompaktor.policy.planning import TabletPlan, TabletPlanner
from kompaktor.policy.services import ServiceConfig
from kompaktor.queues.jobqueue import encode_adds

log = logging.getLogger("kompaktor.coordinator")

#: a pass over fewer tablets is planned in the coordinator's own thread (a worker's start and the
#: hand-over cost more than they save)
PARALLEL_MIN_TABLETS = 50_000


def default_workers() -> int:
    """Worker processes for big passes: one per core beyond the first (Redis and the coordinator's
    own share need one), at most 3; 0 on one core."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(0, min(3, cores - 1))


@dataclass(frozen=True)
class PlanContext:
    """What planning a tablet depends on besides the tablet (read once per pass)."""

    tables: Mapping[str, TableInfo]
    services: Mapping[str, ServiceConfig]
    now: int
    active: Collection[str]
    skip: Collection[str]


@dataclass
class ShareResult:
    """A share's outcome: the jobs to queue, tablets whose table is gone or offline (their queued
    jobs are removed), tablets for which a selector chose files (the coordinator re-plans them:
    recording a selection is a write), and how many tablets were planned."""

    #: the jobs as queue-add arguments (:func:`~kompaktor.queues.jobqueue.encode_adds`): plain
    #: values are cheaper to hand over than job objects, and the worker, not the coordinator,
    #: encodes them
    adds: list[list[Any]] = field(default_factory=list)
    remove: list[str] = field(default_factory=list)
    reselect: list[str] = field(default_factory=list)
    planned: int = 0


#: a tablet as a pass reads it: its id and stored document (``store.tables.tablet_doc_batches``)
TabletDoc = tuple[str, bytes]


def plan_share(
    batches: Iterable[Sequence[TabletDoc | Tablet]],
    ctx: PlanContext,
    send: Callable[[list[tuple[str, list[Job]]]], None],
    select: Callable[[Tablet, TabletPlan], bool],
    before: Callable[[], None] | None = None,
) -> tuple[int, list[str]]:
    """Plan batches of tablets (pure but for reading them), each a :data:`TabletDoc` or a
    :class:`Tablet`: each batch's jobs go to ``send``, a selector's choice to ``select`` (which
    says whether the tablet's jobs are still to be sent: a worker leaves such a tablet to the
    coordinator); ``before()`` runs before each batch. Returns how many tablets were planned and
    the tablets whose table is gone or offline (their queued jobs are removed).

    A plain tablet is planned from its document as decoded JSON (:meth:`TabletPlanner.doc`); only
    the others are decoded to a :class:`Tablet`."""
    planned = 0
    remove: list[str] = []
    planner = TabletPlanner(ctx.services, ctx.now, ctx.active, ctx.skip)
    tables, loads, from_json = ctx.tables, orjson.loads, Tablet.from_json
    with gc_paused():  # millions of small acyclic objects (see gc_paused)
        for items in batches:
            if before is not None:
                before()
            plans: list[tuple[str, list[Job]]] = []
            for item in items:
                if isinstance(item, Tablet):
                    t: Tablet | None = item
                    tid, table_id, d = item.id, item.table, None
                else:
                    t = None
                    tid, raw = item
                    d = loads(raw)
                    table_id = d["table"]
                info = tables.get(table_id)
                if info is None or info.state != ONLINE:
                    remove.append(tid)
                    continue
                tp = planner.doc(tid, d, info) if d is not None else None
                if tp is None:
                    if t is None:
                        t = from_json(tid, cast("dict[str, Any]", d))  # a raw document's tablet
                    tp = planner.tablet(t, info)
                planned += 1
                if tp.select:
                    # only a decoded tablet's plan selects: doc() leaves every tablet of a table
                    # with a selector to tablet()
                    assert t is not None
                    if not select(t, tp):
                        continue
                if tp.jobs:
                    plans.append((tid, tp.jobs))
            send(plans)
    return planned, remove


#: the worker process's own store and its URL (a worker serves every pass of its coordinator,
#: which has one URL; a new URL replaces and closes the old store)
_store: tuple[str, Any] | None = None


def _plan_in_worker(url: str, tablet_ids: Sequence[str], ctx: PlanContext, batch: int) -> ShareResult:
    from kompaktor.metadata.store import MetadataStore  # the worker's own connection

    global _store
    if _store is None or _store[0] != url:
        if _store is not None:
            _store[1].close()
        _store = (url, MetadataStore.from_url(url))
    store = _store[1]
    out = ShareResult()

    def leave(t: Tablet, _tp: TabletPlan) -> bool:  # a selection is a write: the coordinator's
        out.reselect.append(t.id)
        return False

    out.planned, out.remove = plan_share(
        store.tables.tablet_doc_batches(list(tablet_ids), batch),
        ctx,
        send=lambda plans: out.adds.extend(encode_adds(plans)),
        select=leave,
    )
    return out


class PlanPool:
    """Worker processes for big passes, started at the first one and kept for the next."""

    def __init__(self, url: str, workers: int) -> None:
        self.url = url
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None

    def usable(self, tablets: int) -> bool:
        return self.workers > 0 and bool(self.url) and tablets >= PARALLEL_MIN_TABLETS

    def run(self, tablet_ids: Sequence[str], ctx: PlanContext, batch: int) -> ShareRun:
        """Start planning these tablets in the workers, a chunk at a time (:class:`ShareRun`)."""
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))
        return ShareRun(self, tablet_ids, ctx, batch)

    def _submit(self, chunk: Sequence[str], ctx: PlanContext, batch: int) -> Future[ShareResult]:
        if self._pool is None:  # dropped after a failure: the chunk fails over to the coordinator
            failed: Future[ShareResult] = Future()
            failed.set_exception(RuntimeError("the planning workers stopped"))
            return failed
        return self._pool.submit(_plan_in_worker, self.url, chunk, ctx, batch)

    def close(self) -> None:
        """Stop the workers (they hold a Redis connection each)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def broken(self) -> None:
        """A worker died: the next pass starts new ones."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


#: tablets per chunk handed to a worker: what the coordinator holds of a worker's plans at once is
#: bounded by the chunks in flight (two per worker), not by the share
CHUNK_TABLETS = 5_000


class ShareRun:
    """The workers' share of one pass, as chunks: at most two per worker in flight, results taken in
    order by :meth:`ready` (so a chunk's plans are queued while later chunks are planned)."""

    def __init__(self, pool: PlanPool, tablet_ids: Sequence[str], ctx: PlanContext, batch: int) -> None:
        self._pool, self._ctx, self._batch = pool, ctx, batch
        self._todo = [tablet_ids[i : i + CHUNK_TABLETS] for i in range(0, len(tablet_ids), CHUNK_TABLETS)]
        self._todo.reverse()
        self._inflight: list[tuple[Sequence[str], Future[ShareResult]]] = []
        self._fill()

    def _fill(self) -> None:
        while self._todo and len(self._inflight) < 2 * max(1, self._pool.workers):
            chunk = self._todo.pop()
            self._inflight.append((chunk, self._pool._submit(chunk, self._ctx, self._batch)))

    @property
    def finished(self) -> bool:
        return not self._inflight and not self._todo

    def ready(self, timeout: float = 0.0) -> list[tuple[Sequence[str], ShareResult | BaseException]]:
        """The chunks finished in order (waiting up to ``timeout`` for the next): each with its
        result, or the exception that failed it (the caller then plans that chunk itself)."""
        out: list[tuple[Sequence[str], ShareResult | BaseException]] = []
        if self._inflight and timeout > 0:
            wait([self._inflight[0][1]], timeout=timeout)
        while self._inflight and self._inflight[0][1].done():
            chunk, fut = self._inflight.pop(0)
            exc = fut.exception()
            out.append((chunk, fut.result() if exc is None else exc))
            self._fill()
        return out

    def steal(self) -> Sequence[str] | None:
        """A chunk no worker has started, for the coordinator to plan itself once its own share is
        done (None when every chunk is taken)."""
        return self._todo.pop() if self._todo else None

    def cancel(self) -> None:
        for _, fut in self._inflight:
            fut.cancel()
        self._inflight.clear()
        self._todo.clear()
