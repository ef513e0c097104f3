"""The compactor: one compaction at a time, forever — reserve, merge, commit, repeat.

While a merge runs, the main thread heartbeats progress (with an estimate of the seconds left,
which the operator's scale-down reads), checks that the job is still wanted (table ONLINE, tablet
and ECID still there, USER compaction not cancelled) and watches for a drain request (SIGTERM,
``POST /drain`` from the preStop hook, or a drain flag in Redis). A draining compactor takes no
new job. Asked by SIGTERM or HTTP (its pod is being deleted), it finishes the current job if it
can complete within the grace period, otherwise it cancels the merge and releases the job at
once; asked by the flag in Redis (the operator's scale-down: nothing stops the pod before it is
drained), it finishes the job however long it takes. Then it exits 0 — or, with
``stay_drained`` (a compactor pod), it stays up and takes no job until SIGTERM, and its drain
mark in Redis outlives the process: a container the kubelet restarts in a draining pod takes no
job either.
"""

from __future__ import annotations

import logging
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from http.server import ThreadingHTTPServer
from typing import Any

from kompaktor.engines.api import MergeCancelled, MergeEngine, MergeProgress, MergeRequest, MergeResult
from kompaktor.files.storage import Storage
from kompaktor.files.storage import unavailable as storage_unavailable
from kompaktor.metadata import compactions, history
from kompaktor.metadata import progress as resume_records
from kompaktor.metadata.compactions import Reservation
from kompaktor.metadata.jobs import DirectJobs, Jobs
from kompaktor.metadata.store import MetadataStore
from kompaktor.model.errors import BadFileError, ConditionFailed, KompaktorError, NotPermitted, StoreUnavailable
from kompaktor.model.iterators import IteratorSettings
from kompaktor.model.tablet import ONLINE, FileInfo
from kompaktor.policy.services import (
    DEFAULT_DRAIN_GRACE_S,
    DEFAULT_ENGINE,
    DEFAULT_RESUME,
    DEFAULT_RESUME_MIN_BYTES,
    DEFAULT_SPARK_MASTER,
    GroupConfig,
)
from kompaktor.policy.sizes import format_quantity
from kompaktor.worker.http import serve
from kompaktor.worker.metrics import CompactorMetrics

log = logging.getLogger("kompaktor.compactor")

IDLE, BUSY, DRAINING = "idle", "busy", "draining"
#: the settings' source of a compactor whose group has no configuration in Redis
DEFAULTS_SOURCE = "the defaults (no configuration of this group in Redis)"
REDIS_SOURCE = "the group's configuration in Redis"


