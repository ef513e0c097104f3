"""Run the operator in-process (kopf) against kmock's Kubernetes emulator, with a fake Redis backend.

Known from the prototype (STYLE.md §7): kopf needs a login handler returning kmock's URL, every
resource declared in discovery, scanning disabled (kmock answers 500 to namespace listings),
and handlers may run twice — so children are created-or-patched.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import kopf
import pytest
import pytest_asyncio

from kompaktor.resources import api as crd
from kompaktor.resources.operator_config import OperatorConfig
from kompaktor_operator import backend as backends
from kompaktor_operator import handlers, kube, runtime
from kompaktor_operator.runtime import Runtime
from kompaktor_operator.scaling import CompactorView
from tests.support.wait import apoll

NS = "kompaktor"
CRDS = [crd.SERVICES, crd.GROUPS, crd.COMPACTIONS]
BUILTIN = {
    "apps/v1/deployments": ("Deployment", True),
    "v1/services": ("Service", True),
    "v1/pods": ("Pod", True),
    "autoscaling/v2/horizontalpodautoscalers": ("HorizontalPodAutoscaler", True),
    "keda.sh/v1alpha1/scaledobjects": ("ScaledObject", True),
    "v1/namespaces": ("Namespace", False),
    "apiextensions.k8s.io/v1/customresourcedefinitions": ("CustomResourceDefinition", False),
}
KINDS = {crd.SERVICES: crd.SERVICE_KIND, crd.GROUPS: crd.GROUP_KIND, crd.COMPACTIONS: crd.COMPACTION_KIND}


@dataclass
class FakeBackend:
    """An in-memory stand-in for Redis (fakes over mocks): records what the operator asked."""

    services: dict[str, Any] = field(default_factory=dict)
    groups: dict[str, Any] = field(default_factory=dict)
    heartbeats: dict[str, dict[str, CompactorView]] = field(default_factory=dict)
    figures: dict[str, backends.QueueFigures] = field(default_factory=dict)
    drained: list[str] = field(default_factory=list)
    compactions: dict[str, dict[str, Any]] = field(default_factory=dict)
    started: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    unavailable: bool = False

    def _check(self) -> None:
        if self.unavailable:
            raise backends.BackendUnavailable("fake Redis is down")

    def put_service(self, cfg: Any) -> None:
        self._check()
        self.services[cfg.name] = cfg

    def delete_service(self, name: str) -> None:
        self.services.pop(name, None)

    def put_group(self, cfg: Any) -> None:
        self._check()
        self.groups[cfg.name] = cfg

    def delete_group(self, name: str) -> None:
        self.groups.pop(name, None)

    def compactors(self, group: str) -> dict[str, CompactorView]:
        self._check()
        return dict(self.heartbeats.get(group, {}))

    def request_drain(self, compactor_id: str) -> None:
        self.drained.append(compactor_id)
        for beats in self.heartbeats.values():
            if compactor_id in beats:
                old = beats[compactor_id]
                beats[compactor_id] = CompactorView(old.id, "draining", old.ecid)

    def queue_figures(self, group: str) -> backends.QueueFigures:
        self._check()
        return self.figures.get(group, backends.QueueFigures())

    def start_compaction(self, request_id, table, start_row, end_row, iterators) -> str:
        self._check()
        if table == "missing":
            raise backends.CompactionRejected("unknown table 'missing'")
        for cid, c in self.compactions.items():
            if c["request_id"] == request_id:
                return cid
        cid = f"UC-{len(self.compactions) + 1:06d}"
        self.compactions[cid] = {
            "request_id": request_id,
            "table": table,
            "rows": (start_row, end_row),
            "iterators": iterators,
            "state": "Running",
            "done": 0,
            "total": 3,
        }
        self.started.append(cid)
        return cid

    def compaction_progress(self, cid: str) -> backends.Progress:
        c = self.compactions[cid]
        return backends.Progress(c["state"], c["done"], c["total"], c.get("message", ""))

    def cancel_compaction(self, cid: str) -> None:
        self.cancelled.append(cid)
        self.compactions[cid]["state"] = "Cancelled"


#: what reading an object the operator has not written yet raises
NOT_YET = (AssertionError, KeyError, TypeError, IndexError, StopIteration)


async def eventually(check: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """:func:`tests.support.wait.apoll`, an object not there yet counting as "not yet"."""
    return await apoll(check, what, timeout, ignore=NOT_YET)


@pytest.fixture
def backend() -> FakeBackend | None:
    """The operator's backend: a fake (None: the real one, on KOMPAKTOR_REDIS_URL)."""
    return FakeBackend()


@pytest.fixture
def operator_runtime(backend: FakeBackend | None) -> Runtime:
    """The operator's Runtime for one test (what ``kompaktor operator`` makes at start-up)."""
    rt = Runtime(
        config=OperatorConfig(
            compactor_image="example.org/compactor:test",
            scale_interval=0.2,
            status_interval=0.2,
            prometheus_url="http://prom:9090",
        ),
        redis_url=os.environ.get("KOMPAKTOR_REDIS_URL"),
        retry_delay=0.3,
    )
    if backend is not None:
        rt.use_backend(backend)
    return rt


