"""kopf registrations: the handlers of each kind, the operator's start-up, login and clean-up, and
``run``.

The handlers live by kind — ``services`` (CompactionService), ``groups`` (CompactorGroup: reconcile
and scaler), ``compactions`` (Compaction) — with what they share in ``common``. Every handler
begins by validating its spec with the pydantic model (a bad spec becomes a ``Ready=False``
condition and a ``kopf.PermanentError``: no crash loop); decisions come from the pure modules
(manifests, scaling, conditions); I/O goes through the :class:`~kompaktor_operator.runtime.Runtime`
in kopf's memo: its Kubernetes client (``kube``) and Redis backend (``backend``). Handlers are
idempotent: kopf may run them twice.

``register`` puts every handler on a registry; ``run`` makes the Runtime (or takes the one given),
puts it in the memo kopf hands to every handler, and runs kopf until stopped.

The coordinator is not run here: the Helm chart runs ``kompaktor coordinator`` as a second
container of the operator pod, and its Redis lease makes exactly one coordinator act at a time.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf

from kompaktor.resources import api
from kompaktor.resources.operator_config import OperatorConfig
from kompaktor_operator import naming, runtime
from kompaktor_operator.handlers import compactions, groups, services
from kompaktor_operator.runtime import Runtime
from kompaktor_operator.runtime import memo as operator_memo

# ---------------------------------------------------------------------------------------------
# start-up, login and clean-up


async def on_startup(settings: kopf.OperatorSettings, logger: kopf.Logger, memo: kopf.Memo, **_: Any) -> None:
    rt = runtime.of(memo)
    # Our own finalizer and annotation names, so kubectl shows whose they are.
    settings.persistence.finalizer = naming.FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=api.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=api.GROUP, key="last-handled-configuration"
    )
    # Events for problems only: a busy cluster need not store one per reconcile.
    settings.posting.level = logging.WARNING
    # Re-open watches every few minutes: long-lived idle watches are cut by load balancers.
    settings.watching.server_timeout = 300
    # A resource being deleted waits for its timers to stop; kopf re-checks a timer caught
    # mid-run only after this many seconds (default 60: a `kubectl delete` of a group whose
    # scale timer was running hung for a minute). Timers here finish in milliseconds.
    settings.background.cancellation_polling = 1
    logger.info("kompaktor operator started; compactor image %s", rt.config.compactor_image)
    if rt.env.get("KOMPAKTOR_METRICS_API"):
        rt.start(lambda: rt.serve_metrics_api(logger))


async def on_cleanup(memo: kopf.Memo, **_: Any) -> None:
    await runtime.of(memo).close()


async def on_login(memo: kopf.Memo, **kwargs: Any) -> kopf.ConnectionInfo | None:
    info = kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)
    if info is not None:
        rt = runtime.of(memo)
        rt.login(info)
        await rt.close_retired()
    return info


# ---------------------------------------------------------------------------------------------
# registration and running


def register(registry: kopf.OperatorRegistry, config: OperatorConfig, *, login: bool = True) -> kopf.OperatorRegistry:
    """Register every handler on ``registry``, the timers at ``config``'s intervals (tests pass
    their own registry and login)."""
    kopf.on.startup(registry=registry)(on_startup)
    kopf.on.cleanup(registry=registry)(on_cleanup)
    if login:
        kopf.on.login(registry=registry)(on_login)

    service, group, compaction = api.SERVICE_RESOURCE, api.GROUP_RESOURCE, api.COMPACTION_RESOURCE
    for decorator in (kopf.on.resume, kopf.on.create, kopf.on.update):
        decorator(*service, id="reconcile", registry=registry)(services.reconcile_service)
        decorator(*group, id="reconcile", registry=registry)(groups.reconcile_group)
    kopf.on.delete(*service, id="delete", registry=registry)(services.delete_service)
    kopf.on.delete(*group, id="delete", registry=registry)(groups.delete_group)
    kopf.timer(*service, id="status", interval=config.status_interval, registry=registry)(services.service_status)
    kopf.timer(*group, id="scale", interval=config.scale_interval, registry=registry)(groups.scale_group)

    not_terminal = compactions.not_terminal
    kopf.on.resume(*compaction, id="start", when=not_terminal, registry=registry)(compactions.start_compaction)
    kopf.on.create(*compaction, id="start", registry=registry)(compactions.start_compaction)
    kopf.timer(*compaction, id="track", interval=config.scale_interval, when=not_terminal, registry=registry)(
        compactions.track_compaction
    )
    kopf.on.update(*compaction, id="immutable", field="spec", registry=registry)(compactions.compaction_changed)
    kopf.on.delete(*compaction, id="cancel", registry=registry)(compactions.cancel_compaction)
    return registry


async def run(
    *,
    runtime: Runtime | None = None,
    namespaces: list[str] | None = None,
    liveness_endpoint: str | None = None,
    registry: kopf.OperatorRegistry | None = None,
    settings: kopf.OperatorSettings | None = None,
    stop_flag: asyncio.Event | None = None,
    ready_flag: asyncio.Event | None = None,
) -> None:
    """Run the operator until stopped (``kompaktor operator``; tests call it with kmock). Without
    a ``runtime``, one is made from the environment (``Runtime.from_env``)."""
    rt = runtime if runtime is not None else Runtime.from_env()
    if registry is None:
        registry = register(kopf.OperatorRegistry(), rt.config)
    await kopf.operator(
        registry=registry,
        settings=settings,
        memo=operator_memo(rt),
        standalone=True,  # one operator replica (Recreate strategy); no peering CRDs needed
        clusterwide=not namespaces,
        namespaces=namespaces or [],
        liveness_endpoint=liveness_endpoint,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )
