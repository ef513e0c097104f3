"""What a CompactorGroup says about pods that cannot run (kompaktor_operator.podhealth).

The pod objects are shaped as a kubelet 1.20 and the kube-scheduler write them; the real node
tier (tests/k8s/test_real_node.py) makes each failure happen and checks the condition."""

from __future__ import annotations

from typing import Any

from kompaktor_operator import podhealth

IMAGE = "ghcr.io/kompaktor/kompaktor-compactor:0.3.0"


def _pod(
    name: str = "kompaktor-big-0",
    *,
    statuses: list[dict[str, Any]] | None = None,
    conditions: list[dict[str, Any]] | None = None,
    memory: str | None = "64Mi",
    deleting: bool = False,
) -> dict[str, Any]:
    limits = {"memory": memory} if memory else {}
    meta: dict[str, Any] = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-25T12:00:00Z"
    status: dict[str, Any] = {"phase": "Pending", "conditions": conditions or []}
    if statuses is not None:
        status["containerStatuses"] = statuses
    return {
        "metadata": meta,
        "spec": {"containers": [{"name": "compactor", "image": IMAGE, "resources": {"limits": limits}}]},
        "status": status,
    }


def _cs(state: dict[str, Any], last: dict[str, Any] | None = None, restarts: int = 0) -> dict[str, Any]:
    return {
        "name": "compactor",
        "image": IMAGE,
        "ready": False,
        "restartCount": restarts,
        "state": state,
        "lastState": last or {},
    }


RUNNING = _cs({"running": {"startedAt": "2026-11-25T12:00:00Z"}})


def test_running_pods_have_no_finding() -> None:
    assert podhealth.diagnose([_pod(statuses=[RUNNING]), _pod("b", statuses=[RUNNING])]) is None
    assert podhealth.diagnose([]) is None


def test_an_image_that_cannot_be_pulled_names_the_image_and_the_registrys_words() -> None:
    pod = _pod(
        statuses=[_cs({"waiting": {"reason": "ImagePullBackOff", "message": f'Back-off pulling image "{IMAGE}"'}})]
    )
    f = podhealth.diagnose([pod])
    assert f is not None and f.reason == podhealth.IMAGE_PULL_FAILED
    assert IMAGE in f.message and "ImagePullBackOff" in f.message and "kompaktor-big-0" in f.message


def test_a_crash_loop_quotes_the_last_exit_and_its_log_tail() -> None:
    last = {
        "terminated": {
            "reason": "Error",
            "exitCode": 1,
            "message": "INFO starting\nkompaktor: error: the Spark master spark://nowhere:7077 does not answer\n\n",
        }
    }
    pod = _pod(statuses=[_cs({"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s"}}, last, 2)])
    f = podhealth.diagnose([pod])
    assert f is not None and f.reason == podhealth.CRASH_LOOP
    assert "Error (exit code 1)" in f.message and "spark://nowhere:7077 does not answer" in f.message
    assert "2 restart(s)" in f.message and "\n" not in f.message


def test_oom_killed_names_the_limit_and_wins_over_the_crash_loop_it_causes() -> None:
    last = {"terminated": {"reason": "OOMKilled", "exitCode": 137}}
    pod = _pod(statuses=[_cs({"waiting": {"reason": "CrashLoopBackOff"}}, last, 3)])
    f = podhealth.diagnose([pod])
    assert f is not None and f.reason == podhealth.OOM_KILLED and "64Mi" in f.message
    # also while the container is down (terminated now) and when no limit is set
    now = _pod(statuses=[_cs({"terminated": {"reason": "OOMKilled", "exitCode": 137}})], memory=None)
    f = podhealth.diagnose([now])
    assert f is not None and f.reason == podhealth.OOM_KILLED and "no limit" in f.message


def test_unschedulable_quotes_the_scheduler() -> None:
    why = "0/1 nodes are available: 1 Insufficient cpu."
    pod = _pod(conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": why}])
    f = podhealth.diagnose([pod])
    assert f is not None and f.reason == podhealth.UNSCHEDULABLE and why in f.message


def test_counts_pods_and_reports_the_most_actionable_reason() -> None:
    unsched = _pod(
        "a",
        conditions=[
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes are available"}
        ],
    )
    pulls = [_pod(n, statuses=[_cs({"waiting": {"reason": "ErrImagePull"}})]) for n in ("b", "c")]
    f = podhealth.diagnose([unsched, *pulls, _pod("d", statuses=[RUNNING])])
    assert f is not None and f.reason == podhealth.IMAGE_PULL_FAILED and f.pods == 2
    assert f.message.startswith("2 pods, e.g. b:")


def test_terminating_pods_and_ordinary_waits_are_not_failures() -> None:
    scaled_down = _pod(statuses=[_cs({"terminated": {"reason": "OOMKilled"}})], deleting=True)
    starting = _pod(statuses=[_cs({"waiting": {"reason": "ContainerCreating"}})])
    pending = _pod(conditions=[{"type": "PodScheduled", "status": "True"}])
    assert podhealth.diagnose([scaled_down, starting, pending]) is None


def test_a_long_message_is_cut_to_fit_a_condition() -> None:
    last = {"terminated": {"reason": "Error", "exitCode": 1, "message": "x" * 5000}}
    f = podhealth.diagnose([_pod(statuses=[_cs({"waiting": {"reason": "CrashLoopBackOff"}}, last, 1)])])
    assert f is not None and len(f.message) <= 600


def test_a_compactor_refusing_its_groups_settings_says_why_on_the_compactor_group() -> None:
    """Issue 34 §2: the compactor's one-line refusal of settings written into Redis outside the
    operator is the group's PodsHealthy message (the container's log tail, FallbackToLogsOnError)."""
    import pytest

    from kompaktor.model.errors import KompaktorError
    from kompaktor.policy.services import GroupConfig
    from kompaktor.worker.assemble import refuse_unadmitted

    tampered = GroupConfig("big", spark_conf={"spark.jars": "http://evil.example/x.jar"})
    with pytest.raises(KompaktorError) as refused:
        refuse_unadmitted("big", tampered, "0123456789abcdef")
    log = f"WARNING kompaktor.connection: not durable\nerror: {refused.value}\n"
    last = {"terminated": {"reason": "Error", "exitCode": 1, "message": log}}
    pod = _pod(statuses=[_cs({"waiting": {"reason": "CrashLoopBackOff"}}, last, 1)])
    f = podhealth.diagnose([pod])
    assert f is not None and f.reason == podhealth.CRASH_LOOP
    assert "settings in Redis (kz:groups) are not allowed in this pod" in f.message
    assert "'spark.jars' is not allowed" in f.message, f.message
