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
