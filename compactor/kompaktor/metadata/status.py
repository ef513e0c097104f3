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
from typing import TYPE_CHECKING, Any

from kompaktor.metadata import failures, history
from kompaktor.metadata import user_compactions as usercompaction
from kompaktor.metadata.store import MetadataStore
from kompaktor.model.tablet import RunningCompaction, TableInfo, Tablet

if TYPE_CHECKING:
    from rich.console import Group

ALIVE_S = 15.0

#: the heartbeat fields of a resumable merge's progress (``engines.ranges.progress_dict``); a
#: merge that is not resumable reports none of them
RESUME_FIELDS = ("parts_reused", "entries_reused", "bytes_reused", "input_bytes_reread", "parts_rejected")


def _count(fields: dict[str, str], name: str) -> int:
    try:
        return int(float(fields.get(name, 0)))
    except ValueError:
        return 0


def resumable_merge(
    table: str, tablet: Tablet, ecid: str, running: RunningCompaction, heartbeat: dict[str, str]
) -> dict[str, Any] | None:
    """One running merge's resume figures from its heartbeat, or None if it is not resumable."""
    if "parts_reused" not in heartbeat:
        return None
    return {
        "ecid": ecid,
        "table": table,
        "tablet": tablet.id,
        "group": running.group,
        "compactor": running.compactor,
        "input_bytes": sum(tablet.files[f].size for f in running.files if f in tablet.files),
        "parts_done": _count(heartbeat, "parts_done"),
        "parts": _count(heartbeat, "parts"),
        **{name: _count(heartbeat, name) for name in RESUME_FIELDS},
    }


def gather(
    store: MetadataStore, table_extra: Callable[[TableInfo, list[Tablet]], dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The status. ``table_extra``: more figures per table, from the tablets this pass reads anyway
    (the coordinator's status page; `kompaktor status` has none)."""
    queues = store.queues
    counters = store.bookkeeping.counters()
    groups: dict[str, Any] = {}
    now = time.time()
    for g in sorted(set(queues.groups()) | set(store.fleet.groups())):
        s = queues.stats(g)
        comps = store.fleet.compactors(g)
        alive = [c for c in comps if now - c.last_seen < ALIVE_S]
        groups[g] = {
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
    tables: dict[str, Any] = {}
    resumable: list[dict[str, Any]] = []
    for t in store.tables.tables():
        tablets = store.tables.tablets(t.id)
        for tb in tablets:
            for ecid, rc in tb.running.items():
                if (merge := resumable_merge(t.name, tb, ecid, rc, store.running.heartbeat(ecid))) is not None:
                    resumable.append(merge)
        counts = [len(tb.files) for tb in tablets]
        hist: dict[str, int] = {}
        for c in counts:
            hist[str(c)] = hist.get(str(c), 0) + 1
        tables[t.name] = {
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
        if table_extra is not None:
            tables[t.name].update(table_extra(t, tablets))
    out = {
        "groups": groups,
        "tables": tables,
        "user_compactions": [u.to_json() for u in usercompaction.all_compactions(store)],
        "dead_letters": failures.dead_letters(store),
        "retries_pending": failures.pending_retries(store),
        "counters": counters,
    }
    if resumable:  # only then: the output without resumable merges stays what it was
        out["resumable_merges"] = sorted(resumable, key=lambda r: r["ecid"])
    last = history.last_failures(store, groups)
    if last:  # likewise
        names = {t.id: t.name for t in store.tables.tables()}
        out["last_failures"] = {
            g: [{**r.to_json(), "table": names.get(r.table, r.table)} for r in recs] for g, recs in last.items()
        }
    return out


def failure_line(r: dict[str, Any]) -> str:
    """One failed compaction of ``gather``'s ``last_failures`` on one line."""
    when = time.strftime("%H:%M:%S", time.gmtime(r["finished"]))
    where = f"{r['tablet']} ({r['table']}, compactor {r['compactor']})"
    return f"{when} {r['outcome']} {r['ecid']} on {where}: {r['reason']}"


def resumable_line(r: dict[str, Any]) -> str:
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


def render(status: dict[str, Any]) -> Group:
    """A rich renderable of the status (one screen)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    gt = Table(title="compactor groups", expand=False)
    for col in (
        "group",
        "queued",
        "running",
        "compactors",
        "busy",
        "oldest queued",
        "committed",
        "dead recovered",
        "dead-lettered",
    ):
        gt.add_column(col, justify="right" if col != "group" else "left")
    for name, g in status["groups"].items():
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
    tt = Table(title="tables", expand=False)
    for col in ("table", "state", "tablets", "files", "files/tablet min·median·max", "running"):
        tt.add_column(col)
    for name, t in status["tables"].items():
        f = t["files_per_tablet"]
        tt.add_row(
            name,
            t["state"],
            str(t["tablets"]),
            str(t["files"]),
            f"{f['min']}·{f['median']}·{f['max']}",
            str(t["running_compactions"]),
        )
    parts: list[Any] = [gt, tt]
    if status.get("retries_pending"):
        parts.append(f"failed jobs waiting out their backoff before a retry: {status['retries_pending']}")
    if status["user_compactions"]:
        ut = Table(title="user compactions")
        for col in ("id", "table", "state", "tablets done", "message"):
            ut.add_column(col)
        for u in status["user_compactions"]:
            ut.add_row(u["id"], u["table"], u["state"], f"{u['tablets_done']}/{u['tablets_total']}", u["message"])
        parts.append(ut)
    # last, and only while one runs: every line above is what it always was
    for r in status.get("resumable_merges", ()):
        parts.append(Text(resumable_line(r)))
    for g, recs in status.get("last_failures", {}).items():
        parts.append(Text(f"last failures of group {g} (kompaktor history --failed --group {g}):"))
        parts.extend(Text("  " + failure_line(r)) for r in recs)
    return Group(*parts)
