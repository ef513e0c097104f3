"""Issue 16 §2 and §3 on a real Kubernetes 1.20 control plane: a namespaced install
(``operator.watchNamespaces``) whose operator runs as a local process with the chart's operator
ServiceAccount token — its RBAC is exactly the chart's Roles, so a verb they lack fails here.

- A CompactorGroup naming a foreign image, ServiceAccount or Secret is refused with a condition
  naming the rule, and nothing is created for it (no Deployment, Service, HPA or NetworkPolicy).
- An allowed group is reconciled with the namespaced RBAC alone: Deployment, Service, HPA and
  NetworkPolicy in the watched namespace; the ReplicaSet controller creates its pods, which the
  ServiceAccount admission plugin accepts as the chart's compactor account with no token mounted.
- The operator's account cannot touch pods outside the watched namespace.
- The drain token Secret is the same after ``helm upgrade`` (kept through lookup) and in every
  compactor namespace.

(Runs before or after test_user_path.py, or alone: tests/support/k8s.py installs the CRDs only
where no release has, and uninstalls each release when its module ends.)
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import helm_python as helm
import kubernetes
import pytest

from kompaktor.local.procs import stop_popen
from kompaktor.resources import api
from kompaktor_operator import naming
from tests.k8s.controlplane import ControlPlane, wait_until
from tests.support.k8s import CHART, Namespaced, container_env, helm_release, start_local

ROOT = Path(__file__).resolve().parents[2]
NS = "kompaktor-sec"  # the release's namespace
WATCHED = "tables-sec"  # the only namespace the operator watches
RELEASE = "kompaktor-sec"
REDIS_SECRET = "sec-redis-url"
BIN = Path(sys.executable).parent
OPERATOR_SA = f"{RELEASE}-operator"


@dataclass
class Install(Namespaced):
    namespace: ClassVar[str] = WATCHED
    cp: ControlPlane
    core: Any
    values: dict[str, Any]
    operator: subprocess.Popen
    log: Path

    def ready(self, name: str) -> dict[str, Any] | None:
        return self.condition("compactorgroup", name, "Ready")


@pytest.fixture(scope="module")
def install(
    control_plane: ControlPlane, redis_server: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Install]:
    cp = control_plane
    core = kubernetes.client.CoreV1Api(cp.api())
    for ns in (NS, WATCHED):
        core.create_namespace({"metadata": {"name": ns}})
    for ns in (NS, WATCHED):  # the Redis URL where the operator and the compactors read it
        core.create_namespaced_secret(ns, {"metadata": {"name": REDIS_SECRET}, "stringData": {"url": redis_server.url}})
    values = {
        "operator": {"watchNamespaces": [WATCHED]},
        "redis": {"bundled": False, "external": {"existingSecret": REDIS_SECRET}},
        "autoscaler": "hpa",
        "storage": {"uri": str(tmp_path_factory.mktemp("storage"))},
    }
    log = tmp_path_factory.mktemp("sec-logs") / "operator.log"
    with helm_release(cp, RELEASE, NS, values) as (_, installed):
        env = {
            **os.environ,
            **container_env(cp, core, NS, f"{RELEASE}-operator", "operator"),
            "KUBECONFIG": str(cp.service_account_kubeconfig(NS, OPERATOR_SA)),  # never admin
            "KOMPAKTOR_SCALE_INTERVAL": "1",
            "KOMPAKTOR_STATUS_INTERVAL": "2",
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        # as the chart runs it: --namespace for each watched namespace
        proc = start_local([str(BIN / "kompaktor"), "operator", "--liveness", "", "--namespace", WATCHED], env, log)
        try:
            yield Install(cp, core, installed, proc, log)
        finally:
            stop_popen(proc, 15)


def _apply_group(inst: Install, name: str, **spec: Any) -> None:
    body = {
        "apiVersion": api.GROUP_VERSION,
        "kind": "CompactorGroup",
        "metadata": {"name": name},
        "spec": {"maxReplicas": 2, **spec},
    }
    inst.kubectl("apply", "-f", "-", input=json.dumps(body))


CHILDREN = (
    ("deployment", naming.deployment_name),
    ("service", naming.metrics_service_name),
    ("hpa", naming.hpa_name),
    ("networkpolicy", naming.network_policy_name),
)


def test_allowed_group_is_reconciled_with_the_namespaced_rbac_alone(install: Install) -> None:
    _apply_group(install, "good", minReplicas=1)
    ready = wait_until(lambda: install.ready("good"), "good's Ready condition", timeout=60)
    assert ready["status"] == "True" and ready["reason"] == "Reconciled", (ready, install.log.read_text()[-3000:])
    for kind, name in CHILDREN:
        assert install.get(kind, name("good")) is not None, kind
    netpol = install.get("networkpolicy", naming.network_policy_name("good"))
    (rule,) = netpol["spec"]["ingress"]
    assert rule["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"
    assert rule["from"][0]["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": NS}}
    # the ReplicaSet controller makes the pod; admission accepts the chart's account, no token mounted
    pods = wait_until(
        lambda: install.core.list_namespaced_pod(WATCHED, label_selector=naming.selector("good")).items,
        "good's pod",
        timeout=60,
    )
    pod = pods[0]
    assert pod.spec.service_account_name == f"{RELEASE}-compactor"
    assert pod.spec.automount_service_account_token is False
    assert not [v for v in pod.spec.volumes or [] if v.secret and "token" in (v.secret.secret_name or "")]
    (c,) = pod.spec.containers
    assert not [m for m in c.volume_mounts or [] if "serviceaccount" in m.mount_path]
    token_ref = next(e for e in c.env if e.name == "KOMPAKTOR_DRAIN_TOKEN").value_from.secret_key_ref
    assert (token_ref.name, token_ref.key) == (f"{RELEASE}-drain-token", "token")
    # the scale timer (lists pods, patches the group's status) works with the same Roles
    wait_until(
        lambda: ((install.get("compactorgroup", "good") or {}).get("status") or {}).get("replicas") == 1,
        "good's status.replicas",
        timeout=30,
    )
    assert "403" not in install.log.read_text() and "Forbidden" not in install.log.read_text()


@pytest.mark.parametrize(
    "name, spec, rule",
    [
        ("foreign-image", {"image": "evil.example/miner:latest"}, "ImageNotAllowed"),
        ("foreign-sa", {"serviceAccountName": "default"}, "ServiceAccountNotAllowed"),
        ("foreign-secret", {"storage": {"credentialsSecret": "cloud-admin"}}, "SecretNotAllowed"),
        # issue 25: what code runs, where the rows and the credentials go, how many pods
        (
            "foreign-code",
            {"spark": {"conf": {"spark.driver.extraJavaOptions": "-javaagent:/x.jar"}}},
            "SparkConfNotAllowed",
        ),
        ("foreign-master", {"spark": {"master": "spark://attacker.example:7077"}}, "SparkMasterNotAllowed"),
        ("foreign-storage", {"storage": {"uri": "s3://someone-elses-bucket/x"}}, "StorageNotAllowed"),
        ("too-many", {"maxReplicas": 100000}, "MaxReplicasNotAllowed"),
        ("reserved-label", {"podLabels": {"app.kubernetes.io/component": "operator"}}, "LabelNotAllowed"),
    ],
)
def test_hostile_group_is_refused_and_nothing_is_created(
    install: Install, name: str, spec: dict[str, Any], rule: str
) -> None:
    _apply_group(install, name, **spec)
    ready = wait_until(lambda: install.ready(name), f"{name}'s Ready condition", timeout=60)
    assert ready["status"] == "False" and ready["reason"] == rule, ready
    assert ready["message"].startswith("refused: ") and (
        "compactor." in ready["message"] or rule == "LabelNotAllowed"
    ), ready
    for kind, child in CHILDREN:
        assert install.get(kind, child(name)) is None, kind
    assert not install.core.list_namespaced_pod(WATCHED, label_selector=naming.selector(name)).items
    install.kubectl("delete", "compactorgroup", name, "--wait=false")


def test_an_edit_that_breaks_a_rule_leaves_the_running_deployment_as_it_was(install: Install) -> None:
    _apply_group(install, "edited", minReplicas=1)
    wait_until(lambda: (install.ready("edited") or {}).get("reason") == "Reconciled", "edited reconciled", timeout=60)
    before = install.get("deployment", naming.deployment_name("edited"))
    install.kubectl(
        "patch",
        "compactorgroup",
        "edited",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"spark": {"conf": {"spark.jars.packages": "org.evil:agent:1.0"}}}}),
    )
    ready = wait_until(
        lambda: (r := install.ready("edited")) and r["reason"] == "SparkConfNotAllowed" and r,
        "edited refused",
        timeout=60,
    )
    assert ready["status"] == "False" and "spark.jars.packages" in ready["message"]
    after = install.get("deployment", naming.deployment_name("edited"))
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert after["spec"]["template"] == before["spec"]["template"]
    assert "spark.jars" not in json.dumps(after)
    install.kubectl("delete", "compactorgroup", "edited", "--wait=false")


def test_the_operator_account_has_no_pod_rights_outside_the_watched_namespace(install: Install) -> None:
    who = f"--as=system:serviceaccount:{NS}:{OPERATOR_SA}"

    def can(verb: str, resource: str, ns: str) -> str:
        out = install.cp.kubectl("auth", "can-i", verb, resource, "-n", ns, who, check=False)
        return out.stdout.strip()

    assert can("delete", "pods", WATCHED) == "yes"
    for ns in ("default", "kube-system", NS):
        assert can("delete", "pods", ns) == "no", ns
        assert can("create", "deployments", ns) == "no", ns
    for ns in (WATCHED, NS):
        assert can("get", "secrets", ns) == "no", ns
        assert can("create", "serviceaccounts", ns) == "no", ns
    out = install.cp.kubectl("auth", "can-i", "delete", "pods", "--all-namespaces", who, check=False)
    assert out.stdout.strip() == "no"


def test_drain_token_is_kept_across_upgrades_and_shared_by_namespaces(install: Install) -> None:
    def token(ns: str) -> str:
        return install.core.read_namespaced_secret(f"{RELEASE}-drain-token", ns).data["token"]

    before = token(NS)
    assert token(WATCHED) == before and len(base64.b64decode(before)) >= 48
    with helm.Config(kubeconfig_path=str(install.cp.kubeconfig), namespace=NS) as cfg:
        cfg.upgrade(str(CHART), RELEASE, install.values, namespace=NS, timeout=120)
    assert token(NS) == before and token(WATCHED) == before
