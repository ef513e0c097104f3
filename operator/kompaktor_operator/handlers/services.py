"""CompactionService handlers: store the planner settings and tiers for the coordinator, and
report the tiers' queue figures and missing groups.
"""

from __future__ import annotations

from typing import Any

import kopf
from pydantic import ValidationError

from kompaktor.resources import api
from kompaktor.resources import models as m
from kompaktor_operator import conditions, runtime
from kompaktor_operator.backend import Backend, QueueFigures
from kompaktor_operator.handlers.common import (
    backend_call,
    counted,
    kube_call,
    mark,
    namespaced,
    parse,
    refused,
    settled,
)


@counted(api.SERVICE_KIND)
async def reconcile_service(
    name: str, spec: kopf.Spec, status: kopf.Status, meta: kopf.Meta, patch: kopf.Patch, memo: kopf.Memo, **_: Any
) -> None:
    rt = runtime.of(memo)
    generation = meta.get("generation")
    svc = parse(m.CompactionServiceSpec, spec, patch, status, generation)
    try:
        cfg = m.to_service_config(name, svc)
    except ValueError as exc:  # the core's own checks (planner settings)
        refused()
        mark(patch, status, conditions.READY, False, "InvalidSpec", str(exc), generation)
        raise kopf.PermanentError(str(exc)) from None
    await backend_call(rt, lambda b: b.put_service(cfg))
    patch.status["observedGeneration"] = generation
    mark(
        patch,
        status,
        conditions.READY,
        True,
        "Stored",
        f"planner settings and {len(svc.tiers)} tier(s) stored for the coordinator",
        generation,
    )


async def delete_service(name: str, memo: kopf.Memo, **_: Any) -> None:
    rt = runtime.of(memo)
    await backend_call(rt, lambda b: b.delete_service(name))


async def service_status(
    name: str,
    namespace: str | None,
    spec: kopf.Spec,
    status: kopf.Status,
    meta: kopf.Meta,
    patch: kopf.Patch,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    rt, namespace = runtime.of(memo), namespaced(namespace)
    try:
        svc = m.CompactionServiceSpec.model_validate(dict(spec))
    except ValidationError:
        return  # reported by the reconcile handler
    tiers, missing = [], []
    figures: dict[str, QueueFigures] = {}
    for group in svc.groups():

        def queue_figures(b: Backend, group: str = group) -> QueueFigures:
            return b.queue_figures(group)

        figures[group] = await backend_call(rt, queue_figures)
        if await kube_call(rt, rt.kube.get(api.GROUP_VERSION, api.GROUP_KIND, namespace, group)) is None:
            missing.append(group)
    for tier in svc.tiers:
        f = figures[tier.compactor_group]
        tiers.append(
            {"name": tier.name, "compactorGroup": tier.compactor_group, "queued": f.queued, "running": f.running}
        )
    patch.status["tiers"] = tiers
    patch.status["queued"] = sum(f.queued for f in figures.values())
    patch.status["running"] = sum(f.running for f in figures.values())
    generation = meta.get("generation")
    if not settled(status, meta):
        return  # the figures now, the condition once the reconcile handler has set Ready
    if missing:
        mark(
            patch,
            status,
            conditions.DEGRADED,
            True,
            "CompactorGroupMissing",
            f"no CompactorGroup {', '.join(missing)} in namespace {namespace}: jobs of those tiers wait",
            generation,
        )
    else:
        mark(patch, status, conditions.DEGRADED, False, "GroupsPresent", "", generation)
