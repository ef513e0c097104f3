"""`kompaktor up`: the whole system on one machine, shaped like the cluster.

An embedded redis-server (AOF on, in a data directory) unless a Redis URL is given, one
coordinator process, and compactor processes per group. A local autoscaler applies the HPA
formula to each group — desired = ceil(depth / jobsPerReplica), clamped to [min, max], where
depth is queued plus running jobs — and, like the operator, scales down by draining *idle*
compactors with SIGTERM, never busy ones.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from kompaktor.local.config import LocalConfig
from kompaktor.local.redis_server import RedisProcess
from kompaktor.metadata.store import MetadataStore
from kompaktor.queues.jobqueue import JobQueues

log = logging.getLogger("kompaktor.local.cluster")


def desired_replicas(depth: int, jobs_per_replica: int, lo: int, hi: int) -> int:
    """The HPA formula with an AverageValue target, clamped to the group's bounds."""
    return max(lo, min(hi, math.ceil(depth / jobs_per_replica)))


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    draining: bool = False
    started: float = field(default_factory=time.monotonic)

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None


@dataclass
class LocalCluster:
    config: LocalConfig
    data_dir: Path
    redis_url: str | None = None
    coordinator_args: list[str] = field(default_factory=list)
    compactor_args: list[str] = field(default_factory=list)
    quiet: bool = True

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        self.storage_uri = str(self.data_dir / "files")
        self.redis: RedisProcess | None = None
        self.coordinator: Proc | None = None
        self.compactors: dict[str, list[Proc]] = {g: [] for g in self.config.groups}
        self.store: MetadataStore | None = None
        self.queues: JobQueues | None = None
        self._seq = 0
        self.scale_events: list[tuple[float, str, str, int]] = []
        self.env = dict(os.environ)

    # -- processes ----------------------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str]) -> Proc:
        logs = self.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        out = open(logs / f"{name}.log", "ab")  # noqa: SIM115 — owned by the child for its lifetime
        env = {**self.env, "KOMPAKTOR_REDIS_URL": self.url, "KOMPAKTOR_STORAGE": self.storage_uri,
               "PYTHONUNBUFFERED": "1"}
        popen = subprocess.Popen([sys.executable, "-m", "kompaktor", *args], stdout=out, stderr=out, env=env,
                                 start_new_session=True)
        out.close()
        return Proc(name, popen)

    @property
    def url(self) -> str:
        assert self.redis_url is not None
        return self.redis_url

    def start(self) -> LocalCluster:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.redis_url is None:
            self.redis = RedisProcess(self.data_dir / "redis").start()
            self.redis_url = self.redis.url
        self.store = MetadataStore.from_url(self.url)
        self.queues = self.store.queues
        for g in self.config.groups.values():
            self.store.put_group(g)
        for s in self.config.services.values():
            self.store.put_service(s)
        self.start_coordinator()
        for g, cfg in self.config.groups.items():
            for _ in range(cfg.min_replicas):
                self.add_compactor(g)
        return self

    def start_coordinator(self) -> None:
        self.coordinator = self._spawn("coordinator", ["coordinator", "--metrics-port", "-1",
                                                       *self.coordinator_args])

    def restart_coordinator(self, kill: bool = True) -> None:
        if self.coordinator is not None and self.coordinator.alive:
            self.coordinator.popen.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            self.coordinator.popen.wait(timeout=30)
        self.start_coordinator()

    def add_compactor(self, group: str) -> Proc:
        self._seq += 1
        name = f"compactor-{group}-{self._seq}"
        p = self._spawn(name, ["compactor", "--group", group, "--id", name, "--http-port", "-1",
                               *self.compactor_args])
        self.compactors[group].append(p)
        return p

    def reap(self) -> None:
        for procs in self.compactors.values():
            procs[:] = [p for p in procs if p.alive]

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
            want = desired_replicas(depth, cfg.jobs_per_replica, cfg.min_replicas, cfg.max_replicas)
            out[g] = want
            live = self.live(g)
            if len(live) < want:
                for _ in range(want - len(live)):
                    self.add_compactor(g)
                self.scale_events.append((time.time(), g, "up", want))
            elif len(live) > want:
                idle = {c.id for c in self.store.compactors(g) if c.state == "idle"}
                victims = [p for p in live if p.name in idle][: len(live) - want]
                for p in victims:
                    p.draining = True
                    p.popen.send_signal(signal.SIGTERM)
                if victims:
                    self.scale_events.append((time.time(), g, "down", want))
        return out

    # -- stop -------------------------------------------------------------------------------------------
    def stop(self, timeout: float = 90.0) -> None:
        """Drain every compactor (SIGTERM), stop the coordinator, then Redis."""
        procs = [p for ps in self.compactors.values() for p in ps if p.alive]
        for p in procs:
            p.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in procs:
            try:
                p.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait()
        if self.coordinator is not None and self.coordinator.alive:
            self.coordinator.popen.send_signal(signal.SIGTERM)
            try:
                self.coordinator.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.coordinator.popen.kill()
        if self.store is not None:
            self.store.close()
        if self.redis is not None:
            self.redis.stop()
