"""Pure helpers for ``status.conditions`` (the metav1.Condition shape).

Owns: setting one condition in a list without losing the others, keeping lastTransitionTime
when the status does not change, and which reason a CompactorGroup's Degraded condition gives
(:func:`decide_group_degraded`). The caller passes the time. Must not import: kopf, redis, kube.
"""

from __future__ import annotations

from dataclasses import dataclass

from kompaktor_operator import naming
from kompaktor_operator.objects import StatusCondition

READY = "Ready"
DEGRADED = "Degraded"


def set_condition(
    conditions: list[StatusCondition] | None,
    type_: str,
    status: bool | str,
    *,
    reason: str,
    message: str = "",
    generation: int | None = None,
    now: str,
) -> list[StatusCondition]:
    """A new list with ``type_`` set; the others are kept in their order."""
    text = status if isinstance(status, str) else ("True" if status else "False")
    old = next((c for c in conditions or [] if c.get("type") == type_), None)
    changed = old is None or old.get("status") != text
    new: StatusCondition = {
        "type": type_,
        "status": text,
        "reason": reason,
        "lastTransitionTime": now if changed or old is None else old.get("lastTransitionTime", now),
    }
    if message:
        # An empty string is left out: a real 1.20 apiserver stored "" as null here and then refused
        # the whole status write (422 "must be of type string"); absent means the same.
        new["message"] = message
    if generation is not None:
        new["observedGeneration"] = generation
    out = [c.copy() for c in conditions or [] if c.get("type") != type_]
    out.append(new)
    return sorted(out, key=lambda c: (c["type"] != READY, c["type"]))


def get(conditions: list[StatusCondition] | None, type_: str) -> StatusCondition | None:
    return next((c for c in conditions or [] if c.get("type") == type_), None)


def is_true(conditions: list[StatusCondition] | None, type_: str) -> bool:
    cond = get(conditions, type_)
    return cond is not None and cond.get("status") == "True"


@dataclass(frozen=True)
class Verdict:
    """What one condition says: its status, reason and message."""

    status: bool
    reason: str
    message: str = ""


def decide_group_degraded(
    group: str, queued: int, ready: int, dead_lettered: int, hpa_blind: str | None = None
) -> Verdict:
    """A CompactorGroup's Degraded condition, the most pressing cause first: jobs queued while its
    HPA cannot scale on the queue depth (``hpa_blind``: why it cannot, or None), jobs queued and
    no compactor pod ready, jobs dead-lettered; else not degraded."""
    if queued > 0 and hpa_blind is not None:
        return Verdict(
            True,
            "AutoscalerCannotReadMetric",
            f"{queued} job(s) queued but HorizontalPodAutoscaler {naming.hpa_name(group)} cannot scale on "
            f"{naming.QUEUE_DEPTH_METRIC}: {hpa_blind}",
        )
    if queued > 0 and ready == 0:
        return Verdict(
            True, "NoReadyCompactors", f"{queued} job(s) queued but no compactor pod is ready; check the pods' events"
        )
    if dead_lettered > 0:
        return Verdict(True, "DeadLetteredJobs", f"{dead_lettered} job(s) failed too often; see `kompaktor status`")
    return Verdict(False, "Healthy")
