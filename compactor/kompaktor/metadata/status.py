"""What `kompaktor status` shows, gathered from the metadata store and the queues.

A running merge that is resumable (docs/architecture.md "Long merges resume") reports what it took over from an earlier
attempt in its heartbeat (``engines.ranges.progress_dict``); those merges are listed under
``resumable_merges`` (and a "resumable merges" table), which is left out entirely while none
runs, so the rest of the output is what it always was. So are ``last_failures`` (each group's
newest failed compactions from the history, :mod:`kompaktor.metadata.history`) and its "last
failures" table: left out while no group has one.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NotRequired, Required, TypedDict, cast

from kompaktor.metadata import failures, history
from kompaktor.metadata import user_compactions as usercompaction
from kompaktor.metadata.store import MetadataStore
from kompaktor.metadata.store.running import FailureJson, Heartbeat
from kompaktor.metadata.user_compactions import UserCompactionRow
from kompaktor.model.tablet import RunningCompaction, TableInfo, Tablet

if TYPE_CHECKING:
    from rich.console import Group
    from rich.table import Table

ALIVE_S = 15.0

#: the heartbeat fields of a resumable merge's progress (``engines.ranges.progress_dict``); a
#: merge that is not resumable reports none of them
RESUME_FIELDS = ("parts_reused", "entries_reused", "bytes_reused", "input_bytes_reread", "parts_rejected")


class ResumableMerge(TypedDict):
    """A running resumable merge (``resumable_merges``): what it took over from an earlier attempt."""

    ecid: str
    table: str
    tablet: str
    group: str
    compactor: str
    input_bytes: int
    parts_done: int
    parts: int
    # RESUME_FIELDS, in that order
    parts_reused: int
    entries_reused: int
    bytes_reused: int
    input_bytes_reread: int
    parts_rejected: int


def resumable_merge(
    table: str, tablet: Tablet, ecid: str, running: RunningCompaction, heartbeat: Heartbeat
) -> ResumableMerge | None:
    """One running merge's resume figures from its heartbeat, or None if it is not resumable."""
    resume = heartbeat.resume
    if resume is None:
        return None
    return {
        "ecid": ecid,
        "table": table,
        "tablet": tablet.id,
        "group": running.group,
        "compactor": running.compactor,
        "input_bytes": sum(tablet.files[f].size for f in running.files if f in tablet.files),
        "parts_done": heartbeat.parts_done or 0,
        "parts": heartbeat.parts or 0,
        "parts_reused": resume.parts_reused,
        "entries_reused": resume.entries_reused,
        "bytes_reused": resume.bytes_reused,
        "input_bytes_reread": resume.input_bytes_reread,
        "parts_rejected": resume.parts_rejected,
    }


class GroupFigures(TypedDict):
    """One compactor group in the status (``kompaktor status --json``'s ``groups``)."""

    queued: int
    running: int
    depth: int
    compactors: int
    busy: int
    draining: int
    oldest_queued_age_s: float
    queued_bytes: int
    rejected: int
    dead_compactions_recovered: int
    compactions_committed: int
    dead_lettered: int


class FilesPerTablet(TypedDict):
    min: int
    median: float
    max: int
    histogram: dict[str, int]


class TableFigures(TypedDict, total=False):
    """One table in the status (``tables``); the status page adds its health figures."""

    id: Required[str]
    state: Required[str]
    tablets: Required[int]
    files: Required[int]
    files_per_tablet: Required[FilesPerTablet]
    running_compactions: Required[int]
    entries: Required[int]
    delete_horizon: Required[int | None]
    # the status page's health figures (coordinator/statuspage.py ``table_health``)
    file_limit: int
    over_limit: int
    deletes: int
    deletes_ratio: float
    score: float


class TableHealth(TypedDict):
    """A table's health figures, which only the status page shows (``statuspage.table_health``)."""

    file_limit: int
    over_limit: int
    deletes: int
    deletes_ratio: float
    score: float


class HistoryRow(TypedDict):
    """A history record (:class:`kompaktor.metadata.history.Record`, its fields in order) as the
    status shows it: ``table`` is the table's name while the table exists."""

    ecid: str
    outcome: str
    group: str
    table: str
    tablet: str
    kind: str
    compactor: str
    finished: float
    reason: str
    engine: str | None
    input_files: int
    input_bytes: int | None
    input_entries: int | None
    output_bytes: int | None
    output_entries: int | None
    deletes_dropped: int | None
    queued_s: float | None
    merge_s: float | None
    commit_s: float | None
    resumed_parts: int


