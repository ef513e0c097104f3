"""CompactorGroup handlers: reconcile a group into its Deployment, Service and autoscaler, and the
scaler — the autoscaler says how many compactors (spec.replicas), the scaler picks which pods go,
drain first, and parks an idle HPA-scaled group at zero.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, cast

import kopf
from pydantic import ValidationError

from kompaktor.resources import admission, api
from kompaktor.resources import models as m
from kompaktor_operator import conditions, manifests, naming, podhealth, runtime
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
from kompaktor_operator.objects import Child, Pod
from kompaktor_operator.runtime import Runtime
from kompaktor_operator.scaling import PodView, ScaleDecision, decide_scale, parked_replicas


@counted(api.GROUP_KIND)
async def reconcile_group(
    name: str,
    namespace: str,
    spec: kopf.Spec,
    status: kopf.Status,
    meta: kopf.Meta,
    body: kopf.Body,
    patch: kopf.Patch,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    """A group into Redis (its settings), its Deployment, Service and autoscaler; Ready says how."""
    rt = runtime.of(memo)
    generation = meta.get("generation")
    group = parse(m.CompactorGroupSpec, spec, patch, status, generation)
    _admit(name, group, rt, patch, status, generation)
    await backend_call(rt, lambda b: b.put_group(m.to_group_config(name, group)))
    if group.replicas is None:
        # The scale subresource reads spec.replicas: without it the HPA controller fails with
        # "the spec replicas field .spec.replicas does not exist" (seen on a real 1.20 apiserver).
        patch.spec["replicas"] = group.desired_replicas()
    hpa_version, keda, missing = await _autoscaler_apis(rt, group)
    children = manifests.build_children(
        name, group, rt.config, hpa_version or manifests.HPA_API_VERSIONS[0], namespace=namespace
    )
    if missing:
        children = [c for c in children if c["kind"] in ("NetworkPolicy", "Deployment", "Service")]
    for child in children:
        await _apply_child(rt, child, group, namespace, body)
    offered = {hpa_version} | ({naming.KEDA_API_VERSION} if keda else set())
    for api_version, kind, autoscaler in manifests.AUTOSCALER_KINDS:
        if api_version in offered and autoscaler != group.autoscaler:
            await kube_call(rt, rt.kube.delete(api_version, kind, namespace, naming.hpa_name(name)))
    _report(name, group, patch, status, generation, missing)


def _admit(
    name: str, group: m.CompactorGroupSpec, rt: Runtime, patch: kopf.Patch, status: kopf.Status, generation: Any
) -> None:
    """Refuse, before anything is stored or applied, a bad name or a spec admission forbids: no
    Deployment runs what the author named (one an earlier, allowed spec made is left as it was)."""
    try:
        m.check_group_name(name)
    except ValueError as exc:
        refused()
        message = f"name {exc}"
        mark(patch, status, conditions.READY, False, "InvalidName", message, generation)
        raise kopf.PermanentError(message) from None
    refusal = admission.check_group(group, rt.config)
    if refusal is not None:
        refused()
        mark(patch, status, conditions.READY, False, refusal.rule, f"refused: {refusal.message}", generation)
        patch.status["observedGeneration"] = generation
        raise kopf.PermanentError(f"refused ({refusal.rule}): {refusal.message}")


async def _autoscaler_apis(rt: Runtime, group: m.CompactorGroupSpec) -> tuple[str | None, bool, str | None]:
    """The HPA API version the server offers, whether KEDA's is there, and why the group's
    autoscaler cannot be made (None: it can). Optional APIs are looked up, never assumed: a
    missing one is a condition, not a crash loop."""
    hpa_version = await kube_call(rt, rt.kube.hpa_api_version())
    keda = naming.KEDA_VERSION in await kube_call(rt, rt.kube.api_versions(naming.KEDA_GROUP))
    missing = None
    if group.autoscaler == m.Autoscaler.HPA and hpa_version is None:
        missing = "the server offers neither autoscaling/v2 nor autoscaling/v2beta2"
    elif group.autoscaler == m.Autoscaler.KEDA and not keda:
        missing = f"KEDA is not installed (no {naming.KEDA_API_VERSION} API): install KEDA or use autoscaler: hpa"
    return hpa_version, keda, missing


async def _apply_child(rt: Runtime, child: Child, group: m.CompactorGroupSpec, namespace: str, body: kopf.Body) -> None:
    """Apply one child, owned by the group. A Deployment gets its replicas only when it is
    created: afterwards the scaler alone changes them."""
    # adopt amends the object in place (owner reference, namespace, the group's labels): the
    # child is a plain dict at run time, which kopf's object type does not name
    kopf.adopt(cast("dict[str, object]", child), owner=body)
    created_with = None
    if child["kind"] == "Deployment":
        existing = await kube_call(rt, rt.kube.get_deployment(namespace, child["metadata"]["name"]))
        if existing is None:
            created_with = child["spec"]["replicas"] = group.desired_replicas()
    await kube_call(rt, rt.kube.apply(child, namespace))
    if created_with is not None:
        # ... and the scaler owns them from then on: the next apply, which renders none,
        # must not remove them (server-side apply removes what its manager stops sending)
        await kube_call(rt, rt.kube.claim_replicas(namespace, child["metadata"]["name"], created_with))


def _report(
    name: str,
    group: m.CompactorGroupSpec,
    patch: kopf.Patch,
    status: kopf.Status,
    generation: Any,
    missing: str | None,
) -> None:
    """The group's status: its selector and desired replicas, and Ready (False while its
    autoscaler's API is missing)."""
    patch.status["selector"] = naming.selector(name)
    patch.status["desiredReplicas"] = group.desired_replicas()
    patch.status["observedGeneration"] = generation
    deployment = naming.deployment_name(name)
    if missing:
        message = f"Deployment {deployment} and Service applied, no autoscaler: {missing}"
        mark(patch, status, conditions.READY, False, "AutoscalerUnavailable", message, generation)
        return
    message = f"Deployment {deployment}, Service and {group.autoscaler} autoscaler applied"
    mark(patch, status, conditions.READY, True, "Reconciled", message, generation)


