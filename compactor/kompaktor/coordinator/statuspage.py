"""What the coordinator's status page shows (docs/ui.md "The status page"), gathered from the store: :func:`collect`.

The page itself is :mod:`.page` (HTML, no I/O); the HTTP server is :mod:`.http`. The figures per
group and table are those of ``kompaktor status --json`` (:func:`kompaktor.metadata.status.gather`),
with what only the page shows beside them: the replicas the autoscaler wants (the HPA formula on the
group's depth and target), the running compactions' progress, the tables' health and the history.
The small charts come from :class:`Samples`, a ring buffer the coordinator fills as it runs.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TypedDict

from kompaktor.metadata import history
from kompaktor.metadata.compactions import running_compactions
from kompaktor.metadata.status import (
    GroupFigures,
    HistoryRow,
    Status,
    TableFigures,
    TableHealth,
    gather,
    history_row,
)
from kompaktor.metadata.store import MetadataStore
from kompaktor.metadata.store.running import Heartbeat
from kompaktor.model.tablet import TableInfo, Tablet
from kompaktor.policy.planning import settings_for
from kompaktor.policy.services import DEFAULT, GroupConfig, ServiceConfig, dispatch

#: the span of the page's charts, and how often the coordinator takes a sample for them
CHART_WINDOW_S = 3600.0
SAMPLE_EVERY_S = 10.0
#: records of the history the page lists (failures first)
HISTORY_ROWS = 50


def wanted_replicas(depth: int, cfg: GroupConfig) -> int:
    """The HPA formula with an AverageValue target of ``jobs_per_replica``, within the group's bounds."""
    return max(cfg.min_replicas, min(cfg.max_replicas, math.ceil(depth / cfg.jobs_per_replica)))


@dataclass(frozen=True)
class Sample:
    t: float  # epoch seconds
    depth: int
    wanted: int
    ready: int


@dataclass
class Samples:
    """Depth and replicas per group over the last hour, one sample every :data:`SAMPLE_EVERY_S`
    at most (a ring buffer per group: the oldest fall out). The coordinator's loop adds samples
    while the HTTP server's threads read them: a lock keeps each read whole."""

    every_s: float = SAMPLE_EVERY_S
    window_s: float = CHART_WINDOW_S
    groups: dict[str, deque[Sample]] = field(default_factory=dict)
    _last: float = float("-inf")
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def due(self, now: float) -> bool:
        return now - self._last >= self.every_s

    def add(self, group: str, sample: Sample) -> None:
        with self._lock:
            ring = self.groups.setdefault(group, deque(maxlen=max(2, int(self.window_s / max(self.every_s, 1.0)) + 1)))
            ring.append(sample)
            self._last = sample.t

    def take(self, store: MetadataStore, now: float | None = None) -> None:
        """One sample of every group (queue depth, replicas wanted and ready), if one is due."""
        now = time.time() if now is None else now
        if not self.due(now):
            return
        configs = store.fleet.groups()
        for g in sorted(set(configs) | set(store.queues.groups())):
            depth = store.queues.stats(g).depth
            ready = sum(c.state != "draining" for c in store.fleet.compactors(g) if now - c.last_seen < 15.0)
            self.add(g, Sample(now, depth, wanted_replicas(depth, configs.get(g) or GroupConfig(g)), ready))

    def of(self, group: str, now: float | None = None) -> list[Sample]:
        now = time.time() if now is None else now
        with self._lock:
            return [s for s in self.groups.get(group, ()) if now - s.t <= self.window_s]


class PageGroup(GroupFigures):
    """A group on the page: ``kompaktor status``'s figures, with its replicas and HPA target."""

    idle: int
    ready: int
    wanted: int
    min_replicas: int
    max_replicas: int
    hpa_target: int


class RunningRow(TypedDict):
    """One running compaction's progress from its heartbeat."""

    table: str
    ecid: str
    tablet: str
    group: str
    kind: str
    compactor: str
    input_files: int
    input_bytes: int
    bytes_read: int
    parts_done: int
    parts: int
    resumed_parts: int
    done: float
    elapsed_s: float
    left_s: float | None


class PageHistoryRow(HistoryRow):
    failed: bool


class PageData(TypedDict):
    """Everything the page shows (:func:`collect`; ``page.render`` renders it)."""

    now: float
    groups: dict[str, PageGroup]
    charts: dict[str, list[Sample]]
    running: list[RunningRow]
    tables: dict[str, TableFigures]
    history: list[PageHistoryRow]
    dead_letters: int
    retries_pending: int


def _groups(status: Status, configs: dict[str, GroupConfig]) -> dict[str, PageGroup]:
    """``kompaktor status``'s groups with the replicas wanted and ready, idle compactors, the HPA target."""
    out: dict[str, PageGroup] = {}
    for name, g in status["groups"].items():
        cfg = configs.get(name) or GroupConfig(name)
        out[name] = {
            **g,
            "idle": g["compactors"] - g["busy"] - g["draining"],
            "ready": g["compactors"] - g["draining"],
            "wanted": wanted_replicas(g["depth"], cfg),
            "min_replicas": cfg.min_replicas,
            "max_replicas": cfg.max_replicas,
            "hpa_target": cfg.jobs_per_replica,
        }
    return out


