"""Models -> CustomResourceDefinitions: ``crds/*.yaml`` and ``crds/examples/*.yaml``.

Owns: turning pydantic JSON Schema into a Kubernetes *structural* OpenAPI v3 schema (inline
``$ref``, ``anyOf [X, null]`` -> ``nullable``, no ``title``/``additionalProperties: false``),
and the CRD metadata that is not in the models (scope, subresources, printer columns).
Run ``kompaktor crds --out crds`` (or ``python -m kompaktor.resources.crdgen crds``).

Must not import: kopf, redis, kubernetes clients. Pure: same models, same bytes.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import yaml

from kompaktor.resources import api
from kompaktor.resources import models as m

#: JSON Schema keys Kubernetes' structural schema accepts; anything else is dropped.
_KEEP = {
    "type",
    "description",
    "properties",
    "required",
    "items",
    "enum",
    "default",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "uniqueItems",
    "format",
    "additionalProperties",
    "anyOf",
    "nullable",
    "minProperties",
    "maxProperties",
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-validations",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
}


def structural(schema: dict[str, Any], defs: dict[str, Any] | None = None, *, defaults: bool = True) -> dict[str, Any]:
    """A pydantic JSON Schema (validation mode) as a Kubernetes structural schema."""
    defs = {**(defs or {}), **schema.get("$defs", {})}

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(n) for n in node]
        if not isinstance(node, dict):
            return node
        node = dict(node)
        if "$ref" in node:
            ref = node.pop("$ref").rsplit("/", 1)[-1]
            node = {**copy.deepcopy(defs[ref]), **node}
        if "allOf" in node and len(node["allOf"]) == 1:  # pydantic wraps a $ref with siblings
            node = {**walk(node.pop("allOf")[0]), **node}
        nullable = False
        if "anyOf" in node:
            options = [o for o in node["anyOf"] if o.get("type") != "null"]
            nullable = len(options) != len(node["anyOf"])
            if len(options) == 1:
                del node["anyOf"]
                node = {**walk(options[0]), **node}
            else:
                node["anyOf"] = options
        if node.get("additionalProperties") is False or node.get("additionalProperties") is True:
            node.pop("additionalProperties")
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key not in _KEEP:
                continue
            if key == "default" and (value is None or not defaults):
                continue
            if key == "properties":
                out[key] = {name: walk(sub) for name, sub in value.items()}
            elif key in ("items", "additionalProperties", "anyOf"):
                out[key] = walk(value)
            else:
                out[key] = copy.deepcopy(value)
        if nullable:
            out["nullable"] = True
        if out.get("x-kubernetes-int-or-string"):
            out.pop("type", None)
        elif out.get("x-kubernetes-preserve-unknown-fields"):
            out.setdefault("type", "object")
        # Kubernetes accepts no empty "required", and "required" must list real properties.
        if out.get("required") == []:
            out.pop("required")
        return out

    result: dict[str, Any] = walk({k: v for k, v in schema.items() if k != "$defs"})
    return result


#: Printer columns per kind (what `kubectl get` shows).
_READY = '.status.conditions[?(@.type=="Ready")].status'
PRINTER_COLUMNS: dict[str, list[dict[str, Any]]] = {
    api.SERVICE_KIND: [
        {"name": "Queued", "type": "integer", "jsonPath": ".status.queued"},
        {"name": "Running", "type": "integer", "jsonPath": ".status.running"},
        {"name": "Ready", "type": "string", "jsonPath": _READY},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ],
    api.GROUP_KIND: [
        {"name": "Desired", "type": "integer", "jsonPath": ".status.desiredReplicas"},
        {"name": "Replicas", "type": "integer", "jsonPath": ".status.replicas"},
        {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
        {"name": "Queued", "type": "integer", "jsonPath": ".status.queued"},
        {"name": "Running", "type": "integer", "jsonPath": ".status.running"},
        {
            "name": "Oldest",
            "type": "number",
            "jsonPath": ".status.oldestQueuedAgeSeconds",
            "description": "age in seconds of the oldest queued job",
        },
        {"name": "Autoscaler", "type": "string", "jsonPath": ".spec.autoscaler", "priority": 1},
        {"name": "Status", "type": "string", "jsonPath": _READY},
        {"name": "Pods", "type": "string", "jsonPath": '.status.conditions[?(@.type=="PodsHealthy")].reason'},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ],
    api.COMPACTION_KIND: [
        {"name": "Table", "type": "string", "jsonPath": ".spec.table"},
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Done", "type": "integer", "jsonPath": ".status.tabletsDone"},
        {"name": "Total", "type": "integer", "jsonPath": ".status.tabletsTotal"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ],
}


def openapi_schema(resource: type[m.Resource]) -> dict[str, Any]:
    """The openAPIV3Schema of one kind: apiVersion, kind, metadata, spec (validated), status."""
    spec = structural(resource.SPEC.model_json_schema(by_alias=True, mode="validation"))
    status = structural(resource.STATUS.model_json_schema(by_alias=True, mode="validation"), defaults=False)
    spec.pop("description", None)
    status.pop("description", None)
    spec["description"] = (resource.SPEC.__doc__ or "").strip().splitlines()[0]
    status["description"] = f"observed state of the {resource.KIND}, written by the operator"
    schema: dict[str, Any] = {
        "type": "object",
        "description": _DESCRIPTIONS[resource.KIND],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }
    if "spec" in resource.model_fields and resource.model_fields["spec"].is_required():
        schema["required"] = ["spec"]
    return schema


_DESCRIPTIONS = {
    api.SERVICE_KIND: "A compaction service: planner settings, size tiers and the tables it serves.",
    api.GROUP_KIND: "A compactor resource group: a pool of compactor pods autoscaled on its queue depth.",
    api.COMPACTION_KIND: "A user compaction of a table or row range; deleting it cancels the compaction.",
}


def build_crd(resource: type[m.Resource]) -> dict[str, Any]:
    """The CustomResourceDefinition of one kind."""
    schema = openapi_schema(resource)
    subresources: dict[str, Any] = {"status": {}}
    if resource is m.CompactorGroup:
        subresources["scale"] = {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{resource.PLURAL}.{api.GROUP}",
            "labels": {"app.kubernetes.io/name": "kompaktor", "app.kubernetes.io/part-of": "kompaktor"},
        },
        "spec": {
            "group": api.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": resource.KIND,
                "listKind": f"{resource.KIND}List",
                "plural": resource.PLURAL,
                "singular": resource.KIND.lower(),
                "shortNames": list(resource.SHORT_NAMES),
                "categories": ["kompaktor"],
            },
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": subresources,
                    "additionalPrinterColumns": PRINTER_COLUMNS[resource.KIND],
                }
            ],
        },
    }


def example(resource: type[m.Resource]) -> dict[str, Any]:
    """A small valid object of each kind, for crds/examples (the models' defaults spelled out)."""
    obj: m.Resource
    if resource is m.CompactionService:
        obj = m.CompactionService(metadata=m.ObjectMeta(name="default"))
    elif resource is m.CompactorGroup:
        obj = m.CompactorGroup(metadata=m.ObjectMeta(name="default"))
    else:
        obj = m.Compaction(metadata=m.ObjectMeta(name="compact-ci"), spec=m.CompactionSpec(table="ci"))
    return obj.model_dump(by_alias=True, exclude_none=True, mode="json")


def dump(obj: Any) -> str:
    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False, width=100)


