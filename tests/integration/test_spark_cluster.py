"""Issue 17 §2 and §4: the Spark engine on a real Spark standalone cluster.

A module fixture starts a master and two workers (1 core each, 127.0.0.1 only) with pyspark's
own ``bin/spark-class`` (:mod:`.spark_cluster`) and one compactor-side driver process on it
(:mod:`.spark_cluster_driver`), whose engine is made from a CompactorGroup resource the way a
compactor makes it. The tests:

- a merge's tasks run on both workers (task attempts from the driver's REST API) and the output
  equals the Arrow engine's;
- the CompactorGroup's master, executor memory/cores and conf reach the session and the master;
- a worker SIGKILLed (with its executor and Python workers) while it holds a task: Spark runs the
  task again on the other worker, the output is identical and no part is left;
- a cancelled merge leaves nothing behind and no task running;
- every worker lost for good: the merge fails in one line, nothing is left;
- a master URL that does not answer: one line, nothing written, Redis unchanged.

Nothing waits a fixed time: "mid-merge" is made deterministic by stopping (SIGSTOP) the
executor of the worker to be killed before the merge starts, so that the task it is given cannot
finish, and killing it once the other worker has done every other task.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from kompaktor.engines.api import MergeRequest
from kompaktor.engines.arrow import ArrowMergeEngine
from kompaktor.files.sortedfile import entries_to_table
from kompaktor.files.storage import Storage
from kompaktor.model.iterators import IteratorSettings
from kompaktor.model.keys import Entry, sort_key
from tests.support.ports import free_port
from tests.support.rawredis import raw_redis
from tests.support.wait import PollTimeout, poll

from .spark_cluster import SparkCluster

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(600)]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
#: the CompactorGroup the driver's engine is made from (spark.master filled in by the fixture)
GROUP = {
    "minReplicas": 1,
    "maxReplicas": 2,
    "spark": {
        "engine": "spark",
        "executorMemory": "600m",
        "executorCores": 1,
        "conf": {
            "spark.cores.max": "2",
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.task.maxFailures": "4",
        },
    },
}
N_FILES = 4
PER_FILE = 4000
TASK_ENTRIES = 1000
#: the merge's Spark tasks: its 16 ranges (of TASK_ENTRIES) lie in one row group per input, so
#: the engine runs them as one run of consecutive ranges per task slot (engines.spark.task_runs):
#: 2 workers of 1 core
N_TASKS = 2


class Driver:
    def __init__(self, setup: dict, log: Path) -> None:
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join([str(ROOT / "compactor"), str(ROOT / "operator")]),
            SPARK_LOCAL_IP="127.0.0.1",
        )
        self.log = open(log, "ab")  # noqa: SIM115 — closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "spark_cluster_driver.py"), json.dumps(setup)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=env,
            cwd=str(log.parent),
            start_new_session=True,
        )
        self.pending: list[dict] = []

    def send(self, **cmd) -> None:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def next_event(self, event: str, timeout: float = 300.0, **match) -> dict:
        for i, e in enumerate(self.pending):
            if e["event"] == event and all(e.get(k) == v for k, v in match.items()):
                return self.pending.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {event} event from the driver in {timeout:.0f}s (see {self.log.name})")
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if not ready:
                continue
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the driver exited ({self.proc.poll()}); see {self.log.name}")
            e = json.loads(line)
            if e["event"] == event and all(e.get(k) == v for k, v in match.items()):
                return e
            self.pending.append(e)

    def ask(self, op: str, **kw) -> dict:
        self.send(op=op, **kw)
        return self.next_event(op)

    def wait_for(self, what: str, cond, op: str, timeout: float = 120.0, **kw) -> dict:
        """Ask ``op`` until ``cond(answer)`` holds (polling, bounded by ``timeout``)."""
        last: list[dict] = []

        def answered() -> dict | None:
            last[:] = [self.ask(op, **kw)]
            return last[0] if cond(last[0]) else None

        try:
            return poll(answered, what, timeout)
        except PollTimeout as exc:
            raise PollTimeout(f"{exc}: last answer {last[0] if last else None}") from None

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send(op="quit")
                self.proc.wait(60)
            except (OSError, subprocess.TimeoutExpired):
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
        self.log.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    c = SparkCluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        c.start(workers=2)
        yield c
    finally:
        c.stop()


def group_spark_settings(master: str) -> tuple[str, dict[str, str], str | None]:
    """What a compactor of the CompactorGroup ``GROUP`` makes its engine with: the operator's
    GroupConfig (stored in Redis, read by `kompaktor compactor`)."""
    from kompaktor.resources.models import CompactorGroupSpec, to_group_config

    spec = CompactorGroupSpec.model_validate({**GROUP, "spark": {**GROUP["spark"], "master": master}})
    cfg = to_group_config("cluster", spec)
    return cfg.spark_master, dict(cfg.spark_conf), cfg.driver_memory


@pytest.fixture(scope="module")
def driver(cluster: SparkCluster, tmp_path_factory: pytest.TempPathFactory):
    master, conf, driver_memory = group_spark_settings(cluster.url)
    d = Driver(
        {
            "master": master,
            "conf": conf,
            "driver_memory": driver_memory,
            "task_entries": TASK_ENTRIES,
            "no_executor_timeout": 5.0,
        },
        tmp_path_factory.mktemp("spark-driver") / "driver.log",
    )
    try:
        d.next_event("ready", timeout=300)
        yield d
    finally:
        d.stop()


def ensure_two_workers(cluster: SparkCluster, driver: Driver) -> None:
    alive = [w for w in cluster.workers if w.proc.poll() is None]
    for _ in range(2 - len(alive)):
        cluster.add_worker()
    cluster.wait_workers(2)
    driver.wait_for("two executors", lambda a: a["n"] == 2, "executors")


def sources(seed: int = 5) -> list[list[Entry]]:
    rng = np.random.default_rng(seed)
    out = []
    for f in range(N_FILES):
        rows = rng.choice(3 * PER_FILE, size=PER_FILE, replace=False)
        out.append(
            sorted(
                (Entry(b"r%06d" % r, b"f", b"q", b"", f + 1, bool(f and r % 13 == 0), b"v%d" % f) for r in rows),
                key=sort_key,
            )
        )
    return out


@pytest.fixture
def inputs(storage: Storage) -> list[str]:
    storage.ensure_dir("t1")
    paths = []
    for i, src in enumerate(sources()):
        paths.append(f"t1/I{i:06d}.parquet")
        pq.write_table(entries_to_table(src), storage.path(paths[-1]), row_group_size=PER_FILE)  # one row group
    return paths


def arrow_reference(storage: Storage, inputs: list[str]) -> object:
    req = MergeRequest(
        tuple(inputs), "ref/A000000.parquet", None, None, IteratorSettings(max_versions=1, full=True), "REF"
    )
    storage.ensure_dir("ref")
    ArrowMergeEngine().merge(storage, req)
    return pq.read_table(storage.path("ref/A000000.parquet"))


def files(storage: Storage, under: str = "t1") -> list[str]:
    return sorted(p for p, _ in storage.list_files(under))


def merge(driver: Driver, storage: Storage, inputs: list[str], id_: str, **kw) -> None:
    driver.send(op="merge", id=id_, storage=storage.uri, inputs=inputs, output="t1/A000001.parquet", **kw)


def last_stage(driver: Driver) -> int:
    """The newest stage the driver's REST API knows of (-1: none)."""
    return max((t["stage"] for t in driver.ask("tasks")["tasks"]), default=-1)


