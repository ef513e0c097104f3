"""The Spark engine: a merge planned as key-range tasks that Spark schedules.

Shape:

1. The driver reads only the inputs' footers: schema check (a clear BadFileError before any
   job runs) and row-group statistics, from which it cuts the tablet's range (prev, end] into
   row ranges of about equal size (:func:`kompaktor.engines.ranges.plan`; row groups too big to cut
   at are sampled from their ``row`` column). Cuts fall on row boundaries, so a column key's
   versions are always in one task.
2. One Spark task per range (``sc.parallelize(ranges).map(...)``) reads its rows from every input
   (row-group statistics prune the rest; big row groups are streamed batch by batch, so the task's
   memory is bounded by its range, not by the inputs' row groups; when row groups hold several
   ranges, one task runs a sequence of consecutive ranges reading each input forward once,
   :func:`task_runs`, so that no big row group is decoded from its start for every range),
   merges and applies the iterator stack with Arrow
   (:mod:`kompaktor.files.arrowstack`) and writes one ordered part — a Parquet file in the
   output's format, encoded and compressed on the executor — under a temporary name carrying the
   ECID, next to the output. Spark schedules, retries and spreads the tasks over its executors;
   the data never takes Spark's own Parquet path or a global sort.
3. While later tasks still run, the driver appends the finished parts, in range order, to the
   single output file without decoding them (:mod:`kompaktor.files.parquetconcat`: their bytes
   are copied and one footer lists every part's row groups; temporary name, then rename). The
   driver never holds entries; ``collect`` returns only each task's small summary.

From ``resume_min_bytes`` of input a merge given a resume log is resumable (docs/architecture.md "Long merges resume",
:mod:`kompaktor.engines.resume`): the parts are named by the job, recorded as the driver appends
them (with the SHA-256 of the bytes it copied), kept until the commit, and a retry runs tasks only
for the ranges whose parts are missing or fail verification.

Each merge runs in its own Spark job group; setting ``cancel`` cancels the group
(``sc.cancelJobGroup``), waits for its tasks to stop, and removes every part and the
temporary output.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from kompaktor.engines.api import MergeCancelled, MergeError, MergeProgress, MergeRequest, MergeResult, ProgressFn
from kompaktor.engines.ranges import (
    MERGE_FACTOR,
    RANGE_BYTES,
    TASK_MEMORY,
    InputCursor,
    InputMeta,
    TaskMemoryExceeded,
    estimate_entries,
    open_merge,
    plan,
    progress_dict,
)
from kompaktor.engines.resume import ResumeRun
from kompaktor.files.arrowstack import merge_tables
from kompaktor.files.parquetconcat import ConcatWriter
from kompaktor.files.sortedfile import DELETES_READ, SortedFileWriter, add_deletes_read, count_deletes
from kompaktor.files.storage import REQUESTS, Storage
from kompaktor.model.errors import BadFileError, UnsortedError
from kompaktor.model.iterators import IteratorSettings
from kompaktor.model.names import part_names, tmp_name
from kompaktor.model.resume import PartRecord

if TYPE_CHECKING:
    from pyspark import SparkContext
from kompaktor.model.tablet import FileInfo

log = logging.getLogger(__name__)

#: bounds of one task's range, in entries (a task holds ~5x its range's data in memory)
MIN_TASK_ENTRIES = 250_000
MAX_TASK_ENTRIES = 2_000_000
POLL_S = 0.02
#: a merge on a Spark cluster fails when the cluster has had no executor for this long (every
#: worker lost): Spark itself would wait for new executors for ever
NO_EXECUTOR_TIMEOUT_S = 120.0


def _run_ranges(
    storage: Storage,
    inputs: tuple[str, ...],
    settings: IteratorSettings,
    tmp_tag: str,
    task_memory: int,
    run: tuple[tuple[int, bytes | None, bytes | None, str], ...],
) -> list[dict[str, Any]]:
    """Executor side: merge a run of consecutive key ranges, one part each, reading every input
    forward once with one cursor (:class:`~kompaktor.engines.ranges.InputCursor`) for the whole
    run — so a row group bigger than a range is decoded once by this task, not from its start by
    the task of every range it holds a slice of. Memory stays bounded by one range (plus one
    batch per input). Stops at the first range that fails (its error is the last result): a bad
    input or a range bigger than the task memory (retrying would not help). A run of one range is
    read as :func:`~kompaktor.engines.ranges.merge_range` reads a range."""
    budget = task_memory // MERGE_FACTOR
    out: list[dict[str, Any]] = []
    cursors: list[InputCursor] = []
    try:
        try:
            for p in inputs:
                cursors.append(InputCursor(storage, p, run[0][1], run[-1][2]))
        except BadFileError as exc:
            return [_task_error(run[0][0], exc)]
        for index, _lo, hi, final in run:
            before = sum(c.bytes_read for c in cursors)
            tables = []
            held = 0
            try:
                for c in cursors:
                    tables.append(c.take(hi, max(0, budget - held)))
                    held += tables[-1].nbytes
            except (BadFileError, TaskMemoryExceeded) as exc:
                out.append(_task_error(index, exc))
                return out
            read = sum(t.num_rows for t in tables)
            deletes = sum(count_deletes(t) for t in tables)
            table = merge_tables(tables, settings)
            del tables
            nbytes = sum(c.bytes_read for c in cursors) - before
            out.append(_write_part(storage, final, tmp_tag, index, table, (read, nbytes, deletes)))
    finally:
        for c in cursors:
            c.close()
    return out


def _task_error(index: int, exc: BaseException) -> dict[str, Any]:
    """A task's result for a range that cannot be merged: a bad input or a range bigger than the
    task memory (retrying would not help)."""
    kind = "unsorted" if isinstance(exc, UnsortedError) else "memory" if isinstance(exc, TaskMemoryExceeded) else "bad"
    return {"index": index, "error": str(exc), "kind": kind}


def _write_part(
    storage: Storage, final: str, tmp_tag: str, index: int, table: Any, counts: tuple[int, int, int]
) -> dict[str, Any]:
    """Write one range's merged entries as the part ``final``; the task's summary for it. ``counts``:
    what the range read — entries, bytes, delete markers — said in the part's footer."""
    read, bytes_read, deletes_read = counts
    # the part is already in the output's format (Parquet, its row groups and compression): the
    # driver copies its bytes into the one output file without decoding them
    try:
        w = SortedFileWriter(storage, final, tmp_tag=tmp_tag)
    except FileExistsError:  # an earlier run of this task published it (complete): the same bytes
        return {"index": index, "entries_read": read, "entries_written": table.num_rows}
    try:
        w.write_table(table, checked=True)
        w.commit(
            {
                b"kompaktor.entries_read": str(read).encode(),
                b"kompaktor.bytes_read": str(bytes_read).encode(),
                DELETES_READ: str(deletes_read).encode(),
            }
        )
    except FileExistsError:
        w.abort()  # published meanwhile by an earlier run of this task (a resumable merge keeps it)
    except BaseException:
        w.abort()
        raise
    return {"index": index, "entries_read": read, "entries_written": table.num_rows}


