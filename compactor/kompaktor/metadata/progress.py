"""Progress records of resumable merges (docs/architecture.md "Long merges resume"), in Redis,
apart from the reserve/commit scripts (plain hash commands; nothing here touches a tablet).

One record per job fingerprint (:func:`kompaktor.model.resume.job_fingerprint`):
``kz:progress:<fp>`` holds ``job`` (tablet, inputs, range cuts, the first attempt's clock) and
``p:<index>`` per finished part (:class:`~kompaktor.model.resume.PartRecord`); ``kz:progress``
indexes fingerprint -> tablet for the garbage collector.

**Bound.** A record lives at most :data:`PROGRESS_TTL_S` after its last write (Redis expiry,
renewed with every part recorded), and is deleted before that:

- on commit, with its parts (:func:`finish`);
- when the job changed: a commit refused, the tablet gone or no longer holding every input, a
  user compaction cancelled, a bad input (:func:`discard`, by the compactor); and by the
  coordinator's garbage collection (:func:`prune`: the tablet gone, split or merged — its range
  is no longer the record's —, an input no longer the tablet's, its selection cancelled or done,
  the job dead-lettered), which also drops index entries whose record expired.

A record whose job is still possible (tablet there with the same range, all its inputs still the
tablet's files, its selection still the tablet's, not dead-lettered) is
**live**: the garbage collector keeps its parts whatever their age. Once it is pruned or expired
its parts are ordinary temporary files, removed after the temp-file grace period.

Losing a record (a Redis failover before it was replicated) loses nothing but work: the parts are
then unreferenced temporary files and the next attempt merges every range again.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import TypedDict, cast

from kompaktor import keyspace
from kompaktor.connection import text
from kompaktor.files.storage import Storage
from kompaktor.metadata.store import MetadataStore
from kompaktor.model.errors import StoreUnavailable
from kompaktor.model.job import fingerprint as job_fingerprint_of_failures
from kompaktor.model.resume import (
    Bound,
    PartRecord,
    ResumeState,
    decode_cuts,
    encode_cuts,
)
from kompaktor.model.tablet import Tablet

log = logging.getLogger(__name__)


def _hex(b: Bound) -> str | None:
    return None if b is None else b.hex()


class ProgressJob(TypedDict, total=False):
    """The job a progress record is for (its ``job`` field, JSON): written whole by
    :meth:`RedisResumeLog.start`, read as it may be found (a damaged or older record lacks fields)."""

    tablet: str
    inputs: list[str]
    range: list[str | None]  # the tablet's range then, rows hex-encoded
    selection: str | None
    cuts: list[list[str | None]]
    now_ms: int
    created: float


#: a progress record expires this long after its last write (a day: a requeued job is normally
#: retried within minutes; a job that waits longer, e.g. behind a full queue, starts over)
PROGRESS_TTL_S = 24 * 3600


class RedisResumeLog:
    """The :class:`~kompaktor.model.resume.ResumeLog` of one job, in the metadata store."""

    def __init__(
        self,
        store: MetadataStore,
        fingerprint: str,
        tablet: str,
        inputs: tuple[str, ...],
        prev: Bound = None,
        end: Bound = None,
        selection: str | None = None,
    ) -> None:
        self.store = store
        self.fingerprint = fingerprint
        self.tablet = tablet
        self.inputs = tuple(inputs)
        self.prev, self.end = prev, end
        self.selection = selection  # a USER or SELECTOR job's selection: cancelled, the job is gone
        self.key = keyspace.progress_key(fingerprint)
        #: parts recorded by this attempt (and reused ones), index -> record
        self.recorded: dict[int, PartRecord] = {}

    def load(self) -> ResumeState | None:
        raw = cast("dict[bytes, bytes]", self.store.call(self.store._r.hgetall, self.key))
        if not raw or b"job" not in raw:
            return None
        try:
            job = json.loads(raw[b"job"])
            cuts = decode_cuts(job["cuts"])
            now_ms = int(job.get("now_ms", 0))
        except (ValueError, KeyError, TypeError):
            log.warning("progress record %s is damaged: not used", self.fingerprint[:16])
            return None
        if job.get("tablet") != self.tablet or sorted(job.get("inputs", [])) != sorted(self.inputs):
            return None  # a fingerprint collision of another job: never
        parts: dict[int, PartRecord] = {}
        for k, v in raw.items():
            if k.startswith(b"p:"):
                try:
                    rec = PartRecord.from_json(v)
                except (ValueError, KeyError, TypeError):
                    continue  # damaged: that range is merged again
                parts[rec.index] = rec
        return ResumeState(cuts, now_ms, parts)

    def start(self, cuts: tuple[tuple[Bound, Bound], ...], now_ms: int) -> None:
        """Record the job and its cuts (a new record: any older one under this key is replaced)."""
        job: ProgressJob = {
            "tablet": self.tablet,
            "inputs": list(self.inputs),
            "range": [_hex(self.prev), _hex(self.end)],
            "selection": self.selection,
            "cuts": encode_cuts(cuts),
            "now_ms": now_ms,
            "created": time.time(),
        }
        r = self.store._r
        p = r.pipeline(transaction=True)
        p.delete(self.key)
        p.hset(self.key, "job", json.dumps(job))
        p.expire(self.key, PROGRESS_TTL_S)
        p.hset(keyspace.PROGRESS, self.fingerprint, self.tablet)
        self.store.call(p.execute)

    def record(self, part: PartRecord) -> None:
        r = self.store._r
        p = r.pipeline(transaction=True)
        p.hset(self.key, f"p:{part.index}", part.to_json())
        p.expire(self.key, PROGRESS_TTL_S)
        self.store.call(p.execute)
        self.recorded[part.index] = part

    def drop(self, index: int) -> None:
        self.store.call(self.store._r.hdel, self.key, f"p:{index}")
        self.recorded.pop(index, None)

    def forget_record(self, fingerprint: str) -> None:
        """How :func:`discard` and :func:`finish` forget this job's record (:func:`forget`)."""
        forget(self.store, fingerprint)