def history_row(r: history.Record, table: str) -> HistoryRow:
    """``r`` as the status shows it (its JSON form, the table named; a unit test holds the keys
    to the record's fields)."""
    return cast(HistoryRow, {**r.to_json(), "table": table})


class Status(TypedDict):
    """What `kompaktor status` shows (``--json`` prints it as it is)."""

    groups: dict[str, GroupFigures]
    tables: dict[str, TableFigures]
    user_compactions: list[UserCompactionRow]
    #: the dead-lettered jobs' failure records, as stored
    dead_letters: list[FailureJson]
    retries_pending: int
    counters: dict[str, int]
    #: only while a resumable merge runs
    resumable_merges: NotRequired[list[ResumableMerge]]
    #: only while a group has failed compactions in its history
    last_failures: NotRequired[dict[str, list[HistoryRow]]]


def no_status() -> Status:
    """The status of a system with nothing in it (before the first :func:`gather`)."""
    return {
        "groups": {},
        "tables": {},
        "user_compactions": [],
        "dead_letters": [],
        "retries_pending": 0,
        "counters": {},
    }


def gather(store: MetadataStore, table_extra: Callable[[TableInfo, list[Tablet]], TableHealth] | None = None) -> Status:
    """The status. ``table_extra``: more figures per table, from the tablets this pass reads anyway
    (the coordinator's status page; `kompaktor status` has none)."""
    counters = store.bookkeeping.counters()
    groups = {
        g: group_figures(store, g, counters) for g in sorted(set(store.queues.groups()) | set(store.fleet.groups()))
    }
    tables: dict[str, TableFigures] = {}
    resumable: list[ResumableMerge] = []
    for t in store.tables.tables():
        tablets = store.tables.tablets(t.id)
        resumable += resumable_merges(store, t.name, tablets)
        tables[t.name] = table_figures(t, tablets)
        if table_extra is not None:
            tables[t.name] = {**tables[t.name], **table_extra(t, tablets)}
    out: Status = {
        "groups": groups,
        "tables": tables,
        "user_compactions": [u.to_json() for u in usercompaction.all_compactions(store)],
        "dead_letters": [rec.to_json() for rec in failures.dead_letters(store)],
        "retries_pending": failures.pending_retries(store),
        "counters": counters,
    }
    if resumable:  # only then: the output without resumable merges stays what it was
        out["resumable_merges"] = sorted(resumable, key=lambda r: r["ecid"])
    last = history.last_failures(store, groups)
    if last:  # likewise
        names = {t.id: t.name for t in store.tables.tables()}
        out["last_failures"] = {
            g: [history_row(r, names.get(r.table, r.table)) for r in recs] for g, recs in last.items()
        }
    return out


def group_figures(store: MetadataStore, g: str, counters: dict[str, int]) -> GroupFigures:
    """A group's queue and its compactors (those seen within :data:`ALIVE_S`)."""
    s = store.queues.stats(g)
    now = time.time()
    alive = [c for c in store.fleet.compactors(g) if now - c.last_seen < ALIVE_S]
    return {
        "queued": s.queued,
        "running": s.running,
        "depth": s.depth,
        "compactors": len(alive),
        "busy": sum(c.state == "busy" for c in alive),
        "draining": sum(c.state == "draining" for c in alive),
        "oldest_queued_age_s": round(s.oldest_age_s, 3),
        "queued_bytes": s.bytes,
        "rejected": s.rejected,
        "dead_compactions_recovered": counters.get(f"dead_compactions:{g}", 0),
        "compactions_committed": counters.get(f"committed:{g}", 0),
        "dead_lettered": s.dead_lettered,
    }


def resumable_merges(store: MetadataStore, table: str, tablets: list[Tablet]) -> list[ResumableMerge]:
    """The table's running merges that are resumable, with their resume figures."""
    out = []
    for tb in tablets:
        for ecid, rc in tb.running.items():
            if (merge := resumable_merge(table, tb, ecid, rc, store.running.heartbeat(ecid))) is not None:
                out.append(merge)
    return out


