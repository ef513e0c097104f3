"""Jobs that fail: retried with backoff, dead-lettered after N failures of the same job
(same tablet and files). Changing a tablet's files changes the job, so a fixed tablet is
planned afresh."""

from __future__ import annotations

import time

from kompaktor.metadata.store import MetadataStore
from kompaktor.metadata.store.running import FailedJob, FailureRecord
from kompaktor.model.job import fingerprint

MAX_ATTEMPTS = 3
MAX_BACKOFF_S = 60.0


def record_failure(
    store: MetadataStore,
    tablet: str,
    files: list[str] | tuple[str, ...],
    group: str,
    error: str,
    *,
    max_attempts: int = MAX_ATTEMPTS,
    base_backoff_s: float = 1.0,
) -> bool:
    """Count one failure, atomically (one script: concurrent failures of the same job each
    count); returns True when the job was dead-lettered."""
    job = FailedJob(tablet, group, tuple(sorted(files)), error[:500])
    _count, dead = store.running.count_failure(
        fingerprint(tablet, files), job, time.time(), base_backoff_s, MAX_BACKOFF_S, max_attempts
    )
    return dead


def skip_set(store: MetadataStore, now: float | None = None) -> set[str]:
    """Fingerprints not to queue now: dead-lettered, or still backing off."""
    now = time.time() if now is None else now
    skip = set(store.running.dead_letters())
    skip.update(fp for fp, rec in store.running.failures().items() if rec.retry_at > now)
    return skip


def redirty_due(store: MetadataStore, now: float | None = None) -> list[str]:
    """Tablets whose backoff has passed: mark them for planning once (one atomic step)."""
    return store.running.redirty_failed(time.time() if now is None else now)


def forget_settled(store: MetadataStore) -> int:
    """Forget the failures of jobs that cannot come back: their tablet is gone, or no longer
    holds all of their files (the job ran again and committed, or the files were compacted away
    by another job, split off or merged). Without this every job that ever failed once stayed in
    ``kz:failures`` for good, and every planning pass read them all (found by the soak bench).
    Returns how many were forgotten."""
    recs = store.running.failures()
    if not recs:
        return 0
    tablets = {t.id: t for t in store.tables.get_tablets(sorted({r.tablet for r in recs.values()}))}
    stale = [fp for fp, r in recs.items() if (t := tablets.get(r.tablet)) is None or not set(r.files) <= set(t.files)]
    store.running.forget_failures(stale)
    return len(stale)


def pending_retries(store: MetadataStore) -> int:
    """Failed jobs waiting out their backoff: not queued and not dirty, yet still to be run."""
    return sum(1 for rec in store.running.failures().values() if not rec.redirtied)


def dead_letters(store: MetadataStore) -> list[FailureRecord]:
    """The dead-lettered jobs, by fingerprint."""
    return [rec for _fp, rec in sorted(store.running.dead_letters().items())]
