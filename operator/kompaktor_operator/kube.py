"""The only module that talks to the Kubernetes API (besides kopf itself).

Owns: a `kubernetes_asyncio` client built from the same ``kopf.ConnectionInfo`` kopf logs in with,
and the few verbs the operator needs — server-side apply (never "create if absent"), get, delete,
list pods of a selector, patch pod annotations, set a Deployment's replicas — plus API discovery
(which optional APIs the server offers: ``autoscaling/v2`` or ``v2beta2``, KEDA). Errors come back
as :class:`KubeError` with the status and the message as Kubernetes returns it (a JSON Status, or
plain text such as "404 page not found" for an API path the server does not know).

One :class:`Client` per operator process: the login handler makes it from kopf's credentials and
the :class:`~kompaktor_operator.runtime.Runtime` holds it (no module-level client).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from typing import Any, cast

import kopf
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from kompaktor.resources import api
from kompaktor_operator import naming
from kompaktor_operator.objects import Child, DeploymentState, FieldsV1, HPAState, KubeObject, Pod

#: kind -> (API path prefix, plural). Only what the operator owns or reads.
_RESOURCES: dict[tuple[str, str], tuple[str, str]] = {
    ("apps/v1", "Deployment"): ("/apis/apps/v1", "deployments"),
    ("v1", "Service"): ("/api/v1", "services"),
    ("v1", "Pod"): ("/api/v1", "pods"),
    ("autoscaling/v2", "HorizontalPodAutoscaler"): ("/apis/autoscaling/v2", "horizontalpodautoscalers"),
    ("autoscaling/v2beta2", "HorizontalPodAutoscaler"): ("/apis/autoscaling/v2beta2", "horizontalpodautoscalers"),
    (naming.KEDA_API_VERSION, "ScaledObject"): (f"/apis/{naming.KEDA_API_VERSION}", "scaledobjects"),
    ("networking.k8s.io/v1", "NetworkPolicy"): ("/apis/networking.k8s.io/v1", "networkpolicies"),
    (api.GROUP_VERSION, api.GROUP_KIND): (f"/apis/{api.GROUP_VERSION}", api.GROUPS),
}


class KubeError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


def _error(exc: ApiException) -> KubeError:
    """The Status message of an API error, or its plain-text body (never a parse failure)."""
    body = exc.body.decode(errors="replace") if isinstance(exc.body, bytes) else (exc.body or "")
    try:
        doc = json.loads(body)
        message = doc.get("message", body) if isinstance(doc, dict) else body
    except ValueError:
        message = body.strip() or (exc.reason or "")
    return KubeError(int(exc.status or 0), message)


def _pem(
    path: str | bytes | os.PathLike[str] | os.PathLike[bytes] | None, data: bytes | str | None, made: list[str]
) -> str | None:
    """A PEM file's path: ``path`` as given, else ``data`` in a new temporary file (:func:`_tmpfile`);
    None without either."""
    if path:
        return os.fsdecode(path)
    return _tmpfile(data, made) if data else None


def _tmpfile(data: bytes | str, made: list[str]) -> str:
    """``data`` (base64 text or bytes) in a new temporary file, its path added to ``made``."""
    raw = base64.b64decode(data) if isinstance(data, str) else data
    f = tempfile.NamedTemporaryFile(delete=False, suffix=".pem")  # noqa: SIM115 - kept for ssl
    f.write(raw)
    f.close()
    made.append(f.name)
    return f.name


def _path(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    prefix, plural = _RESOURCES[(api_version, kind)]
    path = f"{prefix}/namespaces/{namespace}/{plural}"
    return f"{path}/{name}" if name else path


#: the field manager of everything the operator renders (server-side apply)
FIELD_MANAGER = "kompaktor-operator"
#: the field manager of the scaler's writes (a Deployment's replicas, pods' drain annotations),
#: which the rendered objects leave out so that an apply never resets them
SCALER_MANAGER = "kompaktor-scaler"
#: the manager name an operator before server-side apply wrote under (the client's user agent)
LEGACY_MANAGER = "OpenAPI-Generator"
#: fields the legacy manager wrote for the scaler, not for the rendering: never adopted by apply
_SCALER_FIELDS = ("f:replicas",)


def _without_scaler_fields(fields: FieldsV1) -> FieldsV1:
    spec = fields.get("f:spec")
    if not isinstance(spec, dict):
        return fields
    return {**fields, "f:spec": {k: v for k, v in spec.items() if k not in _SCALER_FIELDS}}


@dataclass
class Client:
    """The operator's connection to the API server and the verbs it uses."""

    info: kopf.ConnectionInfo
    _api: k8s.ApiClient | None = None
    _groups: dict[str, list[str]] | None = field(default=None, repr=False)
    _deletion_cost: bool | None = field(default=None, repr=False)
    #: temporary files holding credentials given as data (the SSL library reads paths), removed by close
    _tmpfiles: list[str] = field(default_factory=list, repr=False)

    def api(self) -> k8s.ApiClient:
        if self._api is None:
            info = self.info
            conf = k8s.Configuration(host=info.server.rstrip("/"))
            conf.verify_ssl = not info.insecure
            conf.ssl_ca_cert = _pem(info.ca_path, info.ca_data, self._tmpfiles)
            if info.certificate_path or info.certificate_data:
                conf.cert_file = _pem(info.certificate_path, info.certificate_data, self._tmpfiles)
                conf.key_file = _pem(info.private_key_path, info.private_key_data, self._tmpfiles)
            if info.username:
                conf.username, conf.password = info.username, info.password or ""
            header = (f"{info.scheme or 'Bearer'} {info.token}", "Authorization") if info.token else (None, None)
            self._api = k8s.ApiClient(conf, header_name=header[1], header_value=header[0])
        return self._api

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        content_type: str | None = None,
        params: dict[str, str] | None = None,
    ) -> Any:
        """``json`` is serialized by the client (JSON content types and apply patches: JSON is YAML)."""
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        try:
            return await self.api().call_api(
                path,
                method,
                query_params=list((params or {}).items()),
                header_params=headers,
                body=json,
                response_types_map={200: "object", 201: "object", 202: "object"},
                _return_http_data_only=True,
            )
        except ApiException as exc:
            raise _error(exc) from None

    async def honours_deletion_cost(self) -> bool:
        """Whether the server's ReplicaSet controller removes pods by pod-deletion-cost: on by
        default from Kubernetes 1.22 (alpha and off in 1.21, absent before; read once from
        /version). When the version cannot be read, as if it did (the scaler's default)."""
        if self._deletion_cost is None:
            try:
                v = await self.request("GET", "/version")
                minor = re.match(r"\d+", str(v["minor"]))
                if minor is None:
                    return True
                self._deletion_cost = (int(v["major"]), int(minor[0])) >= (1, 22)
            except (KubeError, KeyError, TypeError, ValueError):
                return True
        return self._deletion_cost

    async def api_versions(self, group: str) -> list[str]:
        """The versions of an API group the server serves (discovery, cached), [] when absent."""
        if self._groups is None:
            body = await self.request("GET", "/apis")
            self._groups = {
                g["name"]: [v["version"] for v in g.get("versions", [])] for g in (body or {}).get("groups", [])
            }
        return list(self._groups.get(group, []))

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> KubeObject | None:
        """The object as the server returns it (its head typed), None when there is none."""
        try:
            found: KubeObject = await self.request("GET", _path(api_version, kind, namespace, name))
            return found
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    async def get_deployment(self, namespace: str, name: str) -> DeploymentState | None:
        return cast("DeploymentState | None", await self.get("apps/v1", "Deployment", namespace, name))

    async def get_hpa(self, api_version: str, namespace: str, name: str) -> HPAState | None:
        return cast("HPAState | None", await self.get(api_version, "HorizontalPodAutoscaler", namespace, name))

    async def _adopt_legacy_fields(self, existing: KubeObject, api_version: str, kind: str, namespace: str) -> None:
        """An object an older operator created or merge-patched is owned by an "Update" manager, so
        applying the new rendering would leave every field it no longer renders in place forever.
        Hand those fields to the apply manager once (as client-go's csaupgrade does), keeping out the
        replicas the scaler set; the apply that follows then removes what is no longer rendered."""
        managed = existing.get("metadata", {}).get("managedFields") or []
        if not any(m.get("manager") == LEGACY_MANAGER and m.get("operation") == "Update" for m in managed):
            return
        if any(m.get("manager") == FIELD_MANAGER and m.get("operation") == "Apply" for m in managed):
            return
        adopted = []
        for m in managed:
            if m.get("manager") == LEGACY_MANAGER and m.get("operation") == "Update" and not m.get("subresource"):
                m = {
                    **m,
                    "manager": FIELD_MANAGER,
                    "operation": "Apply",
                    "fieldsV1": _without_scaler_fields(m.get("fieldsV1") or {}),
                }
            adopted.append(m)
        name = existing["metadata"]["name"]
        await self.request(
            "PATCH",
            _path(api_version, kind, namespace, name),
            json={"metadata": {"managedFields": adopted, "resourceVersion": existing["metadata"]["resourceVersion"]}},
            content_type="application/merge-patch+json",
        )

    async def apply(self, obj: Child, namespace: str) -> KubeObject:
        """Server-side apply of ``obj`` (field manager :data:`FIELD_MANAGER`, forced): creates it or
        makes it exactly the rendering — a field dropped from the rendering (an affinity, a
        toleration, an env var, a label) disappears from the object, while fields other managers own
        (the scaler's replicas, controllers' annotations) stay. Safe to run any number of times."""
        api_version, kind, name = obj["apiVersion"], obj["kind"], obj["metadata"]["name"]
        body = {**obj, "metadata": {**obj["metadata"], "namespace": namespace}}
        for attempt in range(5):
            existing = await self.get(api_version, kind, namespace, name)
            if existing is None:
                break
            try:
                await self._adopt_legacy_fields(existing, api_version, kind, namespace)
                break
            except KubeError as exc:  # a controller wrote the status meanwhile: read it again
                if exc.status != 409 or attempt == 4:
                    raise
        applied: KubeObject = await self.request(
            "PATCH",
            _path(api_version, kind, namespace, name),
            json=body,
            content_type="application/apply-patch+yaml",
            params={"fieldManager": FIELD_MANAGER, "force": "true"},
        )
        return applied

    async def claim_replicas(self, namespace: str, deployment: str, replicas: int) -> None:
        """Make :data:`SCALER_MANAGER` the owner of a Deployment's ``spec.replicas`` (a forced apply of
        just that field), so that the operator's applies, which render no replicas, leave them."""
        body = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": deployment, "namespace": namespace},
            "spec": {"replicas": replicas},
        }
        await self.request(
            "PATCH",
            _path("apps/v1", "Deployment", namespace, deployment),
            json=body,
            content_type="application/apply-patch+yaml",
            params={"fieldManager": SCALER_MANAGER, "force": "true"},
        )

    async def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        """Delete if present; False when it was already gone."""
        try:
            await self.request(
                "DELETE", _path(api_version, kind, namespace, name), json={"propagationPolicy": "Background"}
            )
            return True
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise

    async def list_pods(self, namespace: str, labels: dict[str, str]) -> list[Pod]:
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        body = await self.request("GET", _path("v1", "Pod", namespace), params={"labelSelector": selector})
        items = (body or {}).get("items", [])
        # Filter here too: some API fakes ignore labelSelector.
        return [p for p in items if all(p.get("metadata", {}).get("labels", {}).get(k) == v for k, v in labels.items())]

    async def patch_annotations(
        self, api_version: str, kind: str, namespace: str, name: str, annotations: dict[str, str | None]
    ) -> None:
        await self.request(
            "PATCH",
            _path(api_version, kind, namespace, name),
            json={"metadata": {"annotations": annotations}},
            content_type="application/merge-patch+json",
            params={"fieldManager": SCALER_MANAGER},
        )

    async def set_replicas(self, namespace: str, deployment: str, replicas: int) -> None:
        await self.request(
            "PATCH",
            _path("apps/v1", "Deployment", namespace, deployment),
            json={"spec": {"replicas": replicas}},
            content_type="application/merge-patch+json",
            params={"fieldManager": SCALER_MANAGER},
        )

    async def set_group_replicas(self, namespace: str, name: str, replicas: int) -> None:
        """A CompactorGroup's spec.replicas (what its scale subresource shows the HPA)."""
        await self.request(
            "PATCH",
            _path(api.GROUP_VERSION, api.GROUP_KIND, namespace, name),
            json={"spec": {"replicas": replicas}},
            content_type="application/merge-patch+json",
            params={"fieldManager": SCALER_MANAGER},
        )

    async def delete_pod(self, namespace: str, name: str) -> None:
        await self.delete("v1", "Pod", namespace, name)

    async def hpa_api_version(self) -> str | None:
        """``autoscaling/v2`` where the server offers it, else ``autoscaling/v2beta2``, else None."""
        versions = await self.api_versions("autoscaling")
        for v in ("v2", "v2beta2"):
            if v in versions:
                return f"autoscaling/{v}"
        return None

    async def close(self) -> None:
        if self._api is not None:
            await self._api.close()
            self._api = None
        while self._tmpfiles:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._tmpfiles.pop())
