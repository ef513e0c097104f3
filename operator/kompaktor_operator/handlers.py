"""kopf registrations only: parse, decide, apply, report.

Every handler begins by validating its spec with the pydantic model (a bad spec becomes a
``Ready=False`` condition and a ``kopf.PermanentError``: no crash loop); decisions come from the
pure modules (manifests, scaling, conditions); I/O goes through ``kube`` (Kubernetes) and
``depth`` (Redis). Handlers are idempotent: kopf may run them twice.

The coordinator is not run here: the Helm chart runs ``kompaktor coordinator`` as a second
container of the operator pod, and its Redis lease makes exactly one coordinator act at a time.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import logging
import os
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, TypeVar

import kopf
from pydantic import ValidationError

from kompaktor_operator import admission, conditions, depth, kube, manifests, naming, podhealth
from kompaktor_operator import models as m
from kompaktor_operator.config import OperatorConfig
from kompaktor_operator.metrics import metrics
from kompaktor_operator.scaling import PodView, decide_scale, parked_replicas

SERVICE = (naming.API_GROUP, naming.API_VERSION, naming.SERVICES)
GROUP = (naming.API_GROUP, naming.API_VERSION, naming.GROUPS)
COMPACTION = (naming.API_GROUP, naming.API_VERSION, naming.COMPACTIONS)

#: Retry delay when Redis or the API server is not reachable, seconds.
RETRY_DELAY = 10

T = TypeVar("T", bound=m.CRDModel)
_config: OperatorConfig | None = None


def config() -> OperatorConfig:
    global _config
    if _config is None:
        _config = OperatorConfig.from_env()
    return _config


def set_config(cfg: OperatorConfig | None) -> None:
    global _config
    _config = cfg


def now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _mark(
    patch: kopf.Patch, status: dict[str, Any], type_: str, ok: bool, reason: str, message: str, generation: int | None
) -> None:
    current = patch.status.get("conditions") or status.get("conditions")
    patch.status["conditions"] = conditions.set_condition(
        current, type_, ok, reason=reason, message=message, generation=generation, now=now()
    )


#: How the reconcile running in this task ended, when not by returning or raising: see ``_refused``.
_outcome: ContextVar[str | None] = ContextVar("kompaktor_reconcile_outcome", default=None)


def _refused() -> None:
    """Count the running reconcile as ``refused`` (an invalid or disallowed spec), not ``error``."""
    _outcome.set("refused")


def _counted(kind: str) -> Callable[[Callable[..., Awaitable[None]]], Callable[..., Awaitable[None]]]:
    """Count a reconcile handler's runs in kompaktor_operator_reconciles_total{kind,result}."""

    def wrap(fn: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
        @functools.wraps(fn)
        async def counted(**kwargs: Any) -> None:
            token = _outcome.set(None)
            started = time.monotonic()
            result = "error"
            try:
                await fn(**kwargs)
                result = _outcome.get() or "ok"
            except kopf.PermanentError:
                result = _outcome.get() or "error"
                raise
            finally:
                _outcome.reset(token)
                mx = metrics()
                mx.reconciles.labels(kind, result).inc()
                mx.reconcile_seconds.labels(kind).observe(time.monotonic() - started)

        return counted

    return wrap


def parse(model: type[T], spec: Any, patch: kopf.Patch, status: dict[str, Any], generation: int | None) -> T:
    """Validate a spec; on failure report Ready=False with the reason and stop retrying."""
    try:
        return model.model_validate(dict(spec))
    except ValidationError as exc:
        _refused()
        message = f"invalid spec: {m.explain(exc)}"
        _mark(patch, status, conditions.READY, False, "InvalidSpec", message, generation)
        patch.status["observedGeneration"] = generation
        raise kopf.PermanentError(message) from None


async def _io(fn: Callable[..., Any], *args: Any) -> Any:
    """Run a blocking Redis call off the event loop; unreachable Redis becomes a retry."""
    try:
        return await asyncio.to_thread(fn, *args)
    except depth.BackendUnavailable as exc:
        raise kopf.TemporaryError(str(exc), delay=RETRY_DELAY) from exc


async def _kube(coro: Any) -> Any:
    try:
        return await coro
    except kube.KubeError as exc:
        if exc.status in (400, 403, 404, 422):
            raise kopf.PermanentError(f"the API server refused: {exc}") from exc
        raise kopf.TemporaryError(f"the API server failed: {exc}", delay=RETRY_DELAY) from exc


def _settled(status: Any, meta: Any) -> bool:
    """Whether the reconcile handler has answered for the current generation.

    ``status.conditions`` is one list, and a merge patch replaces a list whole: a timer that
    wrote its condition while a reconcile was landing would put back the old Ready. So timers
    write conditions only once Ready has been set for this generation (kopf hands them the
    latest body), and leave the list to the reconcile handler until then."""
    generation = meta.get("generation")
    ready = conditions.get((status or {}).get("conditions"), conditions.READY)
    return (
        ready is not None
        and ready.get("observedGeneration") == generation
        and (status or {}).get("observedGeneration") == generation
    )


# ---------------------------------------------------------------------------------------------
# start-up and login


async def on_startup(settings: kopf.OperatorSettings, logger: logging.Logger, **_: Any) -> None:
    # Our own finalizer and annotation names, so kubectl shows whose they are.
    settings.persistence.finalizer = naming.FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=naming.API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=naming.API_GROUP, key="last-handled-configuration"
    )
    # Events for problems only: a busy cluster need not store one per reconcile.
    settings.posting.level = logging.WARNING
    # Re-open watches every few minutes: long-lived idle watches are cut by load balancers.
    settings.watching.server_timeout = 300
    # A resource being deleted waits for its timers to stop; kopf re-checks a timer caught
    # mid-run only after this many seconds (default 60: a `kubectl delete` of a group whose
    # scale timer was running hung for a minute). Timers here finish in milliseconds.
    settings.background.cancellation_polling = 1
    logger.info("kompaktor operator started; compactor image %s", config().compactor_image)
    if os.environ.get("KOMPAKTOR_METRICS_API"):
        global _metrics_task
        _metrics_task = asyncio.create_task(_serve_metrics_api(logger))


