"""The Helm chart: lints, renders with several values files, and every manifest validates."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml

from kompaktor import __version__
from kompaktor.resources import crdgen
from kompaktor.resources import models as m

pytestmark = pytest.mark.chart

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "kompaktor"
K8S = "1.30"
VALUES = sorted((CHART / "ci").glob("*.yaml"))
#: Kinds that are not core Kubernetes: checked by shape, not against the official schemas.
FOREIGN = {"ServiceMonitor", "Certificate"}


#: the one value without a default: storage every pod shares
STORAGE = {"storage": {"uri": "s3://compactions/kompaktor"}}


def render(values: dict[str, Any], *, storage: bool = True) -> list[dict[str, Any]]:
    """The chart's manifests for ``values`` (plus :data:`STORAGE` unless they name storage)."""
    if storage and "storage" not in values:
        values = {**values, **STORAGE}
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
        for bad in (
            {"redis": {"bundled": False}},
            {"operator": {"logLevel": "loud"}},
            {"typo": 1},
            {"redis": {"external": {"url": "http://x"}}},
            {"redis": {"password": 'a"b'}},
            {"redis": {"password": "p@ss/word"}},
        ):
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
        if doc["kind"] == "ServiceMonitor":
            assert doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["spec"]["endpoints"]
            continue
        if doc["kind"] == "Certificate":
            assert doc["apiVersion"] == "cert-manager.io/v1" and doc["spec"]["secretName"] and doc["spec"]["issuerRef"]
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
        assert plain == {
            k: v
            for k, v in crdgen.build_crd(
                next(r for r in m.RESOURCES if crd["metadata"]["name"].startswith(r.PLURAL + "."))
            ).items()
            if k != "metadata"
        }
    (operator,) = [d for d in by["Deployment"] if d["metadata"]["name"] == "kompaktor-operator"]
    containers = {c["name"]: c for c in operator["spec"]["template"]["spec"]["containers"]}
    assert set(containers) == {"operator", "coordinator"}
    assert containers["operator"]["args"][0] == "operator" and containers["coordinator"]["args"][0] == "coordinator"
    env = {e["name"]: e for e in containers["operator"]["env"]}
    assert env["KOMPAKTOR_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {"name": "kompaktor-redis-operator", "key": "url"}
    assert env["KOMPAKTOR_COMPACTOR_IMAGE"]["value"].endswith(f":{__version__}")
    assert operator["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    (redis,) = by["StatefulSet"]
    (script,) = redis["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--appendonly yes --appendfsync always" in script  # acknowledged = fsynced (issue 15 §1)
    # the password as configuration on stdin, never an argument (run for real in test_redis_tls.py)
    assert "--requirepass" not in script and 'requirepass "$REDIS_PASSWORD"' in script
    assert redis["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "8Gi"
    secrets = {s["metadata"]["name"]: s for s in by["Secret"]}
    url = secrets["kompaktor-redis"]["stringData"]["url"]
    assert re.fullmatch(r"redis://:[A-Za-z0-9]{32}@kompaktor-redis\.kompaktor-system\.svc:6379/0", url)
    assert {"ClusterRole", "ClusterRoleBinding", "ServiceAccount", "Service", "ConfigMap"} <= set(by)
    assert "ServiceMonitor" not in by


def test_install_without_shared_storage_is_refused_in_one_line() -> None:
    """A default install used to give each pod its own local directory: compactors' outputs were
    invisible to the coordinator and the scans. Now the chart names the value to set."""
    with pytest.raises(helm.HelmError) as err:
        render({}, storage=False)
    message = str(err.value)
    assert "storage.uri is required" in message and "s3://bucket/prefix" in message
    with pytest.raises(helm.HelmError):
        render({"storage": {"uri": ""}}, storage=False)


def test_bundled_redis_runs_the_projects_image_with_its_pull_policy() -> None:
    (redis,) = kinds(render({}))["StatefulSet"]
    (c,) = redis["spec"]["template"]["spec"]["containers"]
    version = __version__
    assert c["image"] == f"ghcr.io/kompaktor/kompaktor-redis:{version}"
    assert c["imagePullPolicy"] == "IfNotPresent"
    (c,) = kinds(
        render(
            {"redis": {"image": {"repository": "docker.io/library/redis", "tag": "7.2-alpine", "pullPolicy": "Always"}}}
        )
    )["StatefulSet"][0]["spec"]["template"]["spec"]["containers"]
    assert (c["image"], c["imagePullPolicy"]) == ("docker.io/library/redis:7.2-alpine", "Always")


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
    (secret,) = [s for s in by["Secret"] if s["metadata"]["name"] == "kompaktor-redis"]
    assert secret["stringData"]["url"].startswith("rediss://")
    operator = by["Deployment"][0]["spec"]["template"]["spec"]
    coordinator = next(c for c in operator["containers"] if c["name"] == "coordinator")
    assert coordinator["envFrom"] == [{"secretRef": {"name": "s3-credentials"}}]
    with pytest.raises(helm.HelmError):
        render({"redis": {"bundled": False, "external": {"url": ""}}})


def test_external_ha_redis_through_sentinel_and_the_fsync_policy() -> None:
    """Issue 15 §2: an external HA Redis is given as its sentinels' URL (the clients follow
    failovers); the bundled Redis fsyncs before every reply unless told otherwise."""
    by = kinds(render(load(CHART / "ci" / "external-sentinel-values.yaml")))
    assert "StatefulSet" not in by
    (secret,) = [s for s in by["Secret"] if s["metadata"]["name"] == "kompaktor-redis"]
    assert secret["stringData"]["url"].startswith("redis+sentinel://:secret@redis-sentinel-0.redis:26379,")
    tls = render({"redis": {"bundled": False, "external": {"url": "rediss+sentinel://h:26379/kompaktor"}}})
    assert any(d["kind"] == "Secret" for d in tls)
    (redis,) = kinds(render({"redis": {"appendfsync": "everysec"}}))["StatefulSet"]
    assert "--appendfsync everysec" in redis["spec"]["template"]["spec"]["containers"][0]["args"][0]
    for bad in (
        {"redis": {"appendfsync": "no"}},
        {"redis": {"bundled": False, "external": {"url": "sentinel://h:26379/kompaktor"}}},
    ):
        with pytest.raises(helm.HelmError):
            render(bad)


def test_service_monitor_and_existing_secret() -> None:
    by = kinds(render(load(CHART / "ci" / "namespaced-keda-values.yaml")))
    (sm,) = by["ServiceMonitor"]
    assert sm["metadata"]["labels"]["release"] == "prometheus"
    assert sorted(sm["spec"]["namespaceSelector"]["matchNames"]) == ["analytics", "kompaktor-system", "tables"]
    env = {e["name"]: e for e in by["Deployment"][0]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["KOMPAKTOR_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {"name": "managed-redis", "key": "uri"}
    assert sorted(s["metadata"]["name"] for s in by.get("Secret", [])) == [
        "kompaktor-drain-token",
        "kompaktor-drain-token",
        "kompaktor-drain-token",
        "kompaktor-group-key",
        "kompaktor-metrics-api-tls",
    ]


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
    for metric in (
        "kompaktor_queue_depth",
        "kompaktor_running_compactions",
        "kompaktor_oldest_queued_job_age_seconds",
        "kompaktor_compactions_completed_total",
    ):
        assert metric in exprs
    assert cms["kompaktor-dashboard"]["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_crds_can_be_left_out() -> None:
    assert "CustomResourceDefinition" not in kinds(render({"crds": {"install": False}}))


def test_image_tags_follow_the_package_version() -> None:
    version = __version__
    chart = load(CHART / "Chart.yaml")
    values = load(CHART / "values.yaml")
    assert chart["appVersion"] == version
    for image in (values["operator"]["image"], values["compactor"]["image"]):
        assert (image["tag"] or chart["appVersion"]) == version
    env = {
        e["name"]: e.get("value")
        for e in next(d for d in render({}) if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0][
            "env"
        ]
    }
    assert env["KOMPAKTOR_COMPACTOR_IMAGE"].endswith(f":{version}")


def _images(docs: list[dict[str, Any]]) -> dict[str, str]:
    """Each container's image by container name, and the compactor image the operator is given."""
    out = {}
    for d in docs:
        if d["kind"] not in ("Deployment", "StatefulSet"):
            continue
        for c in d["spec"]["template"]["spec"]["containers"]:
            out[c["name"]] = c["image"]
            for e in c.get("env", []):
                if e["name"] == "KOMPAKTOR_COMPACTOR_IMAGE":
                    out["compactor"] = e["value"]
    return out


def test_an_image_digest_pins_each_reference_and_changes_only_its_own() -> None:
    """A rebuilt image under the same tag rolls only through its digest (docs/upgrading.md)."""
    digests = {name: "sha256:" + c * 64 for name, c in (("operator", "a"), ("compactor", "b"), ("redis", "c"))}
    plain = _images(render({}))
    assert set(plain) >= {"operator", "coordinator", "compactor", "redis"}
    assert all(ref.endswith(f":{__version__}") for ref in plain.values()), plain
    pinned = _images(render({name: {"image": {"digest": d}} for name, d in digests.items()}))
    owner = {"operator": "operator", "coordinator": "operator", "compactor": "compactor", "redis": "redis"}
    for container, ref in pinned.items():
        expected = f"{plain[container]}@{digests[owner[container]]}" if container in owner else plain[container]
        assert ref == expected, (container, ref)
    only = _images(render({"compactor": {"image": {"digest": digests["compactor"]}}}))
    assert {k for k in only if only[k] != plain[k]} == {"compactor"}
    with helm.Chart.load(str(CHART)) as chart, pytest.raises(helm.HelmError):
        chart.validate_schema({"operator": {"image": {"digest": "latest"}}})


def test_examples_render_as_valid_custom_resources() -> None:
    docs = [d for p in sorted((ROOT / "examples").glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]
    assert [d["kind"] for d in docs] == ["CompactionService", "CompactorGroup", "CompactorGroup", "Compaction"]
    resources = m.load_documents("\n---\n".join(yaml.safe_dump(d) for d in docs))
    svc = resources[0]
    assert {t.compactor_group for t in svc.spec.tiers} == {r.name for r in resources if r.KIND == "CompactorGroup"}


# -- issue 16: secrets, least privilege, drain token, NetworkPolicy, Redis TLS ----------------------
def by_name(docs: list[dict[str, Any]], kind: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["metadata"]["name"], d["metadata"].get("namespace", "")): d for d in docs if d["kind"] == kind}


def container(docs: list[dict[str, Any]], kind: str, name: str, cname: str) -> dict[str, Any]:
    obj = next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)
    return next(c for c in obj["spec"]["template"]["spec"]["containers"] if c["name"] == cname)


def env_of(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in c.get("env") or []}


@pytest.mark.parametrize("tls", [False, True])
def test_redis_probe_reads_the_password_from_the_environment_not_argv(tls: bool) -> None:
    docs = render({"redis": {"tls": {"enabled": tls}}})
    redis = container(docs, "StatefulSet", "kompaktor-redis", "redis")
    probe = " ".join(redis["readinessProbe"]["exec"]["command"])
    assert "redis-cli" in probe and " -a " not in probe and "PASSWORD" not in probe and "AUTH" not in probe, probe
    assert env_of(redis)["REDISCLI_AUTH"]["valueFrom"]["secretKeyRef"] == {"name": "kompaktor-redis", "key": "password"}
    assert ("--tls" in probe) == tls


def test_redis_password_can_come_from_an_existing_secret_and_stays_put() -> None:
    docs = render({"redis": {"existingSecret": "my-redis"}})
    assert ("kompaktor-redis", "kompaktor-system") not in by_name(docs, "Secret")  # no password rendered at all
    redis = container(docs, "StatefulSet", "kompaktor-redis", "redis")
    assert env_of(redis)["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "my-redis", "key": "password"}
    for cname in ("operator", "coordinator"):
        env = env_of(container(docs, "Deployment", "kompaktor-operator", cname))
        assert env["KOMPAKTOR_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {"name": "my-redis", "key": "url"}
    assert (
        env_of(container(docs, "Deployment", "kompaktor-operator", "operator"))["KOMPAKTOR_REDIS_SECRET"]["value"]
        == "my-redis"
    )
    # a given password renders the same Secret every time (GitOps); a generated one only on the cluster
    fixed = [
        by_name(render({"redis": {"password": "chosen"}}), "Secret")[("kompaktor-redis", "kompaktor-system")]
        for _ in range(2)
    ]
    assert fixed[0] == fixed[1] and fixed[0]["stringData"]["password"] == "chosen"


def test_each_role_connects_to_the_bundled_redis_as_its_own_user() -> None:
    """Issue 25 §2: a Redis user per role with the rights of kompaktor.metadata.acl, each
    password in its own Secret; compactor pods (in every namespace that holds them) get only the
    compactor's; the operator and the coordinator theirs."""
    from kompaktor.metadata import acl

    docs = render({"operator": {"watchNamespaces": ["team-a"]}})
    secrets = by_name(docs, "Secret")
    passwords = {}
    for role in acl.ROLES:
        secret = secrets[(f"kompaktor-redis-{role}", "kompaktor-system")]
        passwords[role] = secret["stringData"]["password"]
        assert (
            secret["stringData"]["url"]
            == f"redis://{role}:{passwords[role]}@kompaktor-redis.kompaktor-system.svc:6379/0"
        )
    assert len(set(passwords.values())) == len(acl.ROLES)
    assert secrets[("kompaktor-redis-compactor", "team-a")]["stringData"]["password"] == passwords["compactor"]
    assert ("kompaktor-redis-operator", "team-a") not in secrets and ("kompaktor-redis", "team-a") not in secrets
    redis = container(docs, "StatefulSet", "kompaktor-redis", "redis")
    config = redis["args"][0]
    for role in acl.ROLES:
        assert f"user {role} reset on >$REDIS_PASSWORD_{role.upper()} {acl.rights(role)}\n" in config
        assert env_of(redis)[f"REDIS_PASSWORD_{role.upper()}"]["valueFrom"]["secretKeyRef"] == {
            "name": f"kompaktor-redis-{role}",
            "key": "password",
        }
        assert passwords[role] not in config
    operator = env_of(container(docs, "Deployment", "kompaktor-operator", "operator"))
    assert operator["KOMPAKTOR_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "kompaktor-redis-operator",
        "key": "url",
    }
    assert operator["KOMPAKTOR_REDIS_SECRET"]["value"] == "kompaktor-redis-compactor"
    coordinator = env_of(container(docs, "Deployment", "kompaktor-operator", "coordinator"))
    assert coordinator["KOMPAKTOR_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "kompaktor-redis-coordinator",
        "key": "url",
    }
    # a given password (GitOps): the roles' are derived from it, the same at every render
    fixed = [by_name(render({"redis": {"password": "chosen"}}), "Secret") for _ in range(2)]
    for role in acl.ROLES:
        key = (f"kompaktor-redis-{role}", "kompaktor-system")
        assert fixed[0][key] == fixed[1][key] and fixed[0][key]["stringData"]["password"] != "chosen"
    # the operator's own Redis Secret, or an external Redis: one URL for all (docs/kubernetes.md)
    for values in ({"redis": {"existingSecret": "my-redis"}}, load(CHART / "ci" / "external-redis-values.yaml")):
        names = {n for n, _ in by_name(render(values), "Secret")}
        assert not {n for n in names if n.startswith("kompaktor-redis-")}, names


def test_what_a_group_may_use_reaches_the_operator() -> None:
    docs = render(
        {
            "compactor": {
                "allowedImages": ["registry.corp/kompaktor/*", "x/y:1"],
                "allowedServiceAccounts": ["irsa"],
                "allowedSecrets": ["team-redis"],
            }
        }
    )
    env = env_of(container(docs, "Deployment", "kompaktor-operator", "operator"))
    assert env["KOMPAKTOR_ALLOWED_IMAGES"]["value"] == "registry.corp/kompaktor/*,x/y:1"
    assert env["KOMPAKTOR_ALLOWED_SERVICE_ACCOUNTS"]["value"] == "irsa"
    assert env["KOMPAKTOR_ALLOWED_SECRETS"]["value"] == "team-redis"
    assert env["KOMPAKTOR_COMPACTOR_SERVICE_ACCOUNT"]["value"] == "kompaktor-compactor"
    default = env_of(container(render({}), "Deployment", "kompaktor-operator", "operator"))
    assert default["KOMPAKTOR_ALLOWED_IMAGES"]["value"] == ""  # the chart's compactor image only


def test_compactor_service_account_in_every_compactor_namespace_without_a_token() -> None:
    docs = render({"operator": {"watchNamespaces": ["tables", "analytics"]}})
    accounts = by_name(docs, "ServiceAccount")
    for ns in ("kompaktor-system", "tables", "analytics"):
        assert accounts[("kompaktor-compactor", ns)]["automountServiceAccountToken"] is False
    bound = {s["name"] for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding") for s in d["subjects"]}
    assert "kompaktor-compactor" not in bound  # no API rights


def test_namespaced_rbac_has_no_cluster_wide_pod_rights() -> None:
    docs = render({"operator": {"watchNamespaces": ["tables", "analytics"]}})
    for role in (d for d in docs if d["kind"] == "ClusterRole"):
        resources = {r for rule in role["rules"] for r in rule["resources"]}
        assert not resources & {"pods", "deployments", "services", "networkpolicies", "secrets"}, role["metadata"]
    roles = by_name(docs, "Role")
    assert {ns for (name, ns) in roles if name == "kompaktor-operator"} == {"tables", "analytics"}
    rules = roles[("kompaktor-operator", "tables")]["rules"]
    verbs = {(r, v) for rule in rules for r in rule["resources"] for v in rule["verbs"]}
    assert ("pods", "delete") in verbs and ("networkpolicies", "create") in verbs
    assert not {r for rule in rules for r in rule["resources"]} & {"secrets", "serviceaccounts"}
    bindings = by_name(docs, "RoleBinding")
    assert bindings[("kompaktor-operator", "analytics")]["subjects"] == [
        {"kind": "ServiceAccount", "name": "kompaktor-operator", "namespace": "kompaktor-system"}
    ]


def test_drain_token_secret_is_shared_by_operator_and_compactor_namespaces() -> None:
    docs = render({"operator": {"watchNamespaces": ["tables"]}})
    secrets = by_name(docs, "Secret")
    tokens = {secrets[("kompaktor-drain-token", ns)]["data"]["token"] for ns in ("kompaktor-system", "tables")}
    assert len(tokens) == 1 and len(tokens.pop()) >= 48  # one token, base64 of 48 characters
    env = env_of(container(docs, "Deployment", "kompaktor-operator", "operator"))
    assert env["KOMPAKTOR_DRAIN_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "kompaktor-drain-token",
        "key": "token",
    }
    assert env["KOMPAKTOR_DRAIN_TOKEN_SECRET"]["value"] == "kompaktor-drain-token"
    own = render({"drain": {"existingSecret": "my-drain"}})
    assert not [k for k in by_name(own, "Secret") if k[0] == "kompaktor-drain-token"]
    env = env_of(container(own, "Deployment", "kompaktor-operator", "operator"))
    assert env["KOMPAKTOR_DRAIN_TOKEN_SECRET"]["value"] == "my-drain"
    assert env["KOMPAKTOR_DRAIN_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "my-drain"


def test_the_group_key_is_the_operators_and_the_coordinators_alone() -> None:
    """Issue 34 §1: the key groups' tokens derive from, in the release's namespace only, read by
    the operator (it puts each group's token in its pods) and the coordinator (its broker checks
    them); no compactor namespace holds it. Set redis.password and it is the same every render."""
    docs = render({"operator": {"watchNamespaces": ["tables"]}})
    keys = [k for k in by_name(docs, "Secret") if k[0] == "kompaktor-group-key"]
    assert keys == [("kompaktor-group-key", "kompaktor-system")]
    for name in ("operator", "coordinator"):
        env = env_of(container(docs, "Deployment", "kompaktor-operator", name))
        assert env["KOMPAKTOR_GROUP_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "kompaktor-group-key", "key": "key"}
    fixed = [by_name(render({"redis": {"password": "p4ss"}}), "Secret")[("kompaktor-group-key", "kompaktor-system")]]
    fixed.append(
        by_name(render({"redis": {"password": "p4ss"}}), "Secret")[("kompaktor-group-key", "kompaktor-system")]
    )
    assert fixed[0]["data"] == fixed[1]["data"]


def test_network_policies_on_by_default_and_can_be_relaxed() -> None:
    docs = render({"operator": {"watchNamespaces": ["tables"]}})
    (redis,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert redis["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "redis"
    assert redis["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = redis["spec"]["ingress"]
    assert rule["ports"] == [{"port": 6379, "protocol": "TCP"}]
    peers = rule["from"]
    assert peers[0] == {
        "podSelector": {
            "matchLabels": {
                "app.kubernetes.io/name": "kompaktor",
                "app.kubernetes.io/instance": "kompaktor",
                "app.kubernetes.io/component": "operator",
            }
        }
    }
    compactors = {"app.kubernetes.io/part-of": "kompaktor", "app.kubernetes.io/component": "compactor"}
    assert peers[1] == {"podSelector": {"matchLabels": compactors}}
    assert peers[2] == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "tables"}},
        "podSelector": {"matchLabels": compactors},
    }
    assert len(peers) == 3  # nothing else reaches Redis
    env = env_of(container(docs, "Deployment", "kompaktor-operator", "operator"))
    assert env["KOMPAKTOR_NETWORK_POLICY"]["value"] == "true"
    assert json.loads(env["KOMPAKTOR_OPERATOR_POD_LABELS"]["value"]) == peers[0]["podSelector"]["matchLabels"]
    assert json.loads(env["KOMPAKTOR_METRICS_PEERS"]["value"]) == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    extra = {"podSelector": {"matchLabels": {"app": "kompaktor-cli"}}}
    relaxed = render({"networkPolicy": {"extraRedisClients": [extra]}})
    assert next(d for d in relaxed if d["kind"] == "NetworkPolicy")["spec"]["ingress"][0]["from"][-1] == extra
    off = render({"networkPolicy": {"enabled": False}})
    assert "NetworkPolicy" not in kinds(off)
    assert "KOMPAKTOR_NETWORK_POLICY" not in env_of(container(off, "Deployment", "kompaktor-operator", "operator"))


def test_bundled_redis_over_tls_with_a_generated_certificate() -> None:
    docs = render({"redis": {"tls": {"enabled": True}}, "operator": {"watchNamespaces": ["tables"]}})
    redis = container(docs, "StatefulSet", "kompaktor-redis", "redis")
    args = redis["args"][0].split()
    assert args[args.index("--port") + 1] == "0" and args[args.index("--tls-port") + 1] == "6379"
    assert args[args.index("--tls-auth-clients") + 1] == "no"
    secrets = by_name(docs, "Secret")
    tls = secrets[("kompaktor-redis-tls", "kompaktor-system")]
    assert tls["type"] == "kubernetes.io/tls" and set(tls["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    url = secrets[("kompaktor-redis", "kompaktor-system")]["stringData"]["url"]
    assert re.fullmatch(
        r"rediss://:[A-Za-z0-9]{32}@kompaktor-redis\.kompaktor-system\.svc:6379/0"
        r"\?ssl_ca_certs=/etc/kompaktor/redis-tls/ca\.crt",
        url,
    ), url
    cas = by_name(docs, "ConfigMap")
    import base64

    for ns in ("kompaktor-system", "tables"):  # the CA only, never the key, where compactors run
        assert cas[("kompaktor-redis-ca", ns)]["data"] == {"ca.crt": base64.b64decode(tls["data"]["ca.crt"]).decode()}
    for cname in ("operator", "coordinator"):
        c = container(docs, "Deployment", "kompaktor-operator", cname)
        assert {"name": "redis-ca", "mountPath": "/etc/kompaktor/redis-tls", "readOnly": True} in c["volumeMounts"]
    env = env_of(container(docs, "Deployment", "kompaktor-operator", "operator"))
    assert env["KOMPAKTOR_REDIS_CA_CONFIGMAP"]["value"] == "kompaktor-redis-ca"


def test_bundled_redis_tls_from_cert_manager_or_a_secret_needs_the_ca() -> None:
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    cm = {
        "redis": {
            "tls": {
                "enabled": True,
                "caCert": pem,
                "certManager": {"enabled": True, "issuerRef": {"name": "ca-issuer", "kind": "Issuer"}},
            }
        }
    }
    docs = render(cm)
    (cert,) = [d for d in docs if d["kind"] == "Certificate"]
    assert cert["spec"]["secretName"] == "kompaktor-redis-tls"
    assert "kompaktor-redis.kompaktor-system.svc" in cert["spec"]["dnsNames"]
    assert cert["spec"]["issuerRef"] == {"name": "ca-issuer", "kind": "Issuer"}
    assert ("kompaktor-redis-tls", "kompaktor-system") not in by_name(docs, "Secret")
    assert by_name(docs, "ConfigMap")[("kompaktor-redis-ca", "kompaktor-system")]["data"]["ca.crt"] == pem
    own = render({"redis": {"tls": {"enabled": True, "caCert": pem, "existingSecret": "redis-cert"}}})
    (sts,) = [d for d in own if d["kind"] == "StatefulSet"]
    assert sts["spec"]["template"]["spec"]["volumes"] == [{"name": "tls", "secret": {"secretName": "redis-cert"}}]
    for missing_ca in (
        {"redis": {"tls": {"enabled": True, "existingSecret": "redis-cert"}}},
        {"redis": {"tls": {"enabled": True, "certManager": {"enabled": True, "issuerRef": {"name": "x"}}}}},
    ):
        with pytest.raises(helm.HelmError, match=r"redis\.tls\.caCert"):
            render(missing_ca)


def test_operator_metrics_port_service_and_scrape_config() -> None:
    """The operator's /metrics: its container port, a Service the ServiceMonitor selects (same
    label and port name as the coordinator's) and the prometheus.io annotations for scrapers
    without the Prometheus Operator."""
    docs = render({"metrics": {"serviceMonitor": {"enabled": True}}})
    by = kinds(docs)
    (op,) = [d for d in by["Deployment"] if d["metadata"]["name"] == "kompaktor-operator"]
    c = container(docs, "Deployment", "kompaktor-operator", "operator")
    assert "--metrics-port=9091" in c["args"]
    assert {"name": "op-metrics", "containerPort": 9091, "protocol": "TCP"} in c["ports"]
    ports = [p["name"] for k in op["spec"]["template"]["spec"]["containers"] for p in k["ports"]]
    assert len(ports) == len(set(ports)), ports  # port names are unique in a pod
    svcs = {s["metadata"]["name"]: s for s in by["Service"]}
    svc = svcs["kompaktor-operator-metrics"]
    (port,) = svc["spec"]["ports"]
    assert port["port"] == 9091 and port["targetPort"] == "op-metrics"
    pod_labels = op["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    (sm,) = by["ServiceMonitor"]
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert port["name"] in {e["port"] for e in sm["spec"]["endpoints"]}
    assert sm["spec"]["namespaceSelector"] == {"any": True}
    for name, number in (("kompaktor-operator-metrics", "9091"), ("kompaktor-metrics", "9090")):
        assert svcs[name]["metadata"]["annotations"] == {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": number,
            "prometheus.io/path": "/metrics",
        }

    moved = render({"operator": {"metricsPort": 9100}})
    assert "--metrics-port=9100" in container(moved, "Deployment", "kompaktor-operator", "operator")["args"]
    svc = next(s for s in moved if s["kind"] == "Service" and s["metadata"]["name"] == "kompaktor-operator-metrics")
    assert svc["spec"]["ports"][0]["port"] == 9100 and svc["metadata"]["annotations"]["prometheus.io/port"] == "9100"
    # 6443 is free when the operator does not serve the metrics API
    assert (
        "--metrics-port=6443"
        in container(
            render({"operator": {"metricsPort": 6443}, "autoscaler": "hpa"}),
            "Deployment",
            "kompaktor-operator",
            "operator",
        )["args"]
    )
    for taken in (
        {"operator": {"metricsPort": 9090}},
        {"operator": {"metricsPort": 8080}},
        {"operator": {"metricsPort": 6443}},
        {"operator": {"metricsPort": 9200}, "coordinator": {"metricsPort": 9200}},
    ):
        with pytest.raises(helm.HelmError, match="is taken in the operator pod"):
            render(taken)
    with helm.Chart.load(str(CHART)) as chart, pytest.raises(helm.HelmError):
        chart.validate_schema({"operator": {"metricsPort": 80}})


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.stem)
def test_every_port_names_its_protocol_for_server_side_apply(values: Path) -> None:
    """Helm installs with server-side apply; on Kubernetes before 1.26 a port list entry without
    `protocol` fails it ("associative list with keys has an element that omits key field
    protocol"), which a real node's `helm install` of the bundled Redis hit first."""
    for doc in render(load(values)):
        spec = doc.get("spec") or {}
        for port in spec.get("ports") or [] if doc["kind"] == "Service" else []:
            assert port.get("protocol") == "TCP", (doc["metadata"]["name"], port)
        pod = ((spec.get("template") or {}).get("spec")) or {}
        for c in pod.get("containers", []) + pod.get("initContainers", []):
            for port in c.get("ports") or []:
                assert port.get("protocol") == "TCP", (doc["metadata"]["name"], c["name"], port)


def test_scheduled_backups_and_their_alerts_pass_promtool(tmp_path: Path) -> None:
    """The coordinator takes backups on the chart's schedule; the PrometheusRule's alerts name the
    metrics the coordinator exports and pass `promtool check rules`."""
    import subprocess

    from tests.promcheck import promtool

    by = kinds(render({"metrics": {"prometheusRule": {"enabled": True}}, "coordinator": {"backup": {"keep": 3}}}))
    args = container(by["Deployment"], "Deployment", "kompaktor-operator", "coordinator")["args"]
    assert "--backup-interval=3600" in args and "--backup-keep=3" in args
    assert not any(a.startswith("--bootstrap-from") for a in args)
    boot = kinds(render({"coordinator": {"backup": {"bootstrapFrom": "latest"}}}))
    assert (
        "--bootstrap-from=latest"
        in container(boot["Deployment"], "Deployment", "kompaktor-operator", "coordinator")["args"]
    )
    with helm.Chart.load(str(CHART)) as chart, pytest.raises(helm.HelmError):
        chart.validate_schema({"coordinator": {"backup": {"bootstrapFrom": "../x"}}})
    (rule,) = by["PrometheusRule"]
    exprs = " ".join(r["expr"] for g in rule["spec"]["groups"] for r in g["rules"])
    assert "kompaktor_backup_last_success_timestamp_seconds" in exprs and "> 10800" in exprs
    assert "kompaktor_backup_failures_total" in exprs
    f = tmp_path / "rules.yaml"
    f.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    out = subprocess.run([promtool(), "check", "rules", str(f)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "PrometheusRule" not in kinds(render({}))


def test_where_and_how_big_a_group_may_run_reaches_the_operator() -> None:
    """Issue 34 §3: the chart's scheduling and size rules are the operator's OperatorConfig."""
    from kompaktor.resources.operator_config import DEFAULT_MAX_RESOURCES, OperatorConfig

    toleration = {"key": "dedicated", "operator": "Equal", "value": "compaction", "effect": "NoSchedule"}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}
    values = {
        "compactor": {
            "allowedNodeSelectors": ["pool=compaction"],
            "allowedTolerations": [toleration],
            "allowedAffinities": [affinity],
            "allowedPriorityClasses": ["batch-low"],
            "maxResources": {"cpu": "8", "memory": "32Gi"},
        }
    }
    env = env_of(container(render(values), "Deployment", "kompaktor-operator", "operator"))
    cfg = OperatorConfig.from_env({k: v["value"] for k, v in env.items() if "value" in v})
    assert cfg.allowed_node_selectors == ("pool=compaction",) and cfg.allowed_priority_classes == ("batch-low",)
    assert cfg.allowed_tolerations == (toleration,) and cfg.allowed_affinities == (affinity,)
    # helm merges maps: what the values leave out keeps the default (null removes it)
    assert cfg.max_resources == {"cpu": "8", "memory": "32Gi", "ephemeral-storage": "1Ti"}
    default = env_of(container(render({}), "Deployment", "kompaktor-operator", "operator"))
    cfg = OperatorConfig.from_env({k: v["value"] for k, v in default.items() if "value" in v})
    assert cfg.allowed_node_selectors == () and cfg.allowed_tolerations == () and cfg.allowed_affinities == ()
    assert cfg.max_resources == DEFAULT_MAX_RESOURCES == load(CHART / "values.yaml")["compactor"]["maxResources"]
    with helm.Chart.load(str(CHART)) as chart, pytest.raises(helm.HelmError):
        chart.validate_schema({"compactor": {"allowedNodeSelectors": ["pool"]}})


def test_the_status_page_is_served_through_the_coordinator_service_and_an_optional_ingress() -> None:
    """Issue 36 §2: the coordinator serves /status on its metrics port, which Service
    kompaktor-metrics exposes; an Ingress, off by default, publishes /status alone (not /metrics)."""
    docs = render({})
    assert "Ingress" not in kinds(docs)
    svc = next(s for s in kinds(docs)["Service"] if s["metadata"]["name"] == "kompaktor-metrics")
    c = container(docs, "Deployment", "kompaktor-operator", "coordinator")
    (port,) = svc["spec"]["ports"]
    assert "--metrics-port=9090" in c["args"] and port["port"] == 9090
    assert port["targetPort"] in {p["name"] for p in c["ports"]}

    ing_values = {
        "enabled": True,
        "className": "nginx",
        "host": "kompaktor.example.com",
        "annotations": {"nginx.ingress.kubernetes.io/auth-type": "basic"},
        "tls": [{"secretName": "kompaktor-tls", "hosts": ["kompaktor.example.com"]}],
    }
    (ing,) = kinds(render({"coordinator": {"statusPage": {"ingress": ing_values}}}))["Ingress"]
    assert ing["metadata"]["name"] == "kompaktor-status"
    assert ing["metadata"]["annotations"] == ing_values["annotations"]
    assert ing["spec"]["ingressClassName"] == "nginx" and ing["spec"]["tls"] == ing_values["tls"]
    (rule,) = ing["spec"]["rules"]
    assert rule["host"] == "kompaktor.example.com"
    (path,) = rule["http"]["paths"]
    assert (path["path"], path["pathType"]) == ("/status", "Exact")
    assert path["backend"]["service"] == {"name": "kompaktor-metrics", "port": {"name": "http-metrics"}}
    # the smallest form: any host, the default class; no Ingress without the coordinator
    (bare,) = kinds(render({"coordinator": {"statusPage": {"ingress": {"enabled": True}}}}))["Ingress"]
    assert "host" not in bare["spec"]["rules"][0] and "ingressClassName" not in bare["spec"]
    off = render({"coordinator": {"enabled": False, "statusPage": {"ingress": {"enabled": True}}}})
    assert "Ingress" not in kinds(off)
    with pytest.raises(helm.HelmError, match="statusPage"):
        render({"coordinator": {"statusPage": {"ingress": {"enabled": True, "path": "/"}}}})
