"""The operator under kopf against kmock: children, status, scaling, user compactions.

Fast handler units only: what the real control-plane tier (tests/k8s) proves against a real
apiserver — invalid groups failed by the operator, ``kubectl delete compaction`` cancelling,
CRD schemas, RBAC, the HPA — is not asserted here again."""

from __future__ import annotations

from typing import Any

import pytest

from kompaktor.resources import api as crd
from kompaktor_operator import backend as backends
from kompaktor_operator import naming
from kompaktor_operator.runtime import Runtime
from kompaktor_operator.scaling import CompactorView

from .conftest import NS, Api, FakeBackend, eventually

pytestmark = [pytest.mark.operator, pytest.mark.asyncio]

GROUPS_RES = f"{crd.GROUP_VERSION}/{crd.GROUPS}"
SERVICES_RES = f"{crd.GROUP_VERSION}/{crd.SERVICES}"
COMPACTIONS_RES = f"{crd.GROUP_VERSION}/{crd.COMPACTIONS}"
DEPLOY = "apps/v1/deployments"
HPA = "autoscaling/v2/horizontalpodautoscalers"


def obj(kmock, res: str, name: str) -> dict[str, Any]:
    o = kmock.objects[res, NS, name]
    if o.deleted:
        raise KeyError(name)
    return o.raw


def gone(kmock, res: str, name: str) -> bool:
    key = (res, NS, name)
    try:
        return kmock.objects[key].deleted
    except KeyError:
        return True


def body(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A custom resource of ``kind`` as a user would apply it (generation 1)."""
    return {
        "apiVersion": crd.GROUP_VERSION,
        "kind": kind,
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "generation": 1, "resourceVersion": "1"},
        "spec": spec,
    }


def group_body(name: str, **spec: Any) -> dict[str, Any]:
    return body("CompactorGroup", name, spec)


def reconciles(rt: Runtime, kind: str, result: str) -> float:
    """kompaktor_operator_reconciles_total{kind,result} of the operator's Runtime (kopf runs in a thread here)."""
    value = rt.metrics.registry.get_sample_value(
        "kompaktor_operator_reconciles_total", {"kind": kind, "result": result}
    )
    assert value is not None
    return value


async def test_group_creates_children_and_status(operator, api: Api, backend: FakeBackend) -> None:
    kmock = operator
    await api.create(GROUPS_RES, group_body("small", minReplicas=2, maxReplicas=6, jobsPerReplica=2))

    dep = await eventually(lambda: obj(kmock, DEPLOY, "kompaktor-small"), what="Deployment")
    assert dep["spec"]["replicas"] == 2
    assert dep["metadata"]["ownerReferences"][0]["kind"] == "CompactorGroup"
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:3] == ["compactor", "--group", "small"]
    hpa = await eventually(lambda: obj(kmock, HPA, "kompaktor-small"), what="HPA")
    assert hpa["spec"]["scaleTargetRef"]["kind"] == "CompactorGroup"
    assert hpa["spec"]["metrics"][0]["external"]["target"]["averageValue"] == "2"
    await eventually(lambda: obj(kmock, "v1/services", "kompaktor-small-metrics"), what="metrics Service")
    assert backend.groups["small"].max_replicas == 6

    def ready() -> bool:
        status = obj(kmock, GROUPS_RES, "small").get("status", {})
        conds = {c["type"]: c for c in status.get("conditions", [])}
        return (
            conds["Ready"]["status"] == "True"
            and status["observedGeneration"] == 1
            and status["selector"] == naming.selector("small")
            and status["replicas"] == 2
            and "Degraded" in conds
        )

    await eventually(ready, what="Ready status with replicas and selector")
    # a second reconcile (kopf may replay) changes nothing and never fails with 409
    posts = [r for r in list(kmock) if r.method == "POST" and "deployments" in str(r.url)]
    assert len(posts) == 1


