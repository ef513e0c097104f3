"""`python -m bench.soak --minutes N`: hours, not minutes (issue 24).

Continuous ingest into several tables (flushes, bulk imports now and then, tablet splits and
merges, a user compaction now and then) with the coordinator and autoscaled compactors of
`kompaktor up` — both engines (the demo's groups: `small` merges with Arrow, `large` with Spark) —
on the local HA Redis (a primary, a replica, three sentinels), with faults on a seeded schedule
throughout: SIGKILL and SIGTERM of busy compactors, SIGKILL of idle ones, coordinator restarts,
a second coordinator taking over from a killed first, SIGKILL of the Redis primary mid-ingest or
mid-commit (Sentinel promotes the replica), a Redis outage of 20 s (every server frozen), the
storage turned read-only for 20 s (a read-only bind mount over it: merges fail and are retried
without counting against their jobs; ingest waits it out; needs root, skipped otherwise).

Every `--sample` seconds it samples each long-lived process (RSS, open fds, threads, child
processes), Redis (used memory, keys by family, queue lengths) and storage (files referenced and
present, temporary files, Spark's local directories): `bench/out/soak.csv` and `soak.png`.

At the end it drains, collects garbage and verifies — every acknowledged write scanned exactly
(its timestamp and value too), no undefined reference, no resurrected delete, no commit lost or
applied twice, every killed compaction re-run, no garbage, at most 0.1 % of the mix's keys left
uncertain — and prints one line that scripts rely on (docs/verification.md):

    soak: verified=yes|no minutes=N compactions=N faults=N failovers=N rss_growth_max_pct=X
    fd_growth_max=N redis_keys_after=N redis_keys_baseline=N garbage_files=N

Growth is measured per process over its own life: from the end of its own warm-up (10 minutes
after its first sample, or a third of a shorter run) to its last sample; a process counts when
that window is at least as long as the warm-up. `verified=yes` needs every process that lived
20 minutes within the limits from its 10th minute on (RSS <= +10 %, fds <= +5;
:func:`judge_limits`). The Redis servers are measured per process too, without the buffers their
configuration bounds (see :meth:`Soak._sample_redis`).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from bench import common
from tests.support.growth import FD_LIMIT, LIMIT_WARM_MIN, RSS_LIMIT_PCT, Sample, growth_per_process, judge_limits
from tests.support.rawredis import raw_redis

#: the faults the soak injects (docs/architecture.md, "Running for hours: the soak")
FAULT_KINDS = ("kill", "term", "kill-idle", "coordinator", "takeover", "failover", "outage", "readonly")
#: what each full hour of a soak must have done for `verified` (docs/verification.md): at least
#: this many faults of each kind (a failover is the rarest: about one an hour at the default
#: interval), and compactions committed (recorded hours: 2,700 to 3,900)
FAULTS_PER_HOUR_MIN = 1
COMPACTIONS_PER_HOUR_MIN = 1000


def too_little(minutes: float, faults: Counter, compactions: int) -> list[str]:
    """What a run of ``minutes`` did less of than its full hours ask; empty when enough (a run
    shorter than an hour is asked nothing: its figures are reported, not held to a rate)."""
    hours = int(minutes // 60)
    short = [
        f"{k} faults {faults[k]} < {hours * FAULTS_PER_HOUR_MIN}"
        for k in FAULT_KINDS
        if faults[k] < hours * FAULTS_PER_HOUR_MIN
    ]
    if compactions < hours * COMPACTIONS_PER_HOUR_MIN:
        short.append(f"compactions {compactions} < {hours * COMPACTIONS_PER_HOUR_MIN}")
    return short


KEY_ID = re.compile(r"(ECID-[0-9a-f]+|[0-9a-f]{8,}|\d+|compactor-[\w-]+)")
#: key families bounded by a TTL or a retention rather than by the tables (left out of the
#: comparison with the baseline; their bounds are printed): applied-mutation outcomes (600 s),
#: the auto-split check, wake-up tokens (30 s), finished user compactions (kept
#: user_compactions.RETENTION_S, 7 days), Compaction requests (30 days)
BOUNDED = ("kz:mut:", "kz:split:", "kz:wake:", "kz:ucomp:", "kz:ucomps", "kz:operator:compaction:")
PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class SoakLog:
    faults: Counter = field(default_factory=Counter)
    skipped: Counter = field(default_factory=Counter)
    takeovers: int = 0
    outages: int = 0
    read_only: int = 0


def _proc(pid: int) -> tuple[float, int, int] | None:
    try:
        with open(f"/proc/{pid}/statm") as f:
            rss = int(f.read().split()[1]) * PAGE / 2**20
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        threads = len(os.listdir(f"/proc/{pid}/task"))
        return rss, fds, threads
    except (OSError, ValueError):
        return None


def redis_info(port: int, password: str | None) -> dict | None:
    """One Redis server's own view of itself (``INFO``): its role, its client connections and
    where its memory goes — the replication backlog, the replicas' and clients' buffers and the
    AOF buffer move with the primary's role at each failover. ``None`` when it does not answer
    within a second (frozen by an outage, or restarting)."""
    import redis

    c = redis.Redis(port=port, password=password, socket_connect_timeout=1, socket_timeout=1)
    try:
        i = c.info()
    except redis.RedisError:
        return None
    finally:
        c.close()
    mb = 2**20
    return {
        "role": i.get("role"),
        "clients": i.get("connected_clients", 0),
        "replicas": i.get("connected_slaves", 0),
        "used_mb": round(i.get("used_memory", 0) / mb, 2),
        "rss_mb": round(i.get("used_memory_rss", 0) / mb, 2),
        "dataset_mb": round(i.get("used_memory_dataset", 0) / mb, 2),
        "clients_mb": round((i.get("mem_clients_normal", 0) + i.get("mem_clients_slaves", 0)) / mb, 2),
        "backlog_mb": round(i.get("mem_replication_backlog", 0) / mb, 2),
        "aof_mb": round(i.get("mem_aof_buffer", 0) / mb, 2),
        "frag": i.get("mem_fragmentation_ratio"),
    }


def _family(key: bytes) -> str:
    return KEY_ID.sub("*", key.decode(errors="replace"))


def _du(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def sample_processes(procs: dict[str, int], minute: float) -> list[Sample]:
    """One :class:`Sample` per live process of ``procs`` (role -> PID): RSS, open fds, threads,
    child processes (also used by bench.operator_soak)."""
    out = []
    for role, pid in procs.items():
        got = _proc(pid)
        if got is not None:
            out.append(Sample(minute, role, pid, round(got[0], 1), got[1], got[2], len(common.descendants(pid))))
    return out


def plot_processes(rss_ax, fds_ax, samples: list[Sample]) -> None:
    """RSS and open fds of each process over the minutes, on two matplotlib axes."""
    by: dict[str, list[Sample]] = {}
    for s in samples:
        by.setdefault(s.role, []).append(s)
    for role, ss in sorted(by.items()):
        rss_ax.plot([s.minute for s in ss], [s.rss_mb for s in ss], label=role.rsplit(":", 1)[0])
        fds_ax.plot([s.minute for s in ss], [s.fds for s in ss])
    rss_ax.set_ylabel("RSS (MB)")
    rss_ax.legend(fontsize=6, ncol=2)
    fds_ax.set_ylabel("open fds")


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        from kompaktor.local.cluster import LocalCluster
        from kompaktor.local.config import DEMO_CONFIG, load_config

        self.args = args
        self.mixes: dict = {}  # table -> kompaktor.local.mix.MixedWorkload, with --workload mix
        self.data_dir = Path(args.data_dir or tempfile.mkdtemp(prefix="kompaktor-soak-"))
        self.cfg = load_config(DEMO_CONFIG)
        self.cluster = LocalCluster(
            self.cfg,
            self.data_dir,
            ha=True,
            coordinator_args=[
                "--full-scan-interval",
                "10",
                "--gc-grace",
                "30",
                "--gc-interval",
                "20",
                "--dead-after",
                "10",
            ],
        )
        self.stop = threading.Event()
        self.redis_hold = threading.Lock()  # held by operations whose outcome a Redis fault would blur
        self.storage_hold = threading.Lock()  # held by ingest while it writes files; by the read-only fault
        self.samples: list[Sample] = []
        self.rows: list[dict] = []
        self.log = SoakLog()
        self.started = 0.0
        self.errors: list[str] = []
        self.work: Counter = Counter()  # workload operations done, refused, or hit by an outage
        self.warm = min(10.0, args.minutes / 3)
        self.base: Counter | None = None

    # -- the workload --------------------------------------------------------------------------------
    def minutes(self) -> float:
        return (time.monotonic() - self.started) / 60

    def _ingest(self, client, ingests: dict) -> None:
        from kompaktor.metadata import tablet_ops, user_compactions
        from kompaktor.model.errors import KompaktorError, StoreUnavailable

        rng = random.Random(self.args.seed + 1)
        tables = sorted(ingests)
        per_s = self.args.rate
        next_op = time.monotonic() + 30
        n = 0
        t0 = time.monotonic()
        while not self.stop.is_set():
            table = tables[n % len(tables)]
            n += 1
            try:
                with self.storage_hold:  # the client's writes wait out a read-only storage
                    ingests[table].flush_once()
                    if self.mixes:
                        self.mixes[table].step()
            except Exception as exc:  # a flush that failed through every retry: not acknowledged
                self.errors.append(f"flush {table}: {exc}")
                self.stop.set()
                return
            due = t0 + sum(i.stats.entries for i in ingests.values()) / per_s
            self.stop.wait(max(0.0, due - time.monotonic()))
            if time.monotonic() < next_op:
                continue
            next_op = time.monotonic() + rng.uniform(20, 40)
            op = rng.choice(["import", "import", "split", "merge", "user"])
            table = rng.choice(tables)
            with self.redis_hold, self.storage_hold:
                try:
                    if op == "import":
                        ingests[table].import_burst(3000, 3, self.data_dir / "imports")
                    elif op == "split":
                        tablet_ops.split(
                            client.store,
                            table,
                            [format(rng.getrandbits(16), "04x").encode()],
                            queues=client.store.queues,
                        )
                    elif op == "merge":
                        a, b = sorted(format(rng.getrandbits(16), "04x").encode() for _ in range(2))
                        tablet_ops.merge(client.store, table, a, b, queues=client.store.queues)
                    else:
                        user_compactions.start(client.store, table)
                    self.work[op] += 1
                except StoreUnavailable:
                    self.work[op + " unavailable"] += 1
                except KompaktorError:  # a busy tablet, a merge that would be unsafe: refused, nothing changed
                    self.work[op + " refused"] += 1

    def _faults(self, chaos) -> None:
        rng = random.Random(self.args.seed + 2)
        actions = ["kill", *FAULT_KINDS]  # a busy compactor killed twice as often
        failover_moment = "ingest"
        while not self.stop.wait(rng.uniform(0.6, 1.4) * self.args.fault_interval):
            action = rng.choice(actions)
            try:
                if action == "coordinator":
                    done = chaos.inject(action)
                elif action in ("kill", "term"):
                    done = False
                    for _ in range(60):  # a busy compactor within the next 15 s (merges are short)
                        if self.stop.is_set() or (done := chaos.inject(action)):
                            break
                        time.sleep(0.25)
                elif action == "kill-idle":
                    done = self._kill_idle(rng)
                elif action == "takeover":
                    done = self._takeover()
                elif action == "failover":
                    with self.redis_hold:
                        done = False
                        for _ in range(50):  # the moment it waits for may take a while
                            if self.stop.is_set():
                                break
                            if chaos.inject(f"failover-{failover_moment}"):
                                done = True
                                break
                            self.stop.wait(1.5)
                    if done:
                        failover_moment = "commit" if failover_moment == "ingest" else "ingest"
                elif action == "readonly":
                    with self.storage_hold:
                        done = self._read_only(20.0)
                else:
                    with self.redis_hold:
                        done = self._outage(20.0)
            except Exception as exc:
                self.errors.append(f"fault {action}: {exc!r}")
                done = False
            (self.log.faults if done else self.log.skipped)[action] += 1

    def _kill_idle(self, rng: random.Random) -> bool:
        store = self.cluster.store
        idle = [
            (g, p)
            for g, ps in self.cluster.compactors.items()
            for p in ps
            if p.alive
            and not p.draining
            and any(c.id == p.name and c.state == "idle" for c in store.fleet.compactors(g))
        ]
        if not idle:
            return False
        _g, p = rng.choice(idle)
        p.popen.send_signal(signal.SIGKILL)
        return True

    def _takeover(self) -> bool:
        """A second coordinator starts beside the leader; the leader is SIGKILLed; the second
        takes over when the lease expires."""
        old = self.cluster.coordinator
        self.cluster.start_coordinator()  # the standby (cluster.coordinator is now the new one)
        self.stop.wait(5)
        if old is not None and old.alive:
            old.popen.send_signal(signal.SIGKILL)
            old.popen.wait(30)
        self.log.takeovers += 1
        return True

    def _outage(self, seconds: float) -> bool:
        """Every Redis server frozen for ``seconds``: no primary, no replica to promote."""
        ha = self.cluster.redis_ha
        servers = [s for s in ha.servers if s.proc is not None and s.proc.poll() is None]
        for s in servers:
            s.proc.send_signal(signal.SIGSTOP)
        try:
            time.sleep(seconds)  # the whole outage, even when the run is ending
        finally:
            for s in servers:
                s.proc.send_signal(signal.SIGCONT)
        self.log.outages += 1
        return True

    def _read_only(self, seconds: float) -> bool:
        """The storage directory read-only for ``seconds`` (:func:`kompaktor.local.chaos.read_only`);
        every write fails with EROFS meanwhile."""
        from kompaktor.local.chaos import read_only

        with read_only(self.cluster.storage_uri) as done:
            if not done:
                return False
            time.sleep(seconds)
        self.log.read_only += 1
        return True

    def _autoscale(self, stop: threading.Event) -> None:
        """`kompaktor up`'s autoscaler, a pass every 0.5 s until ``stop``."""
        while not stop.wait(0.5):
            with contextlib.suppress(Exception):
                self.cluster.autoscale()

    # -- sampling -----------------------------------------------------------------------------------
    def _processes(self) -> dict[str, int]:
        c = self.cluster
        out = {}
        if c.coordinator is not None and c.coordinator.alive:
            out[f"coordinator:{c.coordinator.popen.pid}"] = c.coordinator.popen.pid
        for ps in c.compactors.values():
            for p in ps:
                if p.alive:
                    out[f"{p.name}:{p.popen.pid}"] = p.popen.pid
        for i, s in enumerate(c.redis_ha.sentinels):
            if s.proc is not None and s.proc.poll() is None:
                out[f"sentinel-{i}:{s.proc.pid}"] = s.proc.pid
        return out

    @staticmethod
    def accounted(fams: Counter) -> int:
        """Keys that the tables, tablets and processes account for: all but the TTL or
        retention bounded families, and without the tablets' own keys (added back for the
        tablets present, so that a baseline and a later count compare the same tablets)."""
        return sum(n for f, n in fams.items() if not f.startswith(BOUNDED) and not f.startswith("kz:tablet:"))

    def redis_keys(self) -> tuple[int, Counter]:
        from kompaktor.metadata.store import MetadataStore

        store = MetadataStore.from_url(self.cluster.url)
        try:
            fams: Counter = Counter()
            n = 0
            for key in store.call(raw_redis(store).scan_iter, count=1000):
                fams[_family(key)] += 1
                n += 1
            return n, fams
        finally:
            store.close()

    def _sample(self, client) -> None:
        from kompaktor.model.names import TMP_PREFIX

        procs = self._processes()
        m = round(self.minutes(), 2)
        self.samples.extend(sample_processes(procs, m))
        row: dict = {"minute": m}
        self._sample_redis(m, row)
        try:
            store = client.store
            info = store.call(raw_redis(store).info, "memory")
            row["redis_used_mb"] = round(info["used_memory"] / 2**20, 2)
            row["redis_keys"], fams = self.redis_keys()
            if self.base is None and self.minutes() >= self.warm:
                self.base = fams  # the baseline: every key family has appeared by the end of the warm-up
            row["queued"] = sum(store.queues.stats(g).depth for g in self.cfg.groups)
            referenced = {f for t in store.tables.iter_all_tablets() for f in t.files}
            present = [rel for rel, _ in client.storage.list_files("tables")]
            row["files_referenced"] = len(referenced)
            row["files_present"] = len(present)
            row["temp_files"] = sum(TMP_PREFIX in rel for rel in present)
            row["compactions"] = int(store.bookkeeping.counters().get("compactions_committed", 0))
        except Exception as exc:  # Redis frozen or failing over right now
            row["error"] = type(exc).__name__
        row["spark_local_mb"] = round(_du(self.data_dir / "spark") / 2**20, 1)
        row["processes"] = len(procs)
        self.rows.append(row)

    def _sample_redis(self, minute: float, row: dict) -> None:
        """The Redis servers, each process on its own (``redis-<i>:<pid>``; a failover changes a
        server's role, never which process a series is): its RSS is counted without the buffers
        whose size its configuration bounds — the replication backlog (``repl-backlog-size``,
        which a new or newly promoted server fills from empty) — and without the AOF buffer
        (written out before each reply); client output buffers count (nothing bounds a normal
        client's). Its descriptors are counted without its client connections (``INFO clients``;
        a primary holds every client's, and a leak of connections shows in the clients' own fds).
        Each server's raw figures (role, pid, fds, clients, memory by use) go to the system CSV."""
        for i, srv in enumerate(self.cluster.redis_ha.servers):
            if srv.proc is None or srv.proc.poll() is not None:
                continue
            pid = srv.proc.pid
            got = redis_info(srv.port, srv.password)
            stat = _proc(pid)
            if got is None or stat is None:  # frozen by an outage, or restarting
                continue
            rss, fds, threads = stat
            row.update({f"redis{i}_{k}": v for k, v in got.items()})
            row[f"redis{i}_pid"] = pid
            row[f"redis{i}_fds"] = fds
            own_fds = fds - got["clients"] - got["replicas"]
            own_rss = rss - got["backlog_mb"] - got["aof_mb"]
            self.samples.append(Sample(minute, f"redis-{i}:{pid}", pid, round(own_rss, 2), own_fds, threads, 0))

    def _sampler(self, client) -> None:
        while not self.stop.wait(self.args.sample):
            self._sample(client)

    # -- the run ------------------------------------------------------------------------------------
    def run(self) -> int:
        from kompaktor.client import Client
        from kompaktor.files.storage import Storage
        from kompaktor.local.chaos import Chaos
        from kompaktor.local.ingest import ContinuousIngest, split_points

        c = self.cluster
        try:
            c.start()
            store = c.store
            client = Client(store, Storage.from_uri(c.storage_uri))
            tables = [f"soak{i}" for i in range(self.args.tables)]
            for t in tables:
                store.tables.create_table(t, split_points(self.args.tablets))
            ingests = {
                t: ContinuousIngest(client, t, seed=self.args.seed + i, batch=500, flush_attempts=40)
                for i, t in enumerate(tables)
            }
            if self.args.workload == "mix":
                from kompaktor.local.mix import MixedWorkload

                self.mixes = {
                    t: MixedWorkload(client, f"{t}-mix", self.data_dir / "mix" / t, seed=self.args.seed + i)
                    for i, t in enumerate(tables)
                }
            chaos = Chaos(c, seed=self.args.seed)
            self.started = time.monotonic()
            threads = [
                threading.Thread(target=self._ingest, args=(client, ingests), daemon=True),
                threading.Thread(target=self._faults, args=(chaos,), daemon=True),
                threading.Thread(target=self._sampler, args=(client,), daemon=True),
            ]

            threading.Thread(target=self._autoscale, args=(self.stop,), daemon=True).start()
            for th in threads:
                th.start()
            self._sample(client)
            deadline = self.started + self.args.minutes * 60
            tty = sys.stderr.isatty()
            shown = -1
            while time.monotonic() < deadline and not self.stop.is_set():
                time.sleep(1)
                if tty:
                    print(f"\rsoak: minute {self.minutes():5.1f} of {self.args.minutes}", end="", file=sys.stderr)
                elif int(self.minutes()) != shown:
                    shown = int(self.minutes())
                    print(f"soak: minute {shown} of {self.args.minutes}", file=sys.stderr, flush=True)
            if tty:
                print(file=sys.stderr)
            self.stop.set()
            for th in threads:
                th.join(timeout=120)
            return self._finish(client, ingests, chaos)
        finally:
            self.stop.set()
            with contextlib.suppress(Exception):
                c.stop()
            if not self.args.keep:
                shutil.rmtree(self.data_dir, ignore_errors=True)

    def _finish(self, client, ingests, chaos) -> int:
        from kompaktor.coordinator import Coordinator, CoordinatorSettings
        from kompaktor.local.chaoscheck import acknowledged_commits
        from kompaktor.local.ingest import verify

        store = client.store
        self._sample(client)
        # drain: the scaler keeps running; nothing queued, running, waiting to be planned or retried
        drain_deadline = time.monotonic() + 900
        quiet = 0
        scaler_stop = threading.Event()
        th = threading.Thread(target=self._autoscale, args=(scaler_stop,), daemon=True)
        th.start()
        while time.monotonic() < drain_deadline and quiet < 6:
            try:
                busy = sum(store.queues.stats(g).depth for g in self.cfg.groups) + store.bookkeeping.dirty_count()
                busy += store.running.running_count()
            except Exception:
                busy = 1
            quiet = quiet + 1 if busy == 0 else 0
            time.sleep(1)
        drained = quiet >= 6
        scaler_stop.set()
        th.join(timeout=30)
        killed = chaos.log.killed
        alive_tablets = {t.id for t in store.tables.iter_all_tablets()}
        rerun_missing = [
            e
            for e, t in killed
            if store.running.running_tablet(e) is not None
            or (t in alive_tablets and store.bookkeeping.commits_on(t) <= chaos.log.commits_at_kill.get(t, 0))
        ]
        applied = Counter(store.bookkeeping.commit_log())
        acked = set(acknowledged_commits(self.data_dir / "logs"))
        lost = [e for e in acked if e not in applied]
        twice = [e for e, n in applied.items() if n > 1]
        Coordinator(store, client.storage, CoordinatorSettings()).collect_garbage(grace_s=0)
        referenced = {f for t in store.tables.iter_all_tablets() for f in t.files}
        present = [rel for rel, _ in client.storage.list_files("tables")]
        garbage = [f for f in present if f not in referenced]
        missing = [f for f in referenced if not client.storage.exists(f)]
        checks = {t: verify(client, t, ing.stats) for t, ing in ingests.items()}
        mix_checks = {t: m.check() for t, m in self.mixes.items()}
        for t, m in mix_checks.items():
            print(
                f"mix {t}: {m}; uncertain {m.uncertain} of {m.checked} keys "
                f"({'within' if m.uncertain_ok else 'BEYOND'} 0.1 %)"
            )
        self._sample(client)
        _n, fams = self.redis_keys()
        base_fams = self.base or Counter()
        tablets = sum(1 for _t in store.tables.iter_all_tablets())
        after = self.accounted(fams) + tablets
        baseline = self.accounted(base_fams) + tablets
        grown = growth_per_process(self.samples, self.warm)
        judged, over = judge_limits(self.samples)
        compactions = int(store.bookkeeping.counters().get("compactions_committed", 0))
        idle = too_little(self.args.minutes, self.log.faults, compactions)
        verified = (
            not idle
            and drained
            and not self.errors
            and all(v.ok for v in checks.values())
            and all(m.ok for m in mix_checks.values())
            and all(m.uncertain_ok for m in mix_checks.values())  # <= 0.1 % of the checked keys
            and not lost
            and not twice
            and not rerun_missing
            and not garbage
            and not missing
            and not over
        )
        self.write_outputs()
        faults = sum(self.log.faults.values())
        failovers = len(chaos.log.failovers)
        print(
            f"work: {dict(self.work)}; faults: {dict(self.log.faults)}; not possible when drawn: "
            f"{dict(self.log.skipped)}; killed {len(killed)} busy compactors, terminated {len(chaos.log.termed)}, "
            f"coordinator restarts {chaos.log.coordinator_restarts}, takeovers {self.log.takeovers}, "
            f"outages {self.log.outages}, read-only storage {self.log.read_only}"
        )
        print(
            f"checks: drained={drained} entries scanned={sum(v.entries for v in checks.values())} "
            f"undefined={sum(v.undefined for v in checks.values())} "
            f"resurrected={sum(v.resurrected for v in checks.values())} "
            f"lost_ephemeral={sum(v.lost_ephemeral for v in checks.values())} "
            f"changed={sum(v.changed for v in checks.values())} "
            f"shown-twice={sum(v.duplicated for v in checks.values())} "
            f"findings={[f for v in checks.values() for f in v.findings][:3]} acknowledged commits={len(acked)} "
            f"lost={len(lost)} twice={len(twice)} killed-not-rerun={len(rerun_missing)} "
            f"missing files={len(missing)} errors={self.errors[:3]}"
        )
        changed = {
            f: (base_fams.get(f, 0), fams.get(f, 0))
            for f in set(base_fams) | set(fams)
            if base_fams.get(f, 0) != fams.get(f, 0)
        }
        print(f"redis key families changed since the warm-up (then, now): {changed}")
        print(
            "bounded by TTL or retention, now: "
            + ", ".join(f"{f} {n}" for f, n in sorted(fams.items()) if f.startswith(BOUNDED))
        )
        print("growth per process over its own life, after its warm-up: " + ", ".join(map(str, grown)))
        print(f"work per full hour: {'; '.join(idle) or 'enough'} (faults of each kind, compactions)")
        print(
            f"limits (rss <= +{RSS_LIMIT_PCT:g}%, fds <= +{FD_LIMIT} from each process's minute {LIMIT_WARM_MIN:g}; "
            f"{len(judged)} processes lived long enough to be held to them): "
            f"{', '.join(map(str, over)) or ('kept' if judged else 'none held')}"
        )
        print(
            f"soak: verified={'yes' if verified else 'no'} minutes={self.args.minutes} compactions={compactions} "
            f"faults={faults} failovers={failovers} "
            f"rss_growth_max_pct={max((g.rss_pct for g in grown), default=0.0):.1f} "
            f"fd_growth_max={max((g.fds for g in grown), default=0)} redis_keys_after={after} "
            f"redis_keys_baseline={baseline} garbage_files={len(garbage)}",
            flush=True,
        )
        return 0 if verified else 1

    def write_outputs(self) -> None:
        common.OUT.mkdir(parents=True, exist_ok=True)
        with (common.OUT / "soak.csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["minute", "process", "pid", "rss_mb", "fds", "threads", "children"])
            for s in self.samples:
                w.writerow([s.minute, s.role.rsplit(":", 1)[0], s.pid, s.rss_mb, s.fds, s.threads, s.children])
        keys = sorted({k for r in self.rows for k in r})
        with (common.OUT / "soak-system.csv").open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(self.rows)
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return
        fig, (a, b, c) = plt.subplots(3, 1, figsize=(9, 10), sharex=True)
        plot_processes(a, b, [s for s in self.samples if not s.role.startswith("compactor-")])
        rows = [r for r in self.rows if "redis_keys" in r]
        c.plot([r["minute"] for r in rows], [r["redis_keys"] for r in rows], label="Redis keys")
        c.plot([r["minute"] for r in rows], [r["files_present"] for r in rows], label="files present")
        c.plot([r["minute"] for r in rows], [r["redis_used_mb"] for r in rows], label="Redis used MB")
        c.set_xlabel("minute")
        c.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(common.OUT / "soak.png", dpi=100)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=float(os.environ.get("KOMPAKTOR_BENCH_SOAK_MINUTES", 60)))
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--tables", type=int, default=3)
    p.add_argument("--tablets", type=int, default=4)
    p.add_argument("--rate", type=float, default=400.0, help="entries ingested per second, all tables together")
    p.add_argument("--sample", type=float, default=60.0, help="seconds between samples")
    p.add_argument("--fault-interval", type=float, default=45.0, help="mean seconds between faults")
    p.add_argument("--data-dir", default=None)
    p.add_argument(
        "--workload",
        choices=["plain", "mix"],
        default="mix",
        help="mix: beside the ingest, deletes, old imports, --set-time, overlapping imports, splits, "
        "merges and user compactions (kompaktor.local.mix), verified against a reference view",
    )
    p.add_argument("--keep", action="store_true", help="keep the data directory")
    args = p.parse_args(argv)
    if args.minutes <= 0:
        p.error("--minutes must be > 0")
    sys.exit(Soak(args).run())


if __name__ == "__main__":
    main()
