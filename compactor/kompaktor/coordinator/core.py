"""The coordinator: plans changed tablets into the group queues, runs user compactions and
selectors, detects dead compactions, garbage-collects files, exports queue metrics.

Exactly one coordinator acts at a time: it holds a Redis lease (renewed by a thread of its own,
:mod:`.lease`) and a fencing token taken at each takeover; a second coordinator waits and takes
over when the lease expires. Every write of the coordinator goes through a fenced view of the
store: it carries the token and is refused inside Redis once a newer coordinator has taken over.
A pass stops at the next step (or batch) once the lease is no longer trusted.
Queues are a cache: a coordinator that starts (or finds the queue keys gone) rebuilds them with
a full scan.

Redis may be unreachable for any length of time: the coordinator keeps retrying, and when it
can act again it gives running compactions a full ``dead_after_s`` to send a heartbeat before
declaring any of them dead (their compactors could not reach Redis either). So does a new leader
when no leader completed a pass for longer than ``dead_after_s`` (it may have started after an
outage it never saw).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kompaktor.coordinator.dead import detect_dead
from kompaktor.coordinator.gc import GcCursor, collect_garbage
from kompaktor.coordinator.lease import Lease
from kompaktor.coordinator.metrics import QueueMetrics
from kompaktor.coordinator.planpool import PlanContext, PlanPool, TabletDoc, default_workers, plan_share
from kompaktor.coordinator.statuspage import Samples
from kompaktor.files.storage import Storage
from kompaktor.metadata import backup, failures, history, tablet_ops, user_compactions
from kompaktor.metadata import format as metaformat
from kompaktor.metadata.store import MetadataStore
from kompaktor.model.errors import Fenced, KompaktorError, StoreUnavailable
from kompaktor.model.tablet import Tablet, gc_paused, now_ms
from kompaktor.policy.planning import TabletPlan

log = logging.getLogger("kompaktor.coordinator")

#: tablets planned, and their jobs queued (one script call), at a time
PLAN_BATCH = 1000


@dataclass(frozen=True)
class CoordinatorSettings:
    tick_s: float = 0.5
    lease_ms: int = 10_000
    full_scan_s: float = 30.0
    dead_after_s: float = 30.0  # a compaction without a heartbeat for this long is dead
    gc_interval_s: float = 60.0
    gc_grace_s: float = 300.0  # unreferenced files younger than this are left alone
    #: a backup of the metadata this often (kompaktor.metadata.backup); 0: none
    backup_interval_s: float = 0.0
    backup_keep: int = 7  # backups retained (the newest)
    backup_max_age_s: float | None = None  # and none older than this (the newest always kept)
    max_attempts: int = failures.MAX_ATTEMPTS
    #: worker processes that plan shares of a big full pass (:mod:`.planpool`); 0: one thread
    plan_workers: int = field(default_factory=default_workers)
    #: how much of each group's compaction history to keep (the coordinator records dead compactions)
    history_limits: history.HistoryLimits = field(default_factory=history.HistoryLimits)


@dataclass
class Coordinator:
    store: MetadataStore
    storage: Storage
    settings: CoordinatorSettings = field(default_factory=CoordinatorSettings)
    holder: str = field(default_factory=lambda: f"coord-{uuid.uuid4().hex[:8]}")

    def __post_init__(self) -> None:
        self.lease = Lease(self.store, self.holder, self.settings.lease_ms)
        self.store = self.store.fenced(lambda: self.lease.token)  # every write carries the token
        self.queues = self.store.queues
        self.metrics = QueueMetrics.create()
        #: when the store was last found reachable again after being unreachable (time.time()):
        #: compactions are not declared dead for want of heartbeats sent during an outage
        self._store_back = 0.0
        self._store_lost = False
        self._last_full = float("-inf")  # never: the first pass as leader is a full scan
        self._format_current = False  # the metadata's format checked and migrated as leader
        self._last_gc = time.monotonic()
        self._gc_cursor = GcCursor()  # where the next bounded garbage-collection pass resumes
        self._last_backup_ms: int | None = None  # the newest backup's time, once read
        self._known_tables: set[str] | None = None  # table ids seen by the last pass
        self._planpool = PlanPool(self.store.url, self.settings.plan_workers)
        #: queue depth and replicas per group over the last hour, for the status page's charts
        self.samples = Samples()
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
        self._format_current = False  # a new leader checks the format (another may have led a newer release)
        # If no leader completed a pass for longer than dead_after_s (all coordinators down, or
        # Redis away: this process may have started after an outage it never saw), heartbeats
        # could not be watched, nor perhaps sent: every compaction gets dead_after_s from now.
        seen = self.store.lease.coordinator_seen()
        if seen is not None and time.time() - seen > self.settings.dead_after_s:
            self._store_back = max(self._store_back, time.time())
        return True

    def resign(self) -> None:
        self._planpool.close()
        try:
            self.lease.release()
        except StoreUnavailable as exc:  # the lease then expires by itself
            log.warning("%s could not release the lease: %s", self.holder, exc)

    def check_lease(self) -> None:
        """Raise :class:`Fenced` unless this coordinator may still act as leader. Called between
        the steps of a pass and between batches of long steps. A coordinator object that never
        led (a one-shot tool calling one step, e.g. the demo's final garbage collection) is not
        a leader and writes like any other client, unfenced; :meth:`tick` and :meth:`run`
        always lead first."""
        if self.lease.token is not None and not self.lease.valid():
            raise Fenced(f"{self.holder} no longer holds the coordinator lease")

    # -- one pass ----------------------------------------------------------------------------------
    def tick(self) -> bool:
        """One coordinator pass. Returns False when another coordinator leads; raises
        :class:`Fenced` when the lease was lost during the pass (what was written before stays,
        what would have been written after is not)."""
        if not self.try_lead():
            return False
        if self.store.load_scripts():  # after a restart or failover: compactors cannot load them
            log.info("loaded the metadata scripts into Redis")
        if not self._format_current:
            self.upgrade_format()
        if self._store_lost:
            self._store_lost = False
            self._store_back = time.time()
        self.detect_dead()
        self.check_lease()
        user_compactions.advance(self.store)
        self.check_lease()
        failures.redirty_due(self.store)
        failures.forget_settled(self.store)
        self.check_lease()
        try:  # before planning: it reads the dirty set that planning pops
            tablet_ops.auto_split(self.store, self.queues)
        except (Fenced, StoreUnavailable):
            raise
        except Exception:
            log.exception("automatic split failed; retried next tick")
        self.check_lease()
        full_due = time.monotonic() - self._last_full >= self.settings.full_scan_s
        if full_due or not self.queues.has_generation():
            self.full_scan()
        else:
            self.plan_dirty()
        if time.monotonic() - self._last_gc >= self.settings.gc_interval_s:
            self.check_lease()
            self.collect_garbage()
        if self.settings.backup_interval_s > 0 and self.backup_due():
            self.check_lease()
            self.take_backup()
        self.metrics.export(self.store)
        self.samples.take(self.store)
        self.store.lease.mark_coordinator_seen()
        return True

    def upgrade_format(self) -> None:
        """As a new leader, before anything else: migrate the metadata to this code's format
        (refused in one line when it is newer) and record the installation in Redis and storage
        where missing (refused when they belong to two installations): docs/upgrading.md."""
        ran = metaformat.migrate(self.store)
        if ran:
            log.info("migrated the metadata to format %d: %s", metaformat.FORMAT_VERSION, ", ".join(ran))
        metaformat.claim_installation(self.store, self.storage)
        self._format_current = True

    def run(self, stop: threading.Event) -> None:
        """Tick until ``stop`` is set, through Redis outages of any length (retried every
        ``tick_s``, doubling to 5 s) and lost leadership (it waits, then competes again)."""
        wait = self.settings.tick_s
        while not stop.is_set():
            try:
                self.tick()
                wait = self.settings.tick_s
            except Fenced as exc:
                log.warning("%s stops acting as leader: %s", self.holder, exc)
                self.lease.drop()
            except StoreUnavailable as exc:
                if not self._store_lost:
                    log.warning("metadata store unavailable, retrying: %s", exc)
                self._store_lost = True
                wait = min(5.0, max(wait * 2, self.settings.tick_s))
            except OSError as exc:  # the file storage failed under a step (GC, dead-compaction cleanup)
                log.warning("storage error, retrying: %s", " ".join(str(exc).split()))
                wait = min(5.0, max(wait * 2, self.settings.tick_s))
            stop.wait(wait)
        self.resign()

    # -- planning ----------------------------------------------------------------------------------
    def _context(self) -> PlanContext:
        tables = {t.id: t for t in self.store.tables.tables()}
        services = self.store.fleet.services()
        active = {u.id for u in user_compactions.all_compactions(self.store) if u.state == user_compactions.RUNNING}
        return PlanContext(tables, services, now_ms(), active, failures.skip_set(self.store))

    def plan_tablets(self, tablets: Sequence[Tablet | TabletDoc], gen: int) -> int:
        """Plan these tablets (or their stored documents) and queue their jobs; the jobs admitted."""
        return self._plan((tablets[i : i + PLAN_BATCH] for i in range(0, len(tablets), PLAN_BATCH)), gen)

    def _plan(self, batches: Iterable[Sequence[Tablet | TabletDoc]], gen: int, shared: Sequence[str] = ()) -> int:
        """Plan batches of tablets and queue their jobs; a batch's jobs are queued while the next
        batch is decoded and planned. ``shared``: more tablets (ids), planned by the pool's worker
        processes meanwhile (:mod:`.planpool`), their plans queued as they come. Returns the jobs
        admitted."""
        ctx = self._context()
        run = self._planpool.run(shared, ctx, PLAN_BATCH) if shared else None
        planned = 0
        remove: list[str] = []

        def select(t: Tablet, tp: TabletPlan) -> bool:
            user_compactions.select_files(self.store, t, tp.select or [], "SELECTOR", f"SEL-{t.version}-{ctx.now}")
            return True

        def here(ids: Sequence[str]) -> None:
            nonlocal planned
            n, gone = plan_share(self.store.tables.tablet_doc_batches(list(ids), PLAN_BATCH), ctx, adder.send, select)
            planned += n
            remove.extend(gone)

        def take(timeout: float = 0.0) -> None:
            """Queue what the workers have planned so far."""
            nonlocal planned
            self.check_lease()
            for chunk, res in run.ready(timeout) if run is not None else ():
                if isinstance(res, BaseException):  # a worker died or failed: its chunk is planned here
                    log.warning("planning worker failed (%s: %s); planning its share here", type(res).__name__, res)
                    self._planpool.broken()
                    here(chunk)
                    continue
                adder.send_encoded(res.adds)
                remove.extend(res.remove)
                planned += res.planned - len(res.reselect)
                if res.reselect:  # a selection is a write: planned again here, on fresh documents
                    here(res.reselect)

        with gc_paused(), self.queues.adding(gen) as adder:  # gc: millions of acyclic objects
            try:
                n, gone = plan_share(batches, ctx, adder.send, select, take)
                planned += n
                remove.extend(gone)
                while run is not None and not run.finished:
                    chunk = run.steal()  # the coordinator's share is done: it helps with the rest
                    if chunk is not None:
                        here(chunk)
                    take(timeout=0.0 if chunk is not None else 0.5)
            finally:
                if run is not None:
                    run.cancel()
        self.stats["planned"] += planned
        if remove:
            self.queues.remove_tablets(remove)
        self.stats["queued"] += adder.admitted
        return adder.admitted

    def _forget_deleted_tables(self) -> None:
        """Drop queued jobs of tables deleted since the last pass. A deleted table's tablets are
        gone from the metadata (and from the dirty set), so no pass would re-plan them; without
        this their jobs would wait for the next full-scan sweep."""
        live = {t.id for t in self.store.tables.tables()}
        known, self._known_tables = self._known_tables, live
        gone = known - live if known is not None else set()
        if gone:
            victims = {
                tab
                for g in self.queues.groups()
                for tab in self.queues.queued_tablets(g)
                if tab.split(";", 1)[0] in gone
            }
            if victims:
                self.queues.remove_tablets(victims)

    def plan_dirty(self) -> int:
        self._forget_deleted_tables()
        ids = self.store.bookkeeping.pop_dirty()
        if not ids:
            return 0
        docs = self.store.tables.tablet_docs(ids)
        gone = set(ids) - {t for t, _ in docs}
        if gone:
            self.queues.remove_tablets(gone)
        return self.plan_tablets(docs, self.queues.generation())

    def full_scan(self) -> int:
        """Plan every tablet; then sweep queued jobs of tablets that no longer need them."""
        self.store.bookkeeping.clear_dirty()  # everything is planned now
        self._known_tables = {t.id for t in self.store.tables.tables()}  # the sweep drops the rest
        gen = self.queues.begin_full_scan()
        ids = self.store.tables.all_tablet_ids()
        shared: list[str] = []
        if self._planpool.usable(len(ids)):  # the coordinator plans the first share itself
            n = len(ids) // (self._planpool.workers + 1)
            ids, shared = ids[:n], ids[n:]
        queued = self._plan(self.store.tables.tablet_doc_batches(ids, PLAN_BATCH), gen, shared)
        self.queues.end_full_scan(gen)
        self._last_full = time.monotonic()
        self.stats["full_scans"] += 1
        return queued

    # -- dead compactions, garbage ------------------------------------------------------------------
    def detect_dead(self) -> list[str]:
        dead = detect_dead(
            self.store,
            self.storage,
            self.settings.dead_after_s,
            self.settings.max_attempts,
            not_before=self._store_back,
            history_limits=self.settings.history_limits,
        )
        self.stats["dead"] += len(dead)
        return dead

    def backup_due(self) -> bool:
        """Whether the newest backup in storage is older than the interval (read once, then kept:
        a new leader does not take one at once when another just did)."""
        if self._last_backup_ms is None:
            done = backup.list_backups(self.storage)
            self._last_backup_ms = done[-1].created_ms if done else 0
            self.metrics.backup_last.set(self._last_backup_ms / 1000)
        return time.time() * 1000 - self._last_backup_ms >= self.settings.backup_interval_s * 1000

    def take_backup(self) -> backup.Manifest | None:
        """A scheduled backup, then retention. A failure is counted and logged; the next pass
        retries (after the interval again when storage keeps failing)."""
        self._last_backup_ms = int(time.time() * 1000)
        try:
            m = backup.create(self.store, self.storage)
            backup.prune(self.storage, self.settings.backup_keep, self.settings.backup_max_age_s)
        except (Fenced, StoreUnavailable):
            self.metrics.backup_failures.inc()
            raise
        except (OSError, KompaktorError) as exc:
            self.metrics.backup_failures.inc()
            log.warning("backup failed: %s", " ".join(str(exc).split()))
            return None
        self.metrics.backup_last.set(m.created_ms / 1000)
        self.metrics.backup_bytes.set(m.bytes)
        log.info("backup %s: %d tablets, %d files, %.2f s", m.id, m.tablets, m.files, m.took_s)
        return m

    def collect_garbage(self, grace_s: float | None = None) -> list[str]:
        """Delete files under tables/ that no tablet references and no running compaction will
        write, once older than the grace period; and temporary outputs of finished ECIDs."""
        self._last_gc = time.monotonic()
        deleted = collect_garbage(
            self.store,
            self.storage,
            self.settings.gc_grace_s if grace_s is None else grace_s,
            check=self.check_lease,
            cursor=self._gc_cursor,
        )
        self.stats["gc_deleted"] += len(deleted)
        return deleted