@dataclass
class WorkerSettings:
    group: str
    compactor_id: str
    engine: str = DEFAULT_ENGINE  # or "arrow"
    spark_master: str = DEFAULT_SPARK_MASTER
    spark_conf: dict[str, str] = field(default_factory=dict)
    driver_memory: str | None = None
    drain_grace_s: float = float(DEFAULT_DRAIN_GRACE_S)
    heartbeat_s: float = 2.0
    idle_min_s: float = 0.1
    idle_max_s: float = 2.0
    #: an idle compactor waits for a wake-up (a job queued) between polls; False: it only polls
    #: (the baseline the wake-up bench compares with)
    wake: bool = True
    #: with wake-ups, an idle compactor still polls this often (a wake-up lost to a failover, a
    #: drain flag in Redis)
    idle_wake_poll_s: float = 4.0
    default_throughput_bps: float = 20e6  # until measured: bytes of input merged per second
    max_jobs: int | None = None  # stop after this many jobs (tests, benchmarks)
    #: how long to keep retrying a finished merge's commit while the store is unreachable; None:
    #: for as long as it takes (a Redis outage of any length), or until a drain's deadline
    commit_retry_s: float | None = None
    #: merges record their finished key ranges so that a retry of the same job resumes (docs/kubernetes.md
    #: "Resuming long merges"; the group's spec.resume.enabled)
    resume: bool = DEFAULT_RESUME
    #: from this many input bytes (spec.resume.minInputSize): the engine the compactor builds
    #: takes it (an engine passed in keeps its own ``resume_min_bytes``)
    resume_min_bytes: int = DEFAULT_RESUME_MIN_BYTES
    #: where the group's settings above came from, said in the compactor's start-up line
    source: str = "the caller"
    #: the group has no configuration in Redis: its settings are the defaults (said at WARNING)
    unconfigured: bool = False
    #: how much of the group's compaction history to keep (each finished job adds a record and
    #: trims the group's stream to these bounds; the CompactorGroup's spec.history)
    history_limits: history.HistoryLimits = field(default_factory=history.HistoryLimits)
    #: a compactor pod: once drained it stays up, inert, until SIGTERM (its pod deleted), and
    #: its drain mark in Redis (keyed by the pod's name) is kept when it exits, so a restarted
    #: container of a draining pod takes no job; False: drained, it exits 0 and clears the mark
    stay_drained: bool = False

    @classmethod
    def for_group(cls, cfg: GroupConfig, compactor_id: str, **kw: Any) -> WorkerSettings:
        """A compactor's settings from its group's configuration (the one the operator stores)."""
        return cls(
            group=cfg.name,
            compactor_id=compactor_id,
            engine=cfg.engine,
            spark_master=cfg.spark_master,
            spark_conf=dict(cfg.spark_conf),
            driver_memory=cfg.driver_memory,
            drain_grace_s=float(cfg.drain_grace_seconds),
            resume=cfg.resume,
            resume_min_bytes=cfg.resume_min_bytes,
            history_limits=history.HistoryLimits.of_group(cfg),
            **kw,
        )

    def describe(self) -> str:
        """The group's settings this compactor runs with, on one line (logged at start)."""
        conf = ",".join(f"{k}={v}" for k, v in sorted(self.spark_conf.items())) or "-"
        h = self.history_limits
        return (
            f"engine={self.engine} spark_master={self.spark_master} spark_conf={conf} "
            f"driver_memory={self.driver_memory or '-'} drain_grace={self.drain_grace_s:g}s "
            f"resume={format_quantity(self.resume_min_bytes) if self.resume else 'off'} "
            f"history={h.max_records}/{h.max_age_s:g}s"
        )


#: why a merge was stopped that means its job is gone for good: its progress is discarded at once
#: (other stops — a drain, the table offline, the ECID removed as dead — keep it for the retry)
_JOB_GONE = ("tablet no longer exists", "table deleted", "user compaction cancelled")


@dataclass
class MergeFigures:
    """What a job's merge and commit measured, for its history record (None: not known, as a
    killed job's output); filled in as the job goes on."""

    merge_s: float | None = None
    resumed_parts: int = 0
    input_entries: int | None = None
    output_bytes: int | None = None
    output_entries: int | None = None
    deletes_dropped: int | None = None
    commit_s: float | None = None


@dataclass
class JobOutcome:
    status: str  # committed, failed, cancelled
    reason: str = ""
    ecid: str = ""
    #: failed because the storage could not be reached or written: not counted against the job
    storage_down: bool = False
    #: the outcome in the compaction history (:mod:`kompaktor.metadata.history`) and its figures
    #: (the fields of a :class:`~kompaktor.metadata.history.Record` this compactor knows)
    recorded: str = ""
    figures: MergeFigures = field(default_factory=MergeFigures)


def _queued_s(res: Reservation, reserved: float) -> float | None:
    """How long the job waited in its queue before this compactor reserved it, at ``reserved``
    (epoch s). The queue's time is the coordinator's clock: a skew never makes it negative."""
    if res.queued_ms is None:
        return None
    return round(max(0.0, reserved - res.queued_ms / 1000.0), 3)


def _no_progress() -> MergeProgress:
    return {"entries_read": 0, "entries_written": 0, "bytes_read": 0, "bytes_written": 0}


@dataclass
class _Job:
    """One reserved job while the compactor runs it: what its merge is given, what the merge
    reports (progress, then its result or error) and why it was cancelled."""

    res: Reservation
    input_bytes: int
    settings: IteratorSettings  # the merge's (a resumed job's keep the first attempt's age-off cut)
    rlog: resume_records.RedisResumeLog | None = None  # where a resumable merge records its parts
    progress: MergeProgress = field(default_factory=_no_progress)
    cancel: threading.Event = field(default_factory=threading.Event)
    reason: str | None = None  # why the merge was cancelled (the first reason)
    result: MergeResult | None = None
    error: BaseException | None = None
    elapsed: float = 0.0  # seconds the merge took

    def stop(self, why: str) -> None:
        """Cancel the merge for ``why``, unless it is cancelled already."""
        if not self.cancel.is_set():
            self.reason = why
            self.cancel.set()


