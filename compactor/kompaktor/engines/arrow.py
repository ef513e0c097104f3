"""The in-process Arrow engine: the key ranges of the plan (:mod:`kompaktor.engines.ranges`)
merged in this process and streamed into the output file, so its memory is bounded by the range
size, not the job size. No per-job Spark overhead: for groups that hold only small jobs. The
Spark engine (:mod:`kompaktor.engines.spark`) runs the same ranges as Spark tasks.

Ranges run on ``workers`` threads (one per core by default, :func:`default_workers`;
:mod:`kompaktor.engines.pipeline`): each reads its range's rows from the inputs in range order,
merges them (:func:`~kompaktor.files.arrowstack.merge_tables_once`) and encodes them as Parquet in
memory; the encoded ranges are spliced into the output in order
(:class:`~kompaktor.files.parquetconcat.SpliceWriter`) — the same bytes as writing the merged
ranges one after the other with one ``SortedFileWriter``. At most ``workers`` ranges are in flight.

From ``resume_min_bytes`` of input, a merge given a resume log is resumable (docs/architecture.md "Long merges resume",
:mod:`kompaktor.engines.resume`): each range is written as a part, checksummed and recorded, the
ranges an earlier attempt recorded are reused, and the parts are appended into the output at the
end without decoding.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial

import pyarrow as pa

from kompaktor.engines.api import MergeCancelled, MergeProgress, MergeRequest, MergeResult, ProgressFn
from kompaktor.engines.pipeline import run_ordered
from kompaktor.engines.ranges import (
    COPY_MIN_BYTES,
    MERGE_FACTOR,
    RANGE_BYTES,
    TASK_MEMORY,
    Bound,
    Copied,
    CopyRun,
    InputCursor,
    InputMeta,
    Piece,
    copy_run,
    open_merge,
    plan,
    plan_copies,
    progress_dict,
)
from kompaktor.engines.resume import ResumeRun
from kompaktor.files.arrowstack import merge_tables_once
from kompaktor.files.parquetconcat import ConcatWriter, SpliceWriter
from kompaktor.files.phases import phase
from kompaktor.files.sortedfile import (
    DELETES_READ,
    EncodedRange,
    SortedFileWriter,
    count_deletes,
    encode_table,
    write_encoded,
)
from kompaktor.files.storage import Storage
from kompaktor.model.iterators import IteratorSettings
from kompaktor.model.resume import PartRecord
from kompaktor.model.tablet import FileInfo

#: entries per key range for the in-process engine (bounds its memory: ~5x the range's data)
ARROW_RANGE_ENTRIES = 1_000_000
#: uncompressed bytes per key range for the in-process engine, at most: half the planner's
#: default, so that two ranges in flight of big values (decoded, taken, encoded: incompressible
#: values are as big encoded) hold no more than a sort-based peer holding the whole merge
#: (issue 46: 4 KiB values, peak RSS growth 1.96 GB against Polars' 1.43 GB at 256 MiB)
ARROW_RANGE_BYTES = RANGE_BYTES // 2

__all__ = ["ARROW_RANGE_BYTES", "ARROW_RANGE_ENTRIES", "ArrowMergeEngine", "default_workers"]


def default_workers(task_memory: int = TASK_MEMORY) -> int:
    """Ranges merged at once: one per core, at least 2 (reading overlaps merging even on one
    core), at most as many planned ranges (:data:`~kompaktor.engines.ranges.RANGE_BYTES` of data,
    held about :data:`~kompaktor.engines.ranges.MERGE_FACTOR` times) as ``task_memory`` holds."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(2, min(cores, task_memory // (MERGE_FACTOR * RANGE_BYTES)))


