"""A write from many tasks as one atomic import (docs/spark.md, "Writing"), free of Spark: the
data source calls it from the driver (:func:`begin_write`, :func:`commit_write`,
:func:`abort_write`) and from each task (:func:`write_task`).

- The driver records the job among the imports in progress (``kz:imports``) under a tag: every
  task writes its files under temporary names carrying that tag, which the garbage collector
  spares while the job runs. On an object store, where a file is written once at its final
  name, each task also records its own files (a record named after the tag) before writing them.
- A task sorts what it gets in Kompaktor's key order (runs of :data:`RUN_ENTRIES`; a partition
  that arrives sorted is one run), cuts each run at the tablet splits the job began with (one
  file per tablet a run touches, so that no file is listed by two tablets), and returns its files
  without publishing them; a task that fails removes its own.
- The driver's commit publishes every task's files and registers all of them in one mutation
  (:meth:`add_files <kompaktor.metadata.store.files.FileStore.add_files>`), with the write's id
  when it has one: a retried job, or a stream's replayed micro-batch, imports once. The delete
  horizon holds as for ``kompaktor import``. Then it removes whatever else carries the tag:
  files of attempts that died or lost to a speculative copy.
"""

from __future__ import annotations

import bisect
import posixpath
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import pyarrow as pa

from kompaktor.client import Client
from kompaktor.files.arrowstack import first_unsorted
from kompaktor.files.sortedfile import COLUMNS, SortedFileWriter, conform
from kompaktor.files.storage import Storage
from kompaktor.metadata.store import MetadataStore
from kompaktor.model.errors import BadFileError, ConditionFailed, KompaktorError, StoreUnavailable
from kompaktor.model.keys import ARROW_SORT_KEYS
from kompaktor.model.names import TABLES_DIR, tmp_tag
from kompaktor.model.tablet import FileMeta, now_ms

#: how long a write job's staged files are safe from the collector without a commit or an abort
WRITE_TTL_S = 6 * 3600.0
#: entries a task sorts in memory at a time (one file each)
RUN_ENTRIES = 1_000_000
#: the columns a written DataFrame must have; ``ts`` (default: the write's time) and ``deleted``
#: (default: false) may be left out
REQUIRED = ("row", "cf", "cq", "vis", "value")


@dataclass(frozen=True)
class Endpoint:
    """Where a table lives: its metadata store and its storage (resolved on the driver, so that
    every executor reaches the same ones)."""

    redis_url: str
    storage_uri: str

    def client(self) -> Client:
        return _client(self.redis_url, self.storage_uri)


@cache
def _client(redis_url: str, storage_uri: str) -> Client:
    """One client per process and endpoint: a Python worker serves many tasks."""
    return Client(MetadataStore.from_url(redis_url), Storage.from_uri(storage_uri))


@dataclass(frozen=True)
class StagedFile:
    staged: str  # where the task wrote it
    path: str  # its final name
    meta: FileMeta


@dataclass(frozen=True)
class TaskFiles:
    """What a task returns to the driver: its record among the imports and its files."""

    record: str
    files: tuple[StagedFile, ...]


@dataclass(frozen=True)
class WriteJob:
    endpoint: Endpoint
    table: str
    table_id: str
    tag: str
    now_ms: int
    write_id: str | None
    ttl_s: float = WRITE_TTL_S
    run_entries: int = RUN_ENTRIES
    #: the table's tablet splits when the job began: where a task cuts its files (a split made
    #: since only means a file listed by two tablets, as an import's may be)
    splits: tuple[bytes, ...] = ()


def check_columns(names: Iterable[str]) -> None:
    """Refuse a DataFrame without the columns a write needs, or with others, in one line."""
    names = list(names)
    missing = [c for c in REQUIRED if c not in names]
    extra = [c for c in names if c not in COLUMNS]
    if missing or extra:
        raise BadFileError(
            f"cannot write to a Kompaktor table: missing columns {missing or 'none'}, unexpected "
            f"{extra or 'none'}; a write has row, cf, cq, vis, value and optionally ts, deleted"
        )


