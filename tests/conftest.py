"""Shared fixtures: a real redis-server per test session (free port, own temp dir, AOF on)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A redis-server process the tests own; can be stopped and restarted on the same port
    and data directory (AOF on), to test faults."""

    def __init__(self, data_dir: Path) -> None:
        self.exe = shutil.which("redis-server")
        if self.exe is None:
            pytest.fail("redis-server is not installed: run `make install`")
        self.data_dir = data_dir
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.data_dir),
             "--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--daemonize", "no",
             "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        client = redis.Redis(port=self.port)
        while True:
            try:
                if client.ping():
                    break
            except (redis.ConnectionError, redis.BusyLoadingError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.02)
        client.close()

    def stop(self, kill: bool = False) -> None:
        if self.proc and self.proc.poll() is None:
            if kill:
                self.proc.kill()
            else:
                self.proc.terminate()
            self.proc.wait(timeout=20)
        self.proc = None


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """A clean database on the session's redis-server."""
    if redis_server.proc is None or redis_server.proc.poll() is not None:
        redis_server.start()
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    yield redis_server.url


@pytest.fixture
def store(redis_url: str):
    from kompaktor.store import MetadataStore

    s = MetadataStore.from_url(redis_url)
    yield s
    s.r.close()


@pytest.fixture
def storage(tmp_path: Path):
    from kompaktor.storage import Storage

    return Storage.from_uri(str(tmp_path / "files"))


@pytest.fixture
def client(store, storage):
    from kompaktor.client import Client

    return Client(store, storage)


@pytest.fixture(autouse=True)
def _no_global_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("KOMPAKTOR_REDIS_URL", "KOMPAKTOR_STORAGE"):
        monkeypatch.delenv(var, raising=False)
    os.environ.setdefault("PYSPARK_PYTHON", shutil.which("python") or "python3")