async def delete_group(name: str, namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    rt, namespace = runtime.of(memo), namespaced(namespace)
    # Owner references let Kubernetes collect the children; deleting them here as well makes the
    # removal immediate and visible, and works where no garbage collector runs.
    await kube_call(rt, rt.kube.delete("apps/v1", "Deployment", namespace, naming.deployment_name(name)))
    await kube_call(rt, rt.kube.delete("v1", "Service", namespace, naming.metrics_service_name(name)))
    if rt.config.network_policy:
        await kube_call(
            rt, rt.kube.delete("networking.k8s.io/v1", "NetworkPolicy", namespace, naming.network_policy_name(name))
        )
    hpa_version = await kube_call(rt, rt.kube.hpa_api_version())
    if hpa_version is not None:
        await kube_call(rt, rt.kube.delete(hpa_version, "HorizontalPodAutoscaler", namespace, naming.hpa_name(name)))
    if naming.KEDA_VERSION in await kube_call(rt, rt.kube.api_versions(naming.KEDA_GROUP)):
        await kube_call(
            rt, rt.kube.delete(naming.KEDA_API_VERSION, "ScaledObject", namespace, naming.scaled_object_name(name))
        )
    await backend_call(rt, lambda b: b.delete_group(name))
    rt.forget_group(namespace, name)


def _request_drain(pod: str, b: Backend) -> None:
    b.request_drain(pod)


def _pod_view(pod: Pod) -> PodView:
    meta = pod.get("metadata", {})
    annotations = meta.get("annotations") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )
    return PodView(
        name=meta["name"],
        ready=ready,
        terminating=bool(meta.get("deletionTimestamp")),
        marked=annotations.get(naming.DRAINING_ANNOTATION) == "true",
        lowest_cost=annotations.get(naming.POD_DELETION_COST) == naming.VICTIM_DELETION_COST,
    )


