"""Issue 16 §2: what a CompactorGroup may use is the operator's decision (pure rules)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kompaktor.resources import admission, patterns
from kompaktor.resources.models import CompactorGroupSpec
from kompaktor.resources.operator_config import OperatorConfig
from kompaktor_operator import manifests

DEFAULT_IMAGE = "ghcr.io/kompaktor/kompaktor-compactor:0.3.0"
CONFIG = OperatorConfig(
    compactor_image=DEFAULT_IMAGE,
    redis_secret="kompaktor-redis",
    storage_secret="s3-credentials",
    drain_token_secret="kompaktor-drain-token",
    compactor_service_account="kompaktor-compactor",
)


def check(config: OperatorConfig = CONFIG, **spec: Any) -> admission.Refusal | None:
    return admission.check_group(CompactorGroupSpec.model_validate(spec), config)


def test_the_defaults_are_allowed() -> None:
    assert check() is None
    assert (
        check(
            image=DEFAULT_IMAGE,
            serviceAccountName="kompaktor-compactor",
            redis={"secretName": "kompaktor-redis"},
            storage={"credentialsSecret": "s3-credentials"},
        )
        is None
    )


@pytest.mark.parametrize(
    "spec, rule, named",
    [
        ({"image": "evil.example/miner:latest"}, admission.IMAGE_NOT_ALLOWED, "evil.example/miner:latest"),
        # a tag of the default repository is another image
        ({"image": "ghcr.io/kompaktor/kompaktor-compactor:0.3.0-evil"}, admission.IMAGE_NOT_ALLOWED, "0.3.0-evil"),
        ({"serviceAccountName": "default"}, admission.SERVICE_ACCOUNT_NOT_ALLOWED, "'default'"),
        ({"serviceAccountName": "kompaktor-operator"}, admission.SERVICE_ACCOUNT_NOT_ALLOWED, "kompaktor-operator"),
        ({"redis": {"secretName": "payroll-db"}}, admission.SECRET_NOT_ALLOWED, "spec.redis.secretName 'payroll-db'"),
        (
            {"storage": {"credentialsSecret": "cloud-admin"}},
            admission.SECRET_NOT_ALLOWED,
            "spec.storage.credentialsSecret 'cloud-admin'",
        ),
    ],
)
def test_anything_else_is_refused_naming_the_rule(spec: dict[str, Any], rule: str, named: str) -> None:
    refusal = check(**spec)
    assert refusal is not None and refusal.rule == rule
    assert named in refusal.message
    assert "chart value compactor.allowed" in refusal.message


def test_allow_lists_widen_exactly_what_they_name() -> None:
    cfg = CONFIG.model_copy(
        update={
            "allowed_images": ("registry.corp/kompaktor/*", "other/img:1"),
            "allowed_service_accounts": ("compactor-irsa",),
            "allowed_secrets": ("team-redis",),
        }
    )
    assert check(cfg, image="registry.corp/kompaktor/compactor:2") is None
    assert check(cfg, image="other/img:1") is None
    assert check(cfg, image="other/img:2").rule == admission.IMAGE_NOT_ALLOWED
    assert check(cfg, image="registry.corp/kompaktorx:1").rule == admission.IMAGE_NOT_ALLOWED
    assert check(cfg, serviceAccountName="compactor-irsa") is None
    assert check(cfg, redis={"secretName": "team-redis"}) is None
    assert check(cfg, redis={"secretName": "other"}).rule == admission.SECRET_NOT_ALLOWED


def test_config_reads_the_allow_lists_from_the_environment() -> None:
    cfg = OperatorConfig.from_env(
        {
            "KOMPAKTOR_ALLOWED_IMAGES": "a/b:1, c/*",
            "KOMPAKTOR_ALLOWED_SECRETS": "",
            "KOMPAKTOR_COMPACTOR_SERVICE_ACCOUNT": "rel-compactor",
            "KOMPAKTOR_DRAIN_TOKEN_SECRET": "rel-drain-token",
        }
    )
    assert cfg.allowed_images == ("a/b:1", "c/*")
    assert cfg.allowed_secrets == () and cfg.allowed_service_accounts == ()
    assert cfg.compactor_service_account == "rel-compactor" and cfg.drain_token_secret == "rel-drain-token"


def test_compactor_pods_use_their_own_account_without_a_token_and_get_the_drain_token() -> None:
    pod = manifests.build_pod_template("g", CompactorGroupSpec(), CONFIG)["spec"]
    assert pod["serviceAccountName"] == "kompaktor-compactor"
    assert pod["automountServiceAccountToken"] is False
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["KOMPAKTOR_DRAIN_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "kompaktor-drain-token",
        "key": "token",
        "optional": True,
    }
    # no drain-token Secret configured: no variable (loopback drain only)
    pod = manifests.build_pod_template("g", CompactorGroupSpec(), OperatorConfig())["spec"]
    assert "KOMPAKTOR_DRAIN_TOKEN" not in {e["name"] for e in pod["containers"][0]["env"]}
    assert pod["automountServiceAccountToken"] is False


NETPOL_CONFIG = CONFIG.model_copy(
    update={
        "network_policy": True,
        "operator_namespace": "kompaktor-system",
        "redis_ca_configmap": "kompaktor-redis-ca",
        "operator_pod_labels": {"app.kubernetes.io/name": "kompaktor", "app.kubernetes.io/component": "operator"},
        "metrics_peers": ({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}},),
    }
)


@pytest.mark.parametrize("namespace", ["kompaktor-system", "tables"])
def test_network_policy_admits_only_the_operator_and_prometheus_to_the_http_port(namespace: str) -> None:
    import kubernetes_validate

    children = manifests.build_children("g", CompactorGroupSpec(), NETPOL_CONFIG, namespace=namespace)
    assert children[0]["kind"] == "NetworkPolicy"  # before any pod exists
    netpol = children[0]
    kubernetes_validate.validate(
        {**netpol, "metadata": {**netpol["metadata"], "namespace": namespace}}, "1.30", strict=True
    )
    spec = netpol["spec"]
    assert spec["podSelector"]["matchLabels"] == manifests.naming.selector_labels("g")
    assert spec["policyTypes"] == ["Ingress"]
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"port": 8080, "protocol": "TCP"}]
    operator, prometheus = rule["from"]
    assert operator["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"
    if namespace == "kompaktor-system":
        assert "namespaceSelector" not in operator  # same namespace: the pod selector alone
    else:
        assert operator["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "kompaktor-system"}}
    assert prometheus == NETPOL_CONFIG.metrics_peers[0]
    assert all(c["kind"] != "NetworkPolicy" for c in manifests.build_children("g", CompactorGroupSpec(), CONFIG))


def test_compactor_pods_mount_the_redis_ca_for_rediss() -> None:
    pod = manifests.build_pod_template("g", CompactorGroupSpec(), NETPOL_CONFIG)["spec"]
    (c,) = pod["containers"]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "redis-ca")
    assert mount == {"name": "redis-ca", "mountPath": manifests.REDIS_CA_DIR, "readOnly": True}
    assert {"name": "redis-ca", "configMap": {"name": "kompaktor-redis-ca"}} in pod["volumes"]


def test_config_reads_network_policy_settings_from_the_environment() -> None:
    cfg = OperatorConfig.from_env(
        {
            "KOMPAKTOR_NETWORK_POLICY": "true",
            "KOMPAKTOR_OPERATOR_NAMESPACE": "ns",
            "KOMPAKTOR_OPERATOR_POD_LABELS": '{"a": "b"}',
            "KOMPAKTOR_METRICS_PEERS": '[{"podSelector": {}}]',
            "KOMPAKTOR_REDIS_CA_CONFIGMAP": "rel-redis-ca",
        }
    )
    assert cfg.network_policy is True and cfg.operator_pod_labels == {"a": "b"}
    assert cfg.metrics_peers == ({"podSelector": {}},) and cfg.redis_ca_configmap == "rel-redis-ca"


# -- issue 25 §1: what code runs and where data goes is the operator's decision too --------------
STORE = CONFIG.model_copy(update={"storage_uri": "s3://kompaktor-data/tables"})


@pytest.mark.parametrize(
    "spec, rule, named",
    [
        # settings that load or run code in the compactor's JVM or Python workers
        (
            {"spark": {"conf": {"spark.driver.extraJavaOptions": "-javaagent:/tmp/x.jar"}}},
            admission.SPARK_CONF_NOT_ALLOWED,
            "spark.driver.extraJavaOptions",
        ),
        (
            {"spark": {"conf": {"spark.jars.packages": "evil:evil:1"}}},
            admission.SPARK_CONF_NOT_ALLOWED,
            "spark.jars.packages",
        ),
        (
            {"spark": {"conf": {"spark.python.daemon.module": "evil"}}},
            admission.SPARK_CONF_NOT_ALLOWED,
            "daemon.module",
        ),
        ({"spark": {"conf": {"spark.plugins": "evil.Plugin"}}}, admission.SPARK_CONF_NOT_ALLOWED, "spark.plugins"),
        (
            {"spark": {"conf": {"spark.executorEnv.LD_PRELOAD": "/tmp/x.so"}}},
            admission.SPARK_CONF_NOT_ALLOWED,
            "LD_PRELOAD",
        ),
        # ... that move files or unmask secrets
        ({"spark": {"conf": {"spark.local.dir": "/etc"}}}, admission.SPARK_CONF_NOT_ALLOWED, "spark.local.dir"),
        (
            {"spark": {"conf": {"spark.redaction.regex": "^$"}}},
            admission.SPARK_CONF_NOT_ALLOWED,
            "spark.redaction.regex",
        ),
        ({"spark": {"conf": {"spark.eventLog.dir": "s3://elsewhere/"}}}, admission.SPARK_CONF_NOT_ALLOWED, "eventLog"),
        # a master the group's author runs would receive the rows
        (
            {"spark": {"master": "spark://attacker.example:7077"}},
            admission.SPARK_MASTER_NOT_ALLOWED,
            "attacker.example",
        ),
        ({"spark": {"master": "k8s://https://elsewhere:6443"}}, admission.SPARK_MASTER_NOT_ALLOWED, "k8s://"),
        ({"spark": {"master": "local[*]x"}}, admission.SPARK_MASTER_NOT_ALLOWED, "local[*]x"),
        ({"spark": {"master": "yarn"}}, admission.SPARK_MASTER_NOT_ALLOWED, "'yarn'"),
        # the chart's storage credentials pointed elsewhere
        ({"storage": {"uri": "s3://someone-elses-bucket/x"}}, admission.STORAGE_NOT_ALLOWED, "someone-elses-bucket"),
        ({"storage": {"uri": "s3://kompaktor-data/tables-other"}}, admission.STORAGE_NOT_ALLOWED, "tables-other"),
        ({"storage": {"uri": "s3://kompaktor-data/tables/../../other"}}, admission.STORAGE_NOT_ALLOWED, ".."),
        (
            {"storage": {"uri": "s3://kompaktor-data/tables?endpoint_override=evil.example"}},
            admission.STORAGE_NOT_ALLOWED,
            "endpoint_override",
        ),
        ({"storage": {"uri": "file:///etc"}}, admission.STORAGE_NOT_ALLOWED, "file:///etc"),
        # one group asking the HPA for any number of pods
        ({"maxReplicas": 100000}, admission.MAX_REPLICAS_NOT_ALLOWED, "100000"),
        # labels and annotations other controllers or the operator's own selectors act on
        (
            {"podLabels": {"app.kubernetes.io/component": "operator"}},
            admission.LABEL_NOT_ALLOWED,
            "app.kubernetes.io/component",
        ),
        ({"podLabels": {"pod-template-hash": "x"}}, admission.LABEL_NOT_ALLOWED, "pod-template-hash"),
        (
            {"podAnnotations": {"controller.kubernetes.io/pod-deletion-cost": "100000"}},
            admission.LABEL_NOT_ALLOWED,
            "pod-deletion-cost",
        ),
        ({"podLabels": {"node-role.kubernetes.io/control-plane": ""}}, admission.LABEL_NOT_ALLOWED, "node-role"),
    ],
)
def test_code_masters_storage_and_limits_are_the_operators_decision(
    spec: dict[str, Any], rule: str, named: str
) -> None:
    refusal = check(STORE, **spec)
    assert refusal is not None and refusal.rule == rule, refusal
    assert named in refusal.message
    assert "chart value compactor." in refusal.message or rule == admission.LABEL_NOT_ALLOWED


def test_what_a_group_may_ask_for_by_default() -> None:
    ok = check(
        STORE,
        maxReplicas=1000,
        podLabels={"team": "storage", "example.com/cost-center": "42"},
        podAnnotations={"prometheus.io/scrape": "true"},
        spark={
            "master": "local[4]",
            "executorMemory": "2g",
            "driverMemory": "1g",
            "conf": {
                "spark.sql.shuffle.partitions": "8",
                "spark.default.parallelism": "4",
                "spark.sql.execution.arrow.maxRecordsPerBatch": "65536",
            },
        },
        storage={"uri": "s3://kompaktor-data/tables"},
    )
    assert ok is None
    for master in ("local", "local[*]", "local[1]", "local[16]", "local[4,2]"):
        assert check(STORE, spark={"master": master}) is None, master


def test_the_chart_widens_exactly_what_it_lists() -> None:
    cfg = STORE.model_copy(
        update={
            "allowed_spark_conf": ("spark.kryoserializer.buffer.max", "spark.ui.*"),
            "allowed_spark_masters": ("spark://spark-master.spark:7077", "k8s://https://kube:*"),
            "allowed_storage": ("s3://team-bucket/kompaktor/",),
            "max_replicas_limit": 50,
        }
    )
    assert check(cfg, spark={"conf": {"spark.kryoserializer.buffer.max": "1g", "spark.ui.enabled": "false"}}) is None
    assert check(cfg, spark={"conf": {"spark.jars": "x"}}).rule == admission.SPARK_CONF_NOT_ALLOWED
    assert check(cfg, spark={"master": "spark://spark-master.spark:7077"}) is None
    assert check(cfg, spark={"master": "k8s://https://kube:6443"}) is None
    assert check(cfg, spark={"master": "spark://spark-master.spark:7078"}).rule == admission.SPARK_MASTER_NOT_ALLOWED
    assert check(cfg, storage={"uri": "s3://team-bucket/kompaktor/t1"}) is None
    assert check(cfg, storage={"uri": "s3://team-bucket/kompaktor"}) is None
    assert check(cfg, storage={"uri": "s3://team-bucket/kompaktorx"}).rule == admission.STORAGE_NOT_ALLOWED
    assert check(cfg, maxReplicas=50) is None
    assert check(cfg, maxReplicas=51).rule == admission.MAX_REPLICAS_NOT_ALLOWED


def test_config_reads_the_new_rules_from_the_environment() -> None:
    cfg = OperatorConfig.from_env(
        {
            "KOMPAKTOR_ALLOWED_SPARK_CONF": "a.b, c.*",
            "KOMPAKTOR_ALLOWED_SPARK_MASTERS": "",
            "KOMPAKTOR_ALLOWED_STORAGE": "s3://b/p",
            "KOMPAKTOR_MAX_REPLICAS_LIMIT": "64",
        }
    )
    assert cfg.allowed_spark_conf == ("a.b", "c.*") and cfg.allowed_spark_masters == ()
    assert cfg.allowed_storage == ("s3://b/p",) and cfg.max_replicas_limit == 64
    assert OperatorConfig.from_env({}).max_replicas_limit == 1000


# -- issue 34 §3: admission that cannot be talked around ---------------------------------------
ALLOWED_TMP = CONFIG.model_copy(update={"allowed_storage": ("file:///tmp/allowed", "s3://team-bucket/kompaktor")})


@pytest.mark.parametrize(
    "uri, why",
    [
        # pyarrow decodes the path before it opens it: /tmp/allowed/../etc, /tmp/allowed/x/../../etc
        ("file:///tmp/allowed/%2e%2e/etc", "percent-encoded"),
        ("file:///tmp/allowed/x%2f..%2f..%2fetc", "percent-encoded"),
        ("file:///tmp/allowed/%2E%2E", "percent-encoded"),
        ("file:///tmp/allowed//etc", "empty"),
        ("file:///tmp/allowed/./x", "'.'"),
        ("file:///tmp/allowed/../etc", "'..'"),
        ("file:///tmp/allowed\\..\\etc", "backslash"),
        ("s3://evil@team-bucket/kompaktor/t", "user part"),
        ("s3://key:secret@team-bucket/kompaktor/t", "user part"),
        ("s3://team-bucket/kompaktor/t?endpoint_override=evil.example", "query"),
        ("s3://team-bucket/kompaktor/t#x", "fragment"),
        ("s3://team-bucket/kompaktor/\u2025/etc", "non-ASCII"),  # the two-dot leader
        ("s3://team-bucket/kompaktor/\uff0e\uff0e/etc", "non-ASCII"),  # fullwidth full stops
        ("s3://team\u2010bucket/kompaktor/t", "non-ASCII"),  # a hyphen look-alike
        ("s3://team-bucket/kompaktor/t x", "space"),
        ("S3://team-bucket/kompaktor/t", "lowercase scheme"),
        ("file:/tmp/allowed/t", "scheme://"),
    ],
)
def test_storage_uris_are_compared_only_in_the_form_pyarrow_opens(uri: str, why: str) -> None:
    assert admission.storage_allowed("file:///tmp/allowed/t", ALLOWED_TMP)  # the prefix does allow
    refusal = check(ALLOWED_TMP, storage={"uri": uri})
    assert refusal is not None and refusal.rule == admission.STORAGE_NOT_ALLOWED
    assert why in refusal.message and "\n" not in refusal.message, refusal.message


def test_storage_prefixes_match_whole_path_segments() -> None:
    for ok in (
        "file:///tmp/allowed",
        "file:///tmp/allowed/",
        "file:///tmp/allowed/t/1",
        "s3://team-bucket/kompaktor/t",
    ):
        assert admission.storage_allowed(ok, ALLOWED_TMP), ok
    for bad in ("file:///tmp/allowedx", "file:///tmp", "s3://team-bucket/kompaktorx", "s3://team-bucket2/kompaktor"):
        assert not admission.storage_allowed(bad, ALLOWED_TMP), bad


@pytest.mark.parametrize(
    "entry, allowed, refused",
    [
        (
            "spark://spark-master.spark:*",
            ["spark://spark-master.spark:7077"],
            ["spark://spark-master.spark:7077,evil.example:7077", "spark://spark-master.spark:7077/x"],
        ),
        ("spark.ui.*", ["spark.ui.enabled"], ["spark.ui.enabled.x", "spark.uix"]),
        (
            "registry.corp/team/*",
            ["registry.corp/team/compactor:2", f"registry.corp/team/compactor@sha256:{'a' * 64}"],
            ["registry.corp/team/x/evil:1", "registry.corp/teamx:1", "registry.corp/team/"],
        ),
    ],
)
def test_a_wildcard_widens_by_one_segment(entry: str, allowed: list[str], refused: list[str]) -> None:
    segment = patterns.IMAGE_SEGMENT if entry.startswith("registry") else patterns.SEGMENT
    for value in allowed:
        assert patterns.listed(value, [entry], segment), value
    for value in refused:
        assert not patterns.listed(value, [entry], segment), value


@pytest.mark.parametrize(
    "field, entry",
    [
        ("allowed_spark_masters", "spark://trusted*"),  # would allow spark://trusted.evil.example
        ("allowed_images", "registry.corp/team*"),  # ... registry.corp/team-evil/miner
        ("allowed_spark_conf", "spark.*.memory"),
        ("allowed_storage", "s3://bucket/*"),
        ("allowed_storage", "file:///tmp/a/%2e%2e"),
    ],
)
def test_an_allow_list_entry_that_cannot_be_matched_on_boundaries_is_a_configuration_error(
    field: str, entry: str
) -> None:
    with pytest.raises(ValueError, match="allow"):
        OperatorConfig.model_validate({**CONFIG.model_dump(), field: (entry,)})
    # and were it ever to reach admission, it matches nothing
    assert not patterns.listed("spark://trusted.evil.example", ["spark://trusted*"])
    assert not patterns.listed("spark://trusted", ["spark://trusted*"])


def test_the_chart_refuses_wildcards_off_boundaries() -> None:
    import jsonschema

    schema = json.loads((Path(__file__).parents[2] / "helm/kompaktor/values.schema.json").read_text())
    items = schema["properties"]["compactor"]["properties"]
    for key, good, bad in (
        ("allowedSparkMasters", "spark://m.spark:*", "spark://trusted*"),
        ("allowedImages", "registry.corp/team/*", "registry.corp/team*"),
        ("allowedStorage", "s3://b/p", "file:///tmp/a/%2e%2e"),
    ):
        jsonschema.validate(good, items[key]["items"])
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, items[key]["items"])


TOLERATION = {"key": "dedicated", "operator": "Equal", "value": "compaction", "effect": "NoSchedule"}
AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["compaction"]}]}]
        }
    }
}
PLACED = CONFIG.model_copy(
    update={
        "allowed_node_selectors": ("pool=compaction",),
        "allowed_tolerations": (TOLERATION,),
        "allowed_affinities": (AFFINITY,),
        "allowed_priority_classes": ("batch-low",),
        "max_resources": {"cpu": "8", "memory": "32Gi"},
    }
)


def test_a_group_runs_where_and_as_big_as_the_chart_lists() -> None:
    ok = check(
        PLACED,
        nodeSelector={"pool": "compaction"},
        tolerations=[TOLERATION],
        affinity=AFFINITY,
        priorityClassName="batch-low",
        resources={"requests": {"cpu": "7500m", "memory": "32Gi"}, "limits": {"cpu": 8, "memory": "34359738368"}},
    )
    assert ok is None
    pod = manifests.build_pod_template("g", CompactorGroupSpec(priorityClassName="batch-low"), PLACED)["spec"]
    assert pod["priorityClassName"] == "batch-low"


@pytest.mark.parametrize(
    "spec, rule, named",
    [
        # the control plane's nodes, or another team's
        ({"nodeSelector": {"node-role.kubernetes.io/control-plane": ""}}, "NodeSelectorNotAllowed", "control-plane"),
        ({"nodeSelector": {"pool": "payments"}}, "NodeSelectorNotAllowed", "pool=payments"),
        (
            {"tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]},
            "TolerationNotAllowed",
            "control-plane",
        ),
        ({"tolerations": [{"operator": "Exists"}]}, "TolerationNotAllowed", '{"operator":"Exists"}'),  # tolerates all
        ({"tolerations": [{**TOLERATION, "value": "payments"}]}, "TolerationNotAllowed", "payments"),
        (
            {"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "x"}]}}},
            "AffinityNotAllowed",
            "podAffinity",
        ),
        ({"priorityClassName": "system-cluster-critical"}, "PriorityClassNotAllowed", "system-cluster-critical"),
        ({"resources": {"requests": {"cpu": "8001m"}}}, "ResourcesNotAllowed", "requests.cpu 8001m"),
        ({"resources": {"limits": {"memory": "33Gi"}}}, "ResourcesNotAllowed", "at most 32Gi"),
        ({"resources": {"limits": {"nvidia.com/gpu": 1}}}, "ResourcesNotAllowed", "not a resource the chart lists"),
    ],
)
def test_scheduling_and_size_beyond_the_charts_lists_are_refused(spec: dict[str, Any], rule: str, named: str) -> None:
    refusal = check(PLACED, **spec)
    assert refusal is not None and refusal.rule == rule, refusal
    assert named in refusal.message and "chart value compactor." in refusal.message, refusal.message
    assert "\n" not in refusal.message


def test_by_default_a_group_chooses_no_node_and_no_priority_and_is_capped() -> None:
    assert check(nodeSelector={"pool": "compaction"}).rule == "NodeSelectorNotAllowed"
    assert check(tolerations=[TOLERATION]).rule == "TolerationNotAllowed"
    assert check(affinity=AFFINITY).rule == "AffinityNotAllowed"
    assert check(priorityClassName="batch-low").rule == "PriorityClassNotAllowed"
    assert check(resources={"requests": {"cpu": "64", "memory": "256Gi"}}) is None
    assert check(resources={"requests": {"cpu": "65"}}).rule == "ResourcesNotAllowed"


def test_config_reads_scheduling_and_size_from_the_environment() -> None:
    cfg = OperatorConfig.from_env(
        {
            "KOMPAKTOR_ALLOWED_NODE_SELECTORS": "pool=compaction, disk=ssd",
            "KOMPAKTOR_ALLOWED_TOLERATIONS": json.dumps([TOLERATION]),
            "KOMPAKTOR_ALLOWED_AFFINITIES": "[]",
            "KOMPAKTOR_ALLOWED_PRIORITY_CLASSES": "batch-low",
            "KOMPAKTOR_MAX_RESOURCES": '{"cpu": 4, "memory": "8Gi"}',
        }
    )
    assert cfg.allowed_node_selectors == ("pool=compaction", "disk=ssd")
    assert cfg.allowed_tolerations == (TOLERATION,) and cfg.allowed_affinities == ()
    assert cfg.allowed_priority_classes == ("batch-low",) and cfg.max_resources == {"cpu": 4, "memory": "8Gi"}
    with pytest.raises(ValueError, match="key=value"):
        OperatorConfig.from_env({"KOMPAKTOR_ALLOWED_NODE_SELECTORS": "pool"})
    with pytest.raises(ValueError, match="quantity"):
        OperatorConfig.from_env({"KOMPAKTOR_MAX_RESOURCES": '{"cpu": "lots"}'})
