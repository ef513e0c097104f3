"""The engines' side of resumable merges (docs/architecture.md "Long merges resume"; the record:
:mod:`kompaktor.model.resume`).

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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kompaktor.engines.api import MergeProgress, MergeRequest, MergeResult, ResumeFigures
from kompaktor.engines.ranges import progress_dict
from kompaktor.files.sortedfile import add_deletes_read
from kompaktor.files.storage import Storage
from kompaktor.model.errors import StoreUnavailable
from kompaktor.model.names import resume_part_name
from kompaktor.model.resume import Bound, PartRecord, ResumeLog, ResumeState, cuts_valid
from kompaktor.model.tablet import FileInfo

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
    plan_fn: Callable[[], list[tuple[Bound, Bound]]],
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


@dataclass
class ResumeRun:
    """One attempt of a resumable merge, the part both engines share: the plan (:func:`resume_plan`),
    every range's part name, which parts are recorded, and the figures the attempt reports. The
    engine merges the ranges in :attr:`ResumePlan.missing`, hands each finished part to
    :meth:`add_part`, appends :attr:`names` in order into the output and returns :meth:`result`."""

    log: ResumeLog
    plan: ResumePlan
    names: dict[int, str]
    started: float
    #: ranges whose part is recorded (reused, or recorded by this attempt): kept for a later one
    recorded: set[int]
    read: int = 0  # input entries this attempt merged (the reused ranges' are entries_reused)
    reread: int = 0  # compressed input bytes this attempt decoded
    done: int = 0  # parts finished: reused, or merged by this attempt
    #: delete markers the ranges read, from the footers of the parts appended (reused ones too);
    #: None once a part does not say (written before they were counted)
    deletes_read: int | None = 0

    @classmethod
    def start(
        cls, storage: Storage, req: MergeRequest, started: float, plan_fn: Callable[[], list[tuple[Bound, Bound]]]
    ) -> ResumeRun:
        """Plan the attempt: an earlier attempt's cuts and verified parts, else ``plan_fn()``'s
        ranges (recorded as the job's cuts); reused parts keep their names, the others are named
        by the job (:func:`~kompaktor.model.names.resume_part_name`)."""
        log_ = req.resume
        assert log_ is not None
        rp = resume_plan(storage, log_, req.prev, req.end, req.settings.now_ms, plan_fn)
        names = {i: rec.path for i, rec in rp.reused.items()} | {
            i: resume_part_name(req.output, log_.fingerprint, req.tmp_tag, i) for i in rp.missing
        }
        return cls(log_, rp, names, started, set(rp.reused), done=len(rp.reused))

    @property
    def parts(self) -> int:
        return len(self.plan.ranges)

    @property
    def entries_reused(self) -> int:
        return sum(r.entries_read for r in self.plan.reused.values())

    @property
    def bytes_reused(self) -> int:
        return sum(r.input_bytes for r in self.plan.reused.values())

    def figures(self) -> ResumeFigures:
        """What a resumable merge adds to its progress reports (:func:`progress_dict`)."""
        return {
            "parts_reused": len(self.plan.reused),
            "parts_rejected": len(self.plan.rejected),
            "entries_reused": self.entries_reused,
            "bytes_reused": self.bytes_reused,
            "input_bytes_reread": self.reread,
        }

    def progress(self, written: int, bytes_written: int, done: int | None = None) -> MergeProgress:
        """The attempt's progress report now (``done``: parts finished, default :attr:`done`)."""
        done = self.done if done is None else done
        read_bytes = self.bytes_reused + self.reread
        return progress_dict(
            self.read, written, read_bytes, bytes_written, done, self.parts, self.started, **self.figures()
        )

    def add_part(self, rec: PartRecord) -> None:
        """A part this attempt merged and wrote: recorded (when the store takes it) and counted."""
        if record_part(self.log, rec):
            self.recorded.add(rec.index)
        self.read += rec.entries_read
        self.reread += rec.input_bytes
        self.done += 1

    def appended(self, part_meta: dict[bytes, bytes]) -> None:
        """A part appended into the output: its footer's count of the delete markers its range read."""
        self.deletes_read = add_deletes_read(self.deletes_read, part_meta)

    def unrecorded(self, written: Iterable[int]) -> list[str]:
        """The part names among ``written`` not recorded: of no use to a later attempt."""
        return [self.names[i] for i in written if i not in self.recorded]

    def result(self, info: FileInfo, written: int, bytes_in: int) -> MergeResult:
        """The merge's result once its output is committed (the parts stay until the caller's commit)."""
        return MergeResult(
            info=info,
            entries_read=self.read,
            entries_written=written,
            bytes_read=bytes_in,
            bytes_written=info.size,
            parts=tuple(self.names[i] for i in range(self.parts)),
            resumable=True,
            parts_reused=len(self.plan.reused),
            entries_reused=self.entries_reused,
            bytes_reused=self.bytes_reused,
            input_bytes_reread=self.reread,
            deletes_read=self.deletes_read,
        )