async def scale_group(name: str, memo: kopf.Memo, **kwargs: Any) -> None:
    """The HPA says how many (spec.replicas); this picks which pods go, drain first."""
    try:
        await _scale_group(name=name, memo=memo, **kwargs)
    except Exception:
        runtime.of(memo).metrics.scaler_errors.labels(name).inc()
        raise


async def _park_or_wake(
    rt: Runtime, namespace: str, name: str, group: m.CompactorGroupSpec, work: int, logger: logging.Logger
) -> m.CompactorGroupSpec:
    """Scale to zero and back under an HPA (:func:`scaling.parked_replicas`); the group as it
    stands after. How long the group has had no work is kept in the Runtime (lost on a restart:
    the quiet window then starts again)."""
    idle_s = rt.idle_for(namespace, name, work)
    park = parked_replicas(group.replicas, work, idle_s, group.behavior.scale_down_stabilization_seconds)
    if park is None:
        return group
    why = f"{work} job(s) queued or running" if park else f"no job for {idle_s:.0f} s"
    logger.info("group %s: spec.replicas %d -> %d (%s)", name, group.replicas or 0, park, why)
    await kube_call(rt, rt.kube.set_group_replicas(namespace, name, park))
    return group.model_copy(update={"replicas": park})


async def _scale_group(
    name: str,
    namespace: str,
    spec: kopf.Spec,
    status: kopf.Status,
    meta: kopf.Meta,
    patch: kopf.Patch,
    logger: logging.Logger,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    """Read the group, its Deployment, queue and pods; decide (:func:`decide_scale`); apply the
    decision; report the figures, then the group's PodsHealthy and Degraded conditions."""
    rt = runtime.of(memo)
    try:
        group = m.CompactorGroupSpec.model_validate(dict(spec))
    except ValidationError:
        return  # reported by the reconcile handler
    dep = await kube_call(rt, rt.kube.get_deployment(namespace, naming.deployment_name(name)))
    if dep is None:
        return  # the reconcile handler has not created it yet
    current = int((dep.get("spec") or {}).get("replicas", 1))
    figures = await backend_call(rt, lambda b: b.queue_figures(name))
    if group.autoscaler == m.Autoscaler.HPA and group.min_replicas == 0 and not meta.get("deletionTimestamp"):
        group = await _park_or_wake(rt, namespace, name, group, figures.queued + figures.running, logger)
    desired = group.desired_replicas()
    raw_pods = await kube_call(rt, rt.kube.list_pods(namespace, naming.selector_labels(name)))
    pods = [_pod_view(p) for p in raw_pods]
    compactors = await backend_call(rt, lambda b: b.compactors(name))
    honoured = await rt.kube.honours_deletion_cost()
    decision = decide_scale(current, desired, pods, compactors, deletion_cost=honoured)
    await _apply_scale(rt, namespace, name, current, decision, logger)
    if not meta.get("deletionTimestamp"):  # a deleted group's series go with it (delete_group)
        rt.metrics.replicas.labels(name).set(decision.replicas)
        rt.metrics.desired.labels(name).set(desired)
        rt.metrics.draining.labels(name).set(len(decision.waiting))
    ready = int((dep.get("status") or {}).get("readyReplicas") or 0)
    _report_figures(patch, name, decision, ready, desired, figures)
    if not settled(status, meta):
        return  # the figures now, the condition once the reconcile handler has set Ready
    generation = meta.get("generation")
    _mark_pods_healthy(patch, status, raw_pods, ready, decision.replicas, generation)
    blind = (
        await _hpa_cannot_scale(rt, namespace, name)
        if figures.queued > 0 and group.autoscaler == m.Autoscaler.HPA
        else None
    )
    verdict = conditions.decide_group_degraded(name, figures.queued, ready, figures.dead_lettered, blind)
    mark(patch, status, conditions.DEGRADED, verdict.status, verdict.reason, verdict.message, generation)


async def _apply_scale(
    rt: Runtime, namespace: str, name: str, current: int, decision: ScaleDecision, logger: logging.Logger
) -> None:
    """Carry out a scale decision: ask pods to drain, annotate the victims (or take the marks off),
    delete drained pods, set the Deployment's replicas."""
    mx = rt.metrics
    for pod in decision.drain:
        await backend_call(rt, functools.partial(_request_drain, pod))
        mx.drain_requests.labels(name).inc()
    for pod in decision.mark:
        await kube_call(
            rt, rt.kube.patch_annotations("v1", "Pod", namespace, pod, {naming.DRAINING_ANNOTATION: "true"})
        )
    for pod in decision.lowest_cost:
        await kube_call(
            rt,
            rt.kube.patch_annotations(
                "v1", "Pod", namespace, pod, {naming.POD_DELETION_COST: naming.VICTIM_DELETION_COST}
            ),
        )
    for pod in decision.unmark:
        await kube_call(
            rt,
            rt.kube.patch_annotations(
                "v1", "Pod", namespace, pod, {naming.DRAINING_ANNOTATION: None, naming.POD_DELETION_COST: None}
            ),
        )
    for pod in decision.delete:
        await kube_call(rt, rt.kube.delete_pod(namespace, pod))
        mx.pods_deleted.labels(name).inc()
    if decision.replicas != current:
        logger.info("group %s: replicas %d -> %d (%s)", name, current, decision.replicas, decision.reason)
        await kube_call(rt, rt.kube.set_replicas(namespace, naming.deployment_name(name), decision.replicas))
        mx.replica_changes.labels(name, "up" if decision.replicas > current else "down").inc()


def _report_figures(
    patch: kopf.Patch, name: str, decision: ScaleDecision, ready: int, desired: int, figures: QueueFigures
) -> None:
    """The group's replicas (the scale subresource reads them) and queue figures, in its status."""
    patch.status["replicas"] = decision.replicas
    patch.status["readyReplicas"] = ready
    patch.status["desiredReplicas"] = desired
    patch.status["selector"] = naming.selector(name)
    patch.status["draining"] = list(decision.waiting)
    patch.status["queued"] = figures.queued
    patch.status["running"] = figures.running
    patch.status["oldestQueuedAgeSeconds"] = round(figures.oldest_age_s, 1)
    patch.status["deadLettered"] = figures.dead_lettered
    patch.status["rejected"] = figures.rejected


def _mark_pods_healthy(
    patch: kopf.Patch, status: kopf.Status, raw_pods: list[Pod], ready: int, replicas: int, generation: int | None
) -> None:
    """The PodsHealthy condition: the pods' trouble (:func:`podhealth.diagnose`), or how many are ready."""
    trouble = podhealth.diagnose(raw_pods)
    if trouble is not None:
        mark(patch, status, podhealth.PODS_HEALTHY, False, trouble.reason, trouble.message, generation)
        return
    message = f"{ready} of {replicas} compactor pod(s) ready; none failing"
    mark(patch, status, podhealth.PODS_HEALTHY, True, podhealth.HEALTHY, message, generation)


async def _hpa_cannot_scale(rt: Runtime, namespace: str, name: str) -> str | None:
    """Why the group's HPA cannot read its metric (its ScalingActive condition is False: the
    external metrics API unreachable or untrusted, the metric unknown), or None."""
    version = await kube_call(rt, rt.kube.hpa_api_version())
    hpa = await kube_call(rt, rt.kube.get_hpa(version, namespace, naming.hpa_name(name))) if version else None
    for c in ((hpa or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == "ScalingActive" and c.get("status") == "False":
            return f"{c.get('reason', '')}: {c.get('message', '')}".strip(": ")
    return None
