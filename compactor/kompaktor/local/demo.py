"""`kompaktor demo`: local cluster + continuous ingest + a burst + drain + verification + summary.

Phases: steady ingest (paced flushes); a burst (one bulk import of many files spanning every
tablet, then a user compaction of the whole table: the queues fill at once, the autoscaler takes
each group to its maximum and drains it back to its minimum); draining the queues; verification;
the summary. Each phase is a method of :class:`_DemoRun`, which holds what they share.
The temporary data directory is removed at the end (kept when verification fails, and never
touched when ``data_dir`` is given); every child process is stopped however the run ends
(:mod:`kompaktor.local.procs`).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kompaktor.client import Client
from kompaktor.files.storage import Storage
from kompaktor.local.chaoscheck import check_chaos
from kompaktor.local.cluster import GroupSample, LocalCluster, Proc
from kompaktor.local.config import DEMO_CONFIG, LocalConfig, load_config
from kompaktor.local.ingest import ContinuousIngest, IngestStats, Verification, split_points, verify
from kompaktor.local.mix import MixCheck, MixedWorkload, mix_summary
from kompaktor.local.procs import interruptible
from kompaktor.metadata import user_compactions
from kompaktor.metadata.status import Status, gather, no_status
from kompaktor.model.errors import StoreUnavailable

if TYPE_CHECKING:
    from rich.table import Table


@dataclass
class DemoOptions:
    entries: int = 150_000  # steady ingest
    tablets: int = 4
    compactors: int | None = None  # max compactors per group (overrides the config)
    duration_s: float = 45.0
    batch: int = 1500
    burst_entries: int = 50_000  # bulk-imported after the steady ingest (0: no burst)
    burst_files: int = 40
    drain_timeout_s: float = 240.0
    data_dir: str | None = None
    redis_url: str | None = None
    storage: str | None = None  # data files elsewhere than under data_dir (e.g. s3://bucket/prefix)
    config_text: str = DEMO_CONFIG
    table: str = "ci"
    live: bool = True
    chaos: bool = False
    chaos_seed: int = 7
    chaos_interval_s: float = 3.0
    #: a local HA Redis (primary, replica, three sentinels) instead of one redis-server; with
    #: chaos, the Redis faults are then two SIGKILLs of the primary (failovers)
    ha: bool = False
    #: how child processes run the ``kompaktor`` CLI (None: this Python's ``-m kompaktor``)
    command: list[str] | None = None
    #: "plain" (the continuous ingest) or "mix": beside it, the workload of kompaktor.local.mix
    #: (deletes, old imports, --set-time, overlapping imports, splits, merges, user compactions)
    workload: str = "plain"
    #: called once the burst import is acknowledged, before its user compaction starts
    on_burst: Callable[[], None] | None = None
    #: the coordinator serves the status page on this port of 127.0.0.1 while the demo runs (0: a
    #: free port; None: none); ``on_status_page`` is told its address once it is up
    status_port: int | None = 0
    on_status_page: Callable[[str], None] | None = None


@dataclass
class DemoResult:
    verified: bool
    summary: dict[str, object]
    status: Status = field(default_factory=no_status)
    #: (seconds, entries ingested, average files per tablet, compactions committed), sampled
    samples: list[tuple[float, int, float, int]] = field(default_factory=list)
    #: desired and actual compactors per group, one sample per autoscaler pass
    timeline: list[GroupSample] = field(default_factory=list)
    #: where the data stayed (given with data_dir, or kept because verification failed); else None
    data_kept: str | None = None


def _apply_compactors(cfg: LocalConfig, n: int | None) -> LocalConfig:
    if n is None:
        return cfg
    from dataclasses import replace

    groups = {k: replace(g, max_replicas=max(n, g.min_replicas)) for k, g in cfg.groups.items()}
    return LocalConfig(cfg.services, groups)


def _bar(up: int, draining: int, hi: int) -> str:
    return "■" * up + "▫" * draining + "·" * max(0, hi - up - draining)


def _progress_table(
    ingest_stats: IngestStats,
    status: Status,
    phase: str,
    elapsed: float,
    scaling: dict[str, GroupSample],
    cfg: LocalConfig,
) -> Table:
    from rich.table import Table

    t = Table(title=f"kompaktor demo — {phase} — {elapsed:.0f}s", expand=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    t.add_row("entries ingested", f"{ingest_stats.entries:,}")
    t.add_row("ingest rate", f"{ingest_stats.rate:,.0f} entries/s")
    files = f"{ingest_stats.files:,}"
    if ingest_stats.imported_files:
        files += f" (+{ingest_stats.imported_files:,} imported)"
    t.add_row("files flushed", files)
    for g, s in status.get("groups", {}).items():
        t.add_row(
            f"group {g}", f"queued {s['queued']} · running {s['running']} · committed {s['compactions_committed']}"
        )
        sample, gc = scaling.get(g), cfg.groups.get(g)
        if sample is not None and gc is not None:
            t.add_row(
                f"  compactors {g}",
                f"desired {sample.desired} · actual {sample.up} · draining {sample.draining} "
                f"(min {gc.min_replicas}, max {gc.max_replicas})  "
                f"{_bar(sample.up, sample.draining, gc.max_replicas)}",
            )
    for name, tb in status.get("tables", {}).items():
        f = tb["files_per_tablet"]
        t.add_row(f"table {name} files/tablet", f"min {f['min']} · median {f['median']} · max {f['max']}")
    return t


def scaling_summary(cfg: LocalConfig, timeline: list[GroupSample], burst_at: float | None) -> dict[str, object]:
    """Per group: the most compactors up at once, and seconds from the burst until the group
    first had its maximum up (None: never reached, or no burst)."""
    out: dict[str, object] = {}
    for g, gc in cfg.groups.items():
        samples = [x for x in timeline if x.group == g]
        out[f"most compactors ({g}, max {gc.max_replicas})"] = max((x.up for x in samples), default=0)
    for g, gc in cfg.groups.items():
        reached = None
        if burst_at is not None:
            reached = next(
                (
                    round(x.t - burst_at, 1)
                    for x in timeline
                    if x.group == g and x.t >= burst_at and x.up >= gc.max_replicas
                ),
                None,
            )
        out[f"seconds from burst to maximum ({g})"] = reached if reached is not None else "not reached"
    return out


def _scaled_back(cfg: LocalConfig, cluster: LocalCluster) -> bool:
    """Every group back at its minimum, nothing still draining (as of the last autoscaler pass)."""
    last: dict[str, GroupSample] = {}
    for x in cluster.timeline[-4 * max(1, len(cfg.groups)) :]:
        last[x.group] = x
    return all(
        g in last and last[g].desired == gc.min_replicas and last[g].up == gc.min_replicas and last[g].draining == 0
        for g, gc in cfg.groups.items()
    )


def run_demo(opts: DemoOptions) -> DemoResult:
    cfg = _apply_compactors(load_config(opts.config_text), opts.compactors)
    owned = opts.data_dir is None
    data_dir = Path(opts.data_dir or tempfile.mkdtemp(prefix="kompaktor-demo-"))
    keep = not owned
    try:
        coord_args = ["--full-scan-interval", "10", "--gc-grace", "5", "--gc-interval", "5"]
        if opts.chaos:
            coord_args += ["--dead-after", "5"]
        cluster = LocalCluster(
            cfg,
            data_dir,
            redis_url=opts.redis_url,
            coordinator_args=coord_args,
            ha=opts.ha and opts.redis_url is None,
            storage=opts.storage,
            status_port=opts.status_port,
        )
        if opts.command is not None:
            cluster.command = list(opts.command)
        # SIGINT, SIGTERM, SIGHUP: Interrupted, and the clean-up below drains and stops every
        # process; a second signal kills them instead of waiting for the drain
        with interruptible(on_second=cluster.kill):
            try:
                res = _run(opts, cfg, cluster, data_dir)
                keep = keep or not res.verified
                res.data_kept = str(data_dir) if keep else None
                return res
            finally:
                try:
                    cluster.stop()
                except BaseException:
                    cluster.kill()  # failed or interrupted while stopping: nothing is left running
                    raise
    finally:
        if not keep:
            shutil.rmtree(data_dir, ignore_errors=True)


def _run(opts: DemoOptions, cfg: LocalConfig, cluster: LocalCluster, data_dir: Path) -> DemoResult:
    """The demo's phases, in order, on a cluster not yet started (:func:`run_demo` stops it)."""
    from rich.console import Console
    from rich.live import Live

    run = _DemoRun(opts, cfg, cluster, data_dir)
    try:
        run.setup()
        with Live(console=Console(), refresh_per_second=2, transient=False, auto_refresh=False) as live:
            run.live = live
            run.ingest()
            run.await_fault_schedule()
            run.burst()
            drained = run.drain()
            run.show_phase("verifying")
        return run.report(run.verify(drained))
    finally:
        run.stop()


