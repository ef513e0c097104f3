"""A real Spark standalone cluster on loopback for tests (issue 17 §2): one master and workers
started with pyspark's own launcher (``$SPARK_HOME/bin/spark-class``, ``SPARK_HOME`` = the
installed pyspark package), each worker with one core, all bound to 127.0.0.1 and each in its
own process group, so that a test can SIGKILL one worker with its executor and Python workers
("the machine is lost") and the fixture stops everything it started by PID.

Readiness is read from the master's JSON status page (``/json``: alive workers), polled with a
deadline; nothing waits a fixed time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.ports import free_port
from tests.support.procs import descendants, wait_gone
from tests.support.wait import poll

HOST = "127.0.0.1"


def spark_home() -> str:
    import pyspark

    return os.path.dirname(pyspark.__file__)


def _env(log_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "SPARK_HOME": spark_home(),
            "SPARK_LOCAL_IP": HOST,
            "SPARK_LOG_DIR": str(log_dir),
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_NO_DAEMONIZE": "1",
        }
    )
    env.pop("SPARK_CONF_DIR", None)
    return env


@dataclass
class Worker:
    proc: subprocess.Popen
    work_dir: Path
    log: Path
    killed: bool = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def tree(self) -> list[int]:
        return [self.pid, *descendants(self.pid)]

    def executor_tree(self) -> list[int]:
        """The worker's executors and their Python workers (not the worker JVM itself)."""
        return descendants(self.pid)

    def signal_executors(self, sig: int) -> None:
        for pid in self.executor_tree():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """SIGKILL the worker and everything it started, as if its machine were lost."""
        self.killed = True
        pids = self.tree()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(30)
        for pid in pids:  # the orphans are reaped by init; wait until they are gone
            wait_gone(pid)


@dataclass
class SparkCluster:
    root: Path
    master_port: int = 0
    web_port: int = 0
    master: subprocess.Popen | None = None
    workers: list[Worker] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"spark://{HOST}:{self.master_port}"

    def _launch(self, cls: str, args: list[str], log: Path) -> subprocess.Popen:
        cmd = [os.path.join(spark_home(), "bin", "spark-class"), cls, *args]
        with open(log, "ab") as out:
            return subprocess.Popen(
                cmd,
                env=_env(self.root / "logs"),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.root,
            )

    def start(self, workers: int = 2, timeout: float = 120.0) -> SparkCluster:
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        self.master_port, self.web_port = free_port(), free_port()
        self.master = self._launch(
            "org.apache.spark.deploy.master.Master",
            ["--host", HOST, "--port", str(self.master_port), "--webui-port", str(self.web_port)],
            self.root / "logs" / "master.log",
        )
        for _ in range(workers):
            self.add_worker()
        self.wait_workers(workers, timeout)
        return self

    def add_worker(self) -> Worker:
        i = len(self.workers)
        work = self.root / f"worker{i}"
        work.mkdir(parents=True, exist_ok=True)
        log = self.root / "logs" / f"worker{i}.log"
        proc = self._launch(
            "org.apache.spark.deploy.worker.Worker",
            [
                "--host",
                HOST,
                "--cores",
                "1",
                "--memory",
                "1g",
                "--webui-port",
                str(free_port()),
                "--work-dir",
                str(work),
                self.url,
            ],
            log,
        )
        w = Worker(proc, work, log)
        self.workers.append(w)
        return w

    def status(self) -> dict:
        with urllib.request.urlopen(f"http://{HOST}:{self.web_port}/json", timeout=5) as r:
            return json.load(r)

    def alive_workers(self) -> int:
        try:
            return sum(1 for w in self.status().get("workers", []) if w.get("state") == "ALIVE")
        except OSError:
            return -1

    def wait_workers(self, n: int, timeout: float = 120.0) -> None:
        def alive() -> bool:
            for p in [self.master, *(w.proc for w in self.workers if not w.killed)]:
                if p is not None and p.poll() is not None:
                    raise RuntimeError(f"a Spark process exited ({p.args[1]}): see {self.root / 'logs'}")
            return self.alive_workers() == n

        poll(alive, f"{n} workers alive (see {self.root / 'logs'})", timeout, every=0.1)

    def stop(self) -> None:
        """Stop every process this cluster started, by PID (workers with their children)."""
        for w in self.workers:
            if w.proc.poll() is None:
                w.kill()
        if self.master is not None and self.master.poll() is None:
            for pid in [self.master.pid, *descendants(self.master.pid)]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.master.wait(30)
