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

from kompaktor import contract as C
from kompaktor import failures, tabletops, usercompaction
from kompaktor.compactions import delete_outputs, last_heartbeat, remove_running, running_compactions
from kompaktor.errors import ConditionFailed, StoreUnavailable, UnknownTableError
from kompaktor.jobqueue import JobQueues
from kompaktor.metrics import QueueMetrics
from kompaktor.planning import plan_tablet
from kompaktor.storage import TMP_PREFIX, Storage
from kompaktor.store import ONLINE, MetadataStore, Mutation, TableInfo, Tablet, gc_paused, now_ms

log = logging.getLogger("kompaktor.coordinator")

#: tablets planned, and their jobs queued (one script call), at a time
PLAN_BATCH = 1000


_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""


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
        self.queues = JobQueues(self.store.r)
        self.metrics = QueueMetrics.create()
        self.fence: int | None = None
        self._renew = self.store.r.register_script(_RENEW)
        self._last_full = float("-inf")  # never: the first pass as leader is a full scan
        self._last_gc = time.monotonic()
        self._known_tables: set[str] | None = None  # table ids seen by the last pass
        self.stats = {"planned": 0, "queued": 0, "dead": 0, "gc_deleted": 0, "full_scans": 0}

    # -- leadership ------------------------------------------------------------------------------
    def try_lead(self) -> bool:
        """Take or keep the lease. Returns whether this coordinator leads now."""
        r = self.store.r
        if self.fence is not None:
            if int(self._renew(keys=[C.LEASE], args=[self.holder, self.settings.lease_ms])):
                return True
            log.warning("%s lost the coordinator lease", self.holder)
            self.fence = None
        if r.set(C.LEASE, self.holder, nx=True, px=self.settings.lease_ms):
            self.fence = int(r.incr(C.FENCE))
            self._last_full = float("-inf")  # a new leader rebuilds the queues (whatever the uptime)
            log.info("%s leads (fencing token %d)", self.holder, self.fence)
            return True
        return False

    def resign(self) -> None:
        if self.fence is not None and self.store.r.get(C.LEASE) == self.holder.encode():
            self.store.r.delete(C.LEASE)
        self.fence = None

    # -- one pass ----------------------------------------------------------------------------------
    def tick(self) -> bool:
        """One coordinator pass. Returns False when another coordinator leads."""
        if not self.try_lead():
            return False
        self.detect_dead()
        self.run_user_compactions()
        failures.redirty_due(self.store)
        try:  # before planning: it reads the dirty set that planning pops
            tabletops.auto_split(self.store, self.queues)
        except Exception:
            log.exception("automatic split failed; retried next tick")
        full_due = time.monotonic() - self._last_full >= self.settings.full_scan_s
        if full_due or not self.store.r.exists(C.QUEUE_GENERATION):
            self.full_scan()
        else:
            self.plan_dirty()
        if time.monotonic() - self._last_gc >= self.settings.gc_interval_s:
            self.collect_garbage()
        self.export_metrics()
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
        active = {u.id for u in usercompaction.all_compactions(self.store) if u.state == usercompaction.RUNNING}
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
                        self._select(t, tp.select, "SELECTOR", f"SEL-{t.version}-{now}")
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

    def _select(self, t: Tablet, files: list[str], kind: str, sel_id: str, hold: str | None = None) -> bool:
        m = Mutation(table=t.table).require_table(ONLINE)
        tc = m.tablet(t.id).require("no_running").require("no_selection").require("no_op")
        if hold is not None:
            tc.require("hold_is", hold).do("clear_hold")
        else:
            tc.require("no_hold").require("version", t.version)
        tc.do("set_selection", {"id": sel_id, "kind": kind, "files": sorted(files), "done": 0,
                                "created": now_ms()})
        try:
            self.store.mutate(m)
            return True
        except ConditionFailed:
            return False

    # -- user compactions --------------------------------------------------------------------------
    def run_user_compactions(self) -> None:
        for uc in usercompaction.all_compactions(self.store):
            if uc.state != usercompaction.RUNNING:
                continue
            try:
                state = self.store.table_info(uc.table).state
            except UnknownTableError:
                state = "DELETED"
            if state != ONLINE:
                usercompaction.cancel(self.store, uc.id, f"table is {state}")
                continue
            for t in self.store.get_tablets(list(uc.tablets)):
                if t.hold != uc.id or t.running:
                    continue
                if not t.files:  # nothing to compact: done at once
                    m = Mutation()
                    m.tablet(t.id).require("hold_is", uc.id).do("clear_hold").do("ucomp_done", uc.id)
                    try:
                        self.store.mutate(m)
                    except ConditionFailed:
                        pass
                    continue
                if t.selection is None:
                    self._select(t, list(t.files), "USER", uc.id, hold=uc.id)
            uc = usercompaction.get(self.store, uc.id)
            if uc.done >= uc.total:
                usercompaction.set_state(self.store, uc.id, usercompaction.SUCCEEDED,
                                         f"{uc.done}/{uc.total} tablets compacted")

    # -- dead compactions ----------------------------------------------------------------------------
    def detect_dead(self) -> list[str]:
        now = time.time()
        dead = []
        for ecid, (tablet_id, rc) in running_compactions(self.store).items():
            if rc is None:
                self.store.r.hdel(C.RUNNING, ecid)
                continue
            hb = last_heartbeat(self.store, ecid)
            last = float(hb["updated"]) if "updated" in hb else rc.started_ms / 1000.0
            if now - last <= self.settings.dead_after_s:
                continue
            log.warning("compaction %s on %s (compactor %s) is dead: no heartbeat for %.0fs",
                        ecid, tablet_id, rc.compactor, now - last)
            if remove_running(self.store, tablet_id, ecid):
                delete_outputs(self.storage, rc.output, ecid)
                self.store.r.delete(C.heartbeat_key(ecid))
                self.store.incr("dead_compactions")
                self.store.r.rpush(C.DEADLOG, ecid)
                self.store.r.ltrim(C.DEADLOG, -10_000, -1)
                self.store.incr(f"dead_compactions:{rc.group}")
                failures.record_failure(self.store, tablet_id, rc.files, rc.group, "compactor died",
                                        max_attempts=self.settings.max_attempts)
                self.store.mark_dirty([tablet_id])
                dead.append(ecid)
        self.stats["dead"] += len(dead)
        return dead

    # -- garbage collection -----------------------------------------------------------------------
    def collect_garbage(self, grace_s: float | None = None) -> list[str]:
        """Delete files under tables/ that no tablet references and no running compaction will
        write, once older than the grace period; and temporary outputs of finished ECIDs."""
        grace = self.settings.gc_grace_s if grace_s is None else grace_s
        self._last_gc = time.monotonic()
        running = running_compactions(self.store)
        referenced: set[str] = set()
        for t in self.store.iter_all_tablets():
            referenced.update(t.files)
        for _tid, rc in running.values():
            if rc is not None:
                referenced.add(rc.output)
        now = time.time()
        deleted = []
        for rel, mtime in self.storage.list_files("tables"):
            if now - mtime < grace:
                continue
            name = rel.rsplit("/", 1)[-1]
            if name.startswith(TMP_PREFIX):
                ecid = name[len(TMP_PREFIX):].split("_", 1)[0]
                if ecid in running:
                    continue
            elif rel in referenced:
                continue
            if self.storage.delete(rel):
                deleted.append(rel)
        # re-check: a file referenced between listing and deleting would be a bug in the grace
        self.stats["gc_deleted"] += len(deleted)
        if deleted:
            self.store.incr("gc_deleted", len(deleted))
        return deleted

    # -- metrics -----------------------------------------------------------------------------------
    def export_metrics(self) -> None:
        m = self.metrics
        groups = set(self.queues.groups()) | set(self.store.groups())
        for g in sorted(groups):
            s = self.queues.stats(g)
            m.depth.labels(g).set(s.depth)
            m.queued.labels(g).set(s.queued)
            m.running.labels(g).set(s.running)
            m.oldest.labels(g).set(s.oldest_age_s)
            m.rejected.labels(g).set(s.rejected)
            m.dead_lettered.labels(g).set(s.dead_lettered)
        m.dead.set(self.store.counters().get("dead_compactions", 0))
