"""The engines' side of resumable merges (issue 23 §2; the record: :mod:`kompaktor.model.resume`).

A resumable merge writes every key range as one part file named by the job's fingerprint
(:func:`kompaktor.model.names.resume_part_name`), records the finished part in its
:class:`~kompaktor.model.resume.ResumeLog` (size and SHA-256 of the file's bytes, taken as it is
appended to the output), and appends the parts in range order into the output without decoding
them (:class:`~kompaktor.files.parquetconcat.ConcatWriter`). Parts stay until the commit: a later
attempt of the same job then reuses every part that still verifies — same key range as the
recorded cut, same size, same SHA-256 — and merges only the other ranges. A part that does not
verify is deleted, its record dropped, and its range merged again: never trusted.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field

from kompaktor.files.storage import Storage
from kompaktor.model.errors import StoreUnavailable
from kompaktor.model.resume import Bound, PartRecord, ResumeLog, ResumeState, cuts_valid

log = logging.getLogger(__name__)

HASH_CHUNK = 8 << 20


def file_digest(storage: Storage, rel: str) -> tuple[int, str]:
    """(size, SHA-256 hex) of a file's bytes."""
    h = hashlib.sha256()
    n = 0
    with storage.open_input(rel) as f:
        while chunk := f.read(HASH_CHUNK):
            h.update(chunk)
            n += len(chunk)
    return n, h.hexdigest()


def verify_part(storage: Storage, rec: PartRecord, lo: Bound, hi: Bound) -> str | None:
    """Why a recorded part cannot be reused for range (lo, hi], or None when it can."""
    if (rec.lo, rec.hi) != (lo, hi):
        return "recorded for another key range"
    try:
        size, digest = file_digest(storage, rec.path)
    except FileNotFoundError:
        return "file missing"
    except OSError as exc:
        return f"unreadable: {exc}"
    if size != rec.size:
        return f"size {size}, recorded {rec.size}"
    if digest != rec.sha256:
        return "checksum differs from the recorded one"
    return None


@dataclass
class ResumePlan:
    """How one attempt runs: the ranges (recorded cuts, or its own plan) and the parts it reuses."""

    ranges: list[tuple[Bound, Bound]]
    reused: dict[int, PartRecord] = field(default_factory=dict)
    #: recorded parts that failed verification (index -> why), merged again
    rejected: dict[int, str] = field(default_factory=dict)
    resumed: bool = False  # a record of an earlier attempt was found and used

    @property
    def missing(self) -> list[int]:
        return [i for i in range(len(self.ranges)) if i not in self.reused]


def load_state(log_: ResumeLog) -> ResumeState | None:
    try:
        return log_.load()
    except StoreUnavailable as exc:
        log.warning("progress of %s unreadable, merging everything: %s", log_.fingerprint[:16], exc)
        return None


def resume_plan(
    storage: Storage,
    log_: ResumeLog,
    prev: Bound,
    end: Bound,
    now_ms: int,
    plan_fn,
    state: ResumeState | None = None,
) -> ResumePlan:
    """The ranges and reusable parts of a resumable merge: an earlier attempt's cuts and verified
    parts when its record is there, else ``plan_fn()``'s ranges, recorded as the job's cuts."""
    state = load_state(log_) if state is None else state
    if state is not None and cuts_valid(state.cuts, prev, end):
        rp = ResumePlan(list(state.cuts), resumed=True)
        for i, rec in sorted(state.parts.items()):
            if not 0 <= i < len(rp.ranges):
                continue
            why = verify_part(storage, rec, *rp.ranges[i])
            if why is None:
                rp.reused[i] = rec
                continue
            rp.rejected[i] = why
            log.warning("part %d of %s not reused (%s): merged again", i, log_.fingerprint[:16], why)
            try:
                log_.drop(i)
            except StoreUnavailable:
                pass
            try:
                storage.delete(rec.path)
            except OSError:
                pass
        return rp
    rp = ResumePlan(list(plan_fn()))
    try:
        log_.start(tuple(rp.ranges), now_ms)
    except StoreUnavailable as exc:
        log.warning("progress of %s cannot be recorded: %s", log_.fingerprint[:16], exc)
    return rp


def record_part(log_: ResumeLog, rec: PartRecord) -> bool:
    """Record a finished part; False (and a warning) when the store cannot take it now: the part
    is then not reusable, which costs a later attempt that range's merge, nothing else."""
    try:
        log_.record(rec)
        return True
    except StoreUnavailable as exc:
        log.warning("part %d of %s not recorded: %s", rec.index, log_.fingerprint[:16], exc)
        return False