def largest_group_entries(metas: list[InputMeta]) -> int:
    """Entries of the biggest row group among the inputs (a file without row statistics counts
    as one group)."""
    return _largest_group(metas, by_bytes=False)


def largest_group_bytes(metas: list[InputMeta]) -> int:
    """Uncompressed bytes of the biggest row group among the inputs (a file without row
    statistics counts as one group of its data bytes)."""
    return _largest_group(metas, by_bytes=True)


def _largest_group(metas: list[InputMeta], *, by_bytes: bool) -> int:
    """The biggest row group's entries or uncompressed bytes (of its :attr:`InputMeta.groups`), a
    sampled group's segments summed."""

    def size(g: tuple[bytes, bytes, int, int]) -> int:
        return g[3] if by_bytes else g[2]

    best = 0
    for m in metas:
        if not m.groups:
            best = max(best, m.data_bytes if by_bytes else m.entries)
        elif m.group_index:  # sampled: segments of row groups
            per: dict[int, int] = {}
            for seg, g in zip(m.groups, m.group_index, strict=True):
                per[g] = per.get(g, 0) + size(seg)
            best = max(best, *per.values())
        else:
            best = max(best, *(size(g) for g in m.groups))
    return best


def task_runs(
    tasks: list[tuple[int, bytes | None, bytes | None, str]],
    metas: list[InputMeta],
    target_entries: int,
    slots: int,
    target_bytes: int = RANGE_BYTES,
) -> list[tuple[tuple[int, bytes | None, bytes | None, str], ...]]:
    """The Spark tasks of a merge: one per range, unless the inputs' row groups are big (one of
    them, times the inputs, holds more than two ranges' entries or bytes — ranges are cut by
    both: each range's task would decode it from its start to reach its slice) — then
    consecutive ranges are run by one task each, reading the inputs forward once, in as many runs
    as there are task slots. Decoding the big row groups then costs at most (slots + 1) / 2
    passes over them instead of (ranges + 1) / 2.
    Runs hold consecutive ranges only (a resumed merge's reused ranges cut them)."""
    if not tasks:
        return []
    big = largest_group_entries(metas) * len(metas) > 2 * target_entries
    big = big or largest_group_bytes(metas) * len(metas) > 2 * target_bytes  # ranges are cut by bytes too
    if len(tasks) <= slots or not big:
        return [(t,) for t in tasks]
    chains: list[list[tuple[int, bytes | None, bytes | None, str]]] = [[tasks[0]]]
    for t in tasks[1:]:
        if t[0] == chains[-1][-1][0] + 1:
            chains[-1].append(t)
        else:
            chains.append([t])
    per_run = math.ceil(len(tasks) / slots)
    return [tuple(c[i : i + per_run]) for c in chains for i in range(0, len(c), per_run)]


