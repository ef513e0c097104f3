"""Shared fixtures: a real redis-server per test session (free port, own temp dir, AOF on)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from kompaktor.local.redis_server import RedisProcess


class RedisServer(RedisProcess):
    """The tests' redis-server (see kompaktor.local.redis_server)."""

    def __init__(self, data_dir: Path) -> None:
        if shutil.which("redis-server") is None:
            pytest.fail("redis-server is not installed: run `make install`")
        super().__init__(data_dir)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """A clean database on the session's redis-server."""
    if not redis_server.running:
        redis_server.start()
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    yield redis_server.url


@pytest.fixture
def store(redis_url: str):
    from kompaktor.metadata.store import MetadataStore

    s = MetadataStore.from_url(redis_url)
    yield s
    s.close()


@pytest.fixture
def storage(tmp_path: Path):
    from kompaktor.files.storage import Storage

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
