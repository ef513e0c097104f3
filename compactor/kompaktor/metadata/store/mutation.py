"""What a conditional mutation says: :class:`Mutation` (a table's conditions and operations) and
:class:`TabletChange` (one tablet's), as the one Lua script of the metadata (``lua/mutate.lua``)
reads them. Builders only: nothing here talks to Redis; :meth:`StoreCore.apply
<kompaktor.metadata.store.base.StoreCore.apply>` runs one, atomically.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from kompaktor.model.tablet import now_ms


@dataclass
class TabletChange:
    """Conditions and operations on one tablet; build with the fluent methods."""

    tablet_id: str
    conds: list[list[Any]] = field(default_factory=list)
    ops: list[list[Any]] = field(default_factory=list)

    def require(self, name: str, *args: Any) -> TabletChange:
        self.conds.append([name, *args])
        return self

    def do(self, name: str, *args: Any) -> TabletChange:
        self.ops.append([name, *args])
        return self


@dataclass
class Mutation:
    """One atomic conditional mutation over a table and any number of its tablets."""

    table: str | None = None
    table_conds: list[list[Any]] = field(default_factory=list)
    table_ops: list[list[Any]] = field(default_factory=list)
    tablets: list[TabletChange] = field(default_factory=list)
    #: fields of the table's hash to return with the outcome (:meth:`MetadataStore.apply`)
    table_reads: list[str] = field(default_factory=list)

    def tablet(self, tablet_id: str) -> TabletChange:
        tc = TabletChange(tablet_id)
        self.tablets.append(tc)
        return tc

    def require_table(self, *states: str) -> Mutation:
        self.table_conds.append(["exists"])
        if states:
            self.table_conds.append(["state_in", list(states)])
        return self

    def to_json(self, mutation_id: str | None = None, fence: int | None = None) -> str:
        """The spec ``lua/mutate.lua`` reads; a field left empty (no id, no fence, no table
        condition, operation or read) is left out: the script decodes every byte of it."""
        spec: dict[str, Any] = {"now": now_ms(), "table": self.table}
        if mutation_id is not None:
            spec["id"] = mutation_id
        if fence is not None:
            spec["fence"] = fence
        for name in ("table_conds", "table_ops", "table_reads"):
            if value := getattr(self, name):
                spec[name] = value
        spec["tablets"] = [{"id": t.tablet_id, "conds": t.conds, "ops": t.ops} for t in self.tablets]
        return json.dumps(spec, separators=(",", ":"))