def _progress(table: str, tablet: Tablet, ecid: str, hb: Heartbeat, now: float) -> RunningRow:
    """One running compaction's progress from its heartbeat: bytes read of its input, parts done,
    parts resumed, and the time left at the pace so far (None until it is known)."""
    rc = tablet.running[ecid]
    input_bytes = sum(tablet.files[f].size for f in rc.files if f in tablet.files)
    bytes_read, parts_done, parts = hb.bytes_read or 0, hb.parts_done or 0, hb.parts or 0
    done = min(1.0, bytes_read / input_bytes) if input_bytes else 0.0
    if parts:
        done = max(done, parts_done / parts)
    elapsed = max(0.0, now - rc.started_ms / 1000.0)
    return {
        "table": table,
        "ecid": ecid,
        "tablet": tablet.id,
        "group": rc.group,
        "kind": rc.kind,
        "compactor": rc.compactor,
        "input_files": len(rc.files),
        "input_bytes": input_bytes,
        "bytes_read": bytes_read,
        "parts_done": parts_done,
        "parts": parts,
        "resumed_parts": hb.resume.parts_reused if hb.resume else 0,
        "done": round(done, 3),
        "elapsed_s": round(elapsed, 1),
        "left_s": round(elapsed * (1 - done) / done, 1) if 0 < done < 1 else None,
    }


def _running(store: MetadataStore, names: dict[str, str], now: float) -> list[RunningRow]:
    index = running_compactions(store)
    tablets = {t.id: t for t in store.tables.get_tablets(sorted({tid for tid, _rc in index.values()}))}
    out = []
    for ecid, (tid, rc) in sorted(index.items()):
        t = tablets.get(tid)
        if rc is None or t is None or ecid not in t.running:
            continue
        out.append(_progress(names.get(t.table, t.table), t, ecid, store.running.heartbeat(ecid), now))
    return out


def file_limit(table: TableInfo, services: dict[str, ServiceConfig]) -> int:
    """Files per tablet above which the planner compacts a tablet whatever the ratio says (the
    table's ``table.file.max``, else its service's ``maxFilesPerTablet``)."""
    name = dispatch(table.name, table.props, "SYSTEM", services.values())
    return settings_for(table, services.get(name) or DEFAULT).max_files_per_tablet


def table_health(tablets: list[Tablet], limit: int) -> TableHealth:
    """Files per tablet, tablets over the file limit, the deletes ratio and the score.

    The score says which tables most need compaction: the files beyond one per tablet, on
    average (what compactions would remove), plus 10 × the share of tablets over the file limit,
    plus 10 × the share of delete markers among the entries."""
    counts = [len(t.files) for t in tablets]
    entries = sum(m.entries for t in tablets for m in t.files.values())
    deletes = sum(m.deletes for t in tablets for m in t.files.values())
    over = sum(c > limit for c in counts)
    extra = sum(max(0, c - 1) for c in counts) / len(counts) if counts else 0.0
    ratio = deletes / entries if entries else 0.0
    share = over / len(counts) if counts else 0.0
    return {
        "file_limit": limit,
        "over_limit": over,
        "deletes": deletes,
        "deletes_ratio": round(ratio, 4),
        "score": round(extra + 10 * share + 10 * ratio, 2),
    }


def _ranked(tables: dict[str, TableFigures]) -> dict[str, TableFigures]:
    """The tables, the one that most needs compaction first."""
    return dict(sorted(tables.items(), key=lambda kv: -kv[1].get("score", 0.0)))


def _history(store: MetadataStore, groups: set[str], names: dict[str, str]) -> list[PageHistoryRow]:
    """The newest records, failures first (then the newest first within each)."""
    recs = history.read(store, groups, limit=HISTORY_ROWS)
    failed = history.read(store, groups, failed=True, limit=HISTORY_ROWS)
    seen = {r.ecid for r in failed}
    rows = failed + [r for r in recs if r.ecid not in seen]
    return [{**history_row(r, names.get(r.table, r.table)), "failed": r.failed} for r in rows[:HISTORY_ROWS]]


def collect(store: MetadataStore, samples: Samples | None = None, now: float | None = None) -> PageData:
    """Everything the page shows, as plain data (the page renders it; tests read it)."""
    now = time.time() if now is None else now
    services = store.fleet.services()
    # the tables' health from the tablets `kompaktor status` reads anyway: one pass over them
    status = gather(store, lambda t, tablets: table_health(tablets, file_limit(t, services)))
    names = {t["id"]: name for name, t in status["tables"].items()}
    groups = _groups(status, store.fleet.groups())
    samples = samples or Samples()
    return {
        "now": now,
        "groups": groups,
        "charts": {g: samples.of(g, now) for g in groups},
        "running": _running(store, names, now),
        "tables": _ranked(status["tables"]),
        "history": _history(store, set(groups) | history.known_groups(store), names),
        "dead_letters": len(status["dead_letters"]),
        "retries_pending": status["retries_pending"],
    }