async def test_spec_change_patches_children_and_switches_autoscaler(operator, api: Api, backend: FakeBackend) -> None:
    kmock = operator
    await api.create(GROUPS_RES, group_body("g", maxReplicas=3))
    await eventually(lambda: obj(kmock, HPA, "kompaktor-g"), what="HPA")
    await api.patch(
        GROUPS_RES,
        "g",
        {
            "metadata": {"generation": 2},
            "spec": {"autoscaler": "keda", "minReplicas": 0, "maxReplicas": 9, "drainGraceSeconds": 42},
        },
    )
    so = await eventually(lambda: obj(kmock, "keda.sh/v1alpha1/scaledobjects", "kompaktor-g"), what="ScaledObject")
    assert so["spec"]["maxReplicaCount"] == 9 and so["spec"]["minReplicaCount"] == 0
    await eventually(lambda: gone(kmock, HPA, "kompaktor-g"), what="HPA removed")

    def patched() -> bool:
        pod = obj(kmock, DEPLOY, "kompaktor-g")["spec"]["template"]["spec"]
        return pod["terminationGracePeriodSeconds"] == 42 + 30

    await eventually(patched, what="Deployment patched")


async def test_a_groups_settings_reach_redis_only_and_a_change_rolls_the_pods(
    operator, api: Api, backend: FakeBackend
) -> None:
    """Issue 26 §1: the operator stores the group's settings (the compactor's one channel) and
    passes none as pod arguments; a changed setting is stored and changes the pod template's
    digest (a rollout), and the digest is that of what was stored."""
    from kompaktor_operator.naming import SETTINGS_ANNOTATION

    kmock = operator
    conf = {"spark.sql.shuffle.partitions": "2"}
    spark = {"engine": "arrow", "master": "local[1]", "conf": conf, "driverMemory": "512m"}
    await api.create(GROUPS_RES, group_body("s", spark=spark, drainGraceSeconds=40))
    dep = await eventually(lambda: obj(kmock, DEPLOY, "kompaktor-s"), what="Deployment")
    template = dep["spec"]["template"]
    assert template["spec"]["containers"][0]["args"] == [
        "compactor",
        "--group",
        "s",
        "--http-port",
        "8080",
        "--stay-drained",
        "--broker",
    ]
    cfg = backend.groups["s"]
    assert (cfg.engine, cfg.spark_master, dict(cfg.spark_conf), cfg.driver_memory, cfg.drain_grace_seconds) == (
        "arrow",
        "local[1]",
        {"spark.sql.shuffle.partitions": "2"},
        "512m",
        40,
    )
    first = template["metadata"]["annotations"][SETTINGS_ANNOTATION]
    assert first == cfg.settings_digest()

    await api.patch(
        GROUPS_RES, "s", {"metadata": {"generation": 2}, "spec": {"spark": {**spark, "master": "local[2]"}}}
    )

    def rolled() -> bool:
        annotations = obj(kmock, DEPLOY, "kompaktor-s")["spec"]["template"]["metadata"]["annotations"]
        return annotations[SETTINGS_ANNOTATION] != first

    await eventually(rolled, what="pod template with the new settings digest")
    cfg = backend.groups["s"]
    assert cfg.spark_master == "local[2]"
    annotations = obj(kmock, DEPLOY, "kompaktor-s")["spec"]["template"]["metadata"]["annotations"]
    assert annotations[SETTINGS_ANNOTATION] == cfg.settings_digest()