def tasks_of_merge(driver: Driver, n_parts: int, after: int) -> list[dict]:
    """Task attempts of the merge's stage, the first complete one after stage ``after`` (the
    REST API lags behind the job by a little: polled until it shows the stage complete)."""

    def stage(a: dict) -> int | None:
        done = [t["stage"] for t in a["tasks"] if t["stage_status"] == "COMPLETE" and t["stage"] > after]
        return min(done) if done else None

    def merged(a: dict) -> bool:
        sid = stage(a)
        return (
            sid is not None and sum(1 for t in a["tasks"] if t["stage"] == sid and t["status"] == "SUCCESS") == n_parts
        )

    ans = driver.wait_for("the merge stage in the REST API", merged, "tasks")
    sid = stage(ans)
    return [t for t in ans["tasks"] if t["stage"] == sid]


def executor_id(worker) -> str:
    """The executor a worker runs for the app: its working directory is work/<app>/<executor id>."""
    for pid in worker.executor_tree():
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if Path(cwd).parent.name.startswith("app-"):
            return Path(cwd).name
    raise AssertionError(f"no executor under worker {worker.pid}")


def test_merge_runs_on_both_workers_and_equals_the_arrow_engine(cluster, driver, storage, inputs):
    ensure_two_workers(cluster, driver)
    expected = arrow_reference(storage, inputs)
    after = last_stage(driver)
    merge(driver, storage, inputs, "both")
    done = driver.next_event("done", id="both")
    assert "error" not in done, done
    assert pq.read_table(storage.path("t1/A000001.parquet")).equals(expected)
    assert files(storage) == sorted([*inputs, "t1/A000001.parquet"])
    tasks = tasks_of_merge(driver, N_TASKS, after)
    on = {t["executor"] for t in tasks if t["status"] == "SUCCESS"}
    assert on == {executor_id(w) for w in cluster.workers if w.proc.poll() is None}, tasks