def begin_write(
    endpoint: Endpoint, table: str, write_id: str | None, ttl_s: float = WRITE_TTL_S, run_entries: int = RUN_ENTRIES
) -> WriteJob:
    """On the driver, before any task: the job's tag, recorded as an import in progress."""
    if run_entries < 1:
        raise KompaktorError(f"run_entries must be at least 1, got {run_entries}")
    client = endpoint.client()
    tid = client.store.tables.table_id(table)
    tag = f"IMP{uuid.uuid4().hex[:16]}"
    client.store.files.register_import(tag, tid, [], ttl_s)
    splits = tuple(t.end for t in client.store.tables.tablets(tid) if t.end is not None)
    return WriteJob(endpoint, table, tid, tag, now_ms(), write_id, ttl_s, run_entries, splits)


def _file_schema(table: pa.Table, stamp: int) -> pa.Table:
    """A task's input in the file schema: ``ts`` and ``deleted`` filled in where absent."""
    if "ts" not in table.schema.names:
        table = table.append_column("ts", pa.array([stamp] * table.num_rows, pa.int64()))
    if "deleted" not in table.schema.names:
        table = table.append_column("deleted", pa.array([False] * table.num_rows, pa.bool_()))
    return conform(table, "the written DataFrame")


def sorted_runs(batches: Iterable[pa.RecordBatch], stamp: int, run_entries: int = RUN_ENTRIES) -> Iterator[pa.Table]:
    """The task's entries as tables of at most about ``run_entries`` each, in key order."""
    pending: list[pa.RecordBatch] = []
    n = 0
    for batch in batches:
        if batch.num_rows:
            pending.append(batch)
            n += batch.num_rows
        if n >= run_entries:
            yield _in_key_order(_file_schema(pa.Table.from_batches(pending), stamp))
            pending, n = [], 0
    if n:
        yield _in_key_order(_file_schema(pa.Table.from_batches(pending), stamp))


def _in_key_order(table: pa.Table) -> pa.Table:
    """``table`` sorted; a run that arrives sorted (``kompaktor.spark.write``'s) is only checked,
    in one vectorized pass, which costs a fraction of a sort."""
    return table if first_unsorted(table) is None else table.sort_by(ARROW_SORT_KEYS)


class _Rows(Sequence[bytes]):
    """A sorted ``row`` column as a sequence of bytes, read only where :mod:`bisect` looks."""

    def __init__(self, column: pa.ChunkedArray[Any]) -> None:
        self.column = column

    def __len__(self) -> int:
        return len(self.column)

    def __getitem__(self, i: int) -> bytes:  # type: ignore[override]
        value: bytes = self.column[i].as_py()
        return value


def at_splits(run: pa.Table, splits: Sequence[bytes]) -> Iterator[pa.Table]:
    """``run`` (sorted) in pieces, one per tablet it touches: a tablet ends at its split, which
    it holds (``(prev, end]``). Binary searches only: no pass over the run."""
    n = run.num_rows
    if not n:
        return
    rows = _Rows(run.column("row"))
    start = 0
    for split in splits[bisect.bisect_left(splits, rows[0]) :]:
        if rows[n - 1] <= split:  # the rest is in this split's tablet
            break
        cut = bisect.bisect_right(rows, split, start)  # < n: the last row is past the split
        if cut > start:
            yield run.slice(start, cut - start)
            start = cut
    yield run.slice(start)


def _pieces(job: WriteJob, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.Table]:
    """What a task writes, one file each: its sorted runs, cut at the tablet splits."""
    for run in sorted_runs(batches, job.now_ms, job.run_entries):
        yield from at_splits(run, job.splits)