class SparkMergeEngine:
    """Merges on the process's SparkSession (see :mod:`kompaktor.engines.session`)."""

    name = "spark"

    def __init__(
        self,
        master: str,
        conf: Mapping[str, str] | None = None,
        driver_memory: str | None = None,
        *,
        task_entries: int | None = None,
        tasks_per_core: int = 2,
        warm: bool = True,
        task_memory: int = TASK_MEMORY,
        no_executor_timeout: float = NO_EXECUTOR_TIMEOUT_S,
        resume_min_bytes: int | None = None,
        range_runs: bool = True,
    ) -> None:
        from kompaktor.engines.session import get_session, warm_up

        self.session = get_session(master, conf, driver_memory)
        if warm:
            warm_up(self.session)
        self.task_entries = task_entries
        self.tasks_per_core = tasks_per_core
        #: bytes one task's merge may hold in its Python worker (its range's input data 1/4 of it)
        self.task_memory = task_memory
        self.no_executor_timeout = no_executor_timeout
        #: a merge given a resume log is resumable from this many input bytes (``None``: never;
        #: the compactor gives its group's, :mod:`.resume`)
        self.resume_min_bytes = resume_min_bytes
        #: consecutive ranges in one task when row groups are big (:func:`task_runs`); off: one
        #: task per range always (the bench compares the two)
        self.range_runs = range_runs
        self._local = master.startswith("local")

    @property
    def sc(self) -> SparkContext:
        return self.session.sparkContext

    def _target_entries(self, total: int) -> int:
        if self.task_entries is not None:
            return max(1, self.task_entries)
        slots = max(1, self.sc.defaultParallelism) * self.tasks_per_core
        return min(MAX_TASK_ENTRIES, max(MIN_TASK_ENTRIES, math.ceil(total / slots)))

    def merge(
        self,
        storage: Storage,
        req: MergeRequest,
        *,
        progress: ProgressFn | None = None,
        cancel: threading.Event | None = None,
    ) -> MergeResult:
        started, metas, bytes_in = open_merge(storage, req, cancel)
        resumable = req.resume is not None and self.resume_min_bytes is not None and bytes_in >= self.resume_min_bytes
        merge = _SparkMerge(self, storage, req, cancel, progress or (lambda d: None), started, bytes_in)
        return merge.execute(merge.plan_parts(metas, resumable))

    def executors(self) -> int:
        """Executors the session has now (on a cluster: without the driver)."""
        if self._local:
            return 1
        return max(0, int(self.sc._jsc.sc().getExecutorMemoryStatus().size()) - 1)

    def _wait_for_part(
        self,
        storage: Storage,
        final: str,
        done: threading.Event,
        outcome: dict[str, Any],
        cancel: threading.Event | None,
        req: MergeRequest,
        i: int,
        n: int,
    ) -> None:
        none_since: float | None = None
        next_check = time.monotonic() + 1.0
        while not storage.exists(final):
            if cancel is not None and cancel.is_set():
                raise MergeCancelled(f"merge into {req.output} cancelled after {i} of {n} parts")
            if done.is_set():
                if storage.exists(final):
                    return
                self._raise_job_failure(outcome, req)
                raise MergeError(f"merge into {req.output}: Spark job ended without part {i}")
            now = time.monotonic()
            if now >= next_check:  # every worker lost: Spark would wait for executors for ever
                next_check = now + min(1.0, self.no_executor_timeout / 4)
                if self.executors():
                    none_since = None
                elif none_since is None:
                    none_since = now
                elif now - none_since >= self.no_executor_timeout:
                    raise MergeError(
                        f"merge into {req.output}: the Spark cluster {self.sc.master} has had no "
                        f"executor for {self.no_executor_timeout:.0f}s (every worker lost); "
                        f"{i} of {n} parts done, job cancelled"
                    )
            done.wait(POLL_S)

    @staticmethod
    def _raise_job_failure(outcome: dict[str, Any], req: MergeRequest) -> None:
        if "error" in outcome:
            exc = outcome["error"]
            raise MergeError(f"merge into {req.output}: Spark job failed: {_short(exc)}") from exc
        errors = [r for r in outcome.get("results", []) if "error" in r]
        if errors:
            kind = {"unsorted": UnsortedError, "memory": TaskMemoryExceeded}.get(errors[0]["kind"], BadFileError)
            raise kind(errors[0]["error"])

    @staticmethod
    def _append_part(
        final: str, w: ConcatWriter, cancel: threading.Event | None, req: MergeRequest, digest: Any = None
    ) -> dict[bytes, bytes]:
        """Copy one part's row groups into the output without decoding them (feeding its bytes to
        ``digest``, if given); its footer metadata (what its range read)."""
        if cancel is not None and cancel.is_set():
            raise MergeCancelled(f"merge into {req.output} cancelled")
        return w.append(final, digest)

    def _wait_tasks_stopped(self, group: str, timeout: float = 30.0) -> None:
        """After a cancel, wait until no task of the group still runs (a killed task's Python
        worker could otherwise write a part after the cleanup)."""
        tracker = self.sc.statusTracker()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            active = 0
            for job_id in tracker.getJobIdsForGroup(group):
                info = tracker.getJobInfo(job_id)
                if info is None:
                    continue
                for sid in info.stageIds:
                    st = tracker.getStageInfo(sid)
                    if st is not None:
                        active += st.numActiveTasks
            if not active:
                return
            time.sleep(0.05)
        log.warning("tasks of %s still running %.0fs after cancel", group, timeout)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[-1][:500] if text else type(exc).__name__


