"""Dead-compaction detection: a running compaction without a heartbeat for too long is removed
(ECID, temporary output), its failure counted, and its tablet re-planned (DESIGN invariant 5)."""

from __future__ import annotations

import logging
import time

from kompaktor.connection import NotDurable
from kompaktor.files.storage import Storage
from kompaktor.metadata import failures, history
from kompaktor.metadata.compactions import delete_outputs, remove_running, running_compactions
from kompaktor.metadata.store import MetadataStore
from kompaktor.metadata.store.running import Heartbeat
from kompaktor.model.errors import StoreUnavailable
from kompaktor.model.tablet import RunningCompaction

log = logging.getLogger("kompaktor.coordinator")

#: how long to wait for Redis to answer again (a failover) when a removal's outcome is unknown
REREAD_S = 30.0


def _removed(store: MetadataStore, tablet_id: str, ecid: str, rc: RunningCompaction) -> bool:
    """Remove a dead compaction from its tablet; True when it is gone because of this removal.

    A removal not confirmed durable (:class:`NotDurable`: a failover while it was replicated)
    may or may not have applied: the tablet, read once Redis answers again, says which. Without
    this, an applied removal whose reply was lost ended the pass before its outputs, failure and
    dead-log entry were handled, and the next pass no longer saw the ECID."""
    try:
        return remove_running(store, tablet_id, ecid)
    except NotDurable:
        log.warning("removing dead compaction %s: outcome unknown (failover?); reading the tablet", ecid)
    deadline = time.monotonic() + REREAD_S
    while True:
        try:
            t = store.tables.tablet(tablet_id)
            break
        except StoreUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    # gone from the tablet and its output not committed there: our removal applied (a release by
    # the compactor in between is handled the same way: its outputs are garbage either way)
    return t is not None and ecid not in t.running and rc.output not in t.files


def _killed(
    tablet_id: str, ecid: str, rc: RunningCompaction, hb: Heartbeat, silent_s: float, lettered: bool
) -> history.Record:
    """The history's record of a compaction found dead (its last heartbeat's figures)."""
    return history.Record(
        ecid=ecid,
        outcome=history.DEAD_LETTERED if lettered else history.KILLED,
        group=rc.group,
        table=tablet_id.split(";", 1)[0],
        tablet=tablet_id,
        kind=rc.kind,
        compactor=rc.compactor,
        finished=time.time(),
        reason=f"compactor died: no heartbeat for {silent_s:.0f}s",
        input_files=len(rc.files),
        input_entries=hb.entries_read,
        merge_s=round(max(0.0, time.time() - rc.started_ms / 1000.0), 3),
        resumed_parts=hb.resume.parts_reused if hb.resume else 0,
    )


def _group_limits(store: MetadataStore) -> dict[str, history.HistoryLimits]:
    """Each configured group's history bounds (its CompactorGroup's spec.history), the bounds its
    compactors trim with; none when they cannot be read (the record is never worth a failure)."""
    try:
        return {g: history.HistoryLimits.of_group(cfg) for g, cfg in store.fleet.groups().items()}
    except Exception as exc:
        log.warning("history bounds of the groups not read: %s", exc)
        return {}


def detect_dead(
    store: MetadataStore,
    storage: Storage,
    dead_after_s: float,
    max_attempts: int,
    *,
    not_before: float = 0.0,
    history_limits: history.HistoryLimits = history.HistoryLimits(),
) -> list[str]:
    """Remove the compactions whose last heartbeat (or start, or ``not_before``: when the store
    became reachable again after an outage) is older than ``dead_after_s``; returns their ECIDs.
    The removal is a (fenced) conditional mutation; outputs are deleted only after it applied.
    Each is recorded in its group's history, trimmed to the group's bounds (``history_limits`` for
    a group with no configuration)."""
    now = time.time()
    dead = []
    limits: dict[str, history.HistoryLimits] | None = None  # read once a pass finds a dead one
    for ecid, (tablet_id, rc) in running_compactions(store).items():
        if rc is None:
            store.running.forget_running(ecid)
            continue
        hb = store.running.heartbeat(ecid)
        last = max(not_before, hb.updated if hb.updated is not None else rc.started_ms / 1000.0)
        if now - last <= dead_after_s:
            continue
        log.warning(
            "compaction %s on %s (compactor %s) is dead: no heartbeat for %.0fs",
            ecid,
            tablet_id,
            rc.compactor,
            now - last,
        )
        if _removed(store, tablet_id, ecid, rc):
            delete_outputs(storage, rc.output, ecid)
            store.running.drop_heartbeat(ecid)
            store.running.log_dead(ecid, rc.group)
            lettered = failures.record_failure(
                store, tablet_id, rc.files, rc.group, "compactor died", max_attempts=max_attempts
            )
            store.bookkeeping.mark_dirty([tablet_id])
            dead.append(ecid)
            if limits is None:
                limits = _group_limits(store)
            rec = _killed(tablet_id, ecid, rc, hb, now - last, lettered)
            history.append(store, rec, limits.get(rc.group, history_limits))
    return dead