async def test_a_groups_resume_settings_reach_redis_and_a_bad_one_changes_nothing(
    operator, api: Api, backend: FakeBackend
) -> None:
    """spec.resume is stored with the group's other settings and rolls its pods like them; a
    negative or unparsable size is an invalid spec: Ready=False naming the field, the stored
    settings and the pods as they were."""
    from kompaktor_operator.naming import SETTINGS_ANNOTATION

    kmock = operator
    await api.create(GROUPS_RES, group_body("r", resume={"minInputSize": "2Gi"}))
    dep = await eventually(lambda: obj(kmock, DEPLOY, "kompaktor-r"), what="Deployment")
    cfg = backend.groups["r"]
    assert (cfg.resume, cfg.resume_min_bytes) == (True, 2 << 30)
    first = dep["spec"]["template"]["metadata"]["annotations"][SETTINGS_ANNOTATION]
    assert first == cfg.settings_digest()

    await api.patch(
        GROUPS_RES, "r", {"metadata": {"generation": 2}, "spec": {"resume": {"enabled": False, "minInputSize": "2Gi"}}}
    )

    def rolled() -> bool:
        annotations = obj(kmock, DEPLOY, "kompaktor-r")["spec"]["template"]["metadata"]["annotations"]
        return annotations[SETTINGS_ANNOTATION] != first

    await eventually(rolled, what="pod template with the new settings digest")
    cfg = backend.groups["r"]
    assert (cfg.resume, cfg.resume_min_bytes) == (False, 2 << 30)
    digest = cfg.settings_digest()

    for generation, bad, words in (
        (3, {"enabled": True, "minInputSize": "-1Gi"}, "resume.minInputSize: '-1Gi' is negative"),
        (4, {"enabled": True, "minInputSize": "2GB"}, "resume.minInputSize: '2GB' is not a Kubernetes quantity"),
    ):
        await api.patch(GROUPS_RES, "r", {"metadata": {"generation": generation}, "spec": {"resume": bad}})

        def refused(generation: int = generation) -> dict[str, Any] | None:
            ready = next(c for c in obj(kmock, GROUPS_RES, "r")["status"]["conditions"] if c["type"] == "Ready")
            return ready if ready["status"] == "False" and ready.get("observedGeneration") == generation else None

        ready = await eventually(refused, what=f"Ready=False for generation {generation}")
        assert ready["reason"] == "InvalidSpec" and words in ready["message"], ready
        assert backend.groups["r"] == cfg  # the stored settings are the last valid ones
        annotations = obj(kmock, DEPLOY, "kompaktor-r")["spec"]["template"]["metadata"]["annotations"]
        assert annotations[SETTINGS_ANNOTATION] == digest


async def test_a_groups_history_bounds_reach_redis_and_a_bad_one_changes_nothing(
    operator, api: Api, backend: FakeBackend
) -> None:
    """spec.history is stored with the group's other settings (its compactors trim the group's
    history to it) and rolls its pods like them; a bound out of range is an invalid spec:
    Ready=False naming the field in one line, the stored settings and the pods as they were."""
    from kompaktor_operator.naming import SETTINGS_ANNOTATION

    kmock = operator
    await api.create(GROUPS_RES, group_body("h"))
    dep = await eventually(lambda: obj(kmock, DEPLOY, "kompaktor-h"), what="Deployment")
    cfg = backend.groups["h"]
    assert (cfg.history_records, cfg.history_age_seconds) == (10_000, 7 * 86_400)  # the defaults
    first = dep["spec"]["template"]["metadata"]["annotations"][SETTINGS_ANNOTATION]

    history = {"maxRecords": 2000, "maxAgeSeconds": 86_400}
    await api.patch(GROUPS_RES, "h", {"metadata": {"generation": 2}, "spec": {"history": history}})

    def rolled() -> bool:
        annotations = obj(kmock, DEPLOY, "kompaktor-h")["spec"]["template"]["metadata"]["annotations"]
        return annotations[SETTINGS_ANNOTATION] != first

    await eventually(rolled, what="pod template with the new settings digest")
    cfg = backend.groups["h"]
    assert (cfg.history_records, cfg.history_age_seconds) == (2000, 86_400)
    digest = cfg.settings_digest()
    assert (
        obj(kmock, DEPLOY, "kompaktor-h")["spec"]["template"]["metadata"]["annotations"][SETTINGS_ANNOTATION] == digest
    )

    for generation, bad, words in (
        (3, {"maxRecords": 0}, "history.maxRecords: Input should be greater than or equal to 1"),
        (4, {"maxAgeSeconds": "a week"}, "history.maxAgeSeconds: Input should be a valid integer"),
    ):
        await api.patch(GROUPS_RES, "h", {"metadata": {"generation": generation}, "spec": {"history": bad}})

        def refused(generation: int = generation) -> dict[str, Any] | None:
            ready = next(c for c in obj(kmock, GROUPS_RES, "h")["status"]["conditions"] if c["type"] == "Ready")
            return ready if ready["status"] == "False" and ready.get("observedGeneration") == generation else None

        ready = await eventually(refused, what=f"Ready=False for generation {generation}")
        assert ready["reason"] == "InvalidSpec" and words in ready["message"], ready
        assert "\n" not in ready["message"]
        assert backend.groups["h"] == cfg  # the stored settings are the last valid ones
        annotations = obj(kmock, DEPLOY, "kompaktor-h")["spec"]["template"]["metadata"]["annotations"]
        assert annotations[SETTINGS_ANNOTATION] == digest