class ArrowMergeEngine:
    """In-process engine: the key ranges of the plan merged with Arrow on ``workers`` threads
    (:func:`default_workers`), at most that many ranges in flight, written in key order."""

    name = "arrow"

    def __init__(
        self,
        range_entries: int = ARROW_RANGE_ENTRIES,
        task_memory: int = TASK_MEMORY,
        resume_min_bytes: int | None = None,
        workers: int | None = None,
        copy_through: bool = True,
        copy_min_bytes: int = COPY_MIN_BYTES,
        range_bytes: int = ARROW_RANGE_BYTES,
    ) -> None:
        self.range_entries = range_entries
        #: uncompressed bytes per key range, at most (about: the plan cuts at row boundaries)
        self.range_bytes = range_bytes
        #: row groups the merge would output unchanged are copied, not decoded
        #: (docs/architecture.md "Copying row groups through";
        #: :mod:`kompaktor.engines.ranges.copies`); not in a resumable merge
        self.copy_through = copy_through
        #: the smallest row group copied (uncompressed bytes; smaller ones are merged)
        self.copy_min_bytes = copy_min_bytes
        #: a merge given a resume log is resumable from this many input bytes (``None``: never;
        #: the compactor gives its group's, :mod:`.resume`)
        self.resume_min_bytes = resume_min_bytes
        #: bytes the merge may hold; one range's input data may take 1/(2 * MERGE_FACTOR) of it
        self.task_memory = task_memory
        #: ranges in flight at most — read, merged and encoded on this many threads, written in
        #: order — so the merge holds about ``workers`` x MERGE_FACTOR x one range's data
        self.workers = workers or default_workers(task_memory)

    def merge(
        self,
        storage: Storage,
        req: MergeRequest,
        *,
        progress: ProgressFn | None = None,
        cancel: threading.Event | None = None,
    ) -> MergeResult:
        with phase("plan"):
            started, metas, bytes_in = open_merge(storage, req, cancel)
        if req.resume is not None and self.resume_min_bytes is not None and bytes_in >= self.resume_min_bytes:
            return self._merge_resumable(storage, req, progress, cancel, started, metas, bytes_in)
        with phase("plan"):
            work = self._plan_ranges(storage, req, metas)
        report = progress or (lambda d: None)
        report(progress_dict(0, 0, 0, 0, 0, len(work.ranges), started))
        w = SpliceWriter(storage, req.output, tmp_tag=req.tmp_tag)
        results = run_ordered(len(work.ranges), work.take, work.merge_encode, self.workers, "arrowmerge")
        try:
            work.open_cursors(req)
            read, deletes = _splice(
                w, results, work, cancel, lambda i, n: report(_progress(w, i, n, work, bytes_in, started))
            )
            with phase("write"):
                info = _finish(storage, req, w, cancel)
        except BaseException:
            w.abort()
            raise
        finally:
            results.close()
            work.close()
        n = len(work.ranges)
        report(progress_dict(read, w.entries, bytes_in, info.size, n, n, started))
        return MergeResult(
            info=info,
            entries_read=read,
            entries_written=w.entries,
            bytes_read=bytes_in,
            bytes_written=info.size,
            deletes_read=deletes,
        )

    def _plan_ranges(self, storage: Storage, req: MergeRequest, metas: list[InputMeta]) -> _RangeWork:
        """The key ranges of the merge and, with the copy-through, the runs of row groups copied."""
        ranges = plan(storage, metas, req.prev, req.end, self.range_entries, self.range_bytes)
        budget = self.task_memory // (2 * MERGE_FACTOR)
        copies: dict[int, CopyRun] = {}
        if self.copy_through:
            ranges, copies = plan_copies(
                storage, metas, req.prev, req.end, req.settings, ranges, min(budget, RANGE_BYTES), self.copy_min_bytes
            )
        return _RangeWork(storage, req.settings, ranges, copies, budget)

    def _merge_resumable(
        self,
        storage: Storage,
        req: MergeRequest,
        progress: ProgressFn | None,
        cancel: threading.Event | None,
        started: float,
        metas: list[InputMeta],
        bytes_in: int,
    ) -> MergeResult:
        """The ranges merged on ``workers`` threads, each written as a part and recorded in
        ``req.resume`` in range order as they finish; ranges an earlier attempt finished are
        taken from its verified parts (the inputs' row groups are read only where a range is
        merged); then every part is appended, in order, into the output without decoding."""
        run = ResumeRun.start(
            storage, req, started, lambda: plan(storage, metas, req.prev, req.end, self.range_entries, self.range_bytes)
        )
        report = progress or (lambda d: None)
        report(run.progress(0, 0))
        missing = run.plan.missing
        reader = _MissingRanges(storage, req, run.plan.ranges, missing, self.task_memory // (2 * MERGE_FACTOR))
        # parts merged and encoded on worker threads (at most self.workers in flight), written
        # and recorded here, in range order, as they finish
        encode = partial(_merge_encode_part, req, missing)
        results = run_ordered(len(missing), reader.take, encode, self.workers, "arrowmerge")
        written: list[int] = []
        try:
            for i, enc, n_read, nbytes, sha in results:
                _stop_if_cancelled(cancel, f"merge into {req.output} cancelled after {run.done} of {run.parts} parts")
                written.append(i)
                _write_part(storage, req, run, i, enc, n_read, nbytes, sha)
                del enc
                report(run.progress(0, 0))
            info = _concat_parts(storage, req, run, cancel)
        except BaseException:
            for name in run.unrecorded(written):  # a part not recorded is of no use to a later attempt
                storage.delete(name)
            raise
        finally:
            results.close()
            reader.close()
        report(run.progress(info.entries, info.size))
        return run.result(info, info.entries, bytes_in)


def _skip(cursors: list[InputCursor], run: CopyRun, hi: Bound) -> None:
    """Move the cursors past a copy range: its input's past the run's row groups, unread; the
    others' hold no row there (their statistics say so, and they check their rows against them)."""
    for j, c in enumerate(cursors):
        if j == run.input:
            c.skip(run.groups, run.last_row)
        elif c.take(hi).num_rows:
            raise RuntimeError(f"{c.path}: rows inside row groups {run.groups} of {run.path}, which no other input has")


def _append(w: SpliceWriter, out: Copied | EncodedRange) -> None:
    if isinstance(out, Copied):
        w.append_row_groups(out.data, out.row_groups, out.entries, out.deletes, out.first, out.last)
    else:
        w.append(out.data, out.entries, out.deletes, out.first, out.last)


def _stop_if_cancelled(cancel: threading.Event | None, message: str) -> None:
    if cancel is not None and cancel.is_set():
        raise MergeCancelled(message)


class _MissingRanges:
    """Reads the ranges a resumable merge still has to merge, in order: the missing ranges in runs
    of consecutive ones, one set of cursors per run, opened at the run's first row (the inputs'
    row groups before it are skipped by their statistics)."""

    def __init__(
        self, storage: Storage, req: MergeRequest, ranges: list[tuple[Bound, Bound]], missing: list[int], budget: int
    ) -> None:
        self.storage, self.inputs, self.ranges, self.missing, self.budget = storage, req.inputs, ranges, missing, budget
        self.run_of: dict[int, int] = {}
        self.runs: list[tuple[int, int]] = []
        for i in missing:
            if self.runs and self.runs[-1][1] == i:
                self.runs[-1] = (self.runs[-1][0], i + 1)
            else:
                self.runs.append((i, i + 1))
            self.run_of[i] = len(self.runs) - 1
        self.run: int | None = None
        self.cursors: list[InputCursor] = []

    def take(self, k: int) -> tuple[list[pa.Table], int]:
        """The rows of the ``k``-th missing range and the input bytes read for them (in range
        order, one thread at a time)."""
        i = self.missing[k]
        if self.run != self.run_of[i]:
            self.close()
            a, b = self.runs[self.run_of[i]]
            lo, hi = self.ranges[a][0], self.ranges[b - 1][1]
            self.cursors = [InputCursor(self.storage, p, lo, hi) for p in self.inputs]
            self.run = self.run_of[i]
        before = sum(c.bytes_read for c in self.cursors)
        tables: list[pa.Table] = []
        for c in self.cursors:
            tables.append(c.take(self.ranges[i][1], self.budget - sum(t.nbytes for t in tables)))
        return tables, sum(c.bytes_read for c in self.cursors) - before

    def close(self) -> None:
        for c in self.cursors:
            c.close()
        self.cursors = []


def _merge_encode_part(
    req: MergeRequest, missing: list[int], k: int, got: tuple[list[pa.Table], int]
) -> tuple[int, EncodedRange, int, int, str]:
    """Merge the ``k``-th missing range and encode it as its part, in memory (on a worker thread):
    the part file appears only when the merge's thread writes it, just before recording it."""
    tables, nbytes = got
    i = missing[k]
    n_read = sum(t.num_rows for t in tables)
    d_read = sum(count_deletes(t) for t in tables)
    out = merge_tables_once(tables, req.settings)
    tables.clear()
    meta = {
        b"kompaktor.entries_read": str(n_read).encode(),
        b"kompaktor.bytes_read": str(nbytes).encode(),
        DELETES_READ: str(d_read).encode(),
    }
    enc = encode_table(out, meta)
    return i, enc, n_read, nbytes, hashlib.sha256(enc.data).hexdigest()


def _write_part(
    storage: Storage, req: MergeRequest, run: ResumeRun, i: int, enc: EncodedRange, n_read: int, nbytes: int, sha: str
) -> None:
    """Write range ``i``'s encoded part under its name and record it."""
    name = run.names[i]
    part = write_encoded(storage, name, enc, tmp_tag=req.tmp_tag)
    run.add_part(PartRecord(i, name, *run.plan.ranges[i], n_read, part.entries, nbytes, part.size, sha))


def _concat_parts(storage: Storage, req: MergeRequest, run: ResumeRun, cancel: threading.Event | None) -> FileInfo:
    """Every part appended, in range order, into the output without decoding; committed."""
    _stop_if_cancelled(cancel, f"merge into {req.output} cancelled before commit")
    w = ConcatWriter(storage, req.output, tmp_tag=req.tmp_tag)
    try:
        for i in range(run.parts):  # a reused part's footer says what its range read, as a new one's
            run.appended(w.append(run.names[i]))
        _stop_if_cancelled(cancel, f"merge into {req.output} cancelled before commit")
        return w.commit()
    except BaseException:
        w.abort()
        raise


@dataclass
class _RangeWork:
    """One merge's ranges, read from the inputs' cursors in range order (:meth:`take`, one thread
    at a time) and merged and encoded on the workers (:meth:`merge_encode`), or copied."""

    storage: Storage
    settings: IteratorSettings
    ranges: list[tuple[Bound, Bound]]
    copies: dict[int, CopyRun]
    budget: int
    cursors: list[InputCursor] = field(default_factory=list)

    def open_cursors(self, req: MergeRequest) -> None:
        self.cursors.extend(InputCursor(self.storage, p, req.prev, req.end) for p in req.inputs)

    def close(self) -> None:
        for c in self.cursors:
            c.close()

    def take(self, i: int) -> list[pa.Table] | CopyRun:
        run = self.copies.get(i)
        if run is not None:
            _skip(self.cursors, run, self.ranges[i][1])
            return run
        tables: list[pa.Table] = []
        with phase("read"):
            for c in self.cursors:
                tables.append(c.take(self.ranges[i][1], self.budget - sum(t.nbytes for t in tables)))
        return tables

    def merge_encode(self, i: int, got: list[pa.Table] | CopyRun) -> list[Piece]:
        if isinstance(got, CopyRun):
            with phase("copy"):
                return copy_run(self.storage, got, self.settings)
        n = sum(t.num_rows for t in got)
        d = sum(count_deletes(t) for t in got)
        out = merge_tables_once(got, self.settings)
        got.clear()  # the inputs go as soon as the range is merged
        with phase("encode"):
            enc = encode_table(out)
        return [Piece(enc, n, d)]


def _splice(
    w: SpliceWriter,
    results: Iterator[list[Piece]],
    work: _RangeWork,
    cancel: threading.Event | None,
    report: Callable[[int, int], None],
) -> tuple[int, int]:
    """Append each range's pieces in order, reporting (ranges done, entries read) after each;
    (entries read, delete markers read)."""
    read = deletes = 0
    for i in range(len(work.ranges)):
        with phase("wait"):
            pieces = next(results)
        if cancel is not None and cancel.is_set():
            raise MergeCancelled(f"merge into {w.rel_path} cancelled after {i} of {len(work.ranges)} parts")
        with phase("write"):
            for p in pieces:
                _append(w, p.out)
                read += p.entries_read
                deletes += p.deletes_read
        del pieces
        report(i + 1, read)
    return read, deletes


def _progress(w: SpliceWriter, done: int, read: int, work: _RangeWork, bytes_in: int, started: float) -> MergeProgress:
    n = len(work.ranges)
    return progress_dict(read, w.entries, round(bytes_in * done / n), w.position(), done, n, started)


def _finish(storage: Storage, req: MergeRequest, w: SpliceWriter, cancel: threading.Event | None) -> FileInfo:
    """The output committed: the spliced file, or the empty one when nothing was spliced."""
    if cancel is not None and cancel.is_set():
        raise MergeCancelled(f"merge into {req.output} cancelled before commit")
    if w.entries:
        return w.commit()
    w.abort()
    return SortedFileWriter(storage, req.output, tmp_tag=req.tmp_tag).commit()