class Compactor:
    def __init__(
        self,
        store: MetadataStore,
        storage: Storage,
        settings: WorkerSettings,
        engine: MergeEngine | None = None,
        jobs: Jobs | None = None,
    ) -> None:
        self.store = store
        #: the writes about its jobs: made with the store's rights, or asked of the coordinator
        self.jobs: Jobs = DirectJobs(store) if jobs is None else jobs
        self.storage = storage
        self.settings = settings
        self.queues = store.queues
        self.metrics = CompactorMetrics.create()
        m = self.metrics
        for series in (
            m.running,
            m.completed,
            m.failed,
            m.cancelled,
            m.entries_read,
            m.entries_written,
            m.bytes_read,
            m.bytes_written,
            m.duration,
            m.resume_parts_reused,
            m.resume_bytes_reused,
            m.resume_parts_rejected,
        ):
            series.labels(settings.group)  # every series exists (at 0) from the start, for rate() and alerts
        self._engine = engine
        self.drain = threading.Event()
        #: SIGTERM: leave once drained, even with ``stay_drained``
        self.leave = threading.Event()
        #: set when there may be work (a wake-up token taken) or a drain was asked for
        self._wake = threading.Event()
        self.drain_deadline: float | None = None
        self.state = IDLE
        self.ready = False
        self.throughput = settings.default_throughput_bps
        self.jobs_done = 0
        self.current: Reservation | None = None
        self._http: ThreadingHTTPServer | None = None

    # -- engine ------------------------------------------------------------------------------------
    @property
    def engine(self) -> MergeEngine:
        if self._engine is None:
            from kompaktor.engines import make_engine

            self._engine = make_engine(
                self.settings.engine,
                spark_master=self.settings.spark_master,
                spark_conf=self.settings.spark_conf,
                driver_memory=self.settings.driver_memory,
                resume_min_bytes=self.settings.resume_min_bytes,
            )
        return self._engine

    # -- drain -------------------------------------------------------------------------------------
    def request_drain(self, why: str = "requested", finish: bool = False) -> None:
        """Take no new job. ``finish``: finish the current one however long it takes (the
        operator's scale-down); else within the grace period (the pod is being deleted)."""
        if not self.drain.is_set():
            log.info("compactor %s draining (%s)", self.settings.compactor_id, why)
            self.drain.set()
            self._wake.set()
        if not finish and self.drain_deadline is None:
            self.drain_deadline = time.monotonic() + self.settings.drain_grace_s

    def install_signal_handlers(self) -> None:
        def on_term(signum: int, _frame: Any) -> None:
            self.leave.set()
            self.request_drain(signal.Signals(signum).name)

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)

    def _publish(self, state: str) -> None:
        self.state = state
        ecid = self.current.ecid if self.current else None
        try:
            self.jobs.register(self.settings.group, self.settings.compactor_id, state, ecid)
            if state == DRAINING and self.settings.stay_drained:  # the mark outlives this process
                self.jobs.mark_drained(self.settings.group, self.settings.compactor_id)
        except StoreUnavailable as exc:
            log.warning("cannot publish state: %s", exc)

    def _drain_flag(self) -> bool:
        """Whether Redis holds a drain request (or mark) for this compactor; drains if so."""
        if self.store.fleet.drain_requested(self.settings.compactor_id):
            self.request_drain("drain flag in Redis", finish=True)
        return self.drain.is_set()

    def _refuse_without_rights(self, exc: StoreUnavailable) -> None:
        """A compactor making its own writes on a Redis user that may not (a compactor pod's):
        one line that says what to do, not an outage retried forever."""
        if isinstance(self.jobs, DirectJobs) and isinstance(exc, NotPermitted):
            raise KompaktorError(
                f"compactor {self.settings.compactor_id}: its Redis user may not write Kompaktor's metadata "
                f"({exc}); run it with --broker, so that the coordinator makes its writes"
            ) from None

    def _stay_drained(self) -> None:
        """Drained, in a pod: stay up and take no job until SIGTERM, still saying ``draining``
        (the operator then removes the pod). Exiting instead would let the kubelet restart the
        container before the pod is deleted."""
        log.info("compactor %s drained: it takes no job until its pod is deleted", self.settings.compactor_id)
        while not self.leave.wait(self.settings.idle_wake_poll_s):
            self._publish(DRAINING)

    # -- main loop -----------------------------------------------------------------------------------
    def _idle_wait(self, wait: float) -> None:
        """Wait up to ``wait`` seconds for work: a job queued for the group wakes this compactor
        at once (a BLPOP on the group's wake-up list, in a helper thread), a drain too; else
        the next poll comes after ``wait`` as before."""
        self._wake.clear()
        if self.drain.is_set():
            return
        if not self.settings.wake:
            self.drain.wait(wait)
            return

        def blpop() -> None:
            deadline = time.monotonic() + wait
            while not self._wake.is_set() and (left := deadline - time.monotonic()) > 0:
                try:  # one BLPOP waits at most WAKE_WAIT_MAX_S: the loop covers the rest
                    if self.queues.wait_for_work(self.settings.group, left):
                        self._wake.set()
                except StoreUnavailable:
                    return  # the main loop sees the outage on its next call

        threading.Thread(target=blpop, name="wake-up", daemon=True).start()
        self._wake.wait(wait + 0.5)

    def run(self) -> int:
        """Work until drained (or max_jobs reached). Returns the process exit code."""
        # start the engine (Spark session) once, before registering and declaring ready: an
        # engine that cannot start (a Spark master that does not answer) leaves no registration
        _ = self.engine
        # said once the engine runs (an engine that cannot start is the one line of the error)
        log.log(
            logging.WARNING if self.settings.unconfigured else logging.INFO,
            "compactor %s of group %s: %s (from %s)",
            self.settings.compactor_id,
            self.settings.group,
            self.settings.describe(),
            self.settings.source,
        )
        try:
            self._drain_flag()  # a restarted container of a draining pod: drained from the start
        except StoreUnavailable as exc:  # checked again before every job
            log.warning("metadata store unavailable: %s", exc)
        self._publish(DRAINING if self.drain.is_set() else IDLE)
        self.ready = True
        idle = self.settings.idle_min_s
        try:
            while not self.drain.is_set():
                try:
                    if self._drain_flag():
                        break
                    outcome = self.run_one()
                except StoreUnavailable as exc:
                    self._refuse_without_rights(exc)
                    log.warning("metadata store unavailable: %s", exc)
                    outcome = None
                if outcome is None or outcome.storage_down:
                    self._publish(IDLE)
                    cap = (
                        max(self.settings.idle_max_s, self.settings.idle_wake_poll_s)
                        if self.settings.wake
                        else self.settings.idle_max_s
                    )
                    wait = min(cap, idle) * random.uniform(0.9, 1.1)
                    if outcome is None:
                        self._idle_wait(wait)
                    else:  # the storage is down: back off, however much work is queued
                        self.drain.wait(wait)
                    idle = min(cap, idle * 2)
                    continue
                idle = self.settings.idle_min_s
                if self.settings.max_jobs is not None and self.jobs_done >= self.settings.max_jobs:
                    break
            if self.drain.is_set() and self.settings.stay_drained:
                self._publish(DRAINING)
                self._stay_drained()
        finally:
            self.ready = False
            keep = self.drain.is_set() and self.settings.stay_drained
            try:
                self.jobs.unregister(self.settings.group, self.settings.compactor_id, keep)
            except StoreUnavailable:
                pass
        return 0

    def run_one(self) -> JobOutcome | None:
        """Reserve and run one job; None when the queue was empty."""
        res = self.jobs.reserve(self.settings.group, self.settings.compactor_id)
        if res is None:
            return None
        reserved = time.time()
        self.current = res
        self._publish(BUSY)
        try:
            outcome = self._execute(res)
        finally:
            self.current = None
        self.jobs_done += 1
        self._remember(res, outcome, reserved)
        log.info("%s %s on %s: %s %s", res.ecid, res.job.kind, res.tablet, outcome.status, outcome.reason)
        return outcome

    def _remember(self, res: Reservation, outcome: JobOutcome, reserved: float) -> None:
        """The job's record in the group's history: written after its outcome is settled (after
        the commit's reply), one round trip — through the broker, which writes it into the
        reservation's group's stream, for a compactor that asks it — never failing the job."""
        rec = history.Record(
            ecid=res.ecid,
            outcome=outcome.recorded or history.FAILED,
            group=self.settings.group,
            table=res.table,
            tablet=res.tablet,
            kind=res.job.kind,
            compactor=self.settings.compactor_id,
            finished=time.time(),
            reason=outcome.reason,
            engine=getattr(self.engine, "name", self.settings.engine),
            input_files=len(res.inputs),
            input_bytes=sum(res.job.files.values()),
            queued_s=_queued_s(res, reserved),
            merge_s=outcome.figures.merge_s,
            resumed_parts=outcome.figures.resumed_parts,
            input_entries=outcome.figures.input_entries,
            output_bytes=outcome.figures.output_bytes,
            output_entries=outcome.figures.output_entries,
            deletes_dropped=outcome.figures.deletes_dropped,
            commit_s=outcome.figures.commit_s,
        )
        self.jobs.record_history(res, rec, self.settings.history_limits)

    # -- one job -------------------------------------------------------------------------------------
    def _still_wanted(self, res: Reservation) -> str | None:
        """Why the job is no longer wanted, or None."""
        t = self.store.tables.tablet(res.tablet)
        if t is None:
            return "tablet no longer exists (split, merged or table deleted)"
        if res.ecid not in t.running:
            return "compaction no longer registered"
        try:
            state = self.store.tables.table_info(res.table).state
        except KompaktorError:
            return "table deleted"
        if state != ONLINE:
            return f"table is {state}"
        if res.job.kind == "USER" and compactions.user_iterators(self.store, res.job.selection or "") is None:
            return "user compaction cancelled"
        return None

    def _execute(self, res: Reservation) -> JobOutcome:
        """Run the job's merge (on a thread of its own, watched from here), then settle it:
        released (cancelled, or failed) or committed."""
        job = self._prepare(res)
        self._merge(job)
        figures = self._merge_figures(job)
        return self._unfinished(job, figures) or self._finish(job, figures)

    def _prepare(self, res: Reservation) -> _Job:
        """The job's state before its merge: its resume record, when the merge is resumable, and
        the iterator settings (the first attempt's age-off cut, when one recorded progress)."""
        job = _Job(res, sum(res.job.files.values()), res.settings)
        # below the engine's threshold a merge is not resumable: no record is read or written
        # (small merges make no Redis request more than before); an engine given none never is
        threshold = getattr(self.engine, "resume_min_bytes", 0)
        if not (self.settings.resume and threshold is not None and job.input_bytes >= threshold):
            return job
        job.rlog = rlog = self.jobs.resume_log(res, res.fingerprint)
        try:
            state = rlog.load()
        except StoreUnavailable:
            state = None
        if state is not None:  # one age-off cut for every range of the output: the first attempt's
            job.settings = replace(job.settings, now_ms=state.now_ms)
        return job

    def _merge(self, job: _Job) -> None:
        """The merge on a thread of its own; this thread heartbeats and watches until it ends."""
        res = job.res

        def work() -> None:
            try:
                job.result = self.engine.merge(
                    self.storage,
                    MergeRequest(res.inputs, res.output, res.prev, res.end, job.settings, res.ecid, resume=job.rlog),
                    progress=job.progress.update,
                    cancel=job.cancel,
                )
            except BaseException as exc:
                job.error = exc

        started = time.monotonic()
        self.metrics.running.labels(self.settings.group).set(1)
        th = threading.Thread(target=work, name=f"merge-{res.ecid}", daemon=True)
        th.start()
        self._watch(job, th)
        self.metrics.running.labels(self.settings.group).set(0)
        job.elapsed = time.monotonic() - started

    def _watch(self, job: _Job, th: threading.Thread) -> None:
        """Until the merge ends: every ``heartbeat_s``, a heartbeat with the progress, the state
        published, whether the job is still wanted and whether Redis asks for a drain; a merge
        that cannot finish within a drain's grace period is cancelled."""
        next_check = 0.0
        while th.is_alive():
            th.join(timeout=min(0.25, self.settings.heartbeat_s))
            if not th.is_alive():
                break
            now = time.monotonic()
            if now >= next_check:
                next_check = now + self.settings.heartbeat_s
                why = self._heartbeat(job)
                if why:
                    job.stop(why)
            if self.drain.is_set() and not job.cancel.is_set() and self.drain_deadline is not None:
                remaining = self._remaining_s(job.input_bytes, job.progress)
                if now + remaining > self.drain_deadline or now >= self.drain_deadline:
                    job.stop("draining: cannot finish within the grace period")

    def _heartbeat(self, job: _Job) -> str | None:
        """One heartbeat of a running merge; why the job is no longer wanted, or None."""
        res, progress = job.res, job.progress
        try:
            left = self._remaining_s(job.input_bytes, progress)
            self.jobs.heartbeat(res, {**progress, "remaining_s": f"{left:.1f}"})
            self._publish(DRAINING if self.drain.is_set() else BUSY)
            why = self._still_wanted(res)
            if not self.drain.is_set():
                self._drain_flag()
        except StoreUnavailable as exc:  # keep merging; the commit is conditional anyway
            log.warning("heartbeat failed: %s", exc)
            why = None
        return why

    def _merge_figures(self, job: _Job) -> MergeFigures:
        """The resume counters, and the history record's figures as far as the merge knows them."""
        g, progress = self.settings.group, job.progress
        self.metrics.resume_parts_reused.labels(g).inc(int(progress.get("parts_reused", 0)))
        self.metrics.resume_bytes_reused.labels(g).inc(int(progress.get("bytes_reused", 0)))
        self.metrics.resume_parts_rejected.labels(g).inc(int(progress.get("parts_rejected", 0)))
        return MergeFigures(
            merge_s=round(job.elapsed, 3),
            resumed_parts=int(progress.get("parts_reused", 0)),
            input_entries=int(progress.get("entries_read", 0)) or None,
        )

    def _unfinished(self, job: _Job, figures: MergeFigures) -> JobOutcome | None:
        """A merge that did not finish: cancelled, or failed (the storage down, or the job
        itself); its job released. None when the merge finished."""
        res, g, err = job.res, self.settings.group, job.error
        if job.cancel.is_set() and (err is not None or job.result is None or job.reason is not None):
            self.jobs.release(self.storage, res)
            why = job.reason or "cancelled"
            if why.startswith(_JOB_GONE):
                self._discard_progress(job)
            self.metrics.cancelled.labels(g).inc()
            return JobOutcome("cancelled", why, res.ecid, recorded=history.CANCELLED, figures=figures)
        if err is not None and storage_unavailable(err):
            # the place failed, not the job: released for a later attempt, no failure counted
            # (an outage longer than the backoff must not dead-letter every job it touched)
            self.jobs.release(self.storage, res)
            self.metrics.failed.labels(g).inc()
            reason = f"storage unavailable: {' '.join(str(err).split())[:300]}"
            log.warning("%s released: %s", res.ecid, reason)
            return JobOutcome("failed", reason, res.ecid, storage_down=True, recorded=history.RETRIED, figures=figures)
        if err is not None:
            reason = str(err) if not isinstance(err, MergeCancelled) else "cancelled"
            self.jobs.release(self.storage, res)
            if isinstance(err, BadFileError):  # fails every attempt: nothing to resume
                self._discard_progress(job)
            dead = self.jobs.record_failure(res, reason)
            self.metrics.failed.labels(g).inc()
            log.error("%s failed: %s", res.ecid, reason)
            recorded = history.DEAD_LETTERED if dead else history.FAILED
            return JobOutcome("failed", reason, res.ecid, recorded=recorded, figures=figures)
        return None

    def _finish(self, job: _Job, figures: MergeFigures) -> JobOutcome:
        """A finished merge committed (:meth:`_commit`), its progress record removed; or, when the
        tablet changed under it or the store stays unreachable, failed."""
        res, result, rlog = job.res, job.result, job.rlog
        assert result is not None
        figures.input_entries = result.entries_read
        figures.output_bytes = result.bytes_written
        figures.output_entries = result.entries_written
        figures.deletes_dropped = result.deletes_dropped
        figures.resumed_parts = max(figures.resumed_parts, result.parts_reused)
        commit_started = time.monotonic()
        try:
            self._commit(res, result.info)
        except ConditionFailed as exc:
            self.jobs.release(self.storage, res)
            self._discard_progress(job)  # the job changed under it: its parts are of no use
            self.metrics.failed.labels(self.settings.group).inc()
            return JobOutcome("failed", f"commit {exc}", res.ecid, recorded=history.RETRIED, figures=figures)
        except StoreUnavailable as exc:
            # Whether the commit landed is unknown, so the output stays; if it did not land,
            # dead-compaction detection removes the ECID and the output once the store is back.
            self.metrics.failed.labels(self.settings.group).inc()
            log.error("%s: cannot commit, metadata store unreachable (gave up): %s", res.ecid, exc)
            reason = f"commit: metadata store unreachable: {exc}"
            return JobOutcome("failed", reason, res.ecid, recorded=history.FAILED, figures=figures)
        figures.commit_s = round(time.monotonic() - commit_started, 3)
        if rlog is not None:
            resume_records.finish(self.store, self.storage, rlog.fingerprint, result.parts, rlog.forget_record)
        self._count_committed(job, result)
        return JobOutcome("committed", "", res.ecid, recorded=history.COMMITTED, figures=figures)

    def _count_committed(self, job: _Job, result: MergeResult) -> None:
        """A committed job's metrics and counters, and the throughput its merge measured."""
        g, m, elapsed, input_bytes = self.settings.group, self.metrics, job.elapsed, job.input_bytes
        m.completed.labels(g).inc()
        m.entries_read.labels(g).inc(result.entries_read)
        m.entries_written.labels(g).inc(result.entries_written)
        m.bytes_read.labels(g).inc(result.bytes_read)
        m.bytes_written.labels(g).inc(result.bytes_written)
        m.duration.labels(g).observe(elapsed)
        try:
            self.jobs.count_written(result.bytes_written)
        except StoreUnavailable as exc:  # a statistic: the job is committed
            log.warning("bytes written not counted: %s", exc)
        if elapsed > 0 and input_bytes > 0:
            self.throughput = 0.7 * self.throughput + 0.3 * (input_bytes / elapsed)

    def _remaining_s(self, input_bytes: int, progress: MergeProgress) -> float:
        """Seconds the merge still needs: the input not read yet at the measured throughput."""
        return max(0.0, input_bytes - float(progress.get("bytes_read", 0))) / self.throughput

    def _discard_progress(self, job: _Job) -> None:
        """The job will not run again as it was: forget its progress, delete its parts."""
        rlog, result = job.rlog, job.result
        if rlog is None:
            return
        try:
            parts = tuple(result.parts) if result else ()
            resume_records.discard(self.store, self.storage, rlog.fingerprint, parts, rlog.forget_record)
        except StoreUnavailable as exc:  # the coordinator's pass prunes it
            log.warning("progress of %s left for the garbage collector: %s", rlog.fingerprint[:16], exc)

    def _commit(self, res: Reservation, info: FileInfo) -> None:
        """Commit the merged output. While the store is unreachable, retry (the merge's work is
        worth keeping), with backoff up to 2 s, until ``commit_retry_s`` (default: no limit) or
        the drain deadline has passed. A retry that is
        rejected because an earlier attempt landed (its reply was lost) is a success: failing it
        would delete an output the tablet now references."""
        deadline = (
            float("inf") if self.settings.commit_retry_s is None else time.monotonic() + self.settings.commit_retry_s
        )
        attempted = False
        pause = 0.5
        warned = 0.0
        while True:
            try:
                self.jobs.commit(res, info.meta)
                return
            except ConditionFailed:
                if attempted and self._landed(res, info):
                    log.info("%s: an earlier commit attempt landed", res.ecid)
                    self.jobs.drop_heartbeat(res)
                    return
                raise
            except StoreUnavailable as exc:
                attempted = True
                now = time.monotonic()
                if now >= deadline or (self.drain_deadline is not None and now >= self.drain_deadline):
                    raise
                if now - warned >= 30.0:  # one line per half minute of outage, not per attempt
                    warned = now
                    log.warning("%s: commit failed, metadata store unreachable; retrying: %s", res.ecid, exc)
                time.sleep(pause)
                pause = min(2.0, pause * 2)

    def _landed(self, res: Reservation, info: FileInfo) -> bool:
        t = self.store.tables.tablet(res.tablet)
        if t is None or res.ecid in t.running:
            return False
        if info.entries > 0:
            return res.output in t.files
        return not set(res.inputs) & set(t.files)

    # -- HTTP: probes, drain, metrics ------------------------------------------------------------------
    def serve_http(self, port: int, host: str = "0.0.0.0", drain_token: Callable[[], str | None] | None = None) -> int:
        """Serve the compactor's endpoints (:mod:`kompaktor.worker.http`; ``drain_token`` authorizes
        ``POST /drain`` from elsewhere than loopback); returns the port."""
        self._http = serve(self, port, host, drain_token)
        return self._http.server_address[1]

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