@dataclass
class _Checks:
    """What verification found (:meth:`_DemoRun.verify`)."""

    scan: Verification
    mix: MixCheck | None
    drained: bool
    scaled_back: bool
    chaos_summary: dict[str, object]
    status: Status
    busy_terminated: list[Proc]
    drains: list[Proc]
    verified: bool


class _DemoRun:
    """One demo run's state, shared by its phases: setup, steady ingest, the rest of the fault
    schedule (chaos), the burst, draining the queues, verification and the report. A phase shows
    its progress (:meth:`show`) while it runs."""

    def __init__(self, opts: DemoOptions, cfg: LocalConfig, cluster: LocalCluster, data_dir: Path) -> None:
        self.opts, self.cfg, self.cluster, self.data_dir = opts, cfg, cluster, data_dir
        self.started = time.monotonic()
        self.chaos: Any = None  # kompaktor.local.chaos.Chaos, with opts.chaos
        self.stop_scaler = threading.Event()
        self.scaler: threading.Thread | None = None
        self.live: Any = None  # rich.live.Live, while the phases run
        self.phase = "ingest"
        self.status: Status = no_status()
        self.max_files_seen = 0
        self.max_files_burst = 0
        self.samples: list[tuple[float, int, float, int]] = []
        self.burst_at: float | None = None
        self.user_compaction: str | None = None
        self.ingest_wall = 0.0
        self.steady_entries = 0

    # -- setup ------------------------------------------------------------------------------------
    def setup(self) -> None:
        """Start the cluster, create the table, start the faults (chaos) and the autoscaler."""
        self.cluster.start()
        if self.opts.on_status_page is not None and self.cluster.status_url:
            self.opts.on_status_page(self.cluster.status_url)
        store = self.cluster.store
        assert store is not None
        self.store = store
        self.client = Client(store, Storage.from_uri(self.cluster.storage_uri))
        store.tables.create_table(self.opts.table, split_points(self.opts.tablets))
        self.ingester = ContinuousIngest(self.client, self.opts.table, batch=self.opts.batch)
        self.mix = (
            MixedWorkload(self.client, f"{self.opts.table}-mix", self.data_dir / "mix", seed=self.opts.chaos_seed)
            if self.opts.workload == "mix"
            else None
        )
        if self.opts.chaos:
            from kompaktor.local.chaos import Chaos

            self.chaos = Chaos(self.cluster, seed=self.opts.chaos_seed, interval_s=self.opts.chaos_interval_s)
            self.chaos.start()
        self.scaler = threading.Thread(target=self._autoscale, name="autoscaler", daemon=True)
        self.scaler.start()

    def _autoscale(self) -> None:
        while not self.stop_scaler.wait(0.5):
            try:
                self.cluster.autoscale()
            except Exception:
                pass

    def stop(self) -> None:
        """However the run ends: the autoscaler and the faults stop."""
        self.stop_scaler.set()
        if self.chaos is not None:
            self.chaos.stop.set()

    # -- progress ---------------------------------------------------------------------------------
    def show(self) -> None:
        """Sample the status (files per tablet, compactions) and show it."""
        try:
            self.status = gather(self.store)
        except StoreUnavailable:
            return  # Redis is restarting (chaos): show the last status
        status = self.status
        for figures in status["tables"].values():
            if self.burst_at is None:
                self.max_files_seen = max(self.max_files_seen, figures["files_per_tablet"]["max"])
            else:
                self.max_files_burst = max(self.max_files_burst, figures["files_per_tablet"]["max"])
        tb = status["tables"].get(self.opts.table)
        if tb is not None:
            self.samples.append(
                (
                    round(time.monotonic() - self.started, 2),
                    self.ingester.stats.entries,
                    tb["files"] / max(1, tb["tablets"]),
                    sum(g["compactions_committed"] for g in status["groups"].values()),
                )
            )
        if self.opts.live:
            scaling = {x.group: x for x in self.cluster.timeline[-4 * len(self.cfg.groups) :]}
            self.live.update(
                _progress_table(
                    self.ingester.stats, status, self.phase, time.monotonic() - self.started, scaling, self.cfg
                ),
                refresh=True,
            )

    def show_phase(self, phase: str) -> None:
        self.phase = phase
        self.show()

    # -- steady ingest ----------------------------------------------------------------------------
    def ingest(self) -> None:
        """Paced flushes of the continuous ingest, the progress shown at most twice a second."""
        last = [0.0]

        def on_flush(_s: IngestStats) -> None:
            if self.mix is not None:
                self.mix.step()
            if time.monotonic() - last[0] > 0.5:
                last[0] = time.monotonic()
                self.show()

        self.ingester.run(entries=self.opts.entries, duration_s=self.opts.duration_s, on_flush=on_flush)

    # -- faults -----------------------------------------------------------------------------------
    def await_fault_schedule(self) -> None:
        """With chaos: let the rest of the fault schedule happen while compactions run. Then the
        steady ingest's wall time and entries are taken."""
        chaos = self.chaos
        if chaos is not None:
            # let the rest of the fault schedule happen while compactions run (failovers take a
            # few seconds each: an HA run gets longer for it)
            limit = self.opts.duration_s * (3 if self.cluster.redis_ha is not None else 2)
            while chaos.thread.is_alive() and chaos.plan and time.monotonic() - self.started < limit:
                self.show()
                time.sleep(0.5)
            if chaos.plan and chaos.plan[0] == "failover-commit":
                # no commit came while the replica was frozen (few compactions run after the
                # ingest): the primary's SIGKILL mid-commit waits for the burst's commits, and
                # the drain below waits for it
                chaos.plan[1:] = []
            else:
                chaos.finish()
        self.ingest_wall = time.monotonic() - self.started
        self.steady_entries = self.ingester.stats.entries

    # -- burst ------------------------------------------------------------------------------------
    def burst(self) -> None:
        """One bulk import of many files spanning every tablet, then a user compaction of the whole
        table (none when ``burst_entries`` is 0)."""
        opts, chaos = self.opts, self.chaos
        if opts.burst_entries <= 0:
            self.phase = "draining queues"
            return
        self.show_phase(f"burst: importing {opts.burst_files} files")
        if chaos is not None:
            chaos.hold_redis.set()  # the import and the user compaction's start are not retried
        self.ingester.import_burst(opts.burst_entries, opts.burst_files, self.data_dir / "burst")
        self.burst_at = time.monotonic()
        if opts.on_burst is not None:
            opts.on_burst()
        # and a user compaction of the whole table: once the import's small merges are
        # done, every tablet is compacted to one file by the large group
        self.user_compaction = user_compactions.start(self.store, opts.table)
        if chaos is not None:
            chaos.hold_redis.clear()
        self.show_phase("burst: scaling up")

    # -- drain ------------------------------------------------------------------------------------
    def drain(self) -> bool:
        """Wait (up to ``drain_timeout_s``) until nothing is left to do and every group is back at
        its minimum; True when the queues drained. The fault schedule ends here."""
        opts, chaos, store, cluster = self.opts, self.chaos, self.store, self.cluster
        deadline = time.monotonic() + opts.drain_timeout_s
        quiet = 0
        quiet_since = 0.0
        while time.monotonic() < deadline:
            self.show()
            status = self.status
            # done when nothing is queued or running, nothing waits to be planned, no failed
            # job (a killed compactor's) waits out its backoff before being re-planned, and
            # the autoscaler has drained every group back to its minimum
            busy = sum(g["depth"] for g in status["groups"].values()) + status.get("retries_pending", 0)
            busy += sum(u["state"] == user_compactions.RUNNING for u in status.get("user_compactions", []))
            try:
                dirty = store.bookkeeping.dirty_count()
            except StoreUnavailable:  # a failover (chaos): look again
                time.sleep(0.5)
                continue
            if chaos is not None and chaos.plan and chaos.thread.is_alive():
                if busy == 0 and dirty == 0:
                    # the fault schedule waits for a commit (the failover mid-commit) and nothing
                    # is left to commit: compact the whole table once more to give it some
                    chaos.hold_redis.set()  # a user compaction's start is not retried
                    try:
                        user_compactions.start(store, opts.table)
                    except StoreUnavailable:
                        pass
                    finally:
                        chaos.hold_redis.clear()
                busy += 1  # the fault schedule is not through
            idle = busy == 0 and dirty == 0
            quiet = quiet + 1 if idle else 0
            if quiet == 1:
                quiet_since = time.monotonic()
            if self.burst_at is not None and idle:
                self.phase = "burst: draining compactors"
            # the scale-down follows within the autoscaler's window; a group that cannot get
            # back to its minimum (a compactor that fails to start) does not hold the demo up
            if quiet >= 4 and (
                _scaled_back(self.cfg, cluster) or time.monotonic() - quiet_since > cluster.scale_down_window_s + 30
            ):
                break
            time.sleep(0.5)
        if chaos is not None:
            chaos.finish()
        return quiet >= 4

    # -- verify -----------------------------------------------------------------------------------
    def verify(self, drained: bool) -> _Checks:
        """The faults' aftermath (chaos), a scan of the table against what was ingested, then the
        autoscaler and every compactor stopped and the final status taken."""
        cfg, cluster, chaos, store = self.cfg, self.cluster, self.chaos, self.store
        stats = self.ingester.stats
        scaled_back = _scaled_back(cfg, cluster)
        chaos_summary: dict[str, object] = {}
        chaos_ok = True
        if chaos is not None:
            acked = stats.flushes + (1 if stats.imported_files else 0)  # flushes + the import
            chaos_summary, chaos_ok = check_chaos(
                chaos.log,
                store,
                self.client.storage,
                ha=cluster.redis_ha is not None,
                logs=self.data_dir / "logs",
                acked_writes=acked,
            )
        scan = verify(self.client, self.opts.table, stats)
        mix = self.mix.check() if self.mix is not None else None
        self.stop_scaler.set()
        assert self.scaler is not None
        self.scaler.join(timeout=30)
        # the compactors' last exits count too: drain them all now, while Redis can tell whether
        # any of them still held a compaction
        cluster.stop_compactors()
        status = self.status = gather(store)
        tb = status["tables"][self.opts.table]
        max_files = cfg.services["default"].max_files_per_tablet if "default" in cfg.services else 15
        bound_ok = tb["files_per_tablet"]["max"] <= (max_files if max_files > 0 else 99)
        chaos_killed = {ecid for ecid, _t in chaos.log.killed} if chaos is not None else set()
        busy_terminated = [p for p in cluster.exited if p.held_ecid and p.held_ecid not in chaos_killed]
        drains = [p for p in cluster.exited if p.scaled_down and p.returncode == 0]
        verified = scan.ok and drained and bound_ok and chaos_ok and not busy_terminated and (mix is None or mix.ok)
        return _Checks(scan, mix, drained, scaled_back, chaos_summary, status, busy_terminated, drains, verified)

    # -- report -----------------------------------------------------------------------------------
    def report(self, checks: _Checks) -> DemoResult:
        """The summary, in the order it is printed."""
        stats, status, v = self.ingester.stats, checks.status, checks.scan
        tb = status["tables"][self.opts.table]
        counters = status["counters"]
        summary = {
            "entries written": stats.entries,
            "entries scanned": v.entries,
            "undefined references": v.undefined,
            "deleted entries resurrected": v.resurrected,
            "live ephemeral entries lost": v.lost_ephemeral,
            "entries not as acknowledged (time, visibility, value)": v.changed,
            "rows shown twice": v.duplicated,
            "referenced files missing": v.missing_files,
            **({"verification found": "; ".join(v.findings)} if v.findings else {}),
            "files flushed": stats.files,
            "files imported (burst)": stats.imported_files,
            "max files per tablet during ingest": self.max_files_seen,
            **(
                {"max files per tablet after the burst import": self.max_files_burst}
                if self.burst_at is not None
                else {}
            ),
            "files after": tb["files"],
            "files per tablet after (max)": tb["files_per_tablet"]["max"],
            **{f"compactions run ({g})": s["compactions_committed"] for g, s in status["groups"].items()},
            "bytes written by compactions": counters.get("bytes_written", 0),
            "dead compactions": counters.get("dead_compactions", 0),
            "jobs dead-lettered": len(status["dead_letters"]),
            **(
                {"user compaction of the whole table": user_compactions.get(self.store, self.user_compaction).state}
                if self.user_compaction
                else {}
            ),
            **scaling_summary(self.cfg, self.cluster.timeline, self.burst_at),
            "compactors drained (scale-down)": len(checks.drains),
            "busy compactors terminated": len(checks.busy_terminated),
            "ingest rate (entries/s)": round(self.steady_entries / max(self.ingest_wall, 1e-9)),
            "wall time (s)": round(time.monotonic() - self.started, 1),
            "queues drained": checks.drained,
            "groups back at minimum": checks.scaled_back,
            **checks.chaos_summary,
            **(mix_summary(checks.mix) if checks.mix is not None else {}),
            "verified": "yes" if checks.verified else "no",
        }
        return DemoResult(checks.verified, summary, status, self.samples, list(self.cluster.timeline))


def print_summary(result: DemoResult) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="kompaktor demo — summary")
    t.add_column("measure")
    t.add_column("value", justify="right")
    for k, v in result.summary.items():
        t.add_row(k, f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v))
    Console().print(t)
