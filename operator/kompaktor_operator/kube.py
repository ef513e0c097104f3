"""The only module that talks to the Kubernetes API (besides kopf itself).

Owns: a small aiohttp client built from the same ``kopf.ConnectionInfo`` kopf logs in with,
and the few verbs the operator needs — create-or-patch (never "create if absent"), get,
delete, list pods of a selector, patch pod annotations, set a Deployment's replicas.
"""

from __future__ import annotations

import base64
import ssl
import tempfile
from dataclasses import dataclass
from typing import Any

import aiohttp
import kopf

#: kind -> (API path prefix, plural). Only what the operator owns or reads.
_RESOURCES: dict[tuple[str, str], tuple[str, str]] = {
    ("apps/v1", "Deployment"): ("/apis/apps/v1", "deployments"),
    ("v1", "Service"): ("/api/v1", "services"),
    ("v1", "Pod"): ("/api/v1", "pods"),
    ("autoscaling/v2", "HorizontalPodAutoscaler"): ("/apis/autoscaling/v2", "horizontalpodautoscalers"),
    ("keda.sh/v1alpha1", "ScaledObject"): ("/apis/keda.sh/v1alpha1", "scaledobjects"),
    ("kompaktor.io/v1alpha1", "CompactorGroup"): ("/apis/kompaktor.io/v1alpha1", "compactorgroups"),
}


class KubeError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


@dataclass
class Client:
    info: kopf.ConnectionInfo
    _session: aiohttp.ClientSession | None = None

    def _ssl(self) -> ssl.SSLContext | bool:
        if self.info.insecure:
            return False
        ctx = ssl.create_default_context(cafile=self.info.ca_path) if self.info.ca_path else None
        if self.info.ca_data:
            ctx = ctx or ssl.create_default_context()
            ctx.load_verify_locations(cadata=base64.b64decode(self.info.ca_data).decode())
        if self.info.certificate_path or self.info.certificate_data:
            ctx = ctx or ssl.create_default_context()
            cert, key = self.info.certificate_path, self.info.private_key_path
            if self.info.certificate_data:
                cert = _tmpfile(self.info.certificate_data)
                key = _tmpfile(self.info.private_key_data) if self.info.private_key_data else None
            ctx.load_cert_chain(cert, key)
        return ctx if ctx is not None else True

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"Accept": "application/json"}
            if self.info.token:
                headers["Authorization"] = f"{self.info.scheme or 'Bearer'} {self.info.token}"
            auth = aiohttp.BasicAuth(self.info.username, self.info.password or "") if self.info.username else None
            self._session = aiohttp.ClientSession(
                base_url=None, headers=headers, auth=auth,
                connector=aiohttp.TCPConnector(ssl=self._ssl()),
                timeout=aiohttp.ClientTimeout(total=30),
            )
        return self._session

    async def request(self, method: str, path: str, *, json: Any = None, content_type: str | None = None,
                      params: dict[str, str] | None = None) -> Any:
        headers = {"Content-Type": content_type} if content_type else None
        url = self.info.server.rstrip("/") + path
        async with self.session().request(method, url, json=json, headers=headers, params=params) as resp:
            body = await resp.json(content_type=None) if resp.content_length != 0 else None
            if resp.status >= 400:
                message = body.get("message", "") if isinstance(body, dict) else str(body)
                raise KubeError(resp.status, message)
            return body

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def _tmpfile(data: bytes | str) -> str:
    raw = base64.b64decode(data) if isinstance(data, str) else data
    f = tempfile.NamedTemporaryFile(delete=False, suffix=".pem")  # noqa: SIM115 - kept for ssl
    f.write(raw)
    f.close()
    return f.name


_client: Client | None = None


def configure(info: kopf.ConnectionInfo) -> None:
    """Use these credentials (the ones kopf logged in with) for the operator's own calls."""
    global _client
    _client = Client(info)


def client() -> Client:
    if _client is None:
        raise RuntimeError("kube.configure() was not called (the login handler does it)")
    return _client


async def shutdown() -> None:
    global _client
    if _client is not None:
        await _client.close()
    _client = None


def _path(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    prefix, plural = _RESOURCES[(api_version, kind)]
    path = f"{prefix}/namespaces/{namespace}/{plural}"
    return f"{path}/{name}" if name else path


async def get(api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return await client().request("GET", _path(api_version, kind, namespace, name))
    except KubeError as exc:
        if exc.status == 404:
            return None
        raise


async def apply(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    """Create or merge-patch ``obj``: safe to run any number of times."""
    api_version, kind, name = obj["apiVersion"], obj["kind"], obj["metadata"]["name"]
    body = {**obj, "metadata": {**obj["metadata"], "namespace": namespace}}
    existing = await get(api_version, kind, namespace, name)
    if existing is None:
        try:
            return await client().request("POST", _path(api_version, kind, namespace), json=body)
        except KubeError as exc:
            if exc.status != 409:  # created meanwhile (a replayed handler): patch it instead
                raise
    return await client().request("PATCH", _path(api_version, kind, namespace, name), json=body,
                                  content_type="application/merge-patch+json")


async def delete(api_version: str, kind: str, namespace: str, name: str) -> bool:
    """Delete if present; False when it was already gone."""
    try:
        await client().request("DELETE", _path(api_version, kind, namespace, name),
                               json={"propagationPolicy": "Background"})
        return True
    except KubeError as exc:
        if exc.status == 404:
            return False
        raise


async def list_pods(namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
    selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    body = await client().request("GET", _path("v1", "Pod", namespace), params={"labelSelector": selector})
    items = (body or {}).get("items", [])
    # Filter here too: some API fakes ignore labelSelector.
    return [p for p in items if all(p.get("metadata", {}).get("labels", {}).get(k) == v for k, v in labels.items())]


async def patch_annotations(api_version: str, kind: str, namespace: str, name: str,
                            annotations: dict[str, str | None]) -> None:
    await client().request("PATCH", _path(api_version, kind, namespace, name),
                           json={"metadata": {"annotations": annotations}},
                           content_type="application/merge-patch+json")


async def set_replicas(namespace: str, deployment: str, replicas: int) -> None:
    await client().request("PATCH", _path("apps/v1", "Deployment", namespace, deployment),
                           json={"spec": {"replicas": replicas}}, content_type="application/merge-patch+json")


async def delete_pod(namespace: str, name: str) -> None:
    await delete("v1", "Pod", namespace, name)