def write_task(job: WriteJob, batches: Iterable[pa.RecordBatch]) -> TaskFiles:
    """On an executor: write the task's entries as sorted files, not yet published."""
    client = job.endpoint.client()
    record = f"{job.tag}-{uuid.uuid4().hex[:8]}"
    writers: list[SortedFileWriter] = []
    done: list[StagedFile] = []
    try:
        for run in _pieces(job, batches):
            path = client.new_file_path(job.table_id, "import")
            client.store.files.register_import(record, job.table_id, [*(w.rel_path for w in writers), path], job.ttl_s)
            w = SortedFileWriter(client.storage, path, tmp_tag=job.tag, source=f"write {job.tag}")
            writers.append(w)
            w.write_table(run, checked=True)
            info = w.finish()
            done.append(StagedFile(w.tmp_rel, w.rel_path, info.meta))
        if job_ended(client.store, job):  # checked after the last file exists (see _sweep)
            raise KompaktorError(f"write {job.tag} ended (committed or aborted) while this task ran")
    except BaseException:
        for w in writers:
            _quietly(w.abort)
        _quietly(client.store.files.forget_import, record)
        raise
    return TaskFiles(record, tuple(done))


def job_ended(store: MetadataStore, job: WriteJob) -> bool:
    """Whether the driver ended the job (its record gone, or brought forward from the expiry
    :func:`begin_write` gave it: both times are the driver's clock, so no clock is compared
    with another's). A stream's micro-batch commit keeps it alive: that pushes it further out."""
    expires = store.files.import_expiry(job.tag)
    return expires is None or expires < job.now_ms / 1000 + job.ttl_s - 1.0


def commit_write(job: WriteJob, tasks: list[TaskFiles], *, end: bool = True) -> bool:
    """On the driver: publish every task's files and register them in one mutation. Returns
    False when the write's id was imported before (its files are removed). ``end=False`` (a
    stream, whose next micro-batch uses the same tag) keeps the job's record alive."""
    client = job.endpoint.client()
    files = [f for t in tasks for f in t.files]
    try:
        if job.write_id is not None and client.store.files.write_imported(job.table_id, job.write_id):
            _discard(client.storage, files)
            return False
        for f in files:
            client.storage.publish(f.staged, f.path)
        metas = {f.path: f.meta for f in files}
        client.store.files.add_files(job.table, metas, write_id=job.write_id)
    except ConditionFailed as exc:
        _discard(client.storage, files)
        if exc.condition == "write new":
            return False
        raise
    except StoreUnavailable:
        raise  # the outcome is unknown: the files stay (the collector takes them if unregistered)
    except BaseException:
        _discard(client.storage, files)
        raise
    finally:
        _sweep(job, tasks, end=end)
    return True


def abort_write(job: WriteJob, tasks: list[TaskFiles], *, end: bool = True) -> None:
    """On the driver, when the job fails: remove every file it wrote (``end``: as in
    :func:`commit_write`)."""
    client = job.endpoint.client()
    _discard(client.storage, [f for t in tasks for f in t.files])
    _sweep(job, tasks, end=end)


def _discard(storage: Storage, files: list[StagedFile]) -> None:
    for f in files:
        _quietly(storage.delete, f.staged)
        if f.path != f.staged:
            _quietly(storage.delete, f.path)


def _sweep(job: WriteJob, tasks: list[TaskFiles], *, end: bool) -> None:
    """Remove what the job's other attempts left (temporary names with its tag; on object
    stores the files of task records no message reported), and end its records."""
    client = job.endpoint.client()
    store, storage = client.store, client.storage
    reported = {f.path for t in tasks for f in t.files} | {f.staged for t in tasks for f in t.files}
    try:
        # the end first, then the listing: a task still writing either finished its files
        # before the listing (which finds them) or checks the end after them (and removes them)
        store.files.register_import(job.tag, job.table_id, [], 0.0 if end else job.ttl_s)
        for rel, _mtime in storage.list_files(posixpath.join(TABLES_DIR, job.table_id)):
            if tmp_tag(rel) == job.tag and rel not in reported:
                _quietly(storage.delete, rel)
        for record, paths in store.files.import_records(f"{job.tag}-").items():
            for p in paths:
                if p not in reported:
                    _quietly(storage.delete, p)
            store.files.forget_import(record)
    except (KompaktorError, OSError):
        pass  # what is left is unreferenced: the collector removes it once the records expire


def _quietly(fn: object, *args: object) -> None:
    try:
        fn(*args)  # type: ignore[operator]
    except (OSError, pa.ArrowException, KompaktorError):
        pass
