"""The operator's state for one run: one :class:`Runtime`, made at start-up and kept in kopf's memo.

Owns: what the handlers share across resources and calls — the operator's settings, its metrics,
the Kubernetes client (made by the login handler from kopf's credentials), the Redis backend
(connected on first use), the scaler's memory of how long each group has been idle, and the
external metrics API server's task. Nothing lives at module level: a second Runtime (a test, a
second operator in one process) shares nothing with the first.

kopf gives every resource a shallow copy of the operator's memo, so ``memo.runtime`` is the same
object in every handler; :func:`of` reads it. Must not import: the handlers.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import kopf

from kompaktor.resources.operator_config import OperatorConfig
from kompaktor_operator import kube
from kompaktor_operator.backend import Backend, connect
from kompaktor_operator.metrics import OperatorMetrics

#: the key of the Runtime in kopf's memo
MEMO_KEY = "runtime"


@dataclass
class Runtime:
    config: OperatorConfig
    #: Redis URL of the store and queues (``--redis``); used when no backend was given. Not in
    #: the repr: it may hold the password.
    redis_url: str | None = field(default=None, repr=False)
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics.create)
    #: Retry delay when Redis or the API server is not reachable, seconds.
    retry_delay: float = 10.0
    #: (namespace, group) -> monotonic time since which the group has had no job (the scaler's
    #: quiet window before it parks a group at 0; lost on a restart, which restarts the window)
    idle_since: dict[tuple[str, str], float] = field(default_factory=dict)
    #: the process environment the optional parts read (the external metrics API)
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ), repr=False)
    _backend: Backend | None = field(default=None, repr=False)
    _kube: kube.Client | None = field(default=None, repr=False)
    #: clients replaced by a new login, closed by :meth:`close_retired` (their sessions, their
    #: credentials' temporary files)
    _retired: list[kube.Client] = field(default_factory=list, repr=False)
    _tasks: list[asyncio.Task[Any]] = field(default_factory=list, repr=False)
    _connecting: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def from_env(cls, redis_url: str | None = None) -> Runtime:
        """The settings the chart sets (``OperatorConfig.from_env``); Redis from ``redis_url`` or
        KOMPAKTOR_REDIS_URL."""
        return cls(config=OperatorConfig.from_env(), redis_url=redis_url or os.environ.get("KOMPAKTOR_REDIS_URL"))

    # -- Redis ---------------------------------------------------------------------------------

    def backend(self) -> Backend:
        """The Redis backend, connected on first use (handlers call it from worker threads: one
        connects, the others wait); raises BackendUnavailable."""
        if self._backend is None:
            with self._connecting:
                if self._backend is None:
                    self._backend = connect(self.redis_url)
        return self._backend

    def use_backend(self, backend: Backend | None) -> None:
        """Use ``backend`` instead of connecting to ``redis_url`` (tests; None: connect again)."""
        self._backend = backend

    # -- Kubernetes ------------------------------------------------------------------------------

    def login(self, info: kopf.ConnectionInfo) -> kube.Client:
        """Use these credentials (the ones kopf logged in with) for the operator's own calls. kopf
        logs in again when credentials expire: the client before is retired, to be closed by
        :meth:`close_retired` (a call it has in flight fails like any call with old credentials)."""
        if self._kube is not None:
            self._retired.append(self._kube)
        self._kube = kube.Client(info)
        return self._kube

    async def close_retired(self) -> None:
        """Close the clients earlier logins made (each login would otherwise leave a session and
        its credentials' temporary files behind, for the operator's life)."""
        retired, self._retired = self._retired, []
        for client in retired:
            await client.close()

    @property
    def kube(self) -> kube.Client:
        if self._kube is None:
            raise RuntimeError("the operator has not logged in yet (the login handler makes the client)")
        return self._kube

    @property
    def logged_in(self) -> bool:
        return self._kube is not None

    # -- the scaler's memory -----------------------------------------------------------------------

    def idle_for(self, namespace: str, group: str, work: int, now: float | None = None) -> float:
        """Seconds ``group`` has had no job (0 while it has work); starts its quiet window."""
        now = time.monotonic() if now is None else now
        if work > 0:
            self.idle_since.pop((namespace, group), None)
            return 0.0
        return now - self.idle_since.setdefault((namespace, group), now)

    def forget_group(self, namespace: str, group: str) -> None:
        """A deleted group leaves nothing behind: its idle clock (a group made again under its name
        starts a new quiet window) and its metric series."""
        self.idle_since.pop((namespace, group), None)
        self.metrics.forget_group(group)

    # -- background tasks --------------------------------------------------------------------------

    def start(self, make: Callable[[], Any]) -> None:
        """Run a coroutine in the background until :meth:`close`."""
        self._tasks.append(asyncio.create_task(make()))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        self._tasks.clear()
        await self.close_retired()
        if self._kube is not None:
            await self._kube.close()
        self._kube = None

    async def serve_metrics_api(self, logger: kopf.Logger) -> None:
        """Serve external.metrics.k8s.io once kopf has logged in (the API needs the cluster's
        request-header CA); a failure is logged loudly and retried, never fatal to the operator."""
        from kompaktor_operator import metrics_api

        while True:
            if not self.logged_in:
                await asyncio.sleep(0.2)  # kopf has not logged in yet
                continue
            try:
                runner = await metrics_api.start_from_env(self.env, self.kube, self.backend(), self.metrics)
            except Exception as exc:  # BackendUnavailable, an API error, a bad certificate
                logger.error("cannot serve the external metrics API (retrying in 10 s): %s", exc)
                await asyncio.sleep(10)
                continue
            try:
                await asyncio.Event().wait()  # until cancelled at cleanup
            finally:
                if runner is not None:
                    await runner.cleanup()


def of(memo: Any) -> Runtime:
    """The Runtime in a kopf memo (the operator's, or a resource's shallow copy of it)."""
    runtime = memo.get(MEMO_KEY) if hasattr(memo, "get") else None
    if not isinstance(runtime, Runtime):
        raise RuntimeError("no Runtime in kopf's memo: run the operator with handlers.run()")
    return runtime


def memo(runtime: Runtime) -> kopf.Memo:
    """The operator-wide memo that carries ``runtime`` to every handler."""
    return kopf.Memo({MEMO_KEY: runtime})