async def _serve_metrics_api(logger: logging.Logger) -> None:
    """Serve external.metrics.k8s.io once kopf has logged in (the API needs the cluster's
    request-header CA); a failure is logged loudly and retried, never fatal to the operator."""
    from kompaktor_operator import metrics_api

    while True:
        try:
            kube.client()
        except RuntimeError:
            await asyncio.sleep(0.2)  # kopf has not logged in yet
            continue
        try:
            runner = await metrics_api.start_from_env(dict(os.environ), kube, depth.backend())
        except Exception as exc:
            logger.error("cannot serve the external metrics API (retrying in 10 s): %s", exc)
            await asyncio.sleep(10)
            continue
        try:
            await asyncio.Event().wait()  # until cancelled at cleanup
        finally:
            if runner is not None:
                await runner.cleanup()


_metrics_task: asyncio.Task | None = None


async def on_cleanup(**_: Any) -> None:
    if _metrics_task is not None:
        _metrics_task.cancel()
    await kube.shutdown()


def on_login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    info = kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)
    if info is not None:
        kube.configure(info)
    return info


# ---------------------------------------------------------------------------------------------
# CompactionService


@_counted("CompactionService")
async def reconcile_service(name: str, spec: Any, status: Any, meta: Any, patch: kopf.Patch, **_: Any) -> None:
    generation = meta.get("generation")
    svc = parse(m.CompactionServiceSpec, spec, patch, status, generation)
    try:
        cfg = m.to_service_config(name, svc)
    except ValueError as exc:  # the core's own checks (planner settings)
        _refused()
        _mark(patch, status, conditions.READY, False, "InvalidSpec", str(exc), generation)
        raise kopf.PermanentError(str(exc)) from None
    await _io(depth.backend().put_service, cfg)
    patch.status["observedGeneration"] = generation
    _mark(
        patch,
        status,
        conditions.READY,
        True,
        "Stored",
        f"planner settings and {len(svc.tiers)} tier(s) stored for the coordinator",
        generation,
    )


async def delete_service(name: str, **_: Any) -> None:
    await _io(depth.backend().delete_service, name)


async def service_status(
    name: str, namespace: str, spec: Any, status: Any, meta: Any, patch: kopf.Patch, **_: Any
) -> None:
    try:
        svc = m.CompactionServiceSpec.model_validate(dict(spec))
    except ValidationError:
        return  # reported by the reconcile handler
    tiers, missing = [], []
    figures: dict[str, depth.QueueFigures] = {}
    for group in svc.groups():
        figures[group] = await _io(depth.backend().queue_figures, group)
        if await _kube(kube.get(naming.GROUP_VERSION, "CompactorGroup", namespace, group)) is None:
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
    if not _settled(status, meta):
        return  # the figures now, the condition once the reconcile handler has set Ready
    if missing:
        _mark(
            patch,
            status,
            conditions.DEGRADED,
            True,
            "CompactorGroupMissing",
            f"no CompactorGroup {', '.join(missing)} in namespace {namespace}: jobs of those tiers wait",
            generation,
        )
    else:
        _mark(patch, status, conditions.DEGRADED, False, "GroupsPresent", "", generation)


