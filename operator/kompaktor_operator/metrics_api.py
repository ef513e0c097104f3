"""The operator serves ``external.metrics.k8s.io`` itself: queue depth straight from Redis to the HPA.

An aggregated API (the chart's APIService points at the operator's Service): the apiserver proxies
``GET /apis/external.metrics.k8s.io/v1beta1/namespaces/<ns>/kompaktor_queue_depth?labelSelector=
group=<g>`` here, and the answer is the group's queued + running jobs — the same number the
coordinator exports to Prometheus as ``kompaktor_queue_depth{group}``. No Prometheus needed.

Security: TLS with the chart's serving certificate; the caller must present a client certificate
signed by the cluster's request-header CA with an allowed name (read from the
``kube-system/extension-apiserver-authentication`` ConfigMap: this is the apiserver's front proxy),
and the user it names in ``X-Remote-User`` must be allowed to ``get`` this API (a
SubjectAccessReview, cached briefly) — the delegated authentication and authorization every
aggregated API server does.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web
from aiohttp.typedefs import Handler

from kompaktor_operator import naming
from kompaktor_operator.backend import Backend
from kompaktor_operator.kube import Client, KubeError
from kompaktor_operator.metrics import OperatorMetrics

log = logging.getLogger("kompaktor.metrics_api")

GROUP = "external.metrics.k8s.io"
VERSION = "v1beta1"
GROUP_VERSION = f"{GROUP}/{VERSION}"
METRIC = naming.QUEUE_DEPTH_METRIC
SAR_TTL_S = 30.0

#: group name -> queued + running jobs; raises KeyError for a group the store does not know
DepthFn = Callable[[str], Awaitable[int]]
#: (user, groups) -> allowed to get the external metrics API
AuthorizeFn = Callable[[str, list[str]], Awaitable[bool]]
#: called with the HTTP status code of every answer (the operator counts them)
ResponseFn = Callable[[int], None]


def _status(code: int, reason: str, message: str) -> web.Response:
    return web.json_response(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        },
        status=code,
    )


async def _healthz(_request: web.Request) -> web.Response:
    return web.Response(text="ok")


def parse_selector(selector: str) -> dict[str, str]:
    """``group=small`` (or ``group==small``, comma-separated equalities) -> {"group": "small"};
    anything else (set-based selectors) raises ValueError."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in selector.split(","))):
        key, sep, value = part.replace("==", "=").partition("=")
        if not sep or not key.strip() or any(c in part for c in "!()"):
            raise ValueError(f"unsupported label selector {selector!r}: use group=<name>")
        out[key.strip()] = value.strip()
    return out


@dataclass
class MetricsAPI:
    depth: DepthFn
    authorize: AuthorizeFn
    allowed_names: list[str] = field(default_factory=list)  # front-proxy client cert CNs ([] = any)
    on_response: ResponseFn | None = None
    _sar: dict[tuple[str, tuple[str, ...]], tuple[float, bool]] = field(default_factory=dict)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._count, self._auth])
        prefix = f"/apis/{GROUP}/{VERSION}"
        app.router.add_get(f"/apis/{GROUP}", self.group)
        app.router.add_get(prefix, self.resources)
        app.router.add_get(prefix + "/namespaces/{namespace}/{metric}", self.value)
        app.router.add_get("/healthz", _healthz)
        return app

    @web.middleware
    async def _count(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every answer's status code to ``on_response`` (refusals and unknown paths too)."""
        count = self.on_response or (lambda _code: None)
        try:
            response = await handler(request)
        except web.HTTPException as exc:  # aiohttp's own answers (404 for a path it does not route)
            count(exc.status)
            raise
        except Exception:  # aiohttp answers 500
            count(500)
            raise
        count(response.status)
        return response

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == "/healthz":
            return await handler(request)
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        if not peer:
            return _status(401, "Unauthorized", "a client certificate from the API server's front proxy is required")
        cn = next((v for rdn in peer.get("subject", ()) for k, v in rdn if k == "commonName"), "")
        if self.allowed_names and cn not in self.allowed_names:
            return _status(403, "Forbidden", f"client certificate {cn!r} is not an allowed front proxy")
        user = request.headers.get("X-Remote-User", "")
        groups = request.headers.getall("X-Remote-Group", [])
        if not user:
            return _status(401, "Unauthorized", "no X-Remote-User from the front proxy")
        if not await self._allowed(user, groups):
            return _status(403, "Forbidden", f"user {user!r} cannot get {GROUP_VERSION}")
        return await handler(request)

    async def _allowed(self, user: str, groups: list[str]) -> bool:
        key = (user, tuple(sorted(groups)))
        hit = self._sar.get(key)
        now = time.monotonic()
        if hit is not None and now - hit[0] < SAR_TTL_S:
            return hit[1]
        ok = await self.authorize(user, groups)
        self._sar[key] = (now, ok)
        return ok

    async def group(self, _request: web.Request) -> web.Response:
        version = {"groupVersion": GROUP_VERSION, "version": VERSION}
        return web.json_response(
            {"kind": "APIGroup", "apiVersion": "v1", "name": GROUP, "versions": [version], "preferredVersion": version}
        )

    async def resources(self, _request: web.Request) -> web.Response:
        return web.json_response(
            {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": GROUP_VERSION,
                "resources": [
                    {
                        "name": METRIC,
                        "singularName": "",
                        "namespaced": True,
                        "kind": "ExternalMetricValueList",
                        "verbs": ["get"],
                    }
                ],
            }
        )

    async def value(self, request: web.Request) -> web.Response:
        metric = request.match_info["metric"]
        if metric != METRIC:
            return _status(404, "NotFound", f"unknown external metric {metric!r}: this server serves {METRIC}")
        try:
            labels = parse_selector(request.query.get("labelSelector", ""))
        except ValueError as exc:
            return _status(400, "BadRequest", str(exc))
        group = labels.get("group")
        if not group:
            return _status(400, "BadRequest", f"{METRIC} needs the label selector group=<compactor group>")
        try:
            depth = await self.depth(group)
        except KeyError:
            return _status(404, "NotFound", f"no compactor group {group!r}: no {METRIC} for it")
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return web.json_response(
            {
                "kind": "ExternalMetricValueList",
                "apiVersion": GROUP_VERSION,
                "metadata": {},
                "items": [
                    {"metricName": METRIC, "metricLabels": {"group": group}, "timestamp": now, "value": str(int(depth))}
                ],
            }
        )


def server_ssl(cert_file: str, key_file: str, client_ca_pem: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert_file, key_file)
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cadata=client_ca_pem)
    return ctx


