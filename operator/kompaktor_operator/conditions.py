"""Pure helpers for ``status.conditions`` (the metav1.Condition shape).

Owns: setting one condition in a list without losing the others, keeping lastTransitionTime
when the status does not change. The caller passes the time. Must not import: kopf, redis, kube.
"""

from __future__ import annotations

from typing import Any

READY = "Ready"
DEGRADED = "Degraded"


def set_condition(
    conditions: list[dict[str, Any]] | None,
    type_: str,
    status: bool | str,
    *,
    reason: str,
    message: str = "",
    generation: int | None = None,
    now: str,
) -> list[dict[str, Any]]:
    """A new list with ``type_`` set; the others are kept in their order."""
    text = status if isinstance(status, str) else ("True" if status else "False")
    old = next((c for c in conditions or [] if c.get("type") == type_), None)
    changed = old is None or old.get("status") != text
    new: dict[str, Any] = {
        "type": type_,
        "status": text,
        "reason": reason,
        "lastTransitionTime": now if changed else old.get("lastTransitionTime", now),
    }
    if message:
        # An empty string is left out: a real 1.20 apiserver stored "" as null here and then refused
        # the whole status write (422 "must be of type string"); absent means the same.
        new["message"] = message
    if generation is not None:
        new["observedGeneration"] = generation
    out = [dict(c) for c in conditions or [] if c.get("type") != type_]
    out.append(new)
    return sorted(out, key=lambda c: (c["type"] != READY, c["type"]))


def get(conditions: list[dict[str, Any]] | None, type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions or [] if c.get("type") == type_), None)


def is_true(conditions: list[dict[str, Any]] | None, type_: str) -> bool:
    cond = get(conditions, type_)
    return cond is not None and cond.get("status") == "True"
