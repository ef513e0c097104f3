"""What every handler shares: spec parsing, conditions, the reconcile counter, and the mapping of
I/O errors to kopf's retry (``TemporaryError``) or stop (``PermanentError``).

Handlers reach the operator's state through the :class:`~kompaktor_operator.runtime.Runtime` in
kopf's memo (``runtime.of(memo)``), never through module-level state.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, TypeVar

import kopf
from pydantic import ValidationError

from kompaktor.resources import models as m
from kompaktor_operator import conditions, kube, runtime
from kompaktor_operator.backend import Backend, BackendUnavailable
from kompaktor_operator.runtime import Runtime

T = TypeVar("T", bound=m.CRDModel)
R = TypeVar("R")


def namespaced(namespace: str | None) -> str:
    """The namespace kopf gives a handler of a namespaced resource (its handler types allow None,
    which only a cluster-scoped resource gets)."""
    if namespace is None:
        raise kopf.PermanentError("a namespaced resource without a namespace")
    return namespace


def now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def mark(
    patch: kopf.Patch, status: kopf.Status, type_: str, ok: bool, reason: str, message: str, generation: int | None
) -> None:
    current = patch.status.get("conditions") or status.get("conditions")
    patch.status["conditions"] = conditions.set_condition(
        current, type_, ok, reason=reason, message=message, generation=generation, now=now()
    )


#: How the reconcile running in this task ended, when not by returning or raising: see ``refused``.
_outcome: ContextVar[str | None] = ContextVar("kompaktor_reconcile_outcome", default=None)


def refused() -> None:
    """Count the running reconcile as ``refused`` (an invalid or disallowed spec), not ``error``."""
    _outcome.set("refused")


def counted(kind: str) -> Callable[[Callable[..., Awaitable[None]]], Callable[..., Awaitable[None]]]:
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
                mx = runtime.of(kwargs["memo"]).metrics
                mx.reconciles.labels(kind, result).inc()
                mx.reconcile_seconds.labels(kind).observe(time.monotonic() - started)

        return counted

    return wrap


def parse(model: type[T], spec: kopf.Spec, patch: kopf.Patch, status: kopf.Status, generation: int | None) -> T:
    """Validate a spec; on failure report Ready=False with the reason and stop retrying."""
    try:
        return model.model_validate(dict(spec))
    except ValidationError as exc:
        refused()
        message = f"invalid spec: {m.explain(exc)}"
        mark(patch, status, conditions.READY, False, "InvalidSpec", message, generation)
        patch.status["observedGeneration"] = generation
        raise kopf.PermanentError(message) from None


async def backend_call(rt: Runtime, call: Callable[[Backend], R]) -> R:
    """Run a blocking Redis call off the event loop; unreachable Redis becomes a retry."""
    try:
        return await asyncio.to_thread(lambda: call(rt.backend()))
    except BackendUnavailable as exc:
        raise kopf.TemporaryError(str(exc), delay=rt.retry_delay) from exc


async def kube_call(rt: Runtime, coro: Awaitable[R]) -> R:
    """Await a Kubernetes call: a refusal stops retrying, anything else is retried."""
    try:
        return await coro
    except kube.KubeError as exc:
        if exc.status in (400, 403, 404, 422):
            raise kopf.PermanentError(f"the API server refused: {exc}") from exc
        raise kopf.TemporaryError(f"the API server failed: {exc}", delay=rt.retry_delay) from exc


def settled(status: kopf.Status, meta: kopf.Meta) -> bool:
    """Whether the reconcile handler has answered for the current generation.

    ``status.conditions`` is one list, and a merge patch replaces a list whole: a timer that
    wrote its condition while a reconcile was landing would put back the old Ready. So timers
    write conditions only once Ready has been set for this generation (kopf hands them the
    latest body), and leave the list to the reconcile handler until then."""
    generation = meta.get("generation")
    ready = conditions.get(status.get("conditions"), conditions.READY)
    return (
        ready is not None
        and ready.get("observedGeneration") == generation
        and status.get("observedGeneration") == generation
    )