async def _emulator_apply(self: kube.Client, obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    """kmock 0.8 does not implement server-side apply (a PATCH of a missing object is a 404, not a
    create): for these handler units, create or merge-patch. What apply itself does — removing a
    field the rendering dropped, keeping the scaler's replicas, adopting an older operator's
    fields — is tested against a real kube-apiserver in tests/k8s/test_server_side_apply.py."""
    api_version, kind, name = obj["apiVersion"], obj["kind"], obj["metadata"]["name"]
    body = {**obj, "metadata": {**obj["metadata"], "namespace": namespace}}
    if await self.get(api_version, kind, namespace, name) is None:
        try:
            return await self.request("POST", kube._path(api_version, kind, namespace), json=body)
        except kube.KubeError as exc:
            if exc.status != 409:
                raise
    return await self.request(
        "PATCH", kube._path(api_version, kind, namespace, name), json=body, content_type="application/merge-patch+json"
    )


@pytest_asyncio.fixture
async def operator(kmock, operator_runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    monkeypatch.setattr(kube.Client, "apply", _emulator_apply)
    for plural in CRDS:
        kmock.resources[f"{crd.GROUP_VERSION}/{plural}"] = kopf_resource(KINDS[plural], plural)
    for key, (kind, namespaced) in BUILTIN.items():
        kmock.resources[key] = {
            "kind": kind,
            "namespaced": namespaced,
            "verbs": ["list", "watch", "get", "create", "patch", "delete"],
        }

    registry = handlers.register(kopf.OperatorRegistry(), operator_runtime.config, login=False)

    @kopf.on.login(registry=registry)
    def _login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
        info = kopf.ConnectionInfo(server=str(kmock.url).rstrip("/"))
        runtime.of(memo).login(info)
        return info

    settings = kopf.OperatorSettings()
    settings.scanning.disabled = True  # kmock 0.8 answers 500 to a namespace listing
    settings.watching.reconnect_backoff = 0.1
    settings.networking.request_timeout = 5
    # kopf cancels every task created after it started, so it gets its own thread and loop
    # (as kopf.testing.KopfRunner does); kmock keeps serving from the test's loop.
    stop, ready = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def _main() -> None:
        try:
            asyncio.run(
                handlers.run(
                    runtime=operator_runtime,
                    namespaces=[NS],
                    registry=registry,
                    settings=settings,
                    stop_flag=stop,
                    ready_flag=ready,
                )
            )
        except BaseException as exc:  # reported at teardown
            errors.append(exc)

    thread = threading.Thread(target=_main, name="kopf", daemon=True)
    thread.start()
    await eventually(ready.is_set, what="operator ready")

    # kmock streams the objects that exist when a watch starts and only then subscribes to the
    # event bus of the resource; an event published before that subscription is never streamed.
    # So the tests begin once every watched resource has a subscriber on its bus (kmock 0.8
    # offers no public view of this).
    def subscribed() -> bool:
        buses = {str(getattr(res, "plural", "")): bus for res, bus in kmock._buses.items()}
        return all(p in buses and buses[p].consumer_count > 0 for p in CRDS)

    await eventually(subscribed, what="kmock streaming events to every watch")
    try:
        yield kmock
    finally:
        stop.set()
        await eventually(lambda: not thread.is_alive(), timeout=20, what="operator stopped")
    assert not errors, errors


def api_path(res: str, name: str | None = None, namespace: str = NS) -> str:
    """The Kubernetes API path of ``res`` ("group/version/plural", "v1/pods") in ``namespace``."""
    group_version, plural = res.rsplit("/", 1)
    root = "/api" if "/" not in group_version else "/apis"
    return f"{root}/{group_version}/namespaces/{namespace}/{plural}" + (f"/{name}" if name else "")


class Api:
    """Changes go through the Kubernetes API, as kubectl and the HPA make them: kmock turns
    them into watch events (writing ``kmock.objects`` directly would not notify any watch)."""

    def __init__(self, kmock: Any) -> None:
        self.kmock = kmock

    async def _send(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        resp = await self.kmock.request(method, path, **kwargs)
        body = await resp.json(content_type=None)
        assert resp.status < 300, f"{method} {path}: {resp.status} {body}"
        return body

    async def create(self, res: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self._send("POST", api_path(res), json=body)

    async def patch(self, res: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return await self._send(
            "PATCH", api_path(res, name), json=patch, headers={"Content-Type": "application/merge-patch+json"}
        )

    async def delete(self, res: str, name: str) -> dict[str, Any]:
        return await self._send("DELETE", api_path(res, name))


@pytest.fixture
def api(operator: Any) -> Api:
    return Api(operator)


def kopf_resource(kind: str, plural: str) -> dict[str, Any]:
    return {
        "kind": kind,
        "namespaced": True,
        "singular": kind.lower(),
        "verbs": ["list", "watch", "get", "patch", "update", "create", "delete"],
        "subresources": ["status"] + (["scale"] if kind == "CompactorGroup" else []),
    }
