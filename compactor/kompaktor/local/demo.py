"""`kompaktor demo`: local cluster + continuous ingest + drain + verification + summary."""

from __future__ import annotations

import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kompaktor.client import Client
from kompaktor.files.storage import Storage
from kompaktor.local.cluster import LocalCluster
from kompaktor.local.config import DEMO_CONFIG, LocalConfig, load_config
from kompaktor.local.ingest import ContinuousIngest, split_points, verify
from kompaktor.metadata.status import gather
from kompaktor.model.errors import StoreUnavailable


@dataclass
class DemoOptions:
    entries: int = 200_000
    tablets: int = 4
    compactors: int | None = None  # max compactors per group (overrides the config)
    duration_s: float = 60.0
    batch: int = 1500
    drain_timeout_s: float = 240.0
    data_dir: str | None = None
    redis_url: str | None = None
    config_text: str = DEMO_CONFIG
    table: str = "ci"
    live: bool = True
    chaos: bool = False
    chaos_seed: int = 7
    chaos_interval_s: float = 3.0


@dataclass
class DemoResult:
    verified: bool
    summary: dict[str, Any]
    status: dict[str, Any] = field(default_factory=dict)
    #: (seconds, entries ingested, average files per tablet, compactions committed), sampled
    samples: list[tuple[float, int, float, int]] = field(default_factory=list)


def _apply_compactors(cfg: LocalConfig, n: int | None) -> LocalConfig:
    if n is None:
        return cfg
    from dataclasses import replace

    groups = {k: replace(g, max_replicas=max(n, g.min_replicas)) for k, g in cfg.groups.items()}
    return LocalConfig(cfg.services, groups)


