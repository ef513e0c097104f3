"""CRDs generated from the models: up to date, structural, valid for Kubernetes, examples valid."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from kompaktor.resources import api, crdgen
from kompaktor.resources import models as m

ROOT = Path(__file__).resolve().parents[2]
K8S_VERSION = "1.30"


def test_crds_directory_matches_the_models() -> None:
    stale = crdgen.stale(ROOT / "crds", examples=True)
    assert not stale, f"crds/ drifted from the models, run `make crds`: {stale}"


def test_chart_crds_match_the_models() -> None:
    stale = crdgen.stale(ROOT / "helm" / "kompaktor" / "files" / "crds", examples=False)
    assert not stale, f"helm/kompaktor/files/crds drifted, run `make crds`: {stale}"


def test_generation_is_deterministic() -> None:
    assert crdgen.render() == crdgen.render()


@pytest.mark.parametrize("resource", m.RESOURCES, ids=lambda r: r.KIND)
def test_crd_is_valid_for_kubernetes(resource: type[m.Resource]) -> None:
    crd = yaml.safe_load((ROOT / "crds" / f"{resource.PLURAL}.kompaktor.io.yaml").read_text())
    kubernetes_validate.validate(crd, K8S_VERSION, strict=True)


def _walk(node, path="$"):
    yield path, node
    if isinstance(node, dict):
        for key, value in node.get("properties", {}).items():
            yield from _walk(value, f"{path}.{key}")
        if isinstance(node.get("items"), dict):
            yield from _walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            yield from _walk(node["additionalProperties"], f"{path}{{}}")


@pytest.mark.parametrize("resource", m.RESOURCES, ids=lambda r: r.KIND)
def test_schema_is_structural(resource: type[m.Resource]) -> None:
    """Every node has a type (or int-or-string / preserve-unknown), no refs, titles or closed maps."""
    schema = crdgen.build_crd(resource)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        assert "$ref" not in node and "title" not in node and "allOf" not in node, path
        assert node.get("additionalProperties") is not False, path
        if node.get("x-kubernetes-int-or-string"):
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
        else:
            assert "type" in node, f"{path} has no type"
            assert "anyOf" not in node, path
        if "default" in node:
            assert node["default"] is not None, path


def test_scale_subresource_and_columns_on_compactor_group() -> None:
    version = crdgen.build_crd(m.CompactorGroup)["spec"]["versions"][0]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert "status" in version["subresources"]
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Replicas"] == ".status.replicas"
    assert columns["Queued"] == ".status.queued" and columns["Running"] == ".status.running"
    names = crdgen.build_crd(m.CompactorGroup)["spec"]["names"]
    assert names["shortNames"] and "kompaktor" in names["categories"]


def test_schema_carries_validation() -> None:
    spec = crdgen.openapi_schema(m.CompactorGroup)["properties"]["spec"]
    assert spec["properties"]["autoscaler"]["enum"] == ["hpa", "keda", "none"]
    assert spec["properties"]["maxReplicas"]["minimum"] == 1
    assert spec["x-kubernetes-validations"]
    svc = crdgen.openapi_schema(m.CompactionService)["properties"]["spec"]
    tier = svc["properties"]["tiers"]["items"]
    assert tier["required"] == ["name", "compactorGroup"]
    assert tier["properties"]["maxSize"]["x-kubernetes-int-or-string"] is True
    comp = crdgen.openapi_schema(m.Compaction)
    assert comp["required"] == ["spec"] and comp["properties"]["spec"]["required"] == ["table"]


def _examples() -> list[Path]:
    return sorted((ROOT / "crds" / "examples").glob("*.yaml")) + sorted((ROOT / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", _examples(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_examples_validate_against_models_and_crd_schemas(path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    resources = m.load_documents(path.read_text())
    assert len(resources) == len(docs)
    by_kind = {r.KIND: r for r in m.RESOURCES}
    for doc in docs:
        schema = crdgen.openapi_schema(by_kind[doc["kind"]])
        jsonschema.validate(doc, _as_jsonschema(schema))


def _as_jsonschema(node):
    """OpenAPI v3 (nullable, int-or-string) -> plain JSON Schema, to validate examples offline."""
    if isinstance(node, list):
        return [_as_jsonschema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _as_jsonschema(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if node.get("nullable"):
        out.pop("nullable")
        out = {"anyOf": [out, {"type": "null"}]}
    return out


def test_invalid_examples_are_rejected_by_the_schema_too() -> None:
    schema = _as_jsonschema(crdgen.openapi_schema(m.CompactorGroup))
    bad = {
        "apiVersion": api.GROUP_VERSION,
        "kind": "CompactorGroup",
        "metadata": {"name": "x"},
        "spec": {"autoscaler": "cpu"},
    }
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
    bad["spec"] = {"maxReplicas": 0}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_the_charts_redis_users_are_the_code_s() -> None:
    """helm/kompaktor/files/redis-users.acl is generated from kompaktor.metadata.acl."""
    from kompaktor.metadata import acl

    path = ROOT / acl.CHART_FILE
    assert path.read_text() == acl.chart_file(), (
        f"{acl.CHART_FILE} drifted: run `python -m kompaktor.metadata.acl > {acl.CHART_FILE}`"
    )


def test_the_api_names_agree() -> None:
    """api.GROUP_VERSION is spelled out (a type checker sees its literal), and so are the models'
    apiVersion and kind Literals: they are the group and version, and the api's kinds."""
    assert f"{api.GROUP}/{api.VERSION}" == api.GROUP_VERSION
    field = m.Resource.model_fields["api_version"]
    assert field.default == api.GROUP_VERSION and field.annotation.__args__ == (api.GROUP_VERSION,)
    assert {r.PLURAL for r in m.RESOURCES} == {api.SERVICES, api.GROUPS, api.COMPACTIONS}
    assert {r.KIND for r in m.RESOURCES} == {api.SERVICE_KIND, api.GROUP_KIND, api.COMPACTION_KIND}
    for r in m.RESOURCES:  # each model's kind Literal is spelled out too: it is its api kind
        kind = r.model_fields["kind"]
        assert kind.default == r.KIND and kind.annotation.__args__ == (r.KIND,), r