# ---------------------------------------------------------------------------------------------
# CompactorGroup


@_counted("CompactorGroup")
async def reconcile_group(
    name: str, namespace: str, spec: Any, status: Any, meta: Any, body: Any, patch: kopf.Patch, **_: Any
) -> None:
    generation = meta.get("generation")
    group = parse(m.CompactorGroupSpec, spec, patch, status, generation)
    if len(name) > 40 or not name.replace("-", "").isalnum() or name != name.lower():
        _refused()
        message = f"name {name!r} must be a DNS label of at most 40 characters"
        _mark(patch, status, conditions.READY, False, "InvalidName", message, generation)
        raise kopf.PermanentError(message)
    cfg = config()
    refusal = admission.check_group(group, cfg)
    if refusal is not None:
        # Refused before anything is stored or applied: no Deployment runs what the author named
        # (one that an earlier, allowed spec made is left as it was).
        _refused()
        _mark(patch, status, conditions.READY, False, refusal.rule, f"refused: {refusal.message}", generation)
        patch.status["observedGeneration"] = generation
        raise kopf.PermanentError(f"refused ({refusal.rule}): {refusal.message}")
    await _io(depth.backend().put_group, m.to_group_config(name, group))
    if group.replicas is None:
        # The scale subresource reads spec.replicas: without it the HPA controller fails with
        # "the spec replicas field .spec.replicas does not exist" (seen on a real 1.20 apiserver).
        patch.spec["replicas"] = group.desired_replicas()
    # Optional APIs are looked up, never assumed: a missing one is a condition, not a crash loop.
    hpa_version = await _kube(kube.hpa_api_version())
    keda = "v1alpha1" in await _kube(kube.api_versions("keda.sh"))
    missing = None
    if group.autoscaler == m.Autoscaler.HPA.value and hpa_version is None:
        missing = "the server offers neither autoscaling/v2 nor autoscaling/v2beta2"
    elif group.autoscaler == m.Autoscaler.KEDA.value and not keda:
        missing = "KEDA is not installed (no keda.sh/v1alpha1 API): install KEDA or use autoscaler: hpa"
    children = manifests.build_children(
        name, group, cfg, hpa_version or manifests.HPA_API_VERSIONS[0], namespace=namespace
    )
    if missing:
        children = [c for c in children if c["kind"] in ("NetworkPolicy", "Deployment", "Service")]
    for child in children:
        kopf.adopt(child, owner=body)
        created_with = None
        if child["kind"] == "Deployment":
            # Only at creation: afterwards the scaler alone changes the replicas.
            existing = await _kube(kube.get("apps/v1", "Deployment", namespace, child["metadata"]["name"]))
            if existing is None:
                created_with = child["spec"]["replicas"] = group.desired_replicas()
        await _kube(kube.apply(child, namespace))
        if created_with is not None:
            # ... and the scaler owns them from then on: the next apply, which renders none,
            # must not remove them (server-side apply removes what its manager stops sending)
            await _kube(kube.claim_replicas(namespace, child["metadata"]["name"], created_with))
    offered = {hpa_version} | ({"keda.sh/v1alpha1"} if keda else set())
    for api_version, kind, autoscaler in manifests.AUTOSCALER_KINDS:
        if api_version in offered and autoscaler != group.autoscaler:
            await _kube(kube.delete(api_version, kind, namespace, naming.hpa_name(name)))
    patch.status["selector"] = naming.selector(name)
    patch.status["desiredReplicas"] = group.desired_replicas()
    patch.status["observedGeneration"] = generation
    if missing:
        _mark(
            patch,
            status,
            conditions.READY,
            False,
            "AutoscalerUnavailable",
            f"Deployment {naming.deployment_name(name)} and Service applied, no autoscaler: {missing}",
            generation,
        )
        return
    _mark(
        patch,
        status,
        conditions.READY,
        True,
        "Reconciled",
        f"Deployment {naming.deployment_name(name)}, Service and {group.autoscaler} autoscaler applied",
        generation,
    )


