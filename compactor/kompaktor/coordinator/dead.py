"""Dead-compaction detection: a running compaction without a heartbeat for too long is removed
(ECID, temporary output), its failure counted, and its tablet re-planned (DESIGN invariant 5)."""

from __future__ import annotations

import logging
import time

from kompaktor.files.storage import Storage
from kompaktor.metadata import failures
from kompaktor.metadata.compactions import delete_outputs, remove_running, running_compactions
from kompaktor.metadata.store import MetadataStore

log = logging.getLogger("kompaktor.coordinator")


def detect_dead(store: MetadataStore, storage: Storage, dead_after_s: float, max_attempts: int, *,
                not_before: float = 0.0) -> list[str]:
    """Remove the compactions whose last heartbeat (or start, or ``not_before``: when the store
    became reachable again after an outage) is older than ``dead_after_s``; returns their ECIDs.
    The removal is a (fenced) conditional mutation; outputs are deleted only after it applied."""
    now = time.time()
    dead = []
    for ecid, (tablet_id, rc) in running_compactions(store).items():
        if rc is None:
            store.forget_running(ecid)
            continue
        hb = store.heartbeat(ecid)
        last = max(not_before, float(hb["updated"]) if "updated" in hb else rc.started_ms / 1000.0)
        if now - last <= dead_after_s:
            continue
        log.warning("compaction %s on %s (compactor %s) is dead: no heartbeat for %.0fs",
                    ecid, tablet_id, rc.compactor, now - last)
        if remove_running(store, tablet_id, ecid):
            delete_outputs(storage, rc.output, ecid)
            store.drop_heartbeat(ecid)
            store.log_dead(ecid, rc.group)
            failures.record_failure(store, tablet_id, rc.files, rc.group, "compactor died", max_attempts=max_attempts)
            store.mark_dirty([tablet_id])
            dead.append(ecid)
    return dead
