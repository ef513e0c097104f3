"""`kompaktor up`: the whole system on one machine, shaped like the cluster.

An embedded redis-server (AOF on, fsync always, in a data directory) — or with ``ha`` a primary,
a replica and three sentinels — unless a Redis URL is given, one
coordinator process, and compactor processes per group. A local autoscaler applies the HPA
formula to each group — desired = ceil(depth / jobsPerReplica), clamped to [min, max], where
depth is queued plus running jobs — and, like the operator, scales down by draining *idle*
compactors with SIGTERM, never busy ones.

Every child dies with this process, also when it is SIGKILLed (:mod:`kompaktor.local.procs`).
Each pass records desired and actual compactors per group (:attr:`LocalCluster.timeline`); each
compactor that ends is checked against Redis: one whose registration still names a running (or
dead) compaction ended busy (:attr:`Proc.held_ecid`), which a drain must never cause.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kompaktor.files.storage import Storage
from kompaktor.local.config import LocalConfig
from kompaktor.local.procs import kill_group, spawn, stop_popen
from kompaktor.local.redis_server import RedisHA, RedisProcess
from kompaktor.metadata import acl
from kompaktor.metadata import format as metaformat
from kompaktor.metadata.store import MetadataStore
from kompaktor.model import grouptoken
from kompaktor.model.errors import StoreUnavailable
from kompaktor.queues.jobqueue import JobQueues

log = logging.getLogger("kompaktor.local.cluster")


def free_port() -> int:
    """A TCP port of 127.0.0.1 free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def desired_replicas(depth: int, jobs_per_replica: int, lo: int, hi: int) -> int:
    """The HPA formula with an AverageValue target, clamped to the group's bounds."""
    return max(lo, min(hi, math.ceil(depth / jobs_per_replica)))


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[Any]
    group: str = ""
    draining: bool = False
    started: float = field(default_factory=time.monotonic)
    #: set when the autoscaler drained it (scale-down), as opposed to the cluster's own stop
    scaled_down: bool = False
    #: once it ended: its exit status and the compaction it still held (None: it ended idle)
    returncode: int | None = None
    held_ecid: str | None = None

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None


@dataclass(frozen=True)
class GroupSample:
    """One autoscaler pass for one group: ``up`` compactors registered in Redis and not draining,
    ``draining`` compactor processes still finishing."""

    t: float  # time.monotonic()
    group: str
    depth: int
    desired: int
    up: int
    draining: int