async def serve(api: MetricsAPI, host: str, port: int, ctx: ssl.SSLContext) -> web.AppRunner:
    runner = web.AppRunner(api.app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=ctx).start()
    log.info("serving %s on %s:%d", GROUP_VERSION, host, port)
    return runner


async def start_from_env(
    env: dict[str, str], client: Client, backend: Backend, metrics: OperatorMetrics
) -> web.AppRunner | None:
    """Start the API when ``KOMPAKTOR_METRICS_API`` (host:port) is set; the serving certificate
    comes from ``KOMPAKTOR_METRICS_API_CERT``/``_KEY`` (files)."""
    address = env.get("KOMPAKTOR_METRICS_API")
    if not address:
        return None
    host, _, port = address.rpartition(":")
    cm = await client.request("GET", "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication")
    data = (cm or {}).get("data") or {}
    ca = data.get("requestheader-client-ca-file")
    if not ca:
        raise RuntimeError(
            "the cluster has no request-header CA (extension-apiserver-authentication): "
            "an aggregated API cannot authenticate the API server"
        )
    import json as _json

    allowed = _json.loads(data.get("requestheader-allowed-names") or "[]")

    async def depth(group: str) -> int:
        groups = await asyncio.to_thread(backend.groups)
        if group not in groups:
            raise KeyError(group)
        f = await asyncio.to_thread(backend.queue_figures, group)
        return f.queued + f.running

    async def authorize(user: str, groups: list[str]) -> bool:
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user,
                "groups": groups,
                "resourceAttributes": {"group": GROUP, "version": VERSION, "resource": METRIC, "verb": "get"},
            },
        }
        out = await client.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", json=review)
        return bool(((out or {}).get("status") or {}).get("allowed"))

    def counted(code: int) -> None:
        metrics.metrics_api_requests.labels(str(code)).inc()

    api = MetricsAPI(depth, authorize, allowed, on_response=counted)
    ctx = server_ssl(env["KOMPAKTOR_METRICS_API_CERT"], env["KOMPAKTOR_METRICS_API_KEY"], ca)
    runner = await serve(api, host or "0.0.0.0", int(port), ctx)
    if env.get("KOMPAKTOR_METRICS_API_REGISTER"):
        await register(client, env["KOMPAKTOR_METRICS_API_REGISTER"], env["KOMPAKTOR_METRICS_API_CA"])
    return runner


async def register(client: Client, spec: str, ca_file: str) -> None:
    """Create or update the APIService (``spec`` = ``<namespace>/<service>/<owner ClusterRoleBinding>``).

    For servers where Helm cannot: Kubernetes < 1.22 panics on a server-side apply of an APIService
    (kubernetes#89264, "FieldManager must be installed to run apply"), which is how Helm 4 installs.
    A plain create / merge patch works there. The APIService is owned by the chart's (cluster-scoped)
    auth-delegator ClusterRoleBinding, so `helm uninstall` takes it away with the binding."""
    import base64

    namespace, service, owner = spec.split("/")
    binding = await client.request("GET", f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{owner}")
    with open(ca_file, "rb") as f:
        ca_bundle = base64.b64encode(f.read()).decode()
    name = f"{VERSION}.{GROUP}"
    body = {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/managed-by": naming.MANAGED_BY},
            "ownerReferences": [
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRoleBinding",
                    "name": owner,
                    "uid": binding["metadata"]["uid"],
                }
            ],
        },
        "spec": {
            "group": GROUP,
            "version": VERSION,
            "groupPriorityMinimum": 100,
            "versionPriority": 100,
            "caBundle": ca_bundle,
            "service": {"name": service, "namespace": namespace, "port": 443},
        },
    }
    path = "/apis/apiregistration.k8s.io/v1/apiservices"
    try:
        await client.request("POST", path, json=body)
    except KubeError as exc:
        if exc.status != 409:
            raise
        await client.request("PATCH", f"{path}/{name}", json=body, content_type="application/merge-patch+json")
    log.info("registered APIService %s -> %s/%s", name, namespace, service)