#: The first line of every generated file; ``write`` owns the files that start with
#: :data:`_OWNED` (also those an older version wrote, when the models lived in the operator).
_OWNED = "# Generated by `kompaktor crds` from "
_HEADER = _OWNED + "kompaktor/resources/models.py. Do not edit.\n"


def render(*, examples: bool = True) -> dict[str, str]:
    """Relative path -> file text, for every generated file."""
    files: dict[str, str] = {}
    for resource in m.RESOURCES:
        files[f"{resource.PLURAL}.{api.GROUP}.yaml"] = _HEADER + dump(build_crd(resource))
        if examples:
            files[f"examples/{resource.KIND.lower()}.yaml"] = _HEADER + dump(example(resource))
    return files


def _generated(out: Path) -> list[Path]:
    return [p for p in [*out.glob("*.yaml"), *out.glob("examples/*.yaml")] if p.read_text().startswith(_OWNED)]


def stale(out: Path, *, examples: bool | None = None) -> list[Path]:
    """Generated files under ``out`` that are missing, different, or no longer generated."""
    if examples is None:
        examples = out.name == "crds" and out.parent.name != "files"
    files = render(examples=examples)
    bad = [out / rel for rel, text in files.items() if not (out / rel).exists() or (out / rel).read_text() != text]
    bad += [p for p in _generated(out) if str(p.relative_to(out)) not in files]
    return bad


def write(out: Path, *, examples: bool = True) -> list[Path]:
    """Write every generated file under ``out``; remove stale generated YAML. Returns the paths."""
    files = render(examples=examples)
    for rel, text in files.items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
    for old in _generated(out):
        if str(old.relative_to(out)) not in files:
            old.unlink()
    return [out / rel for rel in files]


if __name__ == "__main__":  # pragma: no cover
    for p in write(Path(sys.argv[1] if len(sys.argv) > 1 else "crds")):
        print(p)
