"""The verdict of a chaos run (`kompaktor demo --chaos`, the soak): what the faults of
:mod:`kompaktor.local.chaos` left behind, checked once the queues drained.

Owns :func:`check_chaos` and :func:`acknowledged_commits`; the demo and the benches import them
from here. Reads the store and the storage (and the compactors' logs); imports no process
(nothing of :mod:`kompaktor.local.demo` or the benches).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from kompaktor.coordinator import Coordinator, CoordinatorSettings
from kompaktor.files.storage import Storage
from kompaktor.local.chaos import ChaosLog
from kompaktor.metadata.store import MetadataStore


def acknowledged_commits(logs: Path) -> list[str]:
    """The ECIDs whose commit a compactor was told succeeded (its log line ``<ECID> <kind> on
    <tablet>: committed``), from every compactor log under ``logs``."""
    pat = re.compile(r"(ECID-[0-9a-f]{16}) \w+ on \S+: committed")
    out: list[str] = []
    for f in sorted(logs.glob("compactor-*.log")):
        out.extend(m.group(1) for m in pat.finditer(f.read_text(errors="replace")))
    return out


@dataclass
class _Kills:
    """What became of the compactions chaos killed (SIGKILL) and terminated (SIGTERM)."""

    applied: list[str]  # the ECIDs of the commits applied, once per commit
    after_commit: list[str]  # killed after their commit landed: no merge was killed
    mid_merge: list[tuple[str, str]]  # (ECID, tablet) killed mid-merge
    detected: int  # of those, found dead (in the dead log)
    rerun: int  # of those, whose tablet was compacted again
    term_dead: int  # SIGTERMed compactions found dead (a drain must leave none)


def _kills(log: ChaosLog, store: MetadataStore) -> _Kills:
    dead = store.running.dead_log()
    # A commit already on its way to Redis when the compactor was frozen is applied all the same
    # (commands from different connections have no order): such a kill came after the commit
    # landed, it killed no merge, and it is reported apart rather than counted as one.
    applied = store.bookkeeping.commit_log()
    committed = set(applied)
    mid_merge = [(e, t) for e, t in log.killed if e not in committed]
    return _Kills(
        applied=applied,
        after_commit=[e for e, _t in log.killed if e in committed],
        mid_merge=mid_merge,
        detected=sum(1 for e, _t in mid_merge if e in dead),
        rerun=sum(1 for _e, t in mid_merge if store.bookkeeping.commits_on(t) > log.commits_at_kill.get(t, 0)),
        term_dead=sum(1 for e in log.termed if e in dead),
    )


def _files_after_gc(store: MetadataStore, storage: Storage) -> tuple[list[str], list[str]]:
    """After a garbage collection: the files in storage no tablet references (or temporary ones),
    and the files a tablet references that are not in storage."""
    Coordinator(store, storage, CoordinatorSettings()).collect_garbage(grace_s=0)
    referenced = {f for t in store.tables.iter_all_tablets() for f in t.files}
    stray = [rel for rel, _m in storage.list_files("tables") if rel not in referenced]
    missing = [f for f in referenced if not storage.exists(f)]
    return stray, missing


def _failovers(
    log: ChaosLog, kills: _Kills, logs: Path | None, acked_writes: int, missing: list[str]
) -> tuple[dict[str, object], bool]:
    """With an HA Redis: both failovers happened at their moments, and every commit a compactor
    was told succeeded is in the commit log exactly once. The summary's lines, and whether it holds."""
    counts = Counter(kills.applied)
    acked = sorted(set(acknowledged_commits(logs))) if logs is not None else []
    lost = [e for e in acked if e not in counts]
    ok = len(log.failovers) == 2 and {f["moment"] for f in log.failovers} == {"ingest", "commit"} and not lost
    return {
        "chaos: Redis primary SIGKILLed, replica promoted (failovers)": len(log.failovers),
        "chaos: failovers": "; ".join(
            f"mid-{f['moment']}: {f['pending']} writes awaiting acknowledgment, "
            f"{f['commits_pending']} commits applied unacknowledged, promoted in "
            f"{f['promoted_s']}s"
            for f in log.failovers
        ),
        "chaos: acknowledged writes checked (flushes + commits)": acked_writes + len(acked),
        "chaos: acknowledged commits checked": len(acked),
        "chaos: acknowledged commits lost": len(lost),
    }, ok


def _handled_across_failovers(log: ChaosLog, store: MetadataStore, kills: _Kills) -> int:
    """A failover can take the dead-log entry with it (a bookkeeping write, not acknowledged to
    anyone, or the coordinator's pass ended by a write whose outcome was unknown): a killed
    compaction counts as handled when it is gone from the tablet and its tablet was compacted
    again; how many are in the dead log is reported as well."""
    gone_and_rerun = sum(
        1
        for e, t in kills.mid_merge
        if store.running.running_tablet(e) is None and store.bookkeeping.commits_on(t) > log.commits_at_kill.get(t, 0)
    )
    return max(kills.detected, gone_and_rerun)


def check_chaos(
    log: ChaosLog,
    store: MetadataStore,
    storage: Storage,
    *,
    ha: bool = False,
    logs: Path | None = None,
    acked_writes: int = 0,
) -> tuple[dict[str, object], bool]:
    """After the queues drained: every SIGKILLed compaction was detected dead and its tablet
    compacted again; SIGTERMed compactors caused no dead compaction; no running compaction is
    left; after garbage collection every file in storage is referenced and no temp file is left.
    No commit is applied twice (the commit log holds each ECID once) and every file a tablet
    references exists. With an HA Redis (failovers): every commit a compactor was told succeeded
    is in the commit log (none lost)."""
    kills = _kills(log, store)
    running_left = store.running.running_count()
    stray, missing = _files_after_gc(store, storage)
    ha_summary, ha_ok = _failovers(log, kills, logs, acked_writes, missing) if ha else ({}, True)
    twice = sorted(e for e, n in Counter(kills.applied).items() if n > 1)
    detected = _handled_across_failovers(log, store, kills) if ha else kills.detected
    killed = len(kills.mid_merge)
    ok = (
        detected == killed
        and kills.rerun == killed
        and kills.term_dead == 0
        and running_left == 0
        and not stray
        and (len(log.failovers) == 2 if ha else log.redis_restarts == 1)
        and ha_ok
        and not missing
        and not twice
        and log.coordinator_restarts >= 1
    )
    return {
        "chaos: compactors SIGKILLed mid-merge": killed,
        **({"chaos: kills that came after the commit landed": len(kills.after_commit)} if kills.after_commit else {}),
        "chaos: busy compactors SIGTERMed": len(log.termed),
        "chaos: coordinator restarts": log.coordinator_restarts,
        "chaos: Redis restarts": log.redis_restarts,
        "chaos: dead compactions detected (of the killed)": detected,
        **({"chaos: killed compactions in the dead log": kills.detected} if ha else {}),
        "chaos: killed jobs re-run": kills.rerun,
        "chaos: dead compactions from SIGTERM": kills.term_dead,
        "chaos: running compactions left": running_left,
        "chaos: unreferenced or temp files after GC": len(stray),
        "chaos: commits applied twice": len(twice),
        "chaos: referenced files missing": len(missing),
        **({"chaos: found": "; ".join(_found(twice, missing))} if twice or missing else {}),
        **ha_summary,
    }, ok


def _found(twice: list[str], missing: list[str]) -> list[str]:
    """What the verdict names: the first commits applied twice and files missing."""
    return [f"{e} applied twice" for e in twice[:5]] + [f"{f} referenced but missing" for f in sorted(missing)[:5]]
