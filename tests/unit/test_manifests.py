"""Pure manifest builders: deterministic, valid for Kubernetes, and carrying the design's choices."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest
from pydantic import SecretStr

from kompaktor.model import grouptoken
from kompaktor.resources.models import CompactorGroupSpec, to_group_config
from kompaktor.resources.operator_config import OperatorConfig
from kompaktor_operator import manifests, naming

K8S = "1.30"
CONFIG = OperatorConfig(compactor_image="example.org/kompaktor-compactor:0.1.0", prometheus_url="http://prom:9090")

FULL = CompactorGroupSpec.model_validate(
    {
        "image": "example.org/compactor:1",
        "minReplicas": 2,
        "maxReplicas": 40,
        "jobsPerReplica": 3,
        "spark": {
            "master": "k8s://https://kubernetes.default.svc",
            "conf": {"spark.executor.instances": "4", "spark.a": "b"},
            "driverMemory": "4g",
        },
        "resources": {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"memory": "8Gi"}},
        "drainGraceSeconds": 600,
        "redis": {"secretName": "my-redis", "key": "uri"},
        "storage": {"uri": "s3://bucket/kompaktor", "credentialsSecret": "s3-creds"},
        "nodeSelector": {"pool": "compaction"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "compaction", "effect": "NoSchedule"}],
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 50,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": {"kompaktor.io/group": "large"}},
                        },
                    }
                ]
            }
        },
        "podAnnotations": {"team": "storage"},
        "serviceAccountName": "compactor",
    }
)
SPECS = {
    "default": CompactorGroupSpec(),
    "full": FULL,
    "keda": CompactorGroupSpec.model_validate({"autoscaler": "keda", "minReplicas": 0, "maxReplicas": 8}),
    "none": CompactorGroupSpec.model_validate({"autoscaler": "none", "minReplicas": 3, "maxReplicas": 3}),
}


@pytest.mark.parametrize("name", SPECS)
def test_builders_are_deterministic_and_do_not_alias_input(name: str) -> None:
    spec = SPECS[name]
    before = spec.model_dump()
    a = manifests.build_children("small", spec, CONFIG)
    b = manifests.build_children("small", spec, CONFIG)
    assert a == b
    a[0]["spec"]["template"]["spec"]["tolerations"] = "mutated"
    assert spec.model_dump() == before


@pytest.mark.parametrize("name", SPECS)
def test_every_built_object_validates_against_kubernetes(name: str) -> None:
    for obj in manifests.build_children("large", SPECS[name], CONFIG):
        if obj["apiVersion"].startswith("keda.sh"):
            continue  # not a core kind: checked by shape below
        full = copy.deepcopy(obj)
        full["metadata"]["namespace"] = "default"
        kubernetes_validate.validate(full, K8S, strict=True)


def test_deployment_shape() -> None:
    dep = manifests.build_compactor_deployment("large", FULL, CONFIG)
    spec = dep["spec"]
    assert "replicas" not in spec, "only the operator's scaler sets replicas"
    assert spec["selector"]["matchLabels"] == naming.selector_labels("large")
    assert dep["metadata"]["name"] == "kompaktor-large"
    pod = spec["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 600 + manifests.EXIT_MARGIN_SECONDS
    assert pod["securityContext"]["runAsNonRoot"] is True
    (c,) = pod["containers"]
    assert c["image"] == "example.org/compactor:1"
    assert c["command"] == ["kompaktor"]
    # the group's settings are not arguments: the compactor reads them from Redis (one channel)
    assert c["args"] == [
        "compactor",
        "--group",
        "large",
        "--http-port",
        str(naming.HTTP_PORT),
        "--stay-drained",
        "--broker",
    ]
    env = {e["name"]: e for e in c["env"]}
    assert env["KOMPAKTOR_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {"name": "my-redis", "key": "uri"}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    # the compactor checks what it reads from Redis against the digest its pod was made for
    digest_ref = env[manifests.SETTINGS_DIGEST_ENV]["valueFrom"]["fieldRef"]["fieldPath"]
    assert digest_ref == f"metadata.annotations['{naming.SETTINGS_ANNOTATION}']"
    assert env["KOMPAKTOR_STORAGE"]["value"] == "s3://bucket/kompaktor"
    assert c["envFrom"] == [{"secretRef": {"name": "s3-creds"}}]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["lifecycle"]["preStop"]["exec"]["command"] == ["kompaktor", "drain", "--port", str(naming.HTTP_PORT)]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert {m["mountPath"] for m in c["volumeMounts"]} == {"/scratch", "/tmp"}
    assert c["resources"] == {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"memory": "8Gi"}}
    tmpl_meta = spec["template"]["metadata"]
    assert tmpl_meta["annotations"]["team"] == "storage"
    assert tmpl_meta["annotations"][naming.SETTINGS_ANNOTATION] == to_group_config("large", FULL).settings_digest()
    assert not any(k.startswith("kopf.zalando.org") for k in tmpl_meta["annotations"])


def test_defaults_come_from_the_operator_config() -> None:
    dep = manifests.build_compactor_deployment("small", CompactorGroupSpec(), CONFIG)
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["image"] == CONFIG.compactor_image
    env = {e["name"]: e for e in c["env"]}
    assert env["KOMPAKTOR_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {"name": "kompaktor-redis", "key": "url"}
    assert "KOMPAKTOR_STORAGE" not in env and "envFrom" not in c and "resources" not in c


def test_hpa_targets_the_group_on_queue_depth() -> None:
    hpa = manifests.build_hpa("large", FULL)
    spec = hpa["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "kompaktor.io/v1alpha1", "kind": "CompactorGroup", "name": "large"}
    (metric,) = spec["metrics"]
    assert metric["type"] == "External"
    assert metric["external"]["metric"] == {
        "name": "kompaktor_queue_depth",
        "selector": {"matchLabels": {"group": "large"}},
    }
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "3"}
    assert (spec["minReplicas"], spec["maxReplicas"]) == (2, 40)
    up, down = spec["behavior"]["scaleUp"], spec["behavior"]["scaleDown"]
    assert up["stabilizationWindowSeconds"] == 0 and up["selectPolicy"] == "Max"
    assert down["stabilizationWindowSeconds"] == 300


def test_keda_scaled_object() -> None:
    so = manifests.build_autoscaler("small", SPECS["keda"], CONFIG)
    assert so is not None and so["kind"] == "ScaledObject"
    assert so["spec"]["minReplicaCount"] == 0 and so["spec"]["maxReplicaCount"] == 8
    (trig,) = so["spec"]["triggers"]
    assert trig["type"] == "prometheus" and trig["metadata"]["serverAddress"] == "http://prom:9090"
    assert trig["metadata"]["query"] == 'sum(kompaktor_queue_depth{group="small"})'
    assert so["spec"]["scaleTargetRef"]["kind"] == "CompactorGroup"


def test_autoscaler_none_builds_no_autoscaler() -> None:
    kinds = [o["kind"] for o in manifests.build_children("g", SPECS["none"], CONFIG)]
    assert kinds == ["Deployment", "Service"]
    kinds = [o["kind"] for o in manifests.build_children("g", CompactorGroupSpec(), CONFIG)]
    assert kinds == ["Deployment", "Service", "HorizontalPodAutoscaler"]


def test_metrics_service_selects_the_group() -> None:
    svc = manifests.build_metrics_service("small")
    assert svc["spec"]["selector"] == naming.selector_labels("small")
    assert svc["spec"]["ports"][0]["name"] == "http-metrics"


def test_names_fit_in_63_characters() -> None:
    group = "g" * 40
    for name in (naming.deployment_name(group), naming.metrics_service_name(group), naming.hpa_name(group)):
        assert len(name) <= 63
    assert naming.selector("a") == (
        "app.kubernetes.io/component=compactor,app.kubernetes.io/name=kompaktor,kompaktor.io/group=a"
    )


@pytest.mark.parametrize(
    "change",
    [
        {"spark": {"engine": "arrow"}},
        {"spark": {"master": "local[2]"}},
        {"spark": {"conf": {"spark.sql.shuffle.partitions": "4"}}},
        {"spark": {"executorMemory": "2g"}},
        {"spark": {"driverMemory": "2g"}},
        {"drainGraceSeconds": 61},
    ],
)
def test_a_changed_compactor_setting_rolls_the_pods(change: dict) -> None:
    """Issue 26 §1: the settings travel only through Redis, read at a compactor's start; a change
    of any of them changes the pod template (its digest annotation), so the Deployment replaces
    the pods, which read the new settings. The scaler's settings do not restart anything."""

    def template(spec: dict) -> dict:
        dep = manifests.build_compactor_deployment("g", CompactorGroupSpec.model_validate(spec), CONFIG)
        return dep["spec"]["template"]

    before = template({})
    after = template(change)
    key = naming.SETTINGS_ANNOTATION
    assert after["metadata"]["annotations"][key] != before["metadata"]["annotations"][key]
    assert after["spec"]["containers"][0]["args"] == before["spec"]["containers"][0]["args"]
    scaler_only = template({"minReplicas": 0, "maxReplicas": 7, "jobsPerReplica": 3, "autoscaler": "keda"})
    assert scaler_only == before


def test_each_groups_pods_carry_their_groups_token_and_only_with_a_key() -> None:
    """Issue 34 §1: the broker acts for a compactor of the group its token names; the token is
    the group's HMAC under the operator's key, different per group, and never the key itself."""

    def env(group: str, config: OperatorConfig) -> dict[str, object]:
        (c,) = manifests.build_compactor_deployment(group, FULL, config)["spec"]["template"]["spec"]["containers"]
        return {e["name"]: e.get("value") for e in c["env"]}

    assert grouptoken.TOKEN_ENV not in env("large", CONFIG)
    keyed = CONFIG.model_copy(update={"group_key": SecretStr("k" * 48)})
    large, small = env("large", keyed)[grouptoken.TOKEN_ENV], env("small", keyed)[grouptoken.TOKEN_ENV]
    assert large == grouptoken.group_token("k" * 48, "large") != small
    assert grouptoken.holds("k" * 48, "large", large) and not grouptoken.holds("k" * 48, "small", large)
    assert "k" * 48 not in repr(keyed) and "k" * 48 not in str(env("large", keyed))
    assert OperatorConfig.from_env({grouptoken.KEY_ENV: "k" * 48}).group_key == SecretStr("k" * 48)
