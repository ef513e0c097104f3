"""Every query the chart and the operator ship — the Grafana dashboard, the prometheus-adapter
rule, KEDA's trigger — names a metric the code exports: a renamed gauge or a typo in a panel
would otherwise show an empty graph or an HPA that never scales."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from prometheus_client import Metric

from kompaktor.coordinator.metrics import QueueMetrics
from kompaktor.worker.metrics import CompactorMetrics
from kompaktor_operator.manifests import queue_depth_query
from kompaktor_operator.metrics import OperatorMetrics
from tests.chart.test_chart import kinds, render

pytestmark = pytest.mark.chart

NAME = re.compile(r"\bkompaktor_[a-z0-9_]+\b")
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": ("",),
    "summary": ("_sum", "_count", "_created"),
}


def exported() -> set[str]:
    """The series names Prometheus sees from the coordinator's, the compactor's and the operator's /metrics."""
    names: set[str] = set()
    for registry in (
        QueueMetrics.create().registry,
        CompactorMetrics.create().registry,
        OperatorMetrics.create().registry,
    ):
        fam: Metric
        for fam in registry.collect():
            names |= {fam.name + s for s in SUFFIXES[fam.type]}
    return names


def referenced() -> dict[str, set[str]]:
    by = kinds(render({"autoscaler": "hpa"}))
    cms = {c["metadata"]["name"]: c for c in by["ConfigMap"]}
    dash = json.loads(cms["kompaktor-dashboard"]["data"]["kompaktor.json"])
    rules = yaml.safe_load(cms["kompaktor-adapter-rules"]["data"]["config.yaml"])
    out = {
        "dashboard": {n for p in dash["panels"] for t in p.get("targets", []) for n in NAME.findall(t["expr"])},
        "prometheus-adapter rule": {
            n for r in rules["external"] for n in NAME.findall(f"{r['seriesQuery']} {r['name']['as']}")
        },
        "KEDA trigger": set(NAME.findall(queue_depth_query("g"))),
    }
    return out


def test_every_shipped_query_names_an_exported_metric() -> None:
    have = exported()
    assert {
        "kompaktor_queue_depth",
        "kompaktor_compactions_completed_total",
        "kompaktor_operator_reconciles_total",
        "kompaktor_operator_group_replicas",
    } <= have
    refs = referenced()
    assert {"kompaktor_operator_reconciles_total", "kompaktor_operator_group_replicas"} <= refs["dashboard"]
    for where, names in refs.items():
        assert names, f"{where}: no kompaktor_ metric found (the test would pass vacuously)"
        assert names <= have, f"{where} names metrics nobody exports: {sorted(names - have)}"


def test_the_check_sees_a_misspelt_metric() -> None:
    assert "kompaktor_compactions_completed" not in exported()  # a counter is scraped as ..._total


#: metrics a dashboard panel may name that another exporter serves (kube-state-metrics)
FOREIGN = {"kube_deployment_spec_replicas"}


def dashboard() -> dict:
    cms = {c["metadata"]["name"]: c for c in kinds(render({}))["ConfigMap"]}
    return json.loads(cms["kompaktor-dashboard"]["data"]["kompaktor.json"])


def test_every_panel_query_and_variable_names_a_metric_that_exists() -> None:
    """Issue 36 §3: not only the union — each query of each panel (and each templating variable)
    names at least one metric that exists, and only kompaktor_ metrics that are exported; a panel
    whose one query lost its metric to a typo (``kompaktr_queue_depth``) would otherwise pass."""
    have = exported()
    dash = dashboard()
    queries = [(p["title"], t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]
    queries += [(f"variable {v['name']}", v["query"]) for v in dash["templating"]["list"] if v["type"] == "query"]
    assert len(queries) > 10
    for where, expr in queries:
        ours = set(NAME.findall(expr))
        assert ours <= have, f"{where}: {expr} names metrics nobody exports: {sorted(ours - have)}"
        foreign = {n for n in FOREIGN if re.search(rf"\b{n}\b", expr)}
        assert ours or foreign, f"{where}: {expr} names no metric that exists"


def test_every_panel_query_is_valid_promql(tmp_path) -> None:
    """Each panel's query, its dashboard variables filled in, passes ``promtool check rules`` (as a
    recording rule): a query Prometheus cannot parse would show an error instead of a graph."""
    from tests.promcheck import promtool

    exprs = [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]
    filled = [e.replace("$__rate_interval", "5m").replace("$group", ".*") for e in exprs]
    assert not [e for e in filled if "$" in e], "a dashboard variable the test does not fill"
    rules = {
        "groups": [{"name": "dashboard", "rules": [{"record": f"panel:q{i}", "expr": e} for i, e in enumerate(filled)]}]
    }
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    import subprocess

    res = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(filled)} rules found" in res.stdout, res.stdout