@pytest.mark.parametrize(
    "spec, rule",
    [
        ({"image": "evil.example/miner:latest"}, "ImageNotAllowed"),
        ({"serviceAccountName": "default"}, "ServiceAccountNotAllowed"),
        ({"redis": {"secretName": "payroll-db"}}, "SecretNotAllowed"),
        # issue 34 §3: where and how big, only as the chart lists
        ({"nodeSelector": {"node-role.kubernetes.io/control-plane": ""}}, "NodeSelectorNotAllowed"),
        ({"tolerations": [{"operator": "Exists"}]}, "TolerationNotAllowed"),
        ({"affinity": {"podAffinity": {}}}, "AffinityNotAllowed"),
        ({"priorityClassName": "system-node-critical"}, "PriorityClassNotAllowed"),
        ({"resources": {"requests": {"cpu": "1000"}}}, "ResourcesNotAllowed"),
        ({"storage": {"uri": "file:///tmp/allowed/%2e%2e/etc"}}, "StorageNotAllowed"),
    ],
)
async def test_hostile_group_is_refused_and_nothing_is_created(
    operator, operator_runtime: Runtime, api: Api, backend: FakeBackend, spec: dict[str, Any], rule: str
) -> None:
    kmock = operator
    refused0 = reconciles(operator_runtime, "CompactorGroup", "refused")
    await api.create(GROUPS_RES, group_body("hostile", **spec))

    def refused() -> dict[str, Any] | None:
        conds = obj(kmock, GROUPS_RES, "hostile")["status"]["conditions"]
        ready = next(c for c in conds if c["type"] == "Ready")
        return ready if ready["status"] == "False" else None

    ready = await eventually(refused, what=f"Ready=False {rule}")
    assert ready["reason"] == rule and ready["message"].startswith("refused: "), ready
    assert "\n" not in ready["message"]
    # nothing created: no child of any kind, nothing stored for the coordinator
    assert not [
        r
        for r in list(kmock)
        if r.method in ("POST", "PATCH") and "hostile" in str(r.url) and "compactorgroups" not in str(r.url)
    ]
    for res in (DEPLOY, HPA, "v1/services"):
        assert gone(kmock, res, "kompaktor-hostile")
    assert "hostile" not in backend.groups
    assert reconciles(operator_runtime, "CompactorGroup", "refused") > refused0


async def test_a_group_named_with_non_ascii_letters_is_refused(operator, api: Api, backend: FakeBackend) -> None:
    """The operator's own check of a group's name is the models' (ASCII DNS label): "grüppe" was
    accepted by a str.isalnum() check, while the models refuse it."""
    kmock = operator
    await api.create(GROUPS_RES, group_body("grüppe"))

    def refused() -> dict[str, Any] | None:
        conds = (obj(kmock, GROUPS_RES, "grüppe").get("status") or {}).get("conditions") or []
        return next((c for c in conds if c["type"] == "Ready" and c["status"] == "False"), None)

    ready = await eventually(refused, what="Ready=False InvalidName")
    assert ready["reason"] == "InvalidName" and "DNS label" in ready["message"], ready
    assert "grüppe" not in backend.groups and gone(kmock, DEPLOY, "kompaktor-grüppe")


async def test_group_changed_to_a_refused_image_keeps_what_its_allowed_spec_made(
    operator, api: Api, backend: FakeBackend
) -> None:
    kmock = operator
    await api.create(GROUPS_RES, group_body("turned", maxReplicas=3))
    dep = await eventually(lambda: obj(kmock, DEPLOY, "kompaktor-turned"), what="Deployment")
    image = dep["spec"]["template"]["spec"]["containers"][0]["image"]
    await api.patch(
        GROUPS_RES, "turned", {"metadata": {"generation": 2}, "spec": {"image": "evil.example/miner:latest"}}
    )

    def refused() -> dict[str, Any] | None:
        ready = next(c for c in obj(kmock, GROUPS_RES, "turned")["status"]["conditions"] if c["type"] == "Ready")
        return ready if ready["status"] == "False" and ready.get("observedGeneration") == 2 else None

    ready = await eventually(refused, what="Ready=False for generation 2")
    assert ready["reason"] == "ImageNotAllowed" and "evil.example/miner:latest" in ready["message"]
    assert obj(kmock, DEPLOY, "kompaktor-turned")["spec"]["template"]["spec"]["containers"][0]["image"] == image


