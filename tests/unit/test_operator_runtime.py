"""The operator's Runtime: one per run, in kopf's memo, shared by every handler, and nothing of a
deleted group left in it (kompaktor_operator.runtime)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import kopf
import pytest

from kompaktor.resources.operator_config import OperatorConfig
from kompaktor_operator import kube, runtime
from kompaktor_operator.handlers import groups
from kompaktor_operator.runtime import Runtime

NS = "ns"


class StoreWithGroups:
    def __init__(self) -> None:
        self.deleted: list[str] = []

    def delete_group(self, name: str) -> None:
        self.deleted.append(name)


def _runtime(monkeypatch: pytest.MonkeyPatch) -> Runtime:
    rt = Runtime(config=OperatorConfig(compactor_image="x"))
    rt.use_backend(StoreWithGroups())  # type: ignore[arg-type]
    rt.login(kopf.ConnectionInfo(server="https://127.0.0.1:1"))

    async def deleted(*_a: Any) -> bool:
        return True

    async def hpa(*_a: Any) -> str:
        return "autoscaling/v2"

    async def no_keda(*_a: Any) -> list[str]:
        return []

    monkeypatch.setattr(kube.Client, "delete", deleted)
    monkeypatch.setattr(kube.Client, "hpa_api_version", hpa)
    monkeypatch.setattr(kube.Client, "api_versions", no_keda)
    return rt


def test_deleting_a_group_forgets_how_long_it_was_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scaler's idle clock of a deleted group went on living in the operator's memory: one
    entry per group ever deleted, and a group made again under the same name inherited the old
    clock (and could be parked at zero at once)."""
    rt = _runtime(monkeypatch)
    assert rt.idle_for(NS, "g", work=0, now=100.0) == 0.0  # the quiet window starts
    assert rt.idle_for(NS, "other", work=0, now=100.0) == 0.0
    assert rt.idle_for(NS, "g", work=0, now=400.0) == 300.0

    asyncio.run(groups.delete_group(name="g", namespace=NS, memo=runtime.memo(rt)))

    assert rt.backend().deleted == ["g"]  # type: ignore[attr-defined]
    assert (NS, "g") not in rt.idle_since
    assert (NS, "other") in rt.idle_since  # other groups keep theirs
    assert rt.idle_for(NS, "g", work=0, now=500.0) == 0.0  # made again: a new quiet window


def test_every_resource_sees_the_one_runtime() -> None:
    """kopf gives each resource a shallow copy of the operator's memo: the Runtime is shared."""
    rt = Runtime(config=OperatorConfig())
    memo = runtime.memo(rt)
    assert runtime.of(copy.copy(memo)) is rt
    with pytest.raises(RuntimeError, match="no Runtime"):
        runtime.of(kopf.Memo())


def test_two_runtimes_share_nothing() -> None:
    a, b = Runtime(config=OperatorConfig()), Runtime(config=OperatorConfig())
    a.idle_for(NS, "g", work=0, now=1.0)
    assert b.idle_since == {}
    assert a.metrics.registry is not b.metrics.registry
    with pytest.raises(RuntimeError, match="not logged in"):
        _ = a.kube


def test_the_repr_shows_no_redis_password() -> None:
    rt = Runtime(config=OperatorConfig(), redis_url="redis://:PLANTED-rt-91@127.0.0.1:1/0")
    rt.env["KOMPAKTOR_REDIS_URL"] = "redis://:PLANTED-rt-91@127.0.0.1:1/0"
    assert "PLANTED" not in repr(rt)


def test_a_new_login_closes_the_client_before_and_removes_its_credential_files() -> None:
    """kopf logs in again when credentials expire; each login made a client (a session, and the
    CA and client key given as data written to temporary files) that nothing closed: a leak per
    re-login for the operator's life."""
    import base64
    import os

    rt = Runtime(config=OperatorConfig(compactor_image="x"))
    pem = base64.b64encode(_TEST_CA.encode()).decode()

    async def two_logins() -> tuple[kube.Client, kube.Client, list[str]]:
        first = rt.login(kopf.ConnectionInfo(server="https://127.0.0.1:1", ca_data=pem))
        first.api()
        files = list(first._tmpfiles)
        assert len(files) == 1 and os.path.exists(files[0])
        second = rt.login(kopf.ConnectionInfo(server="https://127.0.0.1:1", ca_data=pem))
        second.api()
        await rt.close_retired()
        assert rt.kube is second and first._api is None
        assert not os.path.exists(files[0])
        assert second._tmpfiles and all(os.path.exists(f) for f in second._tmpfiles)
        return first, second, files

    async def run() -> None:
        _first, second, files = await two_logins()
        kept = list(second._tmpfiles)
        await rt.close()
        assert not any(os.path.exists(f) for f in kept + files)

    asyncio.run(run())


#: a self-signed CA certificate (no key kept), only for the SSL library to parse
_TEST_CA = """\
-----BEGIN CERTIFICATE-----
MIIBjzCCATWgAwIBAgIUE6q/8nlQc9SDsWNJcrgMODq3n1UwCgYIKoZIzj0EAwIw
HDEaMBgGA1UEAwwRa29tcGFrdG9yLXRlc3QtY2EwIBcNMjYxMTI2MTQ1MTU3WhgP
MjEyNjExMDIxNDUxNTdaMBwxGjAYBgNVBAMMEWtvbXBha3Rvci10ZXN0LWNhMFkw
EwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEajTca4qAIbptPr1mSLGvs1PNyke2Azq2
NxD3Zm7dBNX/Q5XK0lYmvjnKS45h0Kvtk9sXJIHO+ihoy++/0+ZzHqNTMFEwHQYD
VR0OBBYEFHHh6WOEoJlt0GMCZ1BrqMkfNmv9MB8GA1UdIwQYMBaAFHHh6WOEoJlt
0GMCZ1BrqMkfNmv9MA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZIzj0EAwIDSAAwRQIh
AJO9y82N8Rlz6oTKni41T8Sk7Yv9fJ6za10vNpJh4YhVAiAu/G3wGf3cfshdGx1k
ANV/oEvFJACKMe3z8Nn+q/HOxA==
-----END CERTIFICATE-----
"""
