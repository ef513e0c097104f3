"""Jobs that fail: retried with backoff, dead-lettered after N failures of the same job
(same tablet and files). Changing a tablet's files changes the job, so a fixed tablet is
planned afresh."""

from __future__ import annotations

import json
import time
from typing import Any

from kompaktor import contract as C
from kompaktor.compactions import fingerprint
from kompaktor.store import MetadataStore

MAX_ATTEMPTS = 3
MAX_BACKOFF_S = 60.0


def record_failure(store: MetadataStore, tablet: str, files: list[str] | tuple[str, ...], group: str,
                   error: str, *, max_attempts: int = MAX_ATTEMPTS, base_backoff_s: float = 1.0) -> bool:
    """Count one failure; returns True when the job was dead-lettered."""
    fp = fingerprint(tablet, files)
    raw = store.r.hget(C.FAILURES, fp)
    rec: dict[str, Any] = json.loads(raw) if raw else {"count": 0}
    rec.update(count=rec["count"] + 1, tablet=tablet, group=group, files=sorted(files), last_error=error[:500],
               retry_at=time.time() + min(MAX_BACKOFF_S, base_backoff_s * 2 ** rec["count"]), redirtied=False)
    if rec["count"] >= max_attempts:
        store.r.hset(C.DEADLETTER, fp, json.dumps(rec))
        store.r.hdel(C.FAILURES, fp)
        store.incr("dead_lettered")
        return True
    store.r.hset(C.FAILURES, fp, json.dumps(rec))
    return False


def skip_set(store: MetadataStore, now: float | None = None) -> set[str]:
    """Fingerprints not to queue now: dead-lettered, or still backing off."""
    now = time.time() if now is None else now
    skip = {k.decode() for k in store.r.hkeys(C.DEADLETTER)}
    for fp, raw in store.r.hgetall(C.FAILURES).items():
        if json.loads(raw)["retry_at"] > now:
            skip.add(fp.decode())
    return skip


def redirty_due(store: MetadataStore, now: float | None = None) -> list[str]:
    """Tablets whose backoff has passed: mark them for planning once."""
    now = time.time() if now is None else now
    due = []
    for fp, raw in store.r.hgetall(C.FAILURES).items():
        rec = json.loads(raw)
        if rec["retry_at"] <= now and not rec.get("redirtied"):
            rec["redirtied"] = True
            store.r.hset(C.FAILURES, fp, json.dumps(rec))
            due.append(rec["tablet"])
    store.mark_dirty(due)
    return due


def pending_retries(store: MetadataStore) -> int:
    """Failed jobs waiting out their backoff: not queued and not dirty, yet still to be run."""
    return sum(1 for raw in store.r.hvals(C.FAILURES) if not json.loads(raw).get("redirtied"))


def dead_letters(store: MetadataStore) -> list[dict[str, Any]]:
    return [json.loads(v) for _k, v in sorted(store.r.hgetall(C.DEADLETTER).items())]