def _progress_table(ingest_stats, status: dict[str, Any], phase: str, elapsed: float):
    from rich.table import Table

    t = Table(title=f"kompaktor demo — {phase} — {elapsed:.0f}s", expand=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    t.add_row("entries ingested", f"{ingest_stats.entries:,}")
    t.add_row("ingest rate", f"{ingest_stats.rate:,.0f} entries/s")
    t.add_row("files flushed", f"{ingest_stats.files:,}")
    for g, s in status.get("groups", {}).items():
        t.add_row(f"group {g}", f"queued {s['queued']} · running {s['running']} · compactors {s['compactors']} "
                                f"· committed {s['compactions_committed']}")
    for name, tb in status.get("tables", {}).items():
        f = tb["files_per_tablet"]
        t.add_row(f"table {name} files/tablet", f"min {f['min']} · median {f['median']} · max {f['max']}")
    return t


def run_demo(opts: DemoOptions) -> DemoResult:
    from rich.console import Console
    from rich.live import Live

    console = Console()
    cfg = _apply_compactors(load_config(opts.config_text), opts.compactors)
    data_dir = Path(opts.data_dir or tempfile.mkdtemp(prefix="kompaktor-demo-"))
    coord_args = ["--full-scan-interval", "10", "--gc-grace", "5", "--gc-interval", "5"]
    if opts.chaos:
        coord_args += ["--dead-after", "5"]
    cluster = LocalCluster(cfg, data_dir, redis_url=opts.redis_url, coordinator_args=coord_args)
    chaos = None
    started = time.monotonic()
    stop_scaler = threading.Event()
    status: dict[str, Any] = {}
    max_files_seen = 0
    samples: list[tuple[float, int, float, int]] = []
    try:
        cluster.start()
        store = cluster.store
        assert store is not None
        client = Client(store, Storage.from_uri(cluster.storage_uri))
        store.create_table(opts.table, split_points(opts.tablets))
        ingest = ContinuousIngest(client, opts.table, batch=opts.batch)
        if opts.chaos:
            from kompaktor.local.chaos import Chaos

            chaos = Chaos(cluster, seed=opts.chaos_seed, interval_s=opts.chaos_interval_s)
            chaos.start()

        def scaler() -> None:
            while not stop_scaler.wait(1.0):
                try:
                    cluster.autoscale()
                except Exception:
                    pass

        th = threading.Thread(target=scaler, daemon=True)
        th.start()
        phase = "ingest"
        with Live(console=console, refresh_per_second=2, transient=False, auto_refresh=False) as live:
            def show() -> None:
                nonlocal status, max_files_seen
                try:
                    status = gather(store)
                except StoreUnavailable:
                    return  # Redis is restarting (chaos): show the last status
                for tb in status["tables"].values():
                    max_files_seen = max(max_files_seen, tb["files_per_tablet"]["max"])
                tb = status["tables"].get(opts.table)
                if tb is not None:
                    samples.append((round(time.monotonic() - started, 2), ingest.stats.entries,
                                    tb["files"] / max(1, tb["tablets"]),
                                    sum(g["compactions_committed"] for g in status["groups"].values())))
                if opts.live:
                    live.update(_progress_table(ingest.stats, status, phase, time.monotonic() - started),
                                refresh=True)

            last = [0.0]

            def on_flush(_s) -> None:
                if time.monotonic() - last[0] > 0.5:
                    last[0] = time.monotonic()
                    show()

            ingest.run(entries=opts.entries, duration_s=opts.duration_s, on_flush=on_flush)
            if chaos is not None:
                while chaos.thread.is_alive() and chaos.plan and time.monotonic() - started < opts.duration_s * 2:
                    show()  # let the rest of the fault schedule happen while compactions run
                    time.sleep(0.5)
                chaos.finish()
            phase = "draining queues"
            ingest_wall = time.monotonic() - started
            deadline = time.monotonic() + opts.drain_timeout_s
            quiet = 0
            while time.monotonic() < deadline:
                show()
                # done when nothing is queued or running, nothing waits to be planned, and no
                # failed job (a killed compactor's) waits out its backoff before being re-planned
                busy = sum(g["depth"] for g in status["groups"].values()) + status.get("retries_pending", 0)
                dirty = store.dirty_count()
                quiet = quiet + 1 if busy == 0 and dirty == 0 else 0
                if quiet >= 4:
                    break
                time.sleep(0.5)
            phase = "verifying"
            show()
        drained = quiet >= 4
        chaos_summary: dict[str, Any] = {}
        chaos_ok = True
        if chaos is not None:
            chaos_summary, chaos_ok = check_chaos(chaos.log, store, client.storage)
        v = verify(client, opts.table, ingest.stats)
        status = gather(store)
        tb = status["tables"][opts.table]
        max_files = cfg.services["default"].max_files_per_tablet if "default" in cfg.services else 15
        bound_ok = tb["files_per_tablet"]["max"] <= (max_files if max_files > 0 else 99)
        verified = v.ok and drained and bound_ok and chaos_ok
        counters = status["counters"]
        summary = {
            "entries written": ingest.stats.entries,
            "entries scanned": v.entries,
            "undefined references": v.undefined,
            "deleted entries resurrected": v.resurrected,
            "live ephemeral entries lost": v.lost_ephemeral,
            "files flushed": ingest.stats.files,
            "max files per tablet during ingest": max_files_seen,
            "files after": tb["files"],
            "files per tablet after (max)": tb["files_per_tablet"]["max"],
            **{f"compactions run ({g})": s["compactions_committed"] for g, s in status["groups"].items()},
            "bytes written by compactions": counters.get("bytes_written", 0),
            "dead compactions": counters.get("dead_compactions", 0),
        "jobs dead-lettered": len(status["dead_letters"]),
            "ingest rate (entries/s)": round(ingest.stats.entries / max(ingest_wall, 1e-9)),
            "wall time (s)": round(time.monotonic() - started, 1),
            "queues drained": drained,
            **chaos_summary,
            "verified": "yes" if verified else "no",
        }
        return DemoResult(verified, summary, status, samples)
    finally:
        stop_scaler.set()
        cluster.stop()


def check_chaos(log, store, storage) -> tuple[dict[str, Any], bool]:
    """After the queues drained: every SIGKILLed compaction was detected dead and its tablet
    compacted again; SIGTERMed compactors caused no dead compaction; no running compaction is
    left; after garbage collection every file in storage is referenced and no temp file is left."""
    from kompaktor.coordinator import Coordinator, CoordinatorSettings

    dead = store.dead_log()
    killed = [ecid for ecid, _t in log.killed]
    detected = sum(1 for e in killed if e in dead)
    rerun = sum(1 for _e, t in log.killed
                if store.commits_on(t) > log.commits_at_kill.get(t, 0))
    term_dead = sum(1 for e in log.termed if e in dead)
    running_left = store.running_count()
    gc = Coordinator(store, storage, CoordinatorSettings())
    gc.collect_garbage(grace_s=0)
    referenced = {f for t in store.iter_all_tablets() for f in t.files}
    on_disk = [rel for rel, _m in storage.list_files("tables")]
    stray = [f for f in on_disk if f not in referenced]
    ok = (detected == len(killed) and rerun == len(killed) and term_dead == 0 and running_left == 0
          and not stray and log.redis_restarts == 1 and log.coordinator_restarts >= 1)
    return {
        "chaos: compactors SIGKILLed mid-merge": len(killed),
        "chaos: busy compactors SIGTERMed": len(log.termed),
        "chaos: coordinator restarts": log.coordinator_restarts,
        "chaos: Redis restarts": log.redis_restarts,
        "chaos: dead compactions detected (of the killed)": detected,
        "chaos: killed jobs re-run": rerun,
        "chaos: dead compactions from SIGTERM": term_dead,
        "chaos: running compactions left": running_left,
        "chaos: unreferenced or temp files after GC": len(stray),
    }, ok


def print_summary(result: DemoResult) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="kompaktor demo — summary")
    t.add_column("measure")
    t.add_column("value", justify="right")
    for k, v in result.summary.items():
        t.add_row(k, f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v))
    Console().print(t)
