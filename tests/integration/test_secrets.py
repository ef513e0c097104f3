"""Issue 16 §1: the Redis password never leaves. A password is planted in the Redis URL (a real
redis-server with ``requirepass``, its password in a 0600 config file) and every output a person
or a log collector sees is grepped for it: the CLI's stdout and stderr (Redis unreachable, wrong
password, no password, a database index the server does not have, and the successful paths), and
the coordinator's and compactor's logs while Redis goes away under them and when they start
against an unreachable URL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kompaktor.local.redis_server import RedisProcess
from tests.support.ports import free_port
from tests.support.wait import PollTimeout, poll

pytestmark = pytest.mark.redis

PASSWORD = "PLANTED-s3cret-9f2a"
WRONG = "PLANTED-wrong-77b1"
EXE = Path(sys.executable).parent / "kompaktor"


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[RedisProcess]:
    """A redis-server of this test alone that requires PASSWORD (the tests stop it)."""
    server = RedisProcess(tmp_path / "redis", password=PASSWORD).start()
    yield server
    server.stop()


def run_cli(*args: str, env: dict[str, str] | None = None, storage: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(EXE), *args, "--storage", str(storage)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def assert_clean(text: str) -> None:
    assert PASSWORD not in text and WRONG not in text, text


def test_the_server_really_requires_the_password(secured: RedisProcess) -> None:
    import redis

    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=secured.port).ping()
    assert redis.Redis(port=secured.port, password=PASSWORD).ping()
    assert PASSWORD not in " ".join(secured.proc.args)  # not on redis-server's command line


def test_cli_never_prints_the_password(secured: RedisProcess, tmp_path: Path) -> None:
    good = secured.url
    assert PASSWORD in good
    wrong = f"redis://:{WRONG}@127.0.0.1:{secured.port}/0"
    no_password = f"redis://127.0.0.1:{secured.port}/0"
    unreachable = f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0"
    no_such_db = f"redis://:{PASSWORD}@127.0.0.1:{secured.port}/99"
    not_redis = f"http://:{PASSWORD}@127.0.0.1:{secured.port}/0"
    cases = {
        unreachable: "is unreachable: Error 111 connecting to 127.0.0.1",
        wrong: "refused the credentials (authentication failed): check the password in the Redis URL",
        no_password: "requires a password: give it in the Redis URL",
        no_such_db: "has no such database (DB index out of range)",
        not_redis: "invalid Redis URL 'http://***@127.0.0.1",
    }
    for url, message in cases.items():
        for args in (["table", "create", "t", "--redis", url], ["status", "--redis", url]):
            p = run_cli(*args, storage=tmp_path / "files")
            assert p.returncode == 1, (args, p.stderr)
            assert p.stdout == ""
            assert p.stderr.count("\n") == 1 and p.stderr.startswith("error: "), p.stderr
            assert message in p.stderr, p.stderr
            assert "Traceback" not in p.stderr
            assert_clean(p.stderr)
            if "***" not in message and url != no_password:
                assert "redis://***@127.0.0.1:" in p.stderr
    # the working paths, the URL from the environment as pods get it
    env = {"KOMPAKTOR_REDIS_URL": good}
    for args in (
        ["table", "create", "t"],
        ["table", "list"],
        ["status"],
        ["status", "--json"],
        ["scan", "t"],
        ["table", "config", "t"],
    ):
        p = run_cli(*args, env=env, storage=tmp_path / "files")
        assert p.returncode == 0, (args, p.stderr)
        assert_clean(p.stdout + p.stderr)
    # --debug shows the traceback, still without the password
    p = run_cli("--debug", "table", "list", "--redis", wrong, storage=tmp_path / "files")
    assert p.returncode == 1 and "Traceback" in p.stderr
    assert_clean(p.stderr)


def _start(args: list[str], url: str, log: Path) -> subprocess.Popen:
    out = open(log, "wb")  # noqa: SIM115 — the child's stdout and stderr for its lifetime
    env = {**os.environ, "KOMPAKTOR_REDIS_URL": url, "KOMPAKTOR_LOG": "DEBUG", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([str(EXE), *args], stdout=out, stderr=subprocess.STDOUT, env=env)


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        os.kill(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGKILL)
            p.wait(timeout=10)


def _wait_for(path: Path, text: str, timeout: float) -> bool:
    """Whether ``text`` appears in the log at ``path`` within ``timeout`` seconds."""
    try:
        return poll(lambda: text in path.read_text(errors="replace"), f"{text!r} in {path}", timeout, 0.2)
    except PollTimeout:
        return False


PROCESSES = {
    "coordinator": ["coordinator", "--metrics-port", "-1", "--full-scan-interval", "1"],
    "compactor": ["compactor", "--group", "small", "--engine", "arrow", "--http-port", "-1", "--id", "c1"],
}


def test_coordinator_and_compactor_logs_never_show_the_password(secured: RedisProcess, tmp_path: Path) -> None:
    """Both processes run against the secured Redis, which then goes away: they log that the
    store is unavailable (with its address) and keep retrying; their whole output is grepped."""
    logs = {name: tmp_path / f"{name}.log" for name in PROCESSES}
    procs = {
        name: _start([*args, "--storage", str(tmp_path / "files")], secured.url, logs[name])
        for name, args in PROCESSES.items()
    }
    try:
        assert _wait_for(logs["coordinator"], "leads (fencing token", 60), logs["coordinator"].read_text()
        assert _wait_for(logs["compactor"], "DEBUG", 60) or procs["compactor"].poll() is None
        time.sleep(1.0)
        secured.stop()
        for name in PROCESSES:
            assert _wait_for(logs[name], "unavailable", 60), logs[name].read_text()
            assert procs[name].poll() is None, f"{name} exited: {logs[name].read_text()}"
    finally:
        for p in procs.values():
            _stop(p)
    for name in PROCESSES:
        text = logs[name].read_text()
        assert f"Redis at redis://***@127.0.0.1:{secured.port}/0 is unreachable" in text, text
        assert_clean(text)


def test_coordinator_and_compactor_refuse_an_unreachable_url_in_one_line(tmp_path: Path) -> None:
    url = f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0"
    logs = {name: tmp_path / f"{name}.log" for name in PROCESSES}
    procs = {
        name: _start([*args, "--storage", str(tmp_path / "files")], url, logs[name]) for name, args in PROCESSES.items()
    }
    try:
        for name, p in procs.items():
            assert p.wait(timeout=60) == 1, logs[name].read_text()
    finally:
        for p in procs.values():
            _stop(p)
    for name in PROCESSES:
        text = logs[name].read_text()
        assert text.splitlines()[-1].startswith("error: Redis at redis://***@127.0.0.1:"), text
        assert "Traceback" not in text
        assert_clean(text)
