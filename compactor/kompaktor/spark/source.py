"""``spark.read.format("kompaktor")`` and ``df.write.format("kompaktor")``: PySpark's Python Data
Source API (pyspark >= 4.1) over a Kompaktor table (docs/spark.md).

Reading: one input partition per tablet overlapping the row range, each pinned on the driver to
its files by a record among the imports in progress (the garbage collector spares those files
whatever compactions do meanwhile), refreshed by its task while it reads; the task merges its
tablet with the vectorized iterator stack and hands Spark Arrow batches. The row range comes from
the options and from filters on ``row`` that Spark pushes (with
``spark.sql.python.filterPushdown.enabled``).

Writing: the tasks write sorted files that only the driver's commit publishes and registers, in
one import (:mod:`kompaktor.spark.staged`); a streaming query's micro-batch is one such import,
recorded under its batch id.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    InputPartition,
    LessThanOrEqual,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from kompaktor.client import READ_PIECE_ENTRIES, READ_TTL_S, ReadLease, ReadPart, cut_part, read_part
from kompaktor.files.sortedfile import SCHEMA
from kompaktor.files.storage import default_storage_uri
from kompaktor.metadata.store import DEFAULT_REDIS_URL
from kompaktor.model.errors import KompaktorError
from kompaktor.model.iterators import IteratorSettings
from kompaktor.model.tablet import now_ms
from kompaktor.policy.tableprops import max_versions as table_max_versions
from kompaktor.spark.staged import (
    RUN_ENTRIES,
    Endpoint,
    TaskFiles,
    WriteJob,
    abort_write,
    begin_write,
    check_columns,
    commit_write,
    write_task,
)

#: the file schema as Spark declares it
SPARK_SCHEMA = "row binary, cf binary, cq binary, vis binary, ts bigint, deleted boolean, value binary"
#: the file schema as Spark expects a data source's batches (every field nullable)
NULLABLE = pa.schema([f.with_nullable(True) for f in SCHEMA])
#: how long a read's partitions stay pinned between planning and their tasks (option ``lease_s``)
PLAN_LEASE_S = 3600.0


def endpoint(options: dict[str, str]) -> Endpoint:
    """The store and storage of the options, resolved here (the driver) for every executor."""
    redis_url = options.get("redis") or os.environ.get("KOMPAKTOR_REDIS_URL") or DEFAULT_REDIS_URL
    return Endpoint(redis_url, options.get("storage") or default_storage_uri())


def table_option(options: dict[str, str]) -> str:
    table = options.get("table")
    if not table:
        raise KompaktorError('no table: give .option("table", NAME)')
    return table


def row_option(options: dict[str, str], name: str) -> bytes | None:
    """A row bound: ``start``/``end`` as UTF-8, or ``start_hex``/``end_hex`` as hex digits."""
    if (text := options.get(name)) is not None:
        return text.encode("utf-8")
    if (hexed := options.get(f"{name}_hex")) is not None:
        try:
            return bytes.fromhex(hexed)
        except ValueError:
            raise KompaktorError(f"option {name}_hex: {hexed!r} is not hex digits") from None
    return None


def count_option(options: dict[str, str], name: str, default: int) -> int:
    """A positive whole number (``max_versions``, ``piece_entries``, ``run_entries``), or a
    one-line refusal naming the option."""
    text = options.get(name)
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise KompaktorError(f"option {name}: {text!r} is not a whole number of at least 1")
    return value


def _bytes(value: Any) -> bytes | None:
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    return None


class KompaktorDataSource(DataSource):
    """The ``kompaktor`` format; options ``table`` (required), ``redis``, ``storage`` (default
    ``$KOMPAKTOR_REDIS_URL``, ``$KOMPAKTOR_STORAGE``), reading: ``start``, ``end`` (inclusive,
    or ``start_hex``, ``end_hex``), ``max_versions``, ``lease_s``, ``piece_entries`` (input
    entries a read task merges, about; default 4,000,000), ``pushdown`` (``true`` with
    ``spark.sql.python.filterPushdown.enabled``); writing: ``write_id`` (a
    retried job with the same id imports once), ``run_entries`` (entries a task sorts in
    memory at a time, one file each; default 1,000,000), streaming: ``stream_id``."""

    @classmethod
    def name(cls) -> str:
        return "kompaktor"

    def schema(self) -> str:
        return SPARK_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        # Spark refuses a reader with pushFilters while spark.sql.python.filterPushdown.enabled
        # is off, and a data source cannot read the session's conf: the option says which
        # (kompaktor.spark.read sets it from the conf)
        options = dict(self.options)
        if options.get("pushdown", "false").lower() == "true":
            return KompaktorPushdownReader(options)
        return KompaktorReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        return KompaktorWriter(self._begin(schema, overwrite, self.options.get("write_id")))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        stream_id = self.options.get("stream_id")
        if not stream_id:
            raise KompaktorError(
                'a stream into a Kompaktor table needs .option("stream_id", ID), stable across restarts'
            )
        return KompaktorStreamWriter(self._begin(schema, overwrite, None), stream_id)

    def _begin(self, schema: StructType, overwrite: bool, write_id: str | None) -> WriteJob:
        if overwrite:
            raise KompaktorError("a Kompaktor table is only appended to: use mode('append')")
        check_columns(schema.fieldNames())
        options = dict(self.options)
        runs = count_option(options, "run_entries", RUN_ENTRIES)
        return begin_write(endpoint(options), table_option(options), write_id, run_entries=runs)


@dataclass(frozen=True)
class TabletPartition(InputPartition):
    """One tablet's share of a read and the record that pins its files."""

    value: ReadPart
    lease: str
    table_id: str
    settings: IteratorSettings


class KompaktorReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.endpoint = endpoint(options)
        self.table = table_option(options)
        self.start = row_option(options, "start")
        self.end = row_option(options, "end")
        self.max_versions = count_option(options, "max_versions", 0) or None
        self.lease_s = float(options.get("lease_s") or PLAN_LEASE_S)
        self.piece_entries = count_option(options, "piece_entries", READ_PIECE_ENTRIES)

    def partitions(self) -> list[InputPartition]:
        """One per tablet in the range, or per piece of about ``piece_entries`` input entries of a
        bigger one (:func:`cut_part`); each pinned for ``lease_s`` until its task takes over."""
        client = self.endpoint.client()
        store = client.store
        info = store.tables.table(self.table)
        settings = IteratorSettings(max_versions=self.max_versions or table_max_versions(info.props))
        if self.start is not None and self.end is not None and self.start > self.end:
            return []
        pin = ReadLease(store, info.id)
        try:
            parts = [
                p for part in pin.pin(self.start, self.end) for p in cut_part(client.storage, part, self.piece_entries)
            ]
        except BaseException:
            pin.close()
            raise
        lease = f"READ{uuid.uuid4().hex[:16]}"
        out: list[InputPartition] = []
        for i, part in enumerate(parts):
            store.files.register_import(f"{lease}-{i}", info.id, part.files, self.lease_s)
            out.append(TabletPartition(part, f"{lease}-{i}", info.id, settings))
        pin.close()  # every file is pinned by its partition's record now
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, TabletPartition)
        client = self.endpoint.client()
        lease = ReadLease(client.store, partition.table_id, partition.lease)
        lease.files.update(partition.value.files)
        lease.keep_alive()
        try:
            for batch in read_part(client.storage, partition.value, partition.settings):
                yield pa.RecordBatch.from_arrays(batch.columns, schema=NULLABLE)
        finally:
            lease.close(tail_s=READ_TTL_S)  # a retry of this task is still covered for a while


class KompaktorPushdownReader(KompaktorReader):
    """The reader with filters on ``row`` pushed into its row range (option ``pushdown``)."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        """Take the bounds on ``row`` into the row range; Spark applies the rest."""
        for f in filters:
            if not self._narrow(f):
                yield f

    def _narrow(self, f: Filter) -> bool:
        if getattr(f, "attribute", None) != ("row",) or (v := _bytes(getattr(f, "value", None))) is None:
            return False
        if isinstance(f, GreaterThanOrEqual | GreaterThan | EqualTo):
            low = v + b"\x00" if isinstance(f, GreaterThan) else v
            self.start = low if self.start is None else max(self.start, low)
        if isinstance(f, LessThanOrEqual | EqualTo):
            self.end = v if self.end is None else min(self.end, v)
        return isinstance(f, GreaterThanOrEqual | GreaterThan | EqualTo | LessThanOrEqual)


@dataclass
class TaskMessage(WriterCommitMessage):
    files: TaskFiles


class KompaktorWriter(DataSourceArrowWriter):
    def __init__(self, job: WriteJob) -> None:
        self.job = job

    # pyspark's Arrow writers narrow write()'s argument to Arrow batches (its stubs say Rows)
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:  # type: ignore[override]
        return TaskMessage(write_task(self.job, iterator))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        commit_write(self.job, _tasks(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        abort_write(self.job, _tasks(messages))


class KompaktorStreamWriter(DataSourceStreamArrowWriter):
    """Each micro-batch one import, recorded as ``<stream_id>:<batch id>``: a batch replayed after
    a restart (Spark's checkpoint saw no commit) imports once."""

    def __init__(self, job: WriteJob, stream_id: str) -> None:
        self.job, self.stream_id = job, stream_id

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:  # type: ignore[override]
        # ts defaults to the micro-batch's time (as its task sees it), not the stream's start
        return TaskMessage(write_task(replace(self.job, now_ms=now_ms()), iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        job = replace(self.job, write_id=f"{self.stream_id}:{batchId}")
        commit_write(job, _tasks(messages), end=False)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        abort_write(self.job, _tasks(messages), end=False)


def _tasks(messages: list[WriterCommitMessage | None]) -> list[TaskFiles]:
    return [m.files for m in messages if isinstance(m, TaskMessage)]