async def delete_group(name: str, namespace: str, **_: Any) -> None:
    # Owner references let Kubernetes collect the children; deleting them here as well makes the
    # removal immediate and visible, and works where no garbage collector runs.
    await _kube(kube.delete("apps/v1", "Deployment", namespace, naming.deployment_name(name)))
    await _kube(kube.delete("v1", "Service", namespace, naming.metrics_service_name(name)))
    if config().network_policy:
        await _kube(kube.delete("networking.k8s.io/v1", "NetworkPolicy", namespace, naming.network_policy_name(name)))
    hpa_version = await _kube(kube.hpa_api_version())
    if hpa_version is not None:
        await _kube(kube.delete(hpa_version, "HorizontalPodAutoscaler", namespace, naming.hpa_name(name)))
    if "v1alpha1" in await _kube(kube.api_versions("keda.sh")):
        await _kube(kube.delete("keda.sh/v1alpha1", "ScaledObject", namespace, naming.scaled_object_name(name)))
    await _io(depth.backend().delete_group, name)
    metrics().forget_group(name)


def _pod_view(pod: dict[str, Any]) -> PodView:
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


async def scale_group(name: str, **kwargs: Any) -> None:
    """The HPA says how many (spec.replicas); this picks which pods go, drain first."""
    try:
        await _scale_group(name=name, **kwargs)
    except Exception:
        metrics().scaler_errors.labels(name).inc()
        raise


async def _park_or_wake(
    namespace: str, name: str, group: m.CompactorGroupSpec, work: int, memo: Any, logger: logging.Logger
) -> m.CompactorGroupSpec:
    """Scale to zero and back under an HPA (:func:`scaling.parked_replicas`); the group as it
    stands after. How long the group has had no work is kept in the operator's memo (lost on a
    restart: the quiet window then starts again)."""
    idle_since: dict[tuple[str, str], float] = memo.setdefault("idle_since", {})
    now = time.monotonic()
    if work > 0:
        idle_since.pop((namespace, name), None)
    idle_s = now - idle_since.setdefault((namespace, name), now) if work == 0 else 0.0
    park = parked_replicas(group.replicas, work, idle_s, group.behavior.scale_down_stabilization_seconds)
    if park is None:
        return group
    why = f"{work} job(s) queued or running" if park else f"no job for {idle_s:.0f} s"
    logger.info("group %s: spec.replicas %d -> %d (%s)", name, group.replicas or 0, park, why)
    await _kube(kube.set_group_replicas(namespace, name, park))
    return group.model_copy(update={"replicas": park})