def part_paths(store: MetadataStore, fingerprint: str) -> list[str]:
    """The part files a record lists."""
    raw = cast("dict[bytes, bytes]", store.call(store._r.hgetall, keyspace.progress_key(fingerprint)))
    out = []
    for k, v in raw.items():
        if k.startswith(b"p:"):
            try:
                out.append(PartRecord.from_json(v).path)
            except (ValueError, KeyError, TypeError):
                continue
    return out


def forget(store: MetadataStore, fingerprint: str) -> None:
    """Delete a job's progress record and its index entry (not its parts)."""
    p = store._r.pipeline(transaction=True)
    p.delete(keyspace.progress_key(fingerprint))
    p.hdel(keyspace.PROGRESS, fingerprint)
    store.call(p.execute)


#: how a record is forgotten: :func:`forget` in the store, or through the coordinator's broker
Forget = Callable[[str], None]


def discard(
    store: MetadataStore,
    storage: Storage | None,
    fingerprint: str,
    also: tuple[str, ...] = (),
    forget_record: Forget | None = None,
) -> list[str]:
    """Forget a job's progress and delete its recorded parts (and ``also``); returns the parts
    deleted. The record goes first: a part is never left listed in a record without its file.
    Parts that cannot be deleted now are left to the garbage collector (no live record keeps
    them)."""
    paths = sorted(set(part_paths(store, fingerprint)) | set(also))
    if forget_record is None:
        forget(store, fingerprint)
    else:
        forget_record(fingerprint)
    deleted = []
    if storage is not None:
        for rel in paths:
            try:
                if storage.delete(rel):
                    deleted.append(rel)
            except OSError as exc:
                log.warning("%s: left for the garbage collector (storage: %s)", rel, " ".join(str(exc).split()))
    return deleted


def finish(
    store: MetadataStore,
    storage: Storage,
    fingerprint: str,
    also: tuple[str, ...] = (),
    forget_record: Forget | None = None,
) -> None:
    """After a commit: the record and every part go (best effort: an unreachable store leaves
    the record to :func:`prune`, whose job no longer exists once the commit landed)."""
    try:
        discard(store, storage, fingerprint, also, forget_record)
    except StoreUnavailable as exc:
        log.warning("progress of %s left for the garbage collector: %s", fingerprint[:16], exc)
        for rel in also:
            try:
                storage.delete(rel)
            except OSError:
                pass


def records(store: MetadataStore) -> dict[str, str]:
    """Fingerprint -> tablet id of every indexed record."""
    return {text(k): text(v) for k, v in store.call(store._r.hgetall, keyspace.PROGRESS).items()}


def _gone(job: ProgressJob, t: Tablet | None, dead: set[str]) -> bool:
    """Whether the job a record was written for can no longer run."""
    if t is None:
        return True  # the tablet is gone: split, merged or deleted
    inputs = job.get("inputs", [])
    if not set(inputs) <= set(t.files):
        return True  # an input was compacted away (the job committed, or another one did)
    if job.get("range") != [_hex(t.prev), _hex(t.end)]:
        return True  # the tablet was split or merged into one with the same id
    sel = job.get("selection")
    if sel is not None and (t.selection is None or t.selection.id != sel):
        return True  # its user compaction (or selector's selection) was cancelled or is done
    return job_fingerprint_of_failures(job.get("tablet", ""), inputs) in dead  # dead-lettered


def prune(store: MetadataStore) -> tuple[set[str], list[str]]:
    """The coordinator's pass over the records: forget those whose job can no longer run (see
    :func:`_gone`: tablet gone, split or merged, an input no longer the tablet's, its selection
    cancelled, the job dead-lettered) and index entries whose record expired or is damaged.
    Returns (the live fingerprints, the pruned ones). Parts are not deleted here: once no live
    record names their fingerprint they are temporary files like any other, collected after the
    grace period."""
    idx = records(store)
    if not idx:
        return set(), []
    tablets = {t.id: t for t in store.tables.get_tablets(sorted(set(idx.values())))}
    dead = set(store.running.dead_letters())
    live: set[str] = set()
    stale: list[str] = []
    for fp, tid in idx.items():
        raw = store.call(store._r.hget, keyspace.progress_key(fp), "job")
        try:
            job = json.loads(raw) if raw is not None else None
        except ValueError:
            job = None
        if not isinstance(job, dict) or _gone(cast(ProgressJob, job), tablets.get(tid), dead):
            stale.append(fp)
            continue
        live.add(fp)
    for fp in stale:
        discard(store, None, fp)
    return live, stale
