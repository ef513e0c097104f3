"""Faults on a schedule for `kompaktor demo --chaos` (README.md, "The `kompaktor` command"): SIGKILL busy compactors
mid-merge, SIGTERM busy compactors (a scale-down), restart the coordinator, restart Redis once —
or, with the local HA Redis (docs/architecture.md "Redis HA and failover"), SIGKILL the Redis
primary twice, once mid-ingest and once mid-commit, and let Sentinel promote the replica. The
schedule is drawn from a fixed seed; what happened is recorded for the final checks.

A failover step first freezes the replica (SIGSTOP), so that what the primary applies from then
on is not replicated and every acknowledgment waits (WAIT); it then waits, briefly, for the
moment it wants — mid-ingest: a client blocked in WAIT on its write; mid-commit: a compaction's
commit applied on the primary (the committed counter moved) and not yet acknowledged — SIGKILLs
the primary right then and thaws the replica, which Sentinel promotes. Those writes are lost with
the primary, exactly as in a real crash; their clients were never told they succeeded, so they
must retry them on the new primary. The killed server is started again as a replica.

:func:`read_only` turns a local storage directory read-only for a while (the soak's fault, and the
tests of what meets it)."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from kompaktor import keyspace as C
from kompaktor.local.cluster import LocalCluster
from kompaktor.metadata.failures import MAX_ATTEMPTS

log = logging.getLogger("kompaktor.local.chaos")

#: Below failures.MAX_ATTEMPTS: a tablet's job killed this often is still retried, not dead-lettered.
MAX_KILLS_PER_TABLET = MAX_ATTEMPTS - 1


@contextlib.contextmanager
def read_only(path: str) -> Iterator[bool]:
    """``path`` read-only for the block: a read-only bind mount over it, what a disk remounted
    read-only after an error is (even root cannot write there meanwhile). Yields False, and
    changes nothing, where that cannot be done (not root, no mount, not a local directory)."""
    if (
        os.geteuid() != 0
        or "://" in path
        or subprocess.run(["mount", "--bind", path, path], capture_output=True).returncode != 0
    ):
        yield False
        return
    try:
        ok = subprocess.run(["mount", "-o", "remount,ro,bind", path], capture_output=True).returncode == 0
        yield ok
    finally:
        subprocess.run(["umount", "-l", path], check=True, capture_output=True)


@dataclass
class ChaosLog:
    killed: list[tuple[str, str]] = field(default_factory=list)  # (ecid, tablet) of SIGKILLed merges
    commits_at_kill: dict[str, int] = field(default_factory=dict)  # tablet -> commits when killed
    termed: list[str] = field(default_factory=list)  # ECIDs running in SIGTERMed compactors
    coordinator_restarts: int = 0
    redis_restarts: int = 0
    #: per Redis primary SIGKILLed: {"moment", "pending" (clients waiting for their write's
    #: acknowledgment when it died), "commits_pending", "promoted_s" (kill to new primary)}
    failovers: list[dict[str, Any]] = field(default_factory=list)


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
        #: while set, no Redis fault is injected (the demo's burst import, which is not retried)
        self.hold_redis = threading.Event()
        self._froze = False  # the last failover attempt froze the replica (and its moment did not come)
        self.thread = threading.Thread(target=self._run, name="chaos", daemon=True)
        # a fixed plan: each step is one fault; Redis restarts once, in the middle — with an HA
        # Redis the primary is SIGKILLed instead, once early (ingest running) and once later
        if self.cluster.redis_ha is not None:
            self.plan = [
                "kill",
                "failover-ingest",
                "coordinator",
                "failover-commit",
                "term",
                "kill",
                "term",
                "kill",
                "coordinator",
                "kill",
            ]
        else:
            self.plan = ["kill", "term", "coordinator", "kill", "redis", "kill", "term", "kill", "coordinator", "kill"]

    def start(self) -> None:
        self.thread.start()

    def inject(self, action: str) -> bool:
        """One fault now, outside the plan (the soak bench draws its own schedule): ``kill``,
        ``term``, ``coordinator``, ``failover-ingest``, ``failover-commit`` or ``redis``. False
        when it could not happen now (nothing busy, no moment)."""
        return self._step(action)

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
            for c in store.fleet.compactors(g):
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
            busy = [b for b in busy if self._kills_on(store.running.running_tablet(b[2])) < MAX_KILLS_PER_TABLET]
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
            _wait_stopped(proc.popen.pid)
        tablet = store.running.running_tablet(ecid)
        if tablet is None:
            if sig == signal.SIGKILL:
                proc.popen.send_signal(signal.SIGCONT)
            return False  # finished in between
        tablet_id = tablet
        if sig == signal.SIGKILL:
            self.log.killed.append((ecid, tablet_id))
            self.log.commits_at_kill[tablet_id] = store.bookkeeping.commits_on(tablet_id)
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
        if action.startswith("failover-"):
            return self._failover(action.split("-", 1)[1])
        if action == "redis" and self.cluster.redis is not None:
            with self.lock:
                self.cluster.redis.stop()
                self.cluster.redis.start()
            self.log.redis_restarts += 1
            return True
        return False

    def _failover(self, moment: str, window_s: float = 0.8) -> bool:
        """SIGKILL the Redis primary at ``moment`` (ingest: a write awaiting its acknowledgment;
        commit: a compaction's commit applied, not acknowledged); False if the moment did not come
        within ``window_s`` (the step is tried again soon)."""
        ha = self.cluster.redis_ha
        assert ha is not None
        self._froze = False
        if self.hold_redis.is_set():
            return False
        primary = ha.primary()
        replicas = [s for s in ha.servers if s is not primary and s.running and s.proc is not None]
        if not replicas:
            return False
        pc = primary.client()
        try:
            if moment == "commit" and not pc.hlen(C.RUNNING):
                return False  # no compaction running: no commit can come; do not freeze the replica
            committed = int(pc.hget(C.COUNTERS, "compactions_committed") or 0)
            for r in replicas:
                r.proc.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
            self._froze = True
            hit = False
            pending = commits = 0
            try:
                deadline = time.monotonic() + window_s
                while time.monotonic() < deadline:
                    pending = int(pc.info("clients").get("blocked_clients", 0))
                    commits = int(pc.hget(C.COUNTERS, "compactions_committed") or 0) - committed
                    hit = commits > 0 if moment == "commit" else pending > 0
                    if hit:
                        primary.stop(kill=True)
                        break
                    time.sleep(0.002)
            finally:
                for r in replicas:
                    if r.proc is not None:
                        r.proc.send_signal(signal.SIGCONT)
        finally:
            pc.close()
        if not hit:
            return False
        t0 = time.monotonic()
        with self.lock:
            ha.wait_failover(primary.port)
            promoted = time.monotonic() - t0
            ha.restart(primary)  # back as a replica: acknowledgments (WAIT 1) resume
        self.log.failovers.append(
            {"moment": moment, "pending": pending, "commits_pending": max(0, commits), "promoted_s": round(promoted, 1)}
        )
        log.info(
            "chaos: Redis primary SIGKILLed mid-%s (%d writes awaiting acknowledgment, %d commits); "
            "replica promoted in %.1fs",
            moment,
            pending,
            commits,
            promoted,
        )
        return True

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
            elif action.startswith("failover-") and self._froze:
                # the moment did not come while the replica was frozen: let it catch up
                # (acknowledgments resume) first
                wait = 1.5
            else:
                wait = 0.02  # nothing busy to hit yet: look again soon


def _wait_stopped(pid: int, timeout_s: float = 2.0) -> None:
    """Until the kernel has stopped ``pid`` (a signal is delivered asynchronously; state ``T`` in
    ``/proc/<pid>/stat``); a commit it had already sent may still be applied, which the checks
    account for."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return
        if state in ("T", "t"):
            return
        time.sleep(0.005)