def test_a_pipeline_writes_and_reads_a_table_with_executors_on_both_workers(
    cluster, driver, client, redis_url, storage
):
    """docs/spark.md's pipeline on the cluster: the executors on both workers write a DataFrame
    with versions and deletes as one import (kompaktor.spark.write) and read the merged view
    back (the kompaktor source); the view is the reference's (the merge rules, written in
    test_read_arrow, not the product's merge) and every file the write staged is registered."""
    from tests.integration.test_read_arrow import reference

    ensure_two_workers(cluster, driver)
    client.store.tables.create_table("pipe", [b"r000300", b"r000600"])
    rng = np.random.default_rng(11)
    keys = {(int(r), int(t)) for r, t in zip(rng.integers(0, 900, 3000), rng.integers(1, 6, 3000), strict=True)}
    written = [
        Entry(
            b"r%06d" % r, b"f", b"q%d" % (r % 3), b"", ts, (r + ts) % 7 == 0, b"" if (r + ts) % 7 == 0 else b"v%d" % ts
        )
        for r, ts in sorted(keys)
    ]
    after = last_stage(driver)
    hexed = [[e.row.hex(), e.cf.hex(), e.cq.hex(), e.vis.hex(), e.ts, e.deleted, e.value.hex()] for e in written]
    answer = driver.ask("roundtrip", redis=redis_url, storage=storage.uri, table="pipe", entries=hexed)
    assert "error" not in answer, answer
    got = sorted(
        (Entry(*(bytes.fromhex(x) for x in r[:4]), r[4], r[5], bytes.fromhex(r[6])) for r in answer["rows"]),
        key=sort_key,
    )
    assert got == reference([written], None, None, 1)
    tid = client.store.tables.table_id("pipe")
    registered = {f for t in client.store.tables.tablets(tid) for f in t.files}
    assert registered and {p for p, _ in storage.list_files("tables")} == registered
    ran_on = {t["executor"] for t in driver.ask("tasks")["tasks"] if t["stage"] > after and t["status"] == "SUCCESS"}
    assert ran_on == {executor_id(w) for w in cluster.workers if w.proc.poll() is None}


def test_the_groups_spark_settings_reach_the_session_and_the_master(cluster, driver):
    conf = driver.ask("conf")["conf"]
    assert conf["spark.master"] == cluster.url
    assert conf["spark.executor.memory"] == "600m" and conf["spark.executor.cores"] == "1"
    assert conf["spark.task.maxFailures"] == "4"
    apps = cluster.status()["activeapps"]
    assert len(apps) == 1 and apps[0]["memoryperexecutor"] == 600 and apps[0]["cores"] == 2


