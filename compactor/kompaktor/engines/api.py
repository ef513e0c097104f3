"""The merge engine API the compactor calls: one request in, one committed output file out.

Two engines implement it and are held to the same conformance tests (output identical to
:func:`kompaktor.model.iterators.merged_view`):

- ``spark`` (:mod:`kompaktor.engines.spark`): the merge is planned as key-range tasks that Spark
  schedules on its executors (``local[*]`` in the pod, or a Spark cluster); for big jobs.
- ``arrow`` (:mod:`kompaktor.engines.arrow`): the same key-range plan run in-process, one range
  at a time; no per-job Spark overhead, for groups that hold only small jobs.

Both write the output under a temporary name that carries ``tmp_tag`` (the ECID) and rename it
to ``output`` only when complete; on any failure or cancellation nothing remains under either
name. Corrupt, unreadable or wrongly-shaped inputs raise :class:`~kompaktor.model.errors.BadFileError`
naming the file.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NotRequired, Protocol, TypedDict, runtime_checkable

from kompaktor.files.storage import Storage
from kompaktor.model.errors import KompaktorError
from kompaktor.model.iterators import IteratorSettings
from kompaktor.model.resume import ResumeLog
from kompaktor.model.tablet import FileInfo


@dataclass(frozen=True)
class MergeRequest:
    inputs: tuple[str, ...]  # relative paths, oldest first
    output: str  # relative path of the final output file
    prev: bytes | None  # tablet range (prev, end]: read only those rows, output only those rows
    end: bytes | None
    settings: IteratorSettings
    tmp_tag: str  # put into the temporary file names (the ECID), so dead-compaction cleanup finds them
    #: where a resumable merge records its finished parts (docs/architecture.md "Long merges
    #: resume"; :mod:`.resume`); None: not resumable. The engine decides whether the merge is big enough to pay for it.
    resume: ResumeLog | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.inputs, list):
            object.__setattr__(self, "inputs", tuple(self.inputs))
        if not self.output:
            raise ValueError("merge request without an output path")
        if self.output in self.inputs:
            raise ValueError(f"merge output {self.output!r} is also one of its inputs")
        if self.prev is not None and self.end is not None and self.prev >= self.end:
            raise ValueError(f"empty tablet range ({self.prev!r}, {self.end!r}]")
        if not self.tmp_tag or "/" in self.tmp_tag:
            raise ValueError(f"tmp_tag must be a non-empty name without '/', got {self.tmp_tag!r}")


@dataclass(frozen=True)
class MergeResult:
    info: FileInfo
    entries_read: int
    entries_written: int
    bytes_read: int
    bytes_written: int
    #: a resumable merge's part files: kept until the output is committed, then the caller
    #: removes them (:func:`kompaktor.metadata.progress.finish`)
    parts: tuple[str, ...] = ()
    resumable: bool = False
    parts_reused: int = 0
    entries_reused: int = 0  # input entries of the reused ranges (not read again)
    bytes_reused: int = 0  # compressed input bytes of the reused ranges (not read again)
    input_bytes_reread: int = 0  # compressed input bytes this attempt decoded (resumable merges)
    #: delete markers among the entries of the tablet's range in the inputs (reused ranges
    #: included); None: not counted (a part of an earlier attempt written before they were)
    deletes_read: int | None = None

    @property
    def deletes_dropped(self) -> int | None:
        """Delete markers the merge dropped (a full compaction drops them all): those it read
        minus those it wrote; the merge never makes one."""
        return None if self.deletes_read is None else self.deletes_read - self.info.deletes


class MergeCancelled(Exception):
    """The merge was cancelled (its ``cancel`` event was set); nothing was left behind.
    Deliberately not a KompaktorError: a cancelled job is released, not failed."""


class MergeError(KompaktorError):
    """The merge failed for a reason other than its input files (e.g. the Spark job failed)."""


class ResumeFigures(TypedDict, total=False):
    """What a resumable merge adds to its progress: ``parts_reused``, ``entries_reused`` and
    ``bytes_reused`` (input entries and compressed input bytes of the ranges taken from an earlier
    attempt's parts, not read again), ``input_bytes_reread`` (compressed input bytes of the row
    groups this attempt decoded) and ``parts_rejected`` (recorded parts that failed verification
    and were merged again). A merge that is not resumable reports none of them."""

    parts_reused: int
    entries_reused: int
    bytes_reused: int
    input_bytes_reread: int
    parts_rejected: int


class MergeProgress(ResumeFigures):
    """A merge's progress report (:func:`kompaktor.engines.ranges.progress_dict`), heartbeated by
    the compactor as it is (so its keys are the heartbeat's fields). The four counts are always
    there; the parts and the time from the engine's first report on."""

    entries_read: int
    entries_written: int
    bytes_read: int
    bytes_written: int
    parts_done: NotRequired[int]
    parts: NotRequired[int]
    elapsed_s: NotRequired[float]


ProgressFn = Callable[[MergeProgress], None]


@runtime_checkable
class MergeEngine(Protocol):
    name: str

    def merge(
        self,
        storage: Storage,
        req: MergeRequest,
        *,
        progress: ProgressFn | None = None,
        cancel: threading.Event | None = None,
    ) -> MergeResult: ...