def pod(name: str, group: str, ready: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": naming.selector_labels(group)},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def replica_patches(kmock: Any, deployment: str) -> list[int]:
    """The spec.replicas values the operator wrote to ``deployment``, in order."""
    return [
        r.data["spec"]["replicas"]
        for r in list(kmock)
        if r.method == "PATCH"
        and f"deployments/{deployment}" in str(r.url)
        and isinstance(r.data, dict)
        and "replicas" in r.data.get("spec", {})
    ]


async def test_scale_down_drains_idle_first_then_the_soonest_done_never_stops_a_job(
    operator, api: Api, backend: FakeBackend
) -> None:
    """The HPA lowers spec.replicas 3 -> 1 while jobs are queued: the idle compactor and the busy
    one whose job ends soonest are asked to drain at once; each goes once drained, never before."""
    kmock = operator
    backend.figures["w"] = backends.QueueFigures(queued=30, running=2)
    backend.heartbeats["w"] = {
        "w-a": CompactorView("w-a", "busy", "ECID-1", remaining_s=100.0),
        "w-b": CompactorView("w-b", "idle"),
        "w-c": CompactorView("w-c", "busy", "ECID-2", remaining_s=5.0),
    }
    for name in ("w-a", "w-b", "w-c"):
        await api.create("v1/pods", pod(name, "w"))
    await api.create(GROUPS_RES, group_body("w", minReplicas=1, maxReplicas=5, replicas=3))
    await eventually(lambda: obj(kmock, DEPLOY, "kompaktor-w")["spec"]["replicas"] == 3, what="3 replicas")

    # the HPA writes spec.replicas through the scale subresource
    await api.patch(GROUPS_RES, "w", {"spec": {"replicas": 1}})
    await eventually(
        lambda: obj(kmock, DEPLOY, "kompaktor-w")["spec"]["replicas"] == 2,
        what="the idle compactor drained and removed",
    )
    assert set(backend.drained) == {"w-b", "w-c"}, "the idle one and the busy one that ends soonest"
    annotations = obj(kmock, "v1/pods", "w-b")["metadata"]["annotations"]
    assert annotations[naming.POD_DELETION_COST] == naming.VICTIM_DELETION_COST
    for busy in ("w-a", "w-c"):  # still holding jobs: never the victim cost
        assert naming.POD_DELETION_COST not in (obj(kmock, "v1/pods", busy)["metadata"].get("annotations") or {})
    await eventually(lambda: obj(kmock, GROUPS_RES, "w")["status"]["draining"] == ["w-c"], what="w-c waited for")
    assert min(replica_patches(kmock, "kompaktor-w")) == 2
    assert obj(kmock, GROUPS_RES, "w")["status"]["desiredReplicas"] == 1

    # w-c finishes its job: drained, it goes too; w-a, busy for longer, is never asked
    backend.heartbeats["w"]["w-c"] = CompactorView("w-c", "draining")
    await api.delete("v1/pods", "w-b")
    await eventually(lambda: obj(kmock, DEPLOY, "kompaktor-w")["spec"]["replicas"] == 1, what="scaled to 1")
    assert "w-a" not in backend.drained


async def test_a_lowered_cap_is_obeyed_while_every_compactor_is_busy(operator, api: Api, backend: FakeBackend) -> None:
    """maxReplicas 3 -> 1 with the queue never empty (issue 33 §2): the two compactors whose jobs
    end soonest drain; the group reaches 1 as soon as they finish, not when the queue empties."""
    kmock = operator
    backend.figures["cap"] = backends.QueueFigures(queued=40, running=3)
    backend.heartbeats["cap"] = {
        f"cap-{i}": CompactorView(f"cap-{i}", "busy", f"ECID-{i}", remaining_s=left)
        for i, left in enumerate((3.0, 60.0, 8.0))
    }
    for name in backend.heartbeats["cap"]:
        await api.create("v1/pods", pod(name, "cap"))
    await api.create(GROUPS_RES, group_body("cap", minReplicas=1, maxReplicas=3, replicas=3))
    await eventually(lambda: obj(kmock, DEPLOY, "kompaktor-cap")["spec"]["replicas"] == 3, what="3 replicas")
    await api.patch(GROUPS_RES, "cap", {"spec": {"maxReplicas": 1}})
    await eventually(lambda: set(backend.drained) == {"cap-0", "cap-2"}, what="the two soonest done asked to drain")
    assert obj(kmock, DEPLOY, "kompaktor-cap")["spec"]["replicas"] == 3  # both still hold a job
    for name in ("cap-0", "cap-2"):  # their jobs end: drained (the queue is as full as before)
        backend.heartbeats["cap"][name] = CompactorView(name, "draining")
    await eventually(lambda: obj(kmock, DEPLOY, "kompaktor-cap")["spec"]["replicas"] == 1, what="scaled to 1")
    assert "cap-1" not in backend.drained
    assert min(replica_patches(kmock, "kompaktor-cap")) == 1


async def test_degraded_when_work_is_queued_and_nothing_is_ready(operator, api: Api, backend: FakeBackend) -> None:
    kmock = operator
    backend.figures["q"] = backends.QueueFigures(queued=7, running=0, oldest_age_s=12.5)
    await api.create(GROUPS_RES, group_body("q"))

    def degraded() -> bool:
        status = obj(kmock, GROUPS_RES, "q")["status"]
        cond = next(c for c in status["conditions"] if c["type"] == "Degraded")
        return cond["status"] == "True" and cond["reason"] == "NoReadyCompactors" and status["queued"] == 7

    await eventually(degraded, what="Degraded=True")
    assert obj(kmock, GROUPS_RES, "q")["status"]["oldestQueuedAgeSeconds"] == 12.5


async def test_deleting_a_group_removes_children_and_store_entry(operator, api: Api, backend: FakeBackend) -> None:
    kmock = operator
    await api.create(GROUPS_RES, group_body("d"))
    await eventually(lambda: obj(kmock, HPA, "kompaktor-d"), what="HPA")
    await eventually(
        lambda: naming.FINALIZER in obj(kmock, GROUPS_RES, "d")["metadata"].get("finalizers", []), what="finalizer"
    )
    await api.delete(GROUPS_RES, "d")
    await eventually(
        lambda: gone(kmock, DEPLOY, "kompaktor-d") and gone(kmock, HPA, "kompaktor-d"), what="children deleted"
    )
    await eventually(lambda: "d" not in backend.groups, what="group removed from the store")


async def test_a_deleted_group_leaves_no_idle_clock(
    operator, operator_runtime: Runtime, api: Api, backend: FakeBackend
) -> None:
    """An idle group scaled to zero has an idle clock in the Runtime; deleting the group drops it."""
    await api.create(GROUPS_RES, group_body("idle", minReplicas=0))
    await eventually(lambda: (NS, "idle") in operator_runtime.idle_since, what="the idle clock started")
    await api.delete(GROUPS_RES, "idle")
    await eventually(lambda: "idle" not in backend.groups, what="group removed from the store")
    assert (NS, "idle") not in operator_runtime.idle_since


async def test_service_stored_with_status_and_missing_group(operator, api: Api, backend: FakeBackend) -> None:
    kmock = operator
    backend.figures["small"] = backends.QueueFigures(queued=4, running=2)
    await api.create(GROUPS_RES, group_body("small"))
    await api.create(
        SERVICES_RES,
        body(
            "CompactionService",
            "cs1",
            {
                "tiers": [
                    {"name": "small", "maxSize": "32Mi", "compactorGroup": "small"},
                    {"name": "large", "compactorGroup": "large"},
                ]
            },
        ),
    )
    await eventually(lambda: "cs1" in backend.services, what="service stored")
    assert backend.services["cs1"].tiers[0].max_size == 33_554_432

    def status_ok() -> bool:
        st = obj(kmock, SERVICES_RES, "cs1")["status"]
        conds = {c["type"]: c for c in st["conditions"]}
        return (
            st["queued"] == 4
            and st["running"] == 2
            and conds["Ready"]["status"] == "True"
            and conds["Degraded"]["reason"] == "CompactorGroupMissing"
            and "large" in conds["Degraded"]["message"]
        )

    await eventually(status_ok, what="service status")


async def test_invalid_service_tiers_are_reported(operator, api: Api, backend: FakeBackend) -> None:
    kmock = operator
    await api.create(
        SERVICES_RES,
        body(
            "CompactionService",
            "bad",
            {"tiers": [{"name": "a", "compactorGroup": "a"}, {"name": "b", "maxSize": "1Gi", "compactorGroup": "b"}]},
        ),
    )

    def failed() -> bool:
        ready = next(c for c in obj(kmock, SERVICES_RES, "bad")["status"]["conditions"] if c["type"] == "Ready")
        return ready["status"] == "False" and "only the last tier may be unbounded" in ready["message"]

    await eventually(failed, what="Ready=False")
    assert "bad" not in backend.services


def compaction_body(name: str, **spec: Any) -> dict[str, Any]:
    return body("Compaction", name, spec)


async def test_compaction_start_track_succeed(operator, api: Api, backend: FakeBackend) -> None:
    kmock = operator
    await api.create(
        COMPACTIONS_RES,
        compaction_body("c1", table="ci", startRow="a", endRow="m", iterators={"ageOff": {"ttlSeconds": 3600}}),
    )
    await eventually(lambda: obj(kmock, COMPACTIONS_RES, "c1")["status"]["compactionId"] == "UC-000001", what="started")
    (cid,) = backend.started
    assert backend.compactions[cid]["rows"] == (b"a", b"m")
    assert backend.compactions[cid]["iterators"] == {"ageoff_ttl_ms": 3_600_000}
    backend.compactions[cid]["done"] = 2
    await eventually(lambda: obj(kmock, COMPACTIONS_RES, "c1")["status"]["tabletsDone"] == 2, what="progress")
    assert obj(kmock, COMPACTIONS_RES, "c1")["status"]["phase"] == "Running"
    backend.compactions[cid].update(state="Succeeded", done=3, message="3/3 tablets compacted")

    def done() -> bool:
        st = obj(kmock, COMPACTIONS_RES, "c1")["status"]
        return st["phase"] == "Succeeded" and st["tabletsTotal"] == 3 and st["endTime"]

    await eventually(done, what="Succeeded")
    assert backend.started == [cid], "started exactly once"


async def test_compaction_rejected_by_the_store_fails_cleanly(
    operator, operator_runtime: Runtime, api: Api, backend: FakeBackend
) -> None:
    kmock = operator
    refused0, ok0 = (
        reconciles(operator_runtime, "Compaction", "refused"),
        reconciles(operator_runtime, "Compaction", "ok"),
    )
    await api.create(COMPACTIONS_RES, compaction_body("c3", table="missing"))

    def failed() -> bool:
        st = obj(kmock, COMPACTIONS_RES, "c3")["status"]
        return st["phase"] == "Failed" and "unknown table" in st["message"]

    await eventually(failed, what="Failed")
    assert backend.started == []
    assert (
        reconciles(operator_runtime, "Compaction", "refused") == refused0 + 1
        and reconciles(operator_runtime, "Compaction", "ok") == ok0
    )


async def test_redis_down_is_retried_not_fatal(
    operator, operator_runtime: Runtime, api: Api, backend: FakeBackend
) -> None:
    kmock = operator
    error0, ok0 = (
        reconciles(operator_runtime, "CompactorGroup", "error"),
        reconciles(operator_runtime, "CompactorGroup", "ok"),
    )
    backend.unavailable = True
    await api.create(GROUPS_RES, group_body("r"))

    def retrying() -> bool:
        progress = obj(kmock, GROUPS_RES, "r")["metadata"].get("annotations", {})
        return any("reconcile" in key and "retries" in value for key, value in progress.items())

    await eventually(retrying, what="kopf records a retry")
    assert gone(kmock, DEPLOY, "kompaktor-r"), "nothing applied before the group was stored"
    backend.unavailable = False
    await eventually(lambda: "r" in backend.groups, what="retried after Redis returned")
    await eventually(lambda: obj(kmock, DEPLOY, "kompaktor-r"), what="Deployment after the retry")
    await eventually(
        lambda: reconciles(operator_runtime, "CompactorGroup", "ok") > ok0, what="the retried reconcile counted ok"
    )
    assert reconciles(operator_runtime, "CompactorGroup", "error") > error0  # the attempt while Redis was down