Run = tuple[tuple[int, bytes | None, bytes | None, str], ...]


class _SparkJob:
    """The Spark job of one merge, on a thread of its own, in a job group of its own (so that it
    can be cancelled): the tasks' summaries (or the error) in ``outcome`` once ``done`` is set."""

    def __init__(self, engine: SparkMergeEngine, tmp_tag: str) -> None:
        self.engine = engine
        self.group = f"kompaktor-{tmp_tag}-{uuid.uuid4().hex[:8]}"
        self.outcome: dict[str, Any] = {}
        self.done = threading.Event()

    def start(self, runs: list[Run], task: Callable[[Run], list[dict[str, Any]]], description: str) -> None:
        sc = self.engine.sc

        def run_job() -> None:
            try:
                if not runs:  # every range was reused
                    self.outcome["results"] = []
                    return
                sc.setJobGroup(self.group, description, interruptOnCancel=True)
                rdd = sc.parallelize(runs, len(runs)).flatMap(task)
                results = rdd.collect()
                _add_executor_requests(results)
                self.outcome["results"] = results
            except BaseException as exc:
                self.outcome["error"] = exc
            finally:
                self.done.set()

        threading.Thread(target=run_job, name=f"spark-{self.group}", daemon=True).start()

    def stop(self) -> None:
        """After a failure: cancel the job group, wait for the job to end and its tasks to stop."""
        if not self.done.is_set():
            self.engine.sc.cancelJobGroup(self.group)
        self.done.wait(60)
        self.engine._wait_tasks_stopped(self.group)