@dataclass
class LocalCluster:
    config: LocalConfig
    data_dir: Path
    redis_url: str | None = None
    coordinator_args: list[str] = field(default_factory=list)
    #: where data files go (a pyarrow.fs URI such as s3://bucket/prefix; credentials from the
    #: environment, which every child inherits); default: ``files/`` under ``data_dir``
    storage: str | None = None
    compactor_args: list[str] = field(default_factory=list)
    quiet: bool = True
    #: as the HPA's scale-down stabilization window: scale down only to the highest desired count
    #: of this many recent seconds, so a queue that empties between two flushes does not start and
    #: drain a compactor every pass
    scale_down_window_s: float = 5.0
    #: instead of one embedded redis-server: a primary, a replica and three sentinels
    #: (:class:`~kompaktor.local.redis_server.RedisHA`); clients get the ``redis+sentinel://`` URL
    ha: bool = False
    #: how a child process runs the ``kompaktor`` CLI (tests run a wrapper of it instead)
    command: list[str] = field(default_factory=lambda: [sys.executable, "-m", "kompaktor"])
    #: the coordinator serves /metrics and the status page (/status) on this port of 127.0.0.1
    #: (0: a free port, chosen at start); None: no HTTP server
    status_port: int | None = None

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        self.storage_uri = self.storage or str(self.data_dir / "files")
        self.redis: RedisProcess | None = None
        self.redis_ha: RedisHA | None = None
        #: each role's URL on the embedded Redis (none when given a Redis URL: all use it)
        self.role_urls: dict[str, str] = {}
        self.coordinator: Proc | None = None
        self.compactors: dict[str, list[Proc]] = {g: [] for g in self.config.groups}
        self.store: MetadataStore | None = None
        self.queues: JobQueues | None = None
        self._seq = 0
        self.scale_events: list[tuple[float, str, str, int]] = []
        self.timeline: list[GroupSample] = []
        self._recent: dict[str, list[tuple[float, int]]] = {g: [] for g in self.config.groups}
        self.exited: list[Proc] = []  # compactors that ended, with what they held
        self.env = dict(os.environ)
        #: the key compactor groups' tokens derive from (as the chart's group-key Secret)
        self.group_key = secrets.token_urlsafe(36)

    # -- processes ----------------------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str], extra_env: dict[str, str] | None = None) -> Proc:
        logs = self.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        out = open(logs / f"{name}.log", "ab")  # noqa: SIM115 — owned by the child for its lifetime
        role = "coordinator" if name == "coordinator" else "compactor"
        env = {
            **self.env,
            "KOMPAKTOR_REDIS_URL": self.role_urls.get(role, self.url),
            "KOMPAKTOR_STORAGE": self.storage_uri,
            "PYTHONUNBUFFERED": "1",
            **(extra_env or {}),
        }
        # Spark's scratch space inside the data directory: nothing is left in /tmp by a killed compactor
        env.setdefault("KOMPAKTOR_SPARK_LOCAL_DIR", str(self.data_dir / "spark" / name))
        try:
            popen = spawn([*self.command, *args], stdout=out, stderr=out, env=env)
        finally:
            out.close()
        return Proc(name, popen)

    @property
    def url(self) -> str:
        assert self.redis_url is not None
        return self.redis_url

    def start(self) -> LocalCluster:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # the embedded Redis has the chart's users: coordinator and compactors connect as theirs,
        # so a right their code needs and the ACL lacks fails here, as it would in a cluster
        if self.redis_url is None and self.ha:
            self.redis_ha = RedisHA(self.data_dir / "redis-ha", users=acl.new_passwords())  # stop() stops it
            self.redis_ha.start()
            self.redis_url = self.redis_ha.url
            self.role_urls = {role: self.redis_ha.role_url(role) for role in acl.ROLES}
        elif self.redis_url is None:
            self.redis = RedisProcess(self.data_dir / "redis", users=acl.new_passwords())  # stop() stops it
            self.redis.start()
            self.redis_url = self.redis.url
            self.role_urls = {role: self.redis.role_url(role) for role in acl.ROLES}
        self.store = MetadataStore.from_url(self.role_urls.get("admin", self.url))
        self.store.load_scripts()  # before the compactors' first FCALL (they may not load code)
        self.claim()
        self.queues = self.store.queues
        for group in self.config.groups.values():
            self.store.fleet.put_group(group)
        for s in self.config.services.values():
            self.store.fleet.put_service(s)
        self.start_coordinator()
        for g, cfg in self.config.groups.items():
            for _ in range(cfg.min_replicas):
                self.add_compactor(g)
        return self

    def claim(self) -> None:
        """Before any process starts: the metadata's format readable by this release, and the
        Redis and the storage of one installation, recorded in both on a first start (a restart
        on its own data, or after a restore, passes; another installation's storage is refused in
        one line: docs/upgrading.md). The coordinator migrates an older format as it leads."""
        assert self.store is not None
        metaformat.open_checked(self.store, "kompaktor up")
        metaformat.claim_installation(self.store, Storage.from_uri(self.storage_uri))

    @property
    def status_url(self) -> str | None:
        """The coordinator's status page, once started with a :attr:`status_port`."""
        return None if not self.status_port else f"http://127.0.0.1:{self.status_port}/status"

    def start_coordinator(self) -> None:
        if self.status_port == 0:  # one port for every coordinator this cluster starts (restarts too)
            self.status_port = free_port()
        port = "-1" if self.status_port is None else str(self.status_port)
        args = ["coordinator", "--metrics-port", port, "--metrics-host", "127.0.0.1", *self.coordinator_args]
        # the key groups' tokens derive from: its broker acts for a compactor of its own group only
        self.coordinator = self._spawn("coordinator", args, {grouptoken.KEY_ENV: self.group_key})

    def restart_coordinator(self, kill: bool = True) -> None:
        if self.coordinator is not None and self.coordinator.alive:
            stop_popen(self.coordinator.popen, 30, signal.SIGKILL if kill else signal.SIGTERM)
        self.start_coordinator()

    def add_compactor(self, group: str) -> Proc:
        self._seq += 1
        name = f"compactor-{group}-{self._seq}"
        # with a Redis user per role, a compactor may only read and ask the coordinator's broker
        broker = ["--broker"] if self.role_urls else []
        args = ["compactor", "--group", group, "--id", name, "--http-port", "-1", *broker, *self.compactor_args]
        p = self._spawn(name, args, {grouptoken.TOKEN_ENV: grouptoken.group_token(self.group_key, group)})
        p.group = group
        self.compactors[group].append(p)
        return p

    def reap(self) -> None:
        """Forget compactors that ended, once what they held is known (needs Redis)."""
        for procs in self.compactors.values():
            gone = [p for p in procs if not p.alive]
            for p in gone:
                try:
                    self._record_exit(p)
                except StoreUnavailable:
                    continue  # Redis is restarting: look again next pass
                procs.remove(p)

    def _record_exit(self, p: Proc) -> None:
        """A compactor unregisters when it ends cleanly; one that was stopped while it held a
        compaction leaves its registration naming that ECID, still running or found dead."""
        assert self.store is not None
        kill_group(p.popen.pid)  # whatever it left in its process group (a Spark JVM)
        reg = next((c for c in self.store.fleet.compactors(p.group) if c.id == p.name), None)
        held = None
        if (
            reg is not None
            and reg.ecid
            and (self.store.running.running_tablet(reg.ecid) is not None or reg.ecid in self.store.running.dead_log())
        ):
            held = reg.ecid
        p.returncode = p.popen.returncode
        p.held_ecid = held
        self.exited.append(p)

    def live(self, group: str) -> list[Proc]:
        return [p for p in self.compactors[group] if p.alive and not p.draining]

    # -- autoscaler -------------------------------------------------------------------------------------
    def autoscale(self) -> dict[str, int]:
        """One autoscaler pass; returns the desired replicas per group."""
        assert self.store is not None and self.queues is not None
        self.reap()
        out = {}
        for g, cfg in self.config.groups.items():
            depth = self.queues.stats(g).depth
            want = self._stabilized(
                g, desired_replicas(depth, cfg.jobs_per_replica, cfg.min_replicas, cfg.max_replicas)
            )
            out[g] = want
            live = self.live(g)
            if len(live) < want:
                for _ in range(want - len(live)):
                    self.add_compactor(g)
                self.scale_events.append((time.time(), g, "up", want))
            elif len(live) > want:
                idle = {c.id for c in self.store.fleet.compactors(g) if c.state == "idle"}
                victims = [p for p in live if p.name in idle][: len(live) - want]
                for p in victims:
                    p.draining = p.scaled_down = True
                    p.popen.send_signal(signal.SIGTERM)
                if victims:
                    self.scale_events.append((time.time(), g, "down", want))
            registered = {c.id for c in self.store.fleet.compactors(g) if c.state != "draining"}
            self.timeline.append(
                GroupSample(
                    time.monotonic(),
                    g,
                    depth,
                    want,
                    sum(1 for p in self.live(g) if p.name in registered),
                    sum(1 for p in self.compactors[g] if p.alive and p.draining),
                )
            )
        return out

    def _stabilized(self, group: str, want: int) -> int:
        now = time.monotonic()
        recent = [(t, n) for t, n in self._recent[group] if now - t < self.scale_down_window_s]
        recent.append((now, want))
        self._recent[group] = recent
        return max(n for _t, n in recent)

    # -- stop -------------------------------------------------------------------------------------------
    def stop_compactors(self, timeout: float = 90.0) -> None:
        """Drain every compactor (SIGTERM) and wait for it; record what each held when it ended."""
        procs = [p for ps in self.compactors.values() for p in ps if p.alive]
        for p in procs:
            p.draining = True
            with contextlib.suppress(ProcessLookupError):
                p.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in procs:
            stop_popen(p.popen, deadline - time.monotonic())
        if self.store is not None:
            with contextlib.suppress(StoreUnavailable):
                self.reap()

    def stop(self, timeout: float = 90.0) -> None:
        """Drain every compactor (SIGTERM), stop the coordinator, then Redis."""
        self.stop_compactors(timeout)
        if self.coordinator is not None:
            stop_popen(self.coordinator.popen, 30)
        if self.store is not None:
            self.store.close()
        if self.redis is not None:
            self.redis.stop()
        if self.redis_ha is not None:
            self.redis_ha.stop()

    def kill(self) -> None:
        """Stop everything at once, no drain (a second Ctrl-C): SIGKILL to every child's group."""
        for p in [p for ps in self.compactors.values() for p in ps]:
            kill_group(p.popen.pid)
        if self.coordinator is not None:
            kill_group(self.coordinator.popen.pid)
        if self.redis is not None and self.redis.proc is not None:
            kill_group(self.redis.proc.pid)
        if self.redis_ha is not None:
            self.redis_ha.kill()
