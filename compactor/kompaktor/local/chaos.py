"""Faults on a schedule for `kompaktor demo --chaos` (issue 8): SIGKILL busy compactors
mid-merge, SIGTERM busy compactors (a scale-down), restart the coordinator, restart Redis once.
The schedule is drawn from a fixed seed; what happened is recorded for the final checks."""

from __future__ import annotations

import logging
import random
import signal
import threading
from dataclasses import dataclass, field

from kompaktor.local.cluster import LocalCluster
from kompaktor.metadata.failures import MAX_ATTEMPTS

log = logging.getLogger("kompaktor.local.chaos")

#: Below failures.MAX_ATTEMPTS: a tablet's job killed this often is still retried, not dead-lettered.
MAX_KILLS_PER_TABLET = MAX_ATTEMPTS - 1


@dataclass
class ChaosLog:
    killed: list[tuple[str, str]] = field(default_factory=list)  # (ecid, tablet) of SIGKILLed merges
    commits_at_kill: dict[str, int] = field(default_factory=dict)  # tablet -> commits when killed
    termed: list[str] = field(default_factory=list)  # ECIDs running in SIGTERMed compactors
    coordinator_restarts: int = 0
    redis_restarts: int = 0


@dataclass
class Chaos:
    cluster: LocalCluster
    seed: int = 7
    interval_s: float = 3.0
    log: ChaosLog = field(default_factory=ChaosLog)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.stop = threading.Event()
        self.lock = threading.Lock()  # held while Redis is down, so others can wait
        self.thread = threading.Thread(target=self._run, name="chaos", daemon=True)
        # a fixed plan: each step is one fault; Redis restarts once, in the middle
        self.plan = ["kill", "term", "coordinator", "kill", "redis", "kill", "term", "kill", "coordinator",
                     "kill"]

    def start(self) -> None:
        self.thread.start()

    def finish(self) -> ChaosLog:
        self.stop.set()
        self.thread.join(timeout=60)
        return self.log

    def _busy(self) -> list[tuple[str, str, str]]:
        """(group, compactor name, ecid) of compactors busy right now, in a stable order."""
        store = self.cluster.store
        assert store is not None
        out = []
        for g in sorted(self.cluster.config.groups):
            procs = {p.name: p for p in self.cluster.compactors[g] if p.alive and not p.draining}
            for c in store.compactors(g):
                if c.state == "busy" and c.ecid and c.id in procs:
                    out.append((g, c.id, c.ecid))
        return out

    def _signal_busy(self, sig: signal.Signals) -> bool:
        busy = self._busy()
        if sig == signal.SIGKILL:
            # A job whose compactor dies max_attempts times is dead-lettered by design (it may be
            # what kills them); chaos spreads its kills so that every killed job must be re-run.
            store = self.cluster.store
            assert store is not None
            busy = [b for b in busy if self._kills_on(store.running_tablet(b[2])) < MAX_KILLS_PER_TABLET]
        if not busy:
            return False
        g, name, ecid = self.rng.choice(busy)
        proc = next(p for p in self.cluster.compactors[g] if p.name == name)
        store = self.cluster.store
        assert store is not None
        if sig == signal.SIGKILL:
            # Freeze it first, so it cannot commit between the check below and the kill: a
            # compaction that committed just before is not one killed mid-merge.
            proc.popen.send_signal(signal.SIGSTOP)
        tablet = store.running_tablet(ecid)
        if tablet is None:
            if sig == signal.SIGKILL:
                proc.popen.send_signal(signal.SIGCONT)
            return False  # finished in between
        tablet_id = tablet
        if sig == signal.SIGKILL:
            self.log.killed.append((ecid, tablet_id))
            self.log.commits_at_kill[tablet_id] = store.commits_on(tablet_id)
        else:
            proc.draining = True
            self.log.termed.append(ecid)
        proc.popen.send_signal(sig)
        log.info("chaos: %s %s (running %s on %s)", sig.name, name, ecid, tablet_id)
        return True

    def _kills_on(self, tablet: str | None) -> int:
        if tablet is None:
            return MAX_KILLS_PER_TABLET  # finished in between: not a target
        return sum(1 for _e, t in self.log.killed if t == tablet)

    def _step(self, action: str) -> bool:
        if action == "kill":
            return self._signal_busy(signal.SIGKILL)
        if action == "term":
            return self._signal_busy(signal.SIGTERM)
        if action == "coordinator":
            self.cluster.restart_coordinator(kill=True)
            self.log.coordinator_restarts += 1
            return True
        if action == "redis" and self.cluster.redis is not None:
            with self.lock:
                self.cluster.redis.stop()
                self.cluster.redis.start()
            self.log.redis_restarts += 1
            return True
        return False

    def _run(self) -> None:
        wait = self.interval_s * self.rng.uniform(0.7, 1.3)
        while self.plan and not self.stop.wait(wait):
            action = self.plan[0]
            try:
                done = self._step(action)
            except Exception:
                log.exception("chaos step %s failed", action)
                done = True
            if done:
                self.plan.pop(0)
                wait = self.interval_s * self.rng.uniform(0.7, 1.3)
            else:
                wait = 0.02  # nothing busy to hit yet: look again soon