async def _scale_group(
    name: str,
    namespace: str,
    spec: Any,
    status: Any,
    meta: Any,
    patch: kopf.Patch,
    logger: logging.Logger,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    try:
        group = m.CompactorGroupSpec.model_validate(dict(spec))
    except ValidationError:
        return  # reported by the reconcile handler
    dep = await _kube(kube.get("apps/v1", "Deployment", namespace, naming.deployment_name(name)))
    if dep is None:
        return  # the reconcile handler has not created it yet
    current = int((dep.get("spec") or {}).get("replicas", 1))
    backend = depth.backend()
    figures = await _io(backend.queue_figures, name)
    if group.autoscaler == m.Autoscaler.HPA.value and group.min_replicas == 0 and not meta.get("deletionTimestamp"):
        group = await _park_or_wake(namespace, name, group, figures.queued + figures.running, memo, logger)
    desired = group.desired_replicas()
    raw_pods = await _kube(kube.list_pods(namespace, naming.selector_labels(name)))
    pods = [_pod_view(p) for p in raw_pods]
    compactors = await _io(backend.compactors, name)
    decision = decide_scale(current, desired, pods, compactors)
    mx = metrics()
    for pod in decision.drain:
        await _io(backend.request_drain, pod)
        mx.drain_requests.labels(name).inc()
    for pod in decision.mark:
        await _kube(kube.patch_annotations("v1", "Pod", namespace, pod, {naming.DRAINING_ANNOTATION: "true"}))
    for pod in decision.lowest_cost:
        await _kube(
            kube.patch_annotations("v1", "Pod", namespace, pod, {naming.POD_DELETION_COST: naming.VICTIM_DELETION_COST})
        )
    for pod in decision.unmark:
        await _kube(
            kube.patch_annotations(
                "v1", "Pod", namespace, pod, {naming.DRAINING_ANNOTATION: None, naming.POD_DELETION_COST: None}
            )
        )
    for pod in decision.delete:
        await _kube(kube.delete_pod(namespace, pod))
        mx.pods_deleted.labels(name).inc()
    if decision.replicas != current:
        logger.info("group %s: replicas %d -> %d (%s)", name, current, decision.replicas, decision.reason)
        await _kube(kube.set_replicas(namespace, naming.deployment_name(name), decision.replicas))
        mx.replica_changes.labels(name, "up" if decision.replicas > current else "down").inc()
    if not meta.get("deletionTimestamp"):  # a deleted group's series go with it (delete_group)
        mx.replicas.labels(name).set(decision.replicas)
        mx.desired.labels(name).set(desired)
        mx.draining.labels(name).set(len(decision.waiting))

    ready = int((dep.get("status") or {}).get("readyReplicas") or 0)
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
    generation = meta.get("generation")
    if not _settled(status, meta):
        return  # the figures now, the condition once the reconcile handler has set Ready
    trouble = podhealth.diagnose(raw_pods)
    if trouble is not None:
        _mark(patch, status, podhealth.PODS_HEALTHY, False, trouble.reason, trouble.message, generation)
    else:
        _mark(
            patch,
            status,
            podhealth.PODS_HEALTHY,
            True,
            podhealth.HEALTHY,
            f"{ready} of {decision.replicas} compactor pod(s) ready; none failing",
            generation,
        )
    blind = (
        await _hpa_cannot_scale(namespace, name)
        if figures.queued > 0 and group.autoscaler == m.Autoscaler.HPA.value
        else None
    )
    if blind is not None:
        _mark(
            patch,
            status,
            conditions.DEGRADED,
            True,
            "AutoscalerCannotReadMetric",
            f"{figures.queued} job(s) queued but HorizontalPodAutoscaler {naming.hpa_name(name)} cannot scale on "
            f"{naming.QUEUE_DEPTH_METRIC}: {blind}",
            generation,
        )
    elif figures.queued > 0 and ready == 0:
        _mark(
            patch,
            status,
            conditions.DEGRADED,
            True,
            "NoReadyCompactors",
            f"{figures.queued} job(s) queued but no compactor pod is ready; check the pods' events",
            generation,
        )
    elif figures.dead_lettered > 0:
        _mark(
            patch,
            status,
            conditions.DEGRADED,
            True,
            "DeadLetteredJobs",
            f"{figures.dead_lettered} job(s) failed too often; see `kompaktor status`",
            generation,
        )
    else:
        _mark(patch, status, conditions.DEGRADED, False, "Healthy", "", generation)


async def _hpa_cannot_scale(namespace: str, name: str) -> str | None:
    """Why the group's HPA cannot read its metric (its ScalingActive condition is False: the
    external metrics API unreachable or untrusted, the metric unknown), or None."""
    version = await _kube(kube.hpa_api_version())
    hpa = (
        await _kube(kube.get(version, "HorizontalPodAutoscaler", namespace, naming.hpa_name(name))) if version else None
    )
    for c in ((hpa or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == "ScalingActive" and c.get("status") == "False":
            return f"{c.get('reason', '')}: {c.get('message', '')}".strip(": ")
    return None


# ---------------------------------------------------------------------------------------------
# Compaction (user compactions)


def _terminal(status: Any) -> bool:
    phase = (status or {}).get("phase")
    return phase is not None and m.CompactionPhase(phase).terminal


@_counted("Compaction")
async def start_compaction(uid: str, spec: Any, status: Any, meta: Any, patch: kopf.Patch, **_: Any) -> None:
    if (status or {}).get("compactionId"):
        return  # already started (a replayed or resumed handler)
    generation = meta.get("generation")
    comp = parse(m.CompactionSpec, spec, patch, status, generation)
    start_row, end_row = comp.row_bytes()
    try:
        cid = await _io(depth.backend().start_compaction, uid, comp.table, start_row, end_row, comp.iterator_config())
    except depth.CompactionRejected as exc:
        _refused()
        patch.status.update(
            {
                "phase": m.CompactionPhase.FAILED.value,
                "message": str(exc),
                "endTime": now(),
                "observedGeneration": generation,
            }
        )
        _mark(patch, status, conditions.READY, False, "Rejected", str(exc), generation)
        return
    patch.status.update(
        {
            "compactionId": cid,
            "phase": m.CompactionPhase.SELECTING.value,
            "startTime": now(),
            "tabletsDone": 0,
            "observedGeneration": generation,
        }
    )
    _mark(patch, status, conditions.READY, True, "Started", f"user compaction {cid} started", generation)


async def track_compaction(status: Any, meta: Any, patch: kopf.Patch, **_: Any) -> None:
    cid = (status or {}).get("compactionId")
    if not cid or _terminal(status):
        return
    progress = await _io(depth.backend().compaction_progress, cid)
    phase = progress.phase
    if (
        phase == m.CompactionPhase.RUNNING.value
        and progress.tablets_done == 0
        and status.get("phase") in (None, m.CompactionPhase.SELECTING.value)
    ):
        phase = m.CompactionPhase.SELECTING.value  # no tablet done yet: still selecting files
    patch.status.update(
        {
            "phase": phase,
            "tabletsDone": progress.tablets_done,
            "tabletsTotal": progress.tablets_total,
            "message": progress.message or None,
        }
    )
    if m.CompactionPhase(phase).terminal:
        patch.status["endTime"] = now()
        ok = phase == m.CompactionPhase.SUCCEEDED.value
        _mark(patch, status, conditions.READY, ok, phase, progress.message, meta.get("generation"))


async def compaction_changed(status: Any, meta: Any, patch: kopf.Patch, **_: Any) -> None:
    """A Compaction's spec cannot change (the CRD's CEL rule says so where the server has CEL;
    this says it everywhere): the running compaction keeps the spec it started with."""
    if (status or {}).get("compactionId"):
        _mark(
            patch,
            status,
            conditions.DEGRADED,
            True,
            "SpecChanged",
            "a Compaction cannot change; the running compaction keeps its original spec (delete it and create another)",
            meta.get("generation"),
        )


async def cancel_compaction(status: Any, **_: Any) -> None:
    cid = (status or {}).get("compactionId")
    if cid and not _terminal(status):
        await _io(depth.backend().cancel_compaction, cid)


# ---------------------------------------------------------------------------------------------
# registration and running


def _not_terminal(status: Any, **_: Any) -> bool:
    return not _terminal(status)


def register(registry: kopf.OperatorRegistry, *, login: bool = True) -> kopf.OperatorRegistry:
    """Register every handler on ``registry`` (tests pass their own registry and login)."""
    cfg = config()
    r = {"registry": registry}
    kopf.on.startup(**r)(on_startup)
    kopf.on.cleanup(**r)(on_cleanup)
    if login:
        kopf.on.login(**r)(on_login)

    for decorator in (kopf.on.resume, kopf.on.create, kopf.on.update):
        decorator(*SERVICE, id="reconcile", **r)(reconcile_service)
        decorator(*GROUP, id="reconcile", **r)(reconcile_group)
    kopf.on.delete(*SERVICE, id="delete", **r)(delete_service)
    kopf.on.delete(*GROUP, id="delete", **r)(delete_group)
    kopf.timer(*SERVICE, id="status", interval=cfg.status_interval, **r)(service_status)
    kopf.timer(*GROUP, id="scale", interval=cfg.scale_interval, **r)(scale_group)

    kopf.on.resume(*COMPACTION, id="start", when=_not_terminal, **r)(start_compaction)
    kopf.on.create(*COMPACTION, id="start", **r)(start_compaction)
    kopf.timer(*COMPACTION, id="track", interval=cfg.scale_interval, when=_not_terminal, **r)(track_compaction)
    kopf.on.update(*COMPACTION, id="immutable", field="spec", **r)(compaction_changed)
    kopf.on.delete(*COMPACTION, id="cancel", **r)(cancel_compaction)
    return registry


async def run(
    *,
    namespaces: list[str] | None = None,
    liveness_endpoint: str | None = None,
    registry: kopf.OperatorRegistry | None = None,
    settings: kopf.OperatorSettings | None = None,
    stop_flag: asyncio.Event | None = None,
    ready_flag: asyncio.Event | None = None,
) -> None:
    """Run the operator until stopped (``kompaktor operator``; tests call it with kmock)."""
    if registry is None:
        registry = register(kopf.OperatorRegistry())
    await kopf.operator(
        registry=registry,
        settings=settings,
        standalone=True,  # one operator replica (Recreate strategy); no peering CRDs needed
        clusterwide=not namespaces,
        namespaces=namespaces or [],
        liveness_endpoint=liveness_endpoint,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )
