"""Issue 16 §1, the operator's path: the Redis password never leaves the operator.

kopf runs the real handlers against kmock with the **real** Redis backend (``backend.RedisBackend``
on ``KOMPAKTOR_REDIS_URL``, a planted password in it): once with Redis unreachable, once with a
real redis-server that requires a password and gets a wrong one. The reconcile fails and is
retried; everything it produced — every log record (kopf's and ours), every request the operator
sent to the API server (status patches, Events) — is grepped for the password.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kompaktor.local.redis_server import RedisProcess
from tests.support.ports import free_port

from .conftest import Api, eventually
from .test_operator import SERVICES_RES, body

pytestmark = [pytest.mark.operator, pytest.mark.redis, pytest.mark.asyncio]

PASSWORD = "PLANTED-op-3d77"
WRONG = "PLANTED-op-wrong-81c0"


@pytest.fixture
def redis_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "unreachable":
        yield f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0"
        return
    server = RedisProcess(tmp_path / "redis", password=PASSWORD).start()
    try:
        yield f"redis://:{WRONG}@127.0.0.1:{server.port}/0"
    finally:
        server.stop()


@pytest.fixture
def backend(kmock: Any, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Overrides the fake: the operator's Runtime connects its real backend to KOMPAKTOR_REDIS_URL."""
    monkeypatch.setenv("KOMPAKTOR_REDIS_URL", redis_url)
    kmock.resources["v1/events"] = {"kind": "Event", "namespaced": True, "verbs": ["create", "patch", "list"]}
    yield None


@pytest.mark.parametrize(
    "redis_url, expected",
    [
        ("unreachable", "is unreachable"),
        ("wrong-password", "refused the credentials"),
    ],
    indirect=["redis_url"],
)
async def test_operator_never_shows_the_redis_password(
    operator: Any, api: Api, redis_url: str, expected: str, caplog: pytest.LogCaptureFixture
) -> None:
    kmock = operator
    caplog.set_level(logging.DEBUG)
    await api.create(SERVICES_RES, body("CompactionService", "cs", {"tiers": [{"name": "all", "compactorGroup": "g"}]}))

    def failed_twice() -> bool:
        return caplog.text.count(expected) >= 2  # the first attempt and a retry

    def sent() -> list[str]:
        return [f"{r.method} {r.url} {r.text}" for r in list(kmock)]

    def annotated() -> bool:
        return any("redis://***@127.0.0.1:" in text for text in sent())

    await eventually(failed_twice, timeout=60, what=f"the reconcile failing with {expected!r}")
    assert "redis://***@127.0.0.1:" in caplog.text, caplog.text[-2000:]
    # kopf keeps the failure in the object's progress annotation: the redacted URL reaches the API
    # server (the timers' failures, counted above too, may come before the reconcile's patch)
    await eventually(annotated, timeout=60, what="kopf's failure annotation with the redacted URL")
    for text in [caplog.text, *sent()]:
        assert PASSWORD not in text and WRONG not in text, text[-2000:]
