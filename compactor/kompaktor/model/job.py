"""A compaction job: what the planner emits, the queues hold and a compactor reserves. Pure data."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

#: Priorities run 1..PRIORITY_MAX (docs/planner.md §3); the queues store ``PRIORITY_MAX - priority`` in
#: a fixed-width prefix of each entry so that lexicographic order is priority descending.
PRIORITY_MAX = 20767


#: The kind of a compaction, of its job and of a plan — its one definition (the planner, the
#: services' ``kinds``, the dispatcher's table properties, the plan input and the CRD read it;
#: no docstring: the CRD's schema would carry it).
class Kind(StrEnum):
    SYSTEM = "SYSTEM"  # chosen by the planner from a tablet's files
    USER = "USER"  # a user compaction's selection
    SELECTOR = "SELECTOR"  # a selector's (too many deletes) selection


@dataclass(frozen=True)
class Job:
    """A queued compaction job."""

    tablet: str
    kind: str
    priority: int
    group: str
    files: dict[str, int]  # name -> size in bytes
    service: str = "default"
    selection: str | None = None  # USER/SELECTOR selection id
    overlaps: bool = False  # SYSTEM job overlapping a stale selection (§6.4 rule 5)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "tablet": self.tablet,
            "kind": self.kind,
            "priority": self.priority,
            "group": self.group,
            "files": self.files,
            "service": self.service,
        }
        if self.selection is not None:
            d["selection"] = self.selection
        if self.overlaps:
            d["overlaps"] = True
        if self.extra:
            d["extra"] = self.extra
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Job:
        return cls(
            d["tablet"],
            d["kind"],
            int(d["priority"]),
            d["group"],
            dict(d["files"] or {}),
            d.get("service", "default"),
            d.get("selection"),
            bool(d.get("overlaps", False)),
            dict(d.get("extra") or {}),
        )

    @property
    def size(self) -> int:
        return sum(self.files.values())


def fingerprint(tablet: str, files: list[str] | tuple[str, ...] | dict[str, int]) -> str:
    """Identity of a job for failure counting: same tablet and same files."""
    return hashlib.sha1(json.dumps([tablet, sorted(files)]).encode()).hexdigest()[:16]
