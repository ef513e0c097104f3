"""The Helm chart: lints, renders with several values files, and every manifest validates."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml

from kompaktor_operator import crdgen
from kompaktor_operator import models as m

pytestmark = pytest.mark.chart

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "kompaktor"
K8S = "1.30"
VALUES = sorted((CHART / "ci").glob("*.yaml"))
#: Kinds that are not core Kubernetes: checked by shape, not against the official schemas.
FOREIGN = {"ServiceMonitor"}


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    with helm.Chart.load(str(CHART)) as chart:
        out = chart.render(values, name="kompaktor", namespace="kompaktor-system", is_install=True)
    docs = []
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text()) or {}


def test_values_validate_against_the_schema() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    for path in [CHART / "values.yaml", *VALUES]:
        merged = {**load(CHART / "values.yaml")}
        with helm.Chart.load(str(CHART)) as chart:
            merged = chart.merge_values(load(path))
        jsonschema.validate(merged, schema)


def test_schema_rejects_mistakes() -> None:
    with helm.Chart.load(str(CHART)) as chart:
        for bad in ({"redis": {"bundled": False}}, {"operator": {"logLevel": "loud"}}, {"typo": 1},
                    {"redis": {"external": {"url": "http://x"}}}):
            with pytest.raises(helm.HelmError):
                chart.validate_schema(bad)


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.stem)
def test_lint(values: Path) -> None:
    report = helm.lint(str(CHART), load(values), strict=True, namespace="kompaktor-system")
    problems = [msg for msg in report["messages"] if msg["severity"] >= 2] + report["errors"]
    assert not problems, problems


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.stem)
def test_rendered_manifests_validate(values: Path) -> None:
    docs = render(load(values))
    assert docs
    for doc in docs:
        if doc["kind"] in FOREIGN:
            assert doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["spec"]["endpoints"]
            continue
        kubernetes_validate.validate(doc, K8S, strict=True)


def kinds(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for d in docs:
        out.setdefault(d["kind"], []).append(d)
    return out


def test_default_install_has_the_whole_system() -> None:
    by = kinds(render({}))
    crds = {c["metadata"]["name"]: c for c in by["CustomResourceDefinition"]}
    assert set(crds) == {f"{r.PLURAL}.kompaktor.io" for r in m.RESOURCES}
    for crd in crds.values():
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        plain = {k: v for k, v in crd.items() if k != "metadata"}
        assert plain == {k: v for k, v in crdgen.build_crd(next(
            r for r in m.RESOURCES if crd["metadata"]["name"].startswith(r.PLURAL + "."))).items() if k != "metadata"}
    (operator,) = [d for d in by["Deployment"] if d["metadata"]["name"] == "kompaktor-operator"]
    containers = {c["name"]: c for c in operator["spec"]["template"]["spec"]["containers"]}
    assert set(containers) == {"operator", "coordinator"}
    assert containers["operator"]["args"][0] == "operator" and containers["coordinator"]["args"][0] == "coordinator"
    env = {e["name"]: e for e in containers["operator"]["env"]}
    assert env["KOMPAKTOR_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {"name": "kompaktor-redis", "key": "url"}
    assert env["KOMPAKTOR_COMPACTOR_IMAGE"]["value"].endswith(":0.1.0")
    assert operator["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    (redis,) = by["StatefulSet"]
    args = redis["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--appendonly") + 1] == "yes" and "--requirepass" in args
    assert redis["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "8Gi"
    secrets = {s["metadata"]["name"]: s for s in by["Secret"]}
    url = secrets["kompaktor-redis"]["stringData"]["url"]
    assert re.fullmatch(r"redis://:[A-Za-z0-9]{32}@kompaktor-redis\.kompaktor-system\.svc:6379/0", url)
    assert {"ClusterRole", "ClusterRoleBinding", "ServiceAccount", "Service", "ConfigMap"} <= set(by)
    assert "ServiceMonitor" not in by


def test_rbac_is_least_privilege() -> None:
    by = kinds(render({}))
    role = next(r for r in by["ClusterRole"] if r["metadata"]["name"] == "kompaktor-operator")
    resources = {res for rule in role["rules"] for res in rule["resources"]}
    assert "secrets" not in resources and "*" not in resources
    assert all("*" not in rule["verbs"] for rule in role["rules"])
    namespaced = kinds(render(load(CHART / "ci" / "namespaced-keda-values.yaml")))
    assert {r["metadata"]["namespace"] for r in namespaced["Role"]} == {"tables", "analytics"}
    assert all(r["metadata"]["name"] != "kompaktor-operator" for r in namespaced["ClusterRole"])


def test_external_redis_and_storage() -> None:
    by = kinds(render(load(CHART / "ci" / "external-redis-values.yaml")))
    assert "StatefulSet" not in by
    (secret,) = [s for s in by["Secret"] if not s["metadata"]["name"].endswith("-metrics-api-tls")]
    assert secret["stringData"]["url"].startswith("rediss://")
    operator = by["Deployment"][0]["spec"]["template"]["spec"]
    coordinator = next(c for c in operator["containers"] if c["name"] == "coordinator")
    assert coordinator["envFrom"] == [{"secretRef": {"name": "s3-credentials"}}]
    with pytest.raises(helm.HelmError):
        render({"redis": {"bundled": False, "external": {"url": ""}}})


def test_service_monitor_and_existing_secret() -> None:
    by = kinds(render(load(CHART / "ci" / "namespaced-keda-values.yaml")))
    (sm,) = by["ServiceMonitor"]
    assert sm["metadata"]["labels"]["release"] == "prometheus"
    assert sorted(sm["spec"]["namespaceSelector"]["matchNames"]) == ["analytics", "kompaktor-system", "tables"]
    env = {e["name"]: e for e in by["Deployment"][0]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["KOMPAKTOR_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {"name": "managed-redis", "key": "uri"}
    assert [s["metadata"]["name"] for s in by.get("Secret", [])] == ["kompaktor-metrics-api-tls"]


def test_builtin_metrics_api_by_default_and_the_adapter_rule_only_for_hpa() -> None:
    by = kinds(render({}))
    (api,) = by["APIService"]
    assert api["metadata"]["name"] == "v1beta1.external.metrics.k8s.io"
    assert api["spec"]["service"] == {"name": "kompaktor-metrics-api", "namespace": "kompaktor-system", "port": 443}
    (tls,) = [s for s in by["Secret"] if s["metadata"]["name"] == "kompaktor-metrics-api-tls"]
    assert api["spec"]["caBundle"] == tls["data"]["ca.crt"]
    env = {e["name"]: e.get("value") for e in by["Deployment"][0]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["KOMPAKTOR_METRICS_API"] == "0.0.0.0:6443"
    assert "kompaktor-adapter-rules" not in {c["metadata"]["name"] for c in by["ConfigMap"]}
    for other in ("hpa", "keda"):
        assert "APIService" not in kinds(render({"autoscaler": other}))
    with helm.Chart.load(str(CHART)) as chart, pytest.raises(helm.HelmError):
        chart.validate_schema({"autoscaler": "prometheus"})  # not a value the chart knows


def test_adapter_rule_and_dashboard() -> None:
    by = kinds(render({"autoscaler": "hpa"}))
    cms = {c["metadata"]["name"]: c for c in by["ConfigMap"]}
    rules = yaml.safe_load(cms["kompaktor-adapter-rules"]["data"]["config.yaml"])
    (rule,) = rules["external"]
    assert "kompaktor_queue_depth" in rule["seriesQuery"] and rule["name"]["as"] == "kompaktor_queue_depth"
    dash = json.loads(cms["kompaktor-dashboard"]["data"]["kompaktor.json"])
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
    for metric in ("kompaktor_queue_depth", "kompaktor_running_compactions",
                   "kompaktor_oldest_queued_job_age_seconds", "kompaktor_compactions_completed_total"):
        assert metric in exprs
    assert cms["kompaktor-dashboard"]["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_crds_can_be_left_out() -> None:
    assert "CustomResourceDefinition" not in kinds(render({"crds": {"install": False}}))


def test_image_tags_follow_the_package_version() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = load(CHART / "Chart.yaml")
    values = load(CHART / "values.yaml")
    assert chart["appVersion"] == version
    for image in (values["operator"]["image"], values["compactor"]["image"]):
        assert (image["tag"] or chart["appVersion"]) == version
    env = {e["name"]: e.get("value") for e in next(
        d for d in render({}) if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["KOMPAKTOR_COMPACTOR_IMAGE"].endswith(f":{version}")


def test_examples_render_as_valid_custom_resources() -> None:
    docs = [d for p in sorted((ROOT / "examples").glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]
    assert [d["kind"] for d in docs] == ["CompactionService", "CompactorGroup", "CompactorGroup", "Compaction"]
    resources = m.load_documents("\n---\n".join(yaml.safe_dump(d) for d in docs))
    svc = resources[0]
    assert {t.compactor_group for t in svc.spec.tiers} == {r.name for r in resources if r.KIND == "CompactorGroup"}
