"""Why a CompactorGroup's pods cannot run, read from the pods' own status (pure).

Owns: turning the pod objects the kubelet and the scheduler wrote (container states, the last
termination, the PodScheduled condition) into one finding for the group — the reason a user acts
on and a message that names the container, the image, the limit or the scheduler's words — so the
CompactorGroup says it without anyone reading pod events. Must not import: kopf, redis, kube.

Reasons, most actionable first (a pod that is OOMKilled also shows CrashLoopBackOff):
``OOMKilled``, ``ImagePullFailed``, ``CrashLoop``, ``Unschedulable``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kompaktor_operator.objects import ContainerStateTerminated, ContainerStatus, Pod

#: the condition type on a CompactorGroup
PODS_HEALTHY = "PodsHealthy"

OOM_KILLED = "OOMKilled"
IMAGE_PULL_FAILED = "ImagePullFailed"
CRASH_LOOP = "CrashLoop"
UNSCHEDULABLE = "Unschedulable"
HEALTHY = "PodsRunning"

_ORDER = (OOM_KILLED, IMAGE_PULL_FAILED, CRASH_LOOP, UNSCHEDULABLE)
#: the kubelet's waiting reasons for an image it cannot get
_PULL_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "RegistryUnavailable"}
)
_MESSAGE_MAX = 600


@dataclass(frozen=True)
class Finding:
    reason: str
    message: str
    pods: int  # how many of the group's pods show it


def _one_line(text: str | None, limit: int = 300) -> str:
    words = " ".join((text or "").split())
    return words if len(words) <= limit else words[: limit - 1] + "…"


def _limit(pod: Pod, container: str) -> str | None:
    for c in (pod.get("spec") or {}).get("containers") or []:
        if c.get("name") == container:
            return ((c.get("resources") or {}).get("limits") or {}).get("memory")
    return None


def _image(pod: Pod, container: str, status: ContainerStatus) -> str:
    for c in (pod.get("spec") or {}).get("containers") or []:
        if c.get("name") == container:
            return str(c.get("image") or status.get("image") or "?")
    return str(status.get("image") or "?")


def _terminated_text(term: ContainerStateTerminated) -> str:
    code = term.get("exitCode")
    text = f"{term.get('reason') or 'exited'} (exit code {code})" if code is not None else str(term.get("reason"))
    # the termination message is the log's tail (FallbackToLogsOnError): its last line says why
    lines = [line for line in (term.get("message") or "").splitlines() if line.strip()]
    tail = _one_line(lines[-1] if lines else "", 240)
    return f"{text}: {tail}" if tail else text


def _pod_findings(pod: Pod) -> dict[str, str]:
    """reason → message for one pod (several reasons may hold at once)."""
    status = pod.get("status") or {}
    found: dict[str, str] = {}
    for cs in status.get("containerStatuses") or []:
        name = cs.get("name", "?")
        state, last = cs.get("state") or {}, cs.get("lastState") or {}
        waiting = state.get("waiting") or {}
        terminated = state.get("terminated") or last.get("terminated") or {}
        restarts = int(cs.get("restartCount") or 0)
        if terminated.get("reason") == "OOMKilled":
            limit = _limit(pod, name)
            found.setdefault(
                OOM_KILLED,
                (
                    f"container {name} was killed for using more memory than its limit "
                    f"({limit or 'no limit set: the node ran out of memory'}); {restarts} restart(s). "
                    "Raise spec.resources.limits.memory, or lower spec.spark.driverMemory"
                ),
            )
        if waiting.get("reason") in _PULL_REASONS:
            found.setdefault(
                IMAGE_PULL_FAILED,
                (
                    f"container {name} cannot get image {_image(pod, name, cs)} ({waiting['reason']}): "
                    f"{_one_line(waiting.get('message'))}".rstrip(": ")
                ),
            )
        if waiting.get("reason") == "CrashLoopBackOff":
            last_exit = _terminated_text(last.get("terminated") or {}) if last.get("terminated") else "unknown"
            found.setdefault(
                CRASH_LOOP, (f"container {name} keeps exiting ({restarts} restart(s)); last exit: {last_exit}")
            )
    if not status.get("containerStatuses") and not (pod.get("metadata") or {}).get("deletionTimestamp"):
        for cond in status.get("conditions") or []:
            if (
                cond.get("type") == "PodScheduled"
                and cond.get("status") == "False"
                and cond.get("reason") == "Unschedulable"
            ):
                found.setdefault(UNSCHEDULABLE, f"no node can run the pod: {_one_line(cond.get('message'))}")
    return found


def diagnose(pods: Iterable[Pod]) -> Finding | None:
    """The group's most actionable pod problem now, or None when none of its pods has one.

    Terminating pods are left out: a scale-down's pods are expected to stop."""
    counts: dict[str, int] = {}
    first: dict[str, tuple[str, str]] = {}
    for pod in sorted(pods, key=lambda p: (p.get("metadata") or {}).get("name", "")):
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        for reason, message in _pod_findings(pod).items():
            counts[reason] = counts.get(reason, 0) + 1
            first.setdefault(reason, (meta.get("name", "?"), message))
    for reason in _ORDER:
        if reason in counts:
            pod_name, message = first[reason]
            n = counts[reason]
            who = f"pod {pod_name}" if n == 1 else f"{n} pods, e.g. {pod_name}"
            text = f"{who}: {message}"
            return Finding(reason, text if len(text) <= _MESSAGE_MAX else text[: _MESSAGE_MAX - 1] + "…", n)
    return None