def test_a_worker_killed_mid_merge_its_task_runs_elsewhere(cluster, driver, storage, inputs):
    ensure_two_workers(cluster, driver)
    expected = arrow_reference(storage, inputs)
    victim, survivor = [w for w in cluster.workers if w.proc.poll() is None][:2]
    lost, kept = executor_id(victim), executor_id(survivor)
    n = N_TASKS
    after = last_stage(driver)
    victim.signal_executors(signal.SIGSTOP)  # the task it is given cannot finish
    merge(driver, storage, inputs, "kill")
    driver.wait_for(
        "every task but the stopped worker's done",
        lambda a: any(s["total"] == n and s["completed"] == n - 1 and s["active"] == 1 for s in a["stages"]),
        "stages",
    )
    victim.kill()
    done = driver.next_event("done", id="kill")
    assert "error" not in done, done
    assert pq.read_table(storage.path("t1/A000001.parquet")).equals(expected)
    assert files(storage) == sorted([*inputs, "t1/A000001.parquet"])  # no stray part
    tasks = tasks_of_merge(driver, n, after)
    failed = [t for t in tasks if t["executor"] == lost]
    assert failed and all(t["status"] != "SUCCESS" for t in failed), tasks
    retried = {t["index"] for t in tasks if t["executor"] == kept and t["status"] == "SUCCESS"}
    assert {t["index"] for t in failed} <= retried


def test_cancel_leaves_nothing_behind(cluster, driver, storage, inputs):
    ensure_two_workers(cluster, driver)
    merge(driver, storage, inputs, "cancel", cancel_after_parts=1)
    done = driver.next_event("done", id="cancel")
    assert done.get("type") == "MergeCancelled", done
    assert files(storage) == sorted(inputs)
    assert driver.ask("stages")["stages"] == []  # no task of it still runs


def test_every_worker_lost_for_good_fails_in_one_line(cluster, driver, storage, inputs):
    ensure_two_workers(cluster, driver)
    workers = [w for w in cluster.workers if w.proc.poll() is None]
    for w in workers:
        w.signal_executors(signal.SIGSTOP)
    merge(driver, storage, inputs, "lost")
    driver.wait_for("both workers hold a task", lambda a: any(s["active"] == 2 for s in a["stages"]), "stages")
    for w in workers:
        w.kill()
    done = driver.next_event("done", id="lost")
    assert done.get("type") == "MergeError", done
    assert "\n" not in done["error"] and "no executor" in done["error"] and cluster.url in done["error"]
    assert files(storage) == sorted(inputs)
    ensure_two_workers(cluster, driver)  # the app gets executors again once workers come back


def test_a_dead_master_url_is_one_line_and_writes_nothing(tmp_path: Path, storage: Storage, inputs):
    dead = f"spark://127.0.0.1:{free_port()}"
    exe = Path(sys.executable).parent / "kompaktor"
    out = tmp_path / "out.parquet"
    r = subprocess.run(
        [
            str(exe),
            "merge",
            *(storage.path(p) for p in inputs),
            "-o",
            str(out),
            "--engine",
            "spark",
            "--spark-master",
            dead,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 1, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"error: Spark master {dead} does not answer"), r.stderr
    assert not out.exists() and files(storage) == sorted(inputs)


@pytest.mark.redis
def test_a_compactor_with_a_dead_master_url_is_one_line_and_leaves_redis_and_the_tablet(
    redis_url: str, store, storage: Storage, client
) -> None:
    from kompaktor.coordinator import Coordinator
    from tests.support.snapshot import snapshot

    store.tables.create_table("t", [], {"table.compaction.major.ratio": "1"})
    for src in sources()[:2]:
        client.flush("t", src)
    assert Coordinator(store, storage).full_scan() == 1  # a job is queued for the group
    before = snapshot(raw_redis(store)), files(storage, "")
    dead = f"spark://127.0.0.1:{free_port()}"
    exe = Path(sys.executable).parent / "kompaktor"
    r = subprocess.run(
        [
            str(exe),
            "compactor",
            "--group",
            "default",
            "--engine",
            "spark",
            "--spark-master",
            dead,
            "--http-port",
            "-1",
            "--max-jobs",
            "1",
            "--redis",
            redis_url,
            "--storage",
            storage.uri,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 1, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"error: Spark master {dead} does not answer"), r.stderr
    assert (snapshot(raw_redis(store)), files(storage, "")) == before  # not reserved, not registered, nothing written