def table_figures(t: TableInfo, tablets: list[Tablet]) -> TableFigures:
    """A table's tablets, files (and their spread over the tablets), entries and delete horizon."""
    counts = [len(tb.files) for tb in tablets]
    hist: dict[str, int] = {}
    for c in counts:
        hist[str(c)] = hist.get(str(c), 0) + 1
    return {
        "id": t.id,
        "state": t.state,
        "tablets": len(tablets),
        "files": sum(counts),
        "files_per_tablet": {
            "min": min(counts, default=0),
            "median": statistics.median(counts) if counts else 0,
            "max": max(counts, default=0),
            "histogram": dict(sorted(hist.items(), key=lambda kv: int(kv[0]))),
        },
        "running_compactions": sum(len(tb.running) for tb in tablets),
        "entries": sum(m.entries for tb in tablets for m in tb.files.values()),
        # the newest delete horizon of its tablets (docs/file-format.md, "Deletes stay deleted")
        "delete_horizon": max((tb.horizon for tb in tablets if tb.horizon is not None), default=None),
    }


def failure_line(r: HistoryRow) -> str:
    """One failed compaction of ``gather``'s ``last_failures`` on one line."""
    when = time.strftime("%H:%M:%S", time.gmtime(r["finished"]))
    where = f"{r['tablet']} ({r['table']}, compactor {r['compactor']})"
    return f"{when} {r['outcome']} {r['ecid']} on {where}: {r['reason']}"


def resumable_line(r: ResumableMerge) -> str:
    """One running resumable merge on one line (of ``gather``'s ``resumable_merges``)."""
    return (
        f"resumable merge {r['ecid']} on {r['table']} (group {r['group']}, compactor {r['compactor']}): "
        f"{r['parts_done']}/{r['parts']} parts done, {r['parts_reused']} reused "
        f"({human_bytes(r['bytes_reused'])} of input not read again), {r['parts_rejected']} rejected; "
        f"input re-read {human_bytes(r['input_bytes_reread'])} of {human_bytes(r['input_bytes'])}"
    )


def human_bytes(n: int) -> str:
    """1536 -> '1.5 KiB' (binary units, one decimal)."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(size) < 1024 or unit == "PiB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def render(status: Status) -> Group:
    """A rich renderable of the status (one screen)."""
    from rich.console import Group
    from rich.text import Text

    parts: list[Any] = [_groups_table(status["groups"]), _tables_table(status["tables"])]
    if status.get("retries_pending"):
        parts.append(f"failed jobs waiting out their backoff before a retry: {status['retries_pending']}")
    if status["user_compactions"]:
        parts.append(_user_compactions_table(status["user_compactions"]))
    # last, and only while one runs: every line above is what it always was
    for r in status.get("resumable_merges", ()):
        parts.append(Text(resumable_line(r)))
    for g, recs in status.get("last_failures", {}).items():
        parts.append(Text(f"last failures of group {g} (kompaktor history --failed --group {g}):"))
        parts.extend(Text("  " + failure_line(r)) for r in recs)
    return Group(*parts)


_GROUP_COLUMNS = (
    "group",
    "queued",
    "running",
    "compactors",
    "busy",
    "oldest queued",
    "committed",
    "dead recovered",
    "dead-lettered",
)


def _groups_table(groups: dict[str, GroupFigures]) -> Table:
    from rich.table import Table

    gt = Table(title="compactor groups", expand=False)
    for col in _GROUP_COLUMNS:
        gt.add_column(col, justify="right" if col != "group" else "left")
    for name, g in groups.items():
        gt.add_row(
            name,
            str(g["queued"]),
            str(g["running"]),
            str(g["compactors"]),
            str(g["busy"]),
            f"{g['oldest_queued_age_s']:.1f}s",
            str(g["compactions_committed"]),
            str(g["dead_compactions_recovered"]),
            str(g["dead_lettered"]),
        )
    return gt


def _tables_table(tables: dict[str, TableFigures]) -> Table:
    from rich.table import Table

    tt = Table(title="tables", expand=False)
    for col in ("table", "state", "tablets", "files", "files/tablet min·median·max", "running"):
        tt.add_column(col)
    for name, t in tables.items():
        f = t["files_per_tablet"]
        tt.add_row(
            name,
            t["state"],
            str(t["tablets"]),
            str(t["files"]),
            f"{f['min']}·{f['median']}·{f['max']}",
            str(t["running_compactions"]),
        )
    return tt


def _user_compactions_table(ucomps: list[UserCompactionRow]) -> Table:
    from rich.table import Table

    ut = Table(title="user compactions")
    for col in ("id", "table", "state", "tablets done", "message"):
        ut.add_column(col)
    for u in ucomps:
        ut.add_row(u["id"], u["table"], u["state"], f"{u['tablets_done']}/{u['tablets_total']}", u["message"])
    return ut