def _task(storage: Storage, req: MergeRequest, memory: int) -> Callable[[Run], list[dict[str, Any]]]:
    """What a Spark task runs; it holds the request's fields only (Spark ships it to executors)."""
    inputs, settings, tag = req.inputs, req.settings, req.tmp_tag
    return lambda r: _counted(lambda: _run_ranges(storage, inputs, settings, tag, memory, r))


def _counted(run: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Executor side: a task's summaries, the last one with the storage requests the task made
    (``requests``): an executor's process counts its own, which the compactor's ``/metrics`` would
    not see — the driver adds them to its count (:func:`_add_executor_requests`)."""
    before = REQUESTS.snapshot()
    out = run()
    if out:
        out[-1]["requests"] = {op: n - before[op] for op, n in REQUESTS.snapshot().items() if n != before[op]}
    return out


def _add_executor_requests(results: list[dict[str, Any]]) -> None:
    """Driver side: the executors' storage requests, into this process's count."""
    for r in results:
        for op, n in r.pop("requests", {}).items():
            REQUESTS.add(op, int(n))


class _SparkMerge:
    """One merge on the Spark engine, in steps: plan the parts (:meth:`plan_parts`; a resumable
    merge's through :class:`~kompaktor.engines.resume.ResumeRun`), start the Spark job, append each
    part into the output as it appears and commit (:meth:`append_parts`); on a failure cancel the
    job; always remove the parts not kept (:meth:`remove_parts`)."""

    def __init__(
        self,
        engine: SparkMergeEngine,
        storage: Storage,
        req: MergeRequest,
        cancel: threading.Event | None,
        report: ProgressFn,
        started: float,
        bytes_in: int,
    ) -> None:
        self.engine, self.storage, self.req, self.cancel, self.report = engine, storage, req, cancel, report
        self.started, self.bytes_in = started, bytes_in
        self.run: ResumeRun | None = None  # a resumable merge's attempt
        self.ranges: list[tuple[bytes | None, bytes | None]] = []
        self.names: dict[int, str] = {}
        self.w: ConcatWriter | None = None
        self.read = self.written = 0
        self.deletes_read: int | None = 0  # a plain merge's (a resumable one's: ResumeRun's)

    @property
    def reused(self) -> dict[int, PartRecord]:
        return self.run.plan.reused if self.run is not None else {}

    def plan_parts(self, metas: list[InputMeta], resumable: bool) -> list[Run]:
        """The ranges and their part names; the Spark tasks that merge the ranges not reused."""
        eng, req = self.engine, self.req
        total = estimate_entries(metas, req.prev, req.end)

        def plan_fn() -> list[tuple[bytes | None, bytes | None]]:
            return plan(self.storage, metas, req.prev, req.end, eng._target_entries(total))

        if resumable:
            self.run = ResumeRun.start(self.storage, req, self.started, plan_fn)
            self.ranges, self.names = self.run.plan.ranges, self.run.names
        else:
            self.ranges = plan_fn()
            self.names = {i: part_names(req.output, req.tmp_tag, i)[0] for i in range(len(self.ranges))}
        tasks = [(i, lo, hi, self.names[i]) for i, (lo, hi) in enumerate(self.ranges) if i not in self.reused]
        if not eng.range_runs:
            return [(t,) for t in tasks]
        return task_runs(tasks, metas, eng._target_entries(total), eng.sc.defaultParallelism)

    def execute(self, runs: list[Run]) -> MergeResult:
        req = self.req
        self.report(self._progress(0, len(self.reused)))
        job = _SparkJob(self.engine, req.tmp_tag)
        try:
            what = f"merge {len(req.inputs)} files into {req.output}"
            job.start(runs, _task(self.storage, req, self.engine.task_memory), what)
            info = self.append_parts(job)
        except BaseException:
            job.stop()
            if self.w is not None:
                self.w.abort()
            raise
        finally:
            self.remove_parts()
        return self.result(info)

    def append_parts(self, job: _SparkJob) -> FileInfo:
        """Every part appended into the output in range order as it appears; the output committed
        once the job ended well."""
        req, cancel = self.req, self.cancel
        self.w = w = ConcatWriter(self.storage, req.output, tmp_tag=req.tmp_tag)
        for i in range(len(self.ranges)):
            self.append_part(i, job)
            self.written = w.entries
            self.report(self._progress(w.position(), i + 1))
        while not job.done.wait(0.05):  # every part is in; the job is finishing
            if cancel is not None and cancel.is_set():
                raise MergeCancelled(f"merge into {req.output} cancelled before commit")
        self.engine._raise_job_failure(job.outcome, req)
        if cancel is not None and cancel.is_set():
            raise MergeCancelled(f"merge into {req.output} cancelled before commit")
        return w.commit()

    def append_part(self, i: int, job: _SparkJob) -> None:
        """Part ``i`` appended: a reused one at once; else once its task wrote it, then deleted
        (a plain merge) or recorded with the SHA-256 of the bytes copied (a resumable one). Every
        part's footer adds the delete markers its range read (a reused part's too)."""
        eng, storage, req, cancel, final, w = self.engine, self.storage, self.req, self.cancel, self.names[i], self.w
        assert w is not None
        if i in self.reused:
            self._appended(eng._append_part(final, w, cancel, req))
            return
        eng._wait_for_part(storage, final, job.done, job.outcome, cancel, req, i, len(self.ranges))
        if self.run is None:
            meta = eng._append_part(final, w, cancel, req)
            self.read += int(meta.get(b"kompaktor.entries_read", b"0"))
            self._appended(meta)
            storage.delete(final)
            return
        h = hashlib.sha256()
        meta = eng._append_part(final, w, cancel, req, h)
        self._appended(meta)
        entries_read = int(meta.get(b"kompaktor.entries_read", b"0"))
        bytes_read = int(meta.get(b"kompaktor.bytes_read", b"0"))
        entries = int(meta.get(b"kompaktor.entries", b"0"))
        size = storage.size(final)
        rec = PartRecord(i, final, *self.ranges[i], entries_read, entries, bytes_read, size, h.hexdigest())
        self.run.add_part(rec)
        self.read = self.run.read

    def _appended(self, part_meta: dict[bytes, bytes]) -> None:
        """The delete markers a part's range read (its footer), counted."""
        if self.run is not None:
            self.run.appended(part_meta)
        else:
            self.deletes_read = add_deletes_read(self.deletes_read, part_meta)

    def _progress(self, bytes_written: int, done: int) -> MergeProgress:
        if self.run is not None:
            return self.run.progress(self.written, bytes_written, done)
        n = len(self.ranges)
        bytes_read = round(self.bytes_in * done / n) if n else 0
        return progress_dict(self.read, self.written, bytes_read, bytes_written, done, n, self.started)

    def remove_parts(self) -> None:
        """Every part, also one a retried task may have rewritten after it was consumed; a
        resumable merge keeps the parts it recorded (removed after the commit, or reused)."""
        recorded = self.run.recorded if self.run is not None else set()
        for i in range(len(self.ranges)):
            if i in self.reused:
                continue  # an earlier attempt's part: kept until the commit
            final = self.names[i]
            # done, and in progress (object stores write parts at their final name only)
            staged = (tmp_name(final, self.req.tmp_tag),) if self.storage.renames_atomically else ()
            for name in (final, *staged) if i not in recorded else staged:
                self.storage.delete(name)

    def result(self, info: FileInfo) -> MergeResult:
        n = len(self.ranges)
        if self.run is not None:
            self.report(self.run.progress(self.written, info.size, n))
            return self.run.result(info, self.written, self.bytes_in)
        self.report(progress_dict(self.read, self.written, self.bytes_in, info.size, n, n, self.started))
        return MergeResult(
            info=info,
            entries_read=self.read,
            entries_written=self.written,
            bytes_read=self.bytes_in,
            bytes_written=info.size,
            deletes_read=self.deletes_read,
        )
