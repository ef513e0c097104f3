"""A CompactorGroup's settings reach the running compactor, through their one channel (issue 26 §1).

The operator validates the CompactorGroup into a GroupConfig and stores it in Redis with its
Redis backend (``backend.RedisBackend.put_group``); a compactor pod runs ``kompaktor compactor``
with only the arguments the operator's manifests give it (group and port) and reads its
settings there at start. Here: a real redis-server, the operator's own functions for the
stored config and the pod's arguments, and real ``kompaktor compactor`` processes, whose start-up
line says what they run with. A change of the CompactorGroup rolls the pods (the settings digest
on the pod template, tests/unit/test_manifests.py); here the old compactor is drained (SIGTERM,
as the kubelet does after the preStop drain) and a new one started, which runs the new settings.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from kompaktor.local.redis_server import RedisProcess
from kompaktor.metadata import acl
from kompaktor.metadata.store import MetadataStore
from kompaktor.resources import models as m
from kompaktor.resources.operator_config import OperatorConfig
from kompaktor.worker.compactor import WorkerSettings
from kompaktor_operator import backend as backends
from kompaktor_operator import manifests, naming
from tests.support.broker import running_broker
from tests.support.procs import python_env
from tests.support.wait import poll

pytestmark = [pytest.mark.redis]

GROUP = "settings"
SETTINGS_LINE = re.compile(r"compactor (\S+) of group (\S+): (engine=.*) \(from (.*)\)$")


@pytest.fixture(autouse=True)
def broker(redis_url: str) -> Iterator[None]:
    """The coordinator's broker: a compactor pod's writes are asked of it (``--broker``)."""
    with running_broker(redis_url):
        yield


class Compactor:
    """``kompaktor compactor`` with the pod's arguments (plus a free HTTP port on loopback), in its
    own process group so that a Spark JVM it may have started goes with it."""

    def __init__(self, tmp: Path, redis_url: str, cid: str, *extra: str, env: dict[str, str] | None = None) -> None:
        args = [*manifests.compactor_args(GROUP), "--http-port", "0", "--http-host", "127.0.0.1", *extra]
        env = python_env(
            KOMPAKTOR_REDIS_URL=redis_url,
            KOMPAKTOR_STORAGE=str(tmp / "files"),
            KOMPAKTOR_SPARK_LOCAL_DIR=str(tmp / "spark"),
            POD_NAME=cid,
            PYTHONUNBUFFERED="1",
            **(env or {}),
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kompaktor", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def settings(self, timeout: float = 60.0) -> tuple[str, str]:
        """(the settings it runs with, where they came from), from its start-up line."""

        def line() -> Any:
            for text in self.lines:
                if found := SETTINGS_LINE.search(text.rstrip("\n")):
                    return found
            assert self.proc.poll() is None, f"the compactor exited {self.proc.returncode}:\n{self.log}"
            return None

        found = poll(line, "the compactor's settings line", timeout)
        assert found.group(2) == GROUP
        return found.group(3), found.group(4)

    def drain(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the compactor did not drain within 30 s:\n{self.log}") from None

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its own group: this process and its children
            self.proc.wait(10)


@pytest.fixture
def start(tmp_path: Path, redis_url: str):
    procs: list[Compactor] = []

    def run(cid: str, *extra: str, env: dict[str, str] | None = None) -> Compactor:
        p = Compactor(tmp_path, redis_url, cid, *extra, env=env)
        procs.append(p)
        return p

    yield run
    for p in procs:
        p.stop()


def apply(backend: backends.RedisBackend, spec: dict[str, Any]) -> str:
    """What the operator does with a CompactorGroup: validate, store the GroupConfig; returns the
    settings line a compactor of the group should log."""
    cfg = m.to_group_config(GROUP, m.CompactorGroupSpec.model_validate(spec))
    backend.put_group(cfg)
    return WorkerSettings.for_group(cfg, "-").describe()


def registered(store: MetadataStore, cid: str) -> bool:
    return any(c.id == cid for c in store.fleet.compactors(GROUP))


def test_each_setting_of_a_compactor_group_reaches_the_running_compactor(redis_url: str, start) -> None:
    backend = backends.RedisBackend(redis_url)
    store = backend.store
    first = {
        "spark": {
            "engine": "arrow",
            "master": "local[1]",
            "conf": {"spark.sql.shuffle.partitions": "2"},
            "driverMemory": "512m",
        },
        "drainGraceSeconds": 40,
        "resume": {"minInputSize": "256Mi"},
        "history": {"maxRecords": 500, "maxAgeSeconds": 3600},
    }
    expected = apply(backend, first)
    assert expected == (
        "engine=arrow spark_master=local[1] spark_conf=spark.sql.shuffle.partitions=2 "
        "driver_memory=512m drain_grace=40s resume=256Mi history=500/3600s"
    )
    a = start("c-1")
    assert a.settings() == (expected, "the group's configuration in Redis")
    poll(lambda: registered(store, "c-1"), "compactor c-1 registered", alive=(a.proc,))

    # every setting but the engine changed at once; the pod rolls: the old compactor drains,
    # the new one reads the new settings
    second = {
        "spark": {
            "engine": "arrow",
            "master": "local[2]",
            "conf": {"spark.sql.shuffle.partitions": "3", "spark.executor.memory": "1g"},
            "driverMemory": "1g",
        },
        "drainGraceSeconds": 41,
        "resume": {"enabled": False},
    }
    expected = apply(backend, second)
    assert a.drain() == 0, a.log
    b = start("c-2")
    assert b.settings() == (expected, "the group's configuration in Redis")
    assert "spark_master=local[2]" in expected and "drain_grace=41s" in expected
    assert expected.endswith(" resume=off history=10000/604800s")
    poll(lambda: registered(store, "c-2"), "compactor c-2 registered", alive=(b.proc,))
    assert b.drain() == 0, b.log

    # resuming on again, from another size
    expected = apply(backend, {**second, "resume": {"enabled": True, "minInputSize": "3G"}})
    b = start("c-2b")
    assert b.settings() == (expected, "the group's configuration in Redis")
    assert expected.endswith(" drain_grace=41s resume=3000000000 history=10000/604800s")
    poll(lambda: registered(store, "c-2b"), "compactor c-2b registered", alive=(b.proc,))
    assert b.drain() == 0, b.log

    # the engine: a compactor of a group switched to spark runs Spark, with the group's master
    # and driver memory (its line comes once the session runs)
    conf = {"spark.sql.shuffle.partitions": "1"}
    spark = {"engine": "spark", "master": "local[1]", "conf": conf, "driverMemory": "512m"}
    expected = apply(backend, {**second, "spark": spark})
    c = start("c-3")
    assert c.settings(timeout=180) == (expected, "the group's configuration in Redis")
    assert expected.startswith("engine=spark spark_master=local[1] ")
    poll(lambda: registered(store, "c-3"), "compactor c-3 registered", alive=(c.proc,))
    assert c.drain() == 0, c.log


def test_command_line_flags_override_the_group_for_a_compactor_run_by_hand(redis_url: str, start) -> None:
    backend = backends.RedisBackend(redis_url)
    apply(backend, {"spark": {"engine": "arrow", "master": "local[1]"}, "drainGraceSeconds": 40})
    p = start("by-hand", "--drain-grace", "5", "--spark-conf", "spark.sql.shuffle.partitions=4", "--history-age", "60")
    settings, source = p.settings()
    assert settings == (
        "engine=arrow spark_master=local[1] spark_conf=spark.sql.shuffle.partitions=4 driver_memory=- drain_grace=5s "
        "resume=1Gi history=10000/60s"
    )
    assert source == (
        "the group's configuration in Redis, overridden by --drain-grace --history-records/--history-age --spark-conf"
    )
    poll(lambda: registered(backend.store, "by-hand"), "registered", alive=(p.proc,))
    assert p.drain() == 0, p.log


def test_a_group_nobody_configured_runs_with_the_crds_defaults(redis_url: str, start) -> None:
    p = start("unconfigured", "--engine", "arrow")
    settings, source = p.settings()
    defaults = WorkerSettings.for_group(m.to_group_config(GROUP, m.CompactorGroupSpec()), "-")
    assert settings == WorkerSettings(**{**defaults.__dict__, "engine": "arrow"}).describe()
    assert "drain_grace=300s" in settings and "spark_master=local[*]" in settings and "resume=1Gi" in settings
    assert source.startswith("the defaults (no configuration of this group in Redis)")
    assert any(" WARNING " in line and "of group" in line for line in p.lines), p.log  # said as a warning
    poll(lambda: registered(MetadataStore.from_url(redis_url), "unconfigured"), "registered", alive=(p.proc,))
    assert p.drain() == 0, p.log


def test_a_pod_made_by_the_operator_does_not_start_without_its_groups_configuration(
    redis_url: str, start, store: MetadataStore
) -> None:
    """The operator stores a group before it makes the group's pods, and puts the digest of its
    settings on them: a pod whose group Redis does not hold (Redis lost it, or another Redis)
    stops with one line instead of running with defaults that differ from the CompactorGroup."""
    spec = m.CompactorGroupSpec.model_validate({"spark": {"engine": "arrow"}, "drainGraceSeconds": 40})
    digest = manifests.settings_digest(GROUP, spec)
    p = start("made-by-operator", env={manifests.SETTINGS_DIGEST_ENV: digest})
    assert p.proc.wait(30) == 1, p.log
    (line,) = p.lines
    assert line.startswith(f"error: group {GROUP} has no configuration in Redis (kz:groups)"), line
    assert not store.fleet.compactors(GROUP)

    backend = backends.RedisBackend(redis_url)
    expected = apply(backend, {"spark": {"engine": "arrow"}, "drainGraceSeconds": 40})
    ok = start("made-by-operator-2", env={manifests.SETTINGS_DIGEST_ENV: digest})
    assert ok.settings() == (expected, "the group's configuration in Redis")
    assert ok.drain() == 0, ok.log

    # the group changed since this pod was made (a restart during a rollout): it does not run
    # settings it was not made for (issue 34 §2); the rollout replaces it
    apply(backend, {"spark": {"engine": "arrow"}, "drainGraceSeconds": 41})
    old = start("made-by-operator-3", env={manifests.SETTINGS_DIGEST_ENV: digest})
    assert old.proc.wait(30) == 1, old.log
    (line,) = old.lines
    assert line.startswith(f"error: group {GROUP}'s settings in Redis (kz:groups) have digest "), line
    assert f"not this pod's {digest}" in line


def test_the_compactors_engine_resumes_from_its_groups_size(redis_url: str, tmp_path: Path) -> None:
    """spec.resume.minInputSize is the engine's threshold in the compactor (the engine decides
    which merges are resumable), and spec.resume.enabled: false gives no merge a resume log."""
    from kompaktor.files.storage import Storage
    from kompaktor.worker.compactor import Compactor as Worker

    backend = backends.RedisBackend(redis_url)
    apply(backend, {"spark": {"engine": "arrow"}, "resume": {"minInputSize": "64Mi"}})
    cfg = backend.store.fleet.groups()[GROUP]
    worker = Worker(backend.store, Storage.from_uri(str(tmp_path)), WorkerSettings.for_group(cfg, "in-process"))
    assert (worker.settings.resume, worker.engine.resume_min_bytes) == (True, 64 << 20)
    apply(backend, {"spark": {"engine": "arrow"}, "resume": {"enabled": False}})
    cfg = backend.store.fleet.groups()[GROUP]
    off = Worker(backend.store, Storage.from_uri(str(tmp_path)), WorkerSettings.for_group(cfg, "in-process-2"))
    assert off.settings.resume is False


# -- issue 34 §2: a compactor checks what it is told to run ---------------------------------------
ADMITTED = {"spark": {"engine": "arrow", "master": "local[1]", "conf": {"spark.ui.enabled": "false"}}}
RULES = OperatorConfig(allowed_spark_conf=("spark.ui.*",), allowed_spark_masters=("spark://spark-master.spark:*",))


def pod_env(spec: dict[str, Any]) -> dict[str, str]:
    """The environment the operator's pod template gives the compactor container (its literal
    values, and the settings digest its annotation carries)."""
    template = manifests.build_pod_template(GROUP, m.CompactorGroupSpec.model_validate(spec), RULES)
    (container,) = template["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e and e["name"].startswith("KOMPAKTOR_ALLOW")}
    return {**env, manifests.SETTINGS_DIGEST_ENV: template["metadata"]["annotations"][naming.SETTINGS_ANNOTATION]}


@pytest.fixture
def users(tmp_path: Path) -> Iterator[RedisProcess]:
    server = RedisProcess(tmp_path / "redis", users=acl.new_passwords()).start()
    yield server
    server.stop()


@pytest.mark.parametrize(
    "tampered, refusal",
    [
        # code from elsewhere into every next compactor, with the storage credentials
        ({"spark_conf": {"spark.jars": "http://evil.example/x.jar"}, "engine": "spark"}, "'spark.jars' is not allowed"),
        # the rows to a master elsewhere
        ({"spark_master": "spark://attacker.example:7077"}, "'spark://attacker.example:7077' is not allowed"),
        # settings each allowed, but not the ones the operator admitted for this pod
        ({"spark_master": "spark://spark-master.spark:7077"}, "not this pod's"),
        ({"drain_grace_seconds": 0}, "not this pod's"),
    ],
)
@pytest.mark.parametrize("role", ["compactor", "admin"])
def test_a_compactor_refuses_group_settings_written_outside_the_operator(
    users: RedisProcess, tmp_path: Path, role: str, tampered: dict[str, Any], refusal: str
) -> None:
    operator = backends.RedisBackend(users.role_url("operator"))
    operator.put_group(m.to_group_config(GROUP, m.CompactorGroupSpec.model_validate(ADMITTED)))
    env = pod_env(ADMITTED)
    assert env["KOMPAKTOR_ALLOWED_SPARK_CONF"] == "spark.ui.*"  # the pod's spec carries the rules
    compactor_url = users.role_url("compactor")
    admitted = Compactor(tmp_path, compactor_url, "admitted", env=env)
    try:
        assert admitted.settings()[1] == "the group's configuration in Redis"
        assert admitted.drain() == 0, admitted.log
    finally:
        admitted.stop()

    # someone with another Redis user rewrites the group (a compactor taken over by a file it parsed)
    stored = json.loads(redis.Redis.from_url(users.url).hget("kz:groups", GROUP))
    try:
        redis.Redis.from_url(users.role_url(role)).hset("kz:groups", GROUP, json.dumps({**stored, **tampered}))
    except redis.exceptions.NoPermissionError:  # the user's rights already keep it out (issue 34 §1)
        assert json.loads(redis.Redis.from_url(users.url).hget("kz:groups", GROUP)) == stored
        return
    p = Compactor(tmp_path, compactor_url, "next", env=env)
    try:
        assert p.proc.wait(30) == 1, p.log
        (line,) = [x for x in p.lines if " WARNING " not in x]  # one line, and no Spark started
        assert line.startswith(f"error: group {GROUP}'s settings in Redis (kz:groups) "), line
        assert refusal in line and line.rstrip().endswith(("not starting", "outside the operator)")), line
        assert not any(SETTINGS_LINE.search(x.rstrip()) for x in p.lines)
        assert "next" not in {c.id for c in backends.RedisBackend(users.url).store.fleet.compactors(GROUP)}
    finally:
        p.stop()
