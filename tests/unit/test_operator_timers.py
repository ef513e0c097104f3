"""The status timers and the reconcile handlers share ``status.conditions``: a merge patch
replaces the list whole, so a timer must not write it before Ready exists for the current
generation (or it would put back a list without the reconcile's Ready)."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf

from kompaktor.resources.operator_config import OperatorConfig
from kompaktor_operator import conditions, kube, runtime
from kompaktor_operator.backend import QueueFigures
from kompaktor_operator.handlers import services
from kompaktor_operator.runtime import Runtime


class Figures:
    def queue_figures(self, group: str) -> QueueFigures:
        return QueueFigures(queued=3, running=1)


def _ready(generation: int) -> dict[str, Any]:
    return {
        "observedGeneration": generation,
        "conditions": conditions.set_condition(
            None, conditions.READY, True, reason="Stored", generation=generation, now="2026-01-01T00:00:00Z"
        ),
    }


def _service_status(status: dict[str, Any], generation: int, monkeypatch) -> kopf.Patch:
    rt = Runtime(config=OperatorConfig(compactor_image="x"))
    rt.use_backend(Figures())
    rt.login(kopf.ConnectionInfo(server="https://127.0.0.1:1"))

    async def no_group(*_a: Any) -> None:
        return None

    monkeypatch.setattr(kube.Client, "get", no_group)
    patch = kopf.Patch()
    spec = {"tiers": [{"name": "all", "compactorGroup": "small"}]}
    asyncio.run(
        services.service_status(
            name="cs",
            namespace="ns",
            spec=spec,
            status=status,
            meta={"generation": generation},
            patch=patch,
            memo=runtime.memo(rt),
        )
    )
    return patch


def test_timer_leaves_conditions_alone_before_the_reconcile_set_ready(monkeypatch) -> None:
    patch = _service_status({}, 1, monkeypatch)
    assert patch.status["queued"] == 3 and patch.status["running"] == 1
    assert "conditions" not in patch.status


def test_timer_leaves_conditions_alone_while_a_new_generation_is_reconciled(monkeypatch) -> None:
    patch = _service_status(_ready(1), 2, monkeypatch)
    assert "conditions" not in patch.status


def test_timer_adds_degraded_and_keeps_ready_once_settled(monkeypatch) -> None:
    patch = _service_status(_ready(2), 2, monkeypatch)
    conds = {c["type"]: c for c in patch.status["conditions"]}
    assert conds["Ready"]["status"] == "True"
    assert conds["Degraded"]["reason"] == "CompactorGroupMissing" and "small" in conds["Degraded"]["message"]


def test_an_empty_condition_message_is_left_out() -> None:
    """A real 1.20 apiserver turned message "" into null and refused the status write (422)."""
    out = conditions.set_condition(None, conditions.READY, True, reason="Stored", message="", now="t")
    assert "message" not in out[0]
    out = conditions.set_condition(out, conditions.READY, False, reason="Bad", message="why", now="t")
    assert out[0]["message"] == "why"
