"""From a tablet's metadata to queued jobs (docs/planner.md §5). Pure: no I/O.

Candidates per kind, the dispatcher's service per kind, table properties that override the
service's planner settings, stale selections, and the jobs the coordinator queues.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from functools import lru_cache

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
    if table.state != ONLINE or t.op is not None or not t.files:
        return TabletPlan([])
    sizes = {f: m.size for f, m in t.files.items()}
    running = [Running(Kind(r.kind), r.files) for r in t.running.values()]
    busy = {f for r in running for f in r.files}
    jobs: list[Job] = []

    def emit(kind: Kind, candidates: list[str], selection: str | None, stale_sel: frozenset[str]) -> None:
        svc_name = dispatch(table.name, table.props, kind.value, services.values())
        svc = services.get(svc_name) or (DEFAULT if svc_name == DEFAULT.name else None)
        if svc is None:
            return  # the table names a service that does not exist (yet): nothing to plan
        for pj in plan(kind, settings_for(table, svc), sizes, candidates, running):
            if skip and fingerprint(t.id, pj.files) in skip:
                continue
            jobs.append(
                Job(
                    t.id,
                    kind.value,
                    pj.priority,
                    svc.group_of_tier(pj.group),
                    {f: sizes[f] for f in pj.files},
                    svc.name,
                    selection,
                    bool(stale_sel and stale_sel.intersection(pj.files)),
                )
            )

    sel = t.selection
    stale: frozenset[str] = frozenset()
    excluded: set[str] = set(busy)
    if sel is not None:
        if sel.stale(selection_expiry_ms(table.props), now_ms):
            stale = frozenset(sel.files)
        else:
            excluded.update(sel.files)
    emit(Kind.SYSTEM, sorted([f for f in sizes if f not in excluded] if excluded else sizes), None, stale)
    if sel is not None and (sel.kind != "USER" or sel.id in active_user):
        emit(Kind(sel.kind), sorted([f for f in sel.files if f in sizes and f not in busy]), sel.id, frozenset())

    select = None
    if sel is None and not t.running and t.hold is None and table.props.get(SELECTOR) == "too-many-deletes":
        threshold = float(table.props.get(SELECTOR_THRESHOLD, "0.25"))
        chosen = too_many_deletes({f: FileStats(m.entries, m.deletes) for f, m in t.files.items()}, threshold)
        select = chosen or None
    return TabletPlan(jobs, select)
