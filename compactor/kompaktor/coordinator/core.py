"""The coordinator: plans changed tablets into the group queues, runs user compactions and
selectors, detects dead compactions, garbage-collects files, exports queue metrics.

Exactly one coordinator acts at a time: it holds a Redis lease (renewed every tick) and a fencing
token taken at each takeover; a second coordinator waits and takes over when the lease expires.
Queues are a cache: a coordinator that starts (or finds the queue keys gone) rebuilds them with
a full scan.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kompaktor.coordinator.dead import detect_dead
from kompaktor.coordinator.gc import collect_garbage
from kompaktor.coordinator.lease import Lease
from kompaktor.coordinator.metrics import QueueMetrics
from kompaktor.files.storage import Storage
from kompaktor.metadata import failures, tablet_ops, user_compactions
from kompaktor.metadata.store import MetadataStore
from kompaktor.model.errors import StoreUnavailable
from kompaktor.model.tablet import ONLINE, TableInfo, Tablet, gc_paused, now_ms
from kompaktor.policy.planning import plan_tablet

log = logging.getLogger("kompaktor.coordinator")

#: tablets planned, and their jobs queued (one script call), at a time
PLAN_BATCH = 1000


@dataclass
class CoordinatorSettings:
    tick_s: float = 0.5
    lease_ms: int = 10_000
    full_scan_s: float = 30.0
    dead_after_s: float = 30.0  # a compaction without a heartbeat for this long is dead
    gc_interval_s: float = 60.0
    gc_grace_s: float = 300.0  # unreferenced files younger than this are left alone
    max_attempts: int = failures.MAX_ATTEMPTS


@dataclass
class Coordinator:
    store: MetadataStore
    storage: Storage
    settings: CoordinatorSettings = field(default_factory=CoordinatorSettings)
    holder: str = field(default_factory=lambda: f"coord-{uuid.uuid4().hex[:8]}")

    def __post_init__(self) -> None:
        self.queues = self.store.queues
        self.metrics = QueueMetrics.create()
        self.lease = Lease(self.store, self.holder, self.settings.lease_ms)
        self._last_full = float("-inf")  # never: the first pass as leader is a full scan
        self._last_gc = time.monotonic()
        self._known_tables: set[str] | None = None  # table ids seen by the last pass
        self.stats = {"planned": 0, "queued": 0, "dead": 0, "gc_deleted": 0, "full_scans": 0}

    # -- leadership ------------------------------------------------------------------------------
    @property
    def fence(self) -> int | None:
        """The fencing token taken when this coordinator became leader, or None."""
        return self.lease.fence

    def try_lead(self) -> bool:
        """Take or keep the lease. Returns whether this coordinator leads now."""
        if self.lease.held:
            return self.lease.acquire_or_renew()
        if not self.lease.acquire_or_renew():
            return False
        self._last_full = float("-inf")  # a new leader rebuilds the queues (whatever the uptime)
        return True

    def resign(self) -> None:
        self.lease.release()

    # -- one pass ----------------------------------------------------------------------------------
    def tick(self) -> bool:
        """One coordinator pass. Returns False when another coordinator leads."""
        if not self.try_lead():
            return False
        self.detect_dead()
        user_compactions.advance(self.store)
        failures.redirty_due(self.store)
        try:  # before planning: it reads the dirty set that planning pops
            tablet_ops.auto_split(self.store, self.queues)
        except Exception:
            log.exception("automatic split failed; retried next tick")
        full_due = time.monotonic() - self._last_full >= self.settings.full_scan_s
        if full_due or not self.queues.has_generation():
            self.full_scan()
        else:
            self.plan_dirty()
        if time.monotonic() - self._last_gc >= self.settings.gc_interval_s:
            self.collect_garbage()
        self.metrics.export(self.store)
        return True

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.tick()
            except StoreUnavailable as exc:
                log.warning("metadata store unavailable, retrying: %s", exc)
            stop.wait(self.settings.tick_s)
        self.resign()

    # -- planning ----------------------------------------------------------------------------------
    def _context(self) -> tuple[dict[str, TableInfo], dict, set[str], set[str]]:
        tables = {t.id: t for t in self.store.tables()}
        services = self.store.services()
        active = {u.id for u in user_compactions.all_compactions(self.store) if u.state == user_compactions.RUNNING}
        return tables, services, active, failures.skip_set(self.store)

    def plan_tablets(self, tablets: list[Tablet], gen: int) -> int:
        return self._plan((tablets[i:i + PLAN_BATCH] for i in range(0, len(tablets), PLAN_BATCH)), gen)

    def _plan(self, batches: Iterable[Sequence[Tablet]], gen: int) -> int:
        """Plan batches of tablets and queue their jobs; a batch's jobs are queued while the next
        batch is decoded and planned. Returns the jobs admitted."""
        tables, services, active, skip = self._context()
        now = now_ms()
        remove: list[str] = []
        with gc_paused(), self.queues.adding(gen) as adder:  # gc: millions of acyclic objects
            for tablets in batches:
                plans: list[tuple[str, list]] = []
                for t in tablets:
                    info = tables.get(t.table)
                    if info is None or info.state != ONLINE:
                        remove.append(t.id)
                        continue
                    tp = plan_tablet(t, info, services, now, active, skip)
                    self.stats["planned"] += 1
                    if tp.select:
                        user_compactions.select_files(self.store, t, tp.select, "SELECTOR", f"SEL-{t.version}-{now}")
                    if tp.jobs:
                        plans.append((t.id, tp.jobs))
                adder.send(plans)
        if remove:
            self.queues.remove_tablets(remove)
        self.stats["queued"] += adder.admitted
        return adder.admitted

    def _forget_deleted_tables(self) -> None:
        """Drop queued jobs of tables deleted since the last pass. A deleted table's tablets are
        gone from the metadata (and from the dirty set), so no pass would re-plan them; without
        this their jobs would wait for the next full-scan sweep."""
        live = {t.id for t in self.store.tables()}
        known, self._known_tables = self._known_tables, live
        gone = known - live if known is not None else set()
        if gone:
            victims = {tab for g in self.queues.groups() for tab in self.queues.queued_tablets(g)
                       if tab.split(";", 1)[0] in gone}
            if victims:
                self.queues.remove_tablets(victims)

    def plan_dirty(self) -> int:
        self._forget_deleted_tables()
        ids = self.store.pop_dirty()
        if not ids:
            return 0
        tablets = self.store.get_tablets(ids)
        gone = set(ids) - {t.id for t in tablets}
        if gone:
            self.queues.remove_tablets(gone)
        return self.plan_tablets(tablets, self.queues.generation())

    def full_scan(self) -> int:
        """Plan every tablet; then sweep queued jobs of tablets that no longer need them."""
        self.store.pop_dirty(1_000_000)  # everything is planned now
        self._known_tables = {t.id for t in self.store.tables()}  # the sweep drops the rest
        gen = self.queues.begin_full_scan()
        queued = self._plan(self.store.tablet_batches(self.store.all_tablet_ids(), PLAN_BATCH), gen)
        self.queues.end_full_scan(gen)
        self._last_full = time.monotonic()
        self.stats["full_scans"] += 1
        return queued

    # -- dead compactions, garbage ------------------------------------------------------------------
    def detect_dead(self) -> list[str]:
        dead = detect_dead(self.store, self.storage, self.settings.dead_after_s, self.settings.max_attempts)
        self.stats["dead"] += len(dead)
        return dead

    def collect_garbage(self, grace_s: float | None = None) -> list[str]:
        """Delete files under tables/ that no tablet references and no running compaction will
        write, once older than the grace period; and temporary outputs of finished ECIDs."""
        self._last_gc = time.monotonic()
        deleted = collect_garbage(self.store, self.storage, self.settings.gc_grace_s if grace_s is None else grace_s)
        self.stats["gc_deleted"] += len(deleted)
        return deleted
