"""The typed manifest builders render exactly the objects the earlier dict builders rendered.

``golden/manifests.json`` was written by the dict-based builders (before the manifests became
typed) for a few representative groups and operator configurations: the same keys, values and key
order, so what server-side apply sends and what kopf adopts is byte for byte what it was."""

from __future__ import annotations

import json
import pathlib

import pytest
from pydantic import SecretStr

from kompaktor.resources.models import CompactorGroupSpec
from kompaktor.resources.operator_config import OperatorConfig
from kompaktor_operator import manifests

GOLDEN = pathlib.Path(__file__).parent / "golden" / "manifests.json"

PLAIN = OperatorConfig(compactor_image="example.org/kompaktor-compactor:0.1.0", prometheus_url="http://prom:9090")
LOCKED_DOWN = OperatorConfig(
    compactor_image="example.org/kompaktor-compactor:0.1.0",
    prometheus_url="http://prom:9090",
    storage_uri="s3://bucket/default",
    storage_secret="default-creds",
    allowed_spark_conf=("spark.executor.*",),
    allowed_spark_masters=("spark://master.spark:*",),
    group_key=SecretStr("k" * 32),
    drain_token_secret="drain-token",
    redis_ca_configmap="redis-ca",
    network_policy=True,
    operator_namespace="kompaktor-system",
    operator_pod_labels={"app": "kompaktor-operator"},
    metrics_peers=({"namespaceSelector": {"matchLabels": {"name": "monitoring"}}},),
)
FULL = CompactorGroupSpec.model_validate(
    {
        "image": "example.org/compactor:1",
        "minReplicas": 2,
        "maxReplicas": 40,
        "jobsPerReplica": 3,
        "spark": {
            "master": "spark://master.spark:7077",
            "conf": {"spark.executor.instances": "4"},
            "driverMemory": "4g",
        },
        "resources": {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"memory": "8Gi"}},
        "drainGraceSeconds": 600,
        "redis": {"secretName": "my-redis", "key": "uri"},
        "storage": {"uri": "s3://bucket/kompaktor", "credentialsSecret": "s3-creds"},
        "nodeSelector": {"pool": "compaction"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "compaction", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
        "podLabels": {"team": "storage"},
        "podAnnotations": {"owner": "storage"},
        "priorityClassName": "batch",
        "serviceAccountName": "compactor",
        "behavior": {"scaleUpPercent": 50, "scaleUpPods": 2, "scaleDownPercent": 10},
    }
)
#: name -> (group, spec, config, HPA API version, namespace)
CASES = {
    "default": ("small", CompactorGroupSpec(), PLAIN, "autoscaling/v2", None),
    "full-locked-down": ("large", FULL, LOCKED_DOWN, "autoscaling/v2", "compaction"),
    "full-v2beta2": ("large", FULL, PLAIN, "autoscaling/v2beta2", None),
    "keda": (
        "scale-to-zero",
        CompactorGroupSpec.model_validate({"autoscaler": "keda", "minReplicas": 0, "maxReplicas": 8}),
        LOCKED_DOWN,
        "autoscaling/v2",
        "kompaktor-system",
    ),
    "none": (
        "fixed",
        CompactorGroupSpec.model_validate({"autoscaler": "none", "minReplicas": 3, "maxReplicas": 3}),
        PLAIN,
        "autoscaling/v2",
        None,
    ),
}


def render(case: str) -> list[object]:
    group, spec, config, hpa, namespace = CASES[case]
    return list(manifests.build_children(group, spec, config, hpa, namespace=namespace))


@pytest.mark.parametrize("case", CASES)
def test_manifests_equal_their_dict_form(case: str) -> None:
    # serialised, not compared as dicts: the key order must be the same too (json keeps it)
    assert json.dumps(render(case)) == json.dumps(json.loads(GOLDEN.read_text())[case])


if __name__ == "__main__":  # writes the golden file (only ever from the dict-based builders)
    GOLDEN.write_text(json.dumps({case: render(case) for case in CASES}, indent=1) + "\n")
