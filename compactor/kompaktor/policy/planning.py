"""From a tablet's metadata to queued jobs (docs/planner.md §5). Pure: no I/O.

Candidates per kind, the dispatcher's service per kind, table properties that override the
service's planner settings, stale selections, and the jobs the coordinator queues.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, TypeAlias

from kompaktor.model.job import Job, fingerprint
from kompaktor.model.tablet import ONLINE, TableInfo, Tablet
from kompaktor.policy.planner import Kind, PlannerSettings, Running, plan
from kompaktor.policy.selectors import FileStats, too_many_deletes
from kompaktor.policy.services import DEFAULT, ServiceConfig, dispatch
from kompaktor.policy.tableprops import FILE_MAX, RATIO, SELECTOR, SELECTOR_THRESHOLD, selection_expiry_ms


@dataclass(frozen=True)
class TabletPlan:
    jobs: list[Job]
    #: files a table selector chose (a new SELECTOR selection to record), or None
    select: list[str] | None = None


@lru_cache(maxsize=4096)
def _settings(svc: ServiceConfig, ratio: str | None, file_max: str | None) -> PlannerSettings:
    s = svc.planner_settings()
    if ratio is not None:
        s = replace(s, ratio=float(ratio))
    if file_max is not None:
        s = replace(s, max_files_per_tablet=int(file_max))
    return s


def settings_for(table: TableInfo, svc: ServiceConfig) -> PlannerSettings:
    return _settings(svc, table.props.get(RATIO), table.props.get(FILE_MAX))


def plan_tablet(
    t: Tablet,
    table: TableInfo,
    services: Mapping[str, ServiceConfig],
    now_ms: int,
    active_user: Collection[str] = (),
    skip: Collection[str] = (),
) -> TabletPlan:
    """The jobs to queue for one tablet now. ``active_user``: ids of USER compactions still
    running; ``skip``: job fingerprints that must not be queued (backing off or dead-lettered)."""
    return TabletPlanner(services, now_ms, active_user, skip).tablet(t, table)


#: a table's service and planner settings for one kind, or None when the service named does not exist
_Route: TypeAlias = "tuple[ServiceConfig, PlannerSettings] | None"


class TabletPlanner:
    """:func:`plan_tablet` for the many tablets of one pass (the services, the clock, the running
    USER compactions and the fingerprints to skip are the pass'), with what depends only on a table
    and a kind (the dispatcher's service, the planner settings) found once per table.

    :meth:`doc` plans a tablet from its stored document (a dict) without building the model
    objects, when the tablet is plain — no operation, no running compaction, no selection, no
    table selector to run: the case of most tablets in a full pass — and gives exactly what
    :meth:`tablet` gives for it (a property test compares them); otherwise it returns None and the
    caller decodes the :class:`Tablet`."""

    def __init__(
        self,
        services: Mapping[str, ServiceConfig],
        now_ms: int,
        active_user: Collection[str] = (),
        skip: Collection[str] = (),
    ) -> None:
        self.services = services
        self.now_ms = now_ms
        self.active_user = active_user
        self.skip = skip
        #: (id(table), kind) -> (the table, its route); the table is kept, so its id is not reused
        self._routes: dict[tuple[int, Kind], tuple[TableInfo, _Route]] = {}

    def _route(self, table: TableInfo, kind: Kind) -> _Route:
        key = (id(table), kind)
        hit = self._routes.get(key)
        if hit is not None and hit[0] is table:
            return hit[1]
        svc_name = dispatch(table.name, table.props, kind.value, self.services.values())
        svc = self.services.get(svc_name) or (DEFAULT if svc_name == DEFAULT.name else None)
        route = None if svc is None else (svc, settings_for(table, svc))
        self._routes[key] = (table, route)
        return route

    def _emit(
        self,
        jobs: list[Job],
        tablet_id: str,
        kind: Kind,
        table: TableInfo,
        sizes: dict[str, int],
        candidates: list[str],
        running: list[Running],
        selection: str | None,
        stale_sel: frozenset[str],
    ) -> None:
        route = self._route(table, kind)
        if route is None:
            return  # the table names a service that does not exist (yet): nothing to plan
        svc, settings = route
        skip = self.skip
        for pj in plan(kind, settings, sizes, candidates, running):
            if skip and fingerprint(tablet_id, pj.files) in skip:
                continue
            jobs.append(
                Job(
                    tablet_id,
                    kind.value,
                    pj.priority,
                    svc.group_of_tier(pj.group),
                    {f: sizes[f] for f in pj.files},
                    svc.name,
                    selection,
                    bool(stale_sel and stale_sel.intersection(pj.files)),
                )
            )

    def tablet(self, t: Tablet, table: TableInfo) -> TabletPlan:
        """The jobs to queue for one tablet now (:func:`plan_tablet`)."""
        if table.state != ONLINE or t.op is not None or not t.files:
            return TabletPlan([])
        sizes = {f: m.size for f, m in t.files.items()}
        running = [Running(Kind(r.kind), r.files) for r in t.running.values()]
        busy = {f for r in running for f in r.files}
        jobs: list[Job] = []
        sel = t.selection
        stale: frozenset[str] = frozenset()
        excluded: set[str] = set(busy)
        if sel is not None:
            if sel.stale(selection_expiry_ms(table.props), self.now_ms):
                stale = frozenset(sel.files)
            else:
                excluded.update(sel.files)
        system = sorted([f for f in sizes if f not in excluded] if excluded else sizes)
        self._emit(jobs, t.id, Kind.SYSTEM, table, sizes, system, running, None, stale)
        if sel is not None and (sel.kind != "USER" or sel.id in self.active_user):
            chosen = sorted([f for f in sel.files if f in sizes and f not in busy])
            self._emit(jobs, t.id, Kind(sel.kind), table, sizes, chosen, running, sel.id, frozenset())

        select = None
        if sel is None and not t.running and t.hold is None and table.props.get(SELECTOR) == "too-many-deletes":
            threshold = float(table.props.get(SELECTOR_THRESHOLD, "0.25"))
            chosen = too_many_deletes({f: FileStats(m.entries, m.deletes) for f, m in t.files.items()}, threshold)
            select = chosen or None
        return TabletPlan(jobs, select)

    def doc(self, tablet_id: str, d: Mapping[str, Any], table: TableInfo) -> TabletPlan | None:
        """The jobs of a plain tablet from its stored document (``Tablet.from_json``'s input), the
        same as :meth:`tablet`; None when the tablet is not plain (then decode it and call
        :meth:`tablet`)."""
        if d.get("op") is not None or d.get("running") or d.get("sel"):
            return None
        if d.get("hold") is None and table.props.get(SELECTOR) == "too-many-deletes":
            return None  # the selector reads the files' entry and delete counts
        if table.state != ONLINE:
            return TabletPlan([])
        files = d.get("files")
        if not files or len(files) < 2:
            # a SYSTEM plan of one candidate and nothing running is empty (docs/planner.md §3.5 step
            # 1; §4.4 needs more files than maxFilesPerTablet, which is at least 1): the state of
            # every tablet just compacted
            return TabletPlan([])
        sizes = {f: m["size"] for f, m in files.items()}
        jobs: list[Job] = []
        # the planner sorts the candidates itself (size, then name): no need to sort them here
        self._emit(jobs, tablet_id, Kind.SYSTEM, table, sizes, list(sizes), [], None, frozenset())
        return TabletPlan(jobs)
