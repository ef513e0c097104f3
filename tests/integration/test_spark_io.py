"""PySpark reads and writes Kompaktor tables (docs/spark.md) on the session's real SparkSession
(``local[2]``) and a real redis-server: round trips against a reference view written in
test_read_arrow (not the product's merge), row-range pushdown, one atomic and idempotent import
per write, and a task killed mid-write leaving nothing visible and nothing behind."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import kompaktor.spark as kspark
from kompaktor.client import Client
from kompaktor.files.sortedfile import table_to_entries
from kompaktor.files.storage import Storage
from kompaktor.local.redis_server import RedisProcess
from kompaktor.metadata import acl
from kompaktor.metadata.store import MetadataStore
from kompaktor.model.errors import KompaktorError
from kompaktor.model.keys import Entry, sort_key
from kompaktor.model.names import TMP_PREFIX
from kompaktor.spark import staged
from kompaktor.spark.staged import REQUIRED
from tests.integration.test_read_arrow import flush_st, reference

pytestmark = [pytest.mark.redis, pytest.mark.spark, pytest.mark.timeout(600)]

SPLITS = [b"b", b"m"]
#: a Spark job per example: the failing example is reported as found, not shrunk for minutes
NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)


@pytest.fixture
def spark(spark_session, redis_url: str, storage: Storage):
    kspark.register(spark_session)
    return spark_session


def opts(redis_url: str, storage: Storage) -> dict[str, str]:
    return {"redis": redis_url, "storage": storage.uri}


def rows_of(df) -> list[Entry]:
    return sorted(
        (
            Entry(bytes(r.row), bytes(r.cf), bytes(r.cq), bytes(r.vis), r.ts, r.deleted, bytes(r.value))
            for r in df.collect()
        ),
        key=sort_key,
    )


def table_files(client: Client, name: str) -> set[str]:
    return {f for t in client.store.tables.tablets(client.store.tables.table_id(name)) for f in t.files}


def leftovers(storage: Storage) -> list[str]:
    return [rel for rel, _ in storage.list_files("tables") if TMP_PREFIX in rel]


@settings(max_examples=3, deadline=None, phases=NO_SHRINK, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flushes=st.lists(flush_st, min_size=1, max_size=3), versions=st.integers(1, 2))
def test_a_read_is_the_reference_view_one_partition_per_tablet(
    spark, client: Client, redis_url: str, storage: Storage, flushes: list[list[Entry]], versions: int
) -> None:
    name = f"r{client.store.next_seq('test')}"
    client.store.tables.create_table(name, SPLITS)
    for f in flushes:
        if f:
            client.flush(name, f)
    df = kspark.read(spark, name, max_versions=str(versions), **opts(redis_url, storage))
    assert df.rdd.getNumPartitions() == 3
    assert rows_of(df) == reference(flushes, None, None, versions)
    ranged = kspark.read(spark, name, start="b", end="m", **opts(redis_url, storage))
    assert ranged.rdd.getNumPartitions() == 2  # (-inf, b] and (b, m]
    assert rows_of(ranged) == reference(flushes, b"b", b"m", 1)


def test_a_big_tablet_is_read_by_several_tasks(spark, client: Client, redis_url: str, storage: Storage) -> None:
    """Issue 44: a tablet whose files hold more than ``piece_entries`` entries is read by one task
    per piece (row ranges cut at its files' row groups), and the rows are the reference view."""
    client.store.tables.create_table("big", [])
    flushes = [
        [Entry(b"r%03d" % i, b"f", b"q", b"", ts, i % 7 == 0 and ts == 2, b"") for i in range(100)] for ts in (1, 2)
    ]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("kompaktor.files.sortedfile.ROW_GROUP_SIZE", 10)
        for f in flushes:
            client.flush("big", f)
    df = kspark.read(spark, "big", piece_entries="50", **opts(redis_url, storage))
    assert df.rdd.getNumPartitions() == 4
    assert rows_of(df) == reference(flushes, None, None, 1)
    assert kspark.read(spark, "big", **opts(redis_url, storage)).rdd.getNumPartitions() == 1


def test_filters_on_row_are_pushed_into_the_row_range(spark, client: Client, redis_url: str, storage: Storage) -> None:
    flush = [Entry(r, b"f", b"q", b"", 5, False, r) for r in (b"a", b"b", b"c", b"m", b"n", b"z")]
    client.store.tables.create_table("p", SPLITS)
    client.flush("p", flush)
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    try:
        from pyspark.sql import functions as F

        df = kspark.read(spark, "p", **opts(redis_url, storage)).filter(F.col("row") > F.lit(b"m"))
        assert df.rdd.getNumPartitions() == 1  # only the last tablet
        assert rows_of(df) == [e for e in flush if e.row > b"m"]
        df = kspark.read(spark, "p", **opts(redis_url, storage)).filter(F.col("row") <= F.lit(b"b"))
        assert df.rdd.getNumPartitions() == 1
        assert rows_of(df) == [e for e in flush if e.row <= b"b"]
    finally:
        spark.conf.unset("spark.sql.python.filterPushdown.enabled")


entry_st = flush_st.filter(bool)


def dataframe(spark, entries: list[Entry], *, with_ts: bool = True):
    cols = ["row", "cf", "cq", "vis", "ts", "deleted", "value"] if with_ts else ["row", "cf", "cq", "vis", "value"]
    data = [tuple(getattr(e, c) for c in cols) for e in entries]
    types = {"ts": "bigint", "deleted": "boolean"}
    schema = ", ".join(f"{c} {types.get(c, 'binary')}" for c in cols)
    return spark.createDataFrame(data[::-1], schema).repartition(3)  # out of order, spread


@settings(max_examples=3, deadline=None, phases=NO_SHRINK, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(old=entry_st, new=entry_st)
def test_a_write_is_one_import_of_every_row(
    spark, client: Client, redis_url: str, storage: Storage, old: list[Entry], new: list[Entry]
) -> None:
    """A flush, then a Spark write (the helper, or the format itself on unsorted data): the table
    reads as the reference view of both, the write's files registered in one import."""
    name = f"w{client.store.next_seq('test')}"
    client.store.tables.create_table(name, SPLITS)
    client.flush(name, old)
    before = table_files(client, name)
    kspark.write(dataframe(spark, new), name, **opts(redis_url, storage))
    assert list(client.scan(name)) == reference([new, old], None, None, 1)
    assert table_files(client, name) > before and leftovers(storage) == []
    dataframe(spark, new).write.format("kompaktor").option("table", name).options(**opts(redis_url, storage)).mode(
        "append"
    ).save()
    assert list(client.scan(name)) == reference([new, new, old], None, None, 1)


def test_a_write_spreads_over_tasks_and_each_file_is_in_one_tablet(
    spark, client: Client, redis_url: str, storage: Storage
) -> None:
    """A table of one tablet is not written by one task (``partitions``), and in a split table
    every file the write adds is listed by exactly one tablet (tasks cut their runs at splits)."""
    entries = [Entry(b"%c%03d" % (c, i), b"f", b"q", b"", 5, False, b"v") for c in b"aez" for i in range(40)]
    client.store.tables.create_table("one")
    kspark.write(dataframe(spark, entries), "one", partitions=3, **opts(redis_url, storage))
    assert list(client.scan("one")) == reference([entries], None, None, 1)
    assert len(table_files(client, "one")) >= 2
    client.store.tables.create_table("split", SPLITS)
    one_task = dataframe(spark, entries).coalesce(1).write.format("kompaktor").option("table", "split")
    one_task.options(**opts(redis_url, storage)).mode("append").save()  # one task, every tablet
    assert list(client.scan("split")) == reference([entries], None, None, 1)
    listed = [f for t in client.store.tables.tablets(client.store.tables.table_id("split")) for f in t.files]
    assert len(listed) == len(set(listed)) == 3


def test_ts_defaults_to_the_writes_time_and_bad_input_changes_nothing(
    spark, client: Client, redis_url: str, storage: Storage
) -> None:
    client.store.tables.create_table("d", SPLITS)
    entries = [Entry(b"k%d" % i, b"f", b"q", b"", 0, False, b"v") for i in range(10)]
    kspark.write(dataframe(spark, entries, with_ts=False), "d", **opts(redis_url, storage))
    got = list(client.scan("d"))
    assert [e.row for e in got] == sorted(e.row for e in entries) and len({e.ts for e in got}) == 1
    files = table_files(client, "d")
    bad = spark.createDataFrame([(b"r", b"v")], "row binary, value binary")
    with pytest.raises(Exception, match="missing columns"):
        kspark.write(bad, "d", **opts(redis_url, storage))
    with pytest.raises(Exception, match="only appended"):
        dataframe(spark, entries).write.format("kompaktor").option("table", "d").options(
            **opts(redis_url, storage)
        ).mode("overwrite").save()
    assert table_files(client, "d") == files and leftovers(storage) == []


def test_a_task_killed_mid_write_leaves_nothing_and_the_retried_job_imports_once(
    spark, client: Client, redis_url: str, storage: Storage, tmp_path: Path
) -> None:
    """Partition 1's Python worker dies after its first batch while the other tasks have staged
    their files: the job fails, nothing is visible, no file is left. The same job again (same
    write id) imports every row once; a third run imports nothing."""
    client.store.tables.create_table("k", SPLITS)
    entries = sorted(
        (Entry(b"%c%04d" % (c, i), b"f", b"q", b"", 7, False, b"v") for c in b"amz" for i in range(300)), key=sort_key
    )
    arm = tmp_path / "kill-armed"
    arm.touch()

    def maybe_die(index, rows):
        for i, r in enumerate(rows):
            yield r
            if index == 1 and i == 120 and os.path.exists(str(arm)):
                os.unlink(str(arm))
                os._exit(3)  # the Python worker feeding the write task dies

    def write(df):
        # batches of 20 rows, files of 50 entries: the tasks have staged files when one dies
        df.write.format("kompaktor").option("table", "k").options(**opts(redis_url, storage)).option(
            "write_id", "job-1"
        ).option("run_entries", "50").mode("append").save()

    def df():
        base = dataframe(spark, entries)
        return spark.createDataFrame(base.rdd.mapPartitionsWithIndex(maybe_die), base.schema)

    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "20")
    try:
        do_test(client, storage, arm, entries, lambda: write(df()))
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")


def do_test(client: Client, storage: Storage, arm: Path, entries: list[Entry], run) -> None:
    with pytest.raises(Exception) as failed:
        run()
    assert not arm.exists(), f"the task was not killed: {failed.value}"
    assert list(client.scan("k")) == [] and table_files(client, "k") == set()
    assert leftovers(storage) == [] and [rel for rel, _ in storage.list_files("tables")] == []
    run()
    assert list(client.scan("k")) == entries
    files = table_files(client, "k")
    assert len(files) > 3  # runs of 50 entries: several files per task, one import
    run()
    assert table_files(client, "k") == files and list(client.scan("k")) == entries
    assert leftovers(storage) == [] and {rel for rel, _ in storage.list_files("tables")} == files


def test_a_stream_imports_each_micro_batch_once(
    spark, client: Client, redis_url: str, storage: Storage, tmp_path: Path
) -> None:
    """A file stream into a table: each micro-batch one import. A batch replayed because the
    query died after the sink's commit and before Spark's checkpoint (its commit log entry
    removed here) imports nothing again."""
    import pyarrow.parquet as pq

    from kompaktor.files.sortedfile import entries_to_table

    client.store.tables.create_table("s", SPLITS)
    src = tmp_path / "in"
    src.mkdir()
    entries = [Entry(b"%c%03d" % (c, i), b"f", b"q", b"", 3, False, b"v") for c in b"anz" for i in range(20)]
    pq.write_table(entries_to_table(entries[:30]), src / "a.parquet")
    pq.write_table(entries_to_table(entries[30:]), src / "b.parquet")
    checkpoint = tmp_path / "checkpoint"

    def run() -> None:
        stream = spark.readStream.schema(dataframe(spark, entries[:1]).schema).option("maxFilesPerTrigger", 1)
        query = (
            stream.parquet(str(src))
            .writeStream.format("kompaktor")
            .option("table", "s")
            .option("stream_id", "s-1")
            .options(**opts(redis_url, storage))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(300)
        assert query.exception() is None

    run()
    assert list(client.scan("s")) == sorted(entries, key=sort_key)
    files = table_files(client, "s")
    assert len(files) >= 2  # a file per micro-batch at least
    tid = client.store.tables.table_id("s")
    assert client.store.files.write_imported(tid, "s-1:0") and client.store.files.write_imported(tid, "s-1:1")
    for entry in ("1", ".1.crc"):  # died before Spark recorded batch 1 as done
        (checkpoint / "commits" / entry).unlink(missing_ok=True)
    run()
    assert table_files(client, "s") == files and list(client.scan("s")) == sorted(entries, key=sort_key)
    assert leftovers(storage) == []


def test_partitions_stay_pinned_through_compactions_until_their_tasks_read(
    client: Client, store, storage: Storage, redis_url: str
) -> None:
    """The source's plan pins each tablet's files (the driver's side), every one of them is
    compacted away and the collector runs (grace 0) before the tasks read: each partition still
    reads its tablet as planned. The reader's two halves are called here as Spark calls them."""
    from kompaktor.coordinator.gc import collect_garbage
    from kompaktor.spark.source import KompaktorDataSource
    from tests.integration.test_read_arrow import compact_everything
    from tests.integration.test_worker import make_table

    tid = make_table(client)
    want = list(client.scan("t"))
    before = table_files(client, "t")
    reader = KompaktorDataSource({"table": "t", **opts(redis_url, storage)}).reader(None)  # type: ignore[arg-type]
    partitions = reader.partitions()
    assert len(partitions) == len(store.tables.tablets(tid))
    assert compact_everything(store, storage) == 2 and not before & table_files(client, "t")
    assert collect_garbage(store, storage, grace_s=0.0) == []
    batches = [b for p in partitions for b in reader.read(p)]
    assert [e for b in batches for e in table_to_entries(pa.Table.from_batches([b]))] == want


@pytest.mark.parametrize("ending", ["commit", "abort"])
def test_a_task_that_finishes_after_its_job_ended_leaves_nothing(
    client: Client, redis_url: str, storage: Storage, ending: str
) -> None:
    """A straggler — a task Spark was still cancelling when the job failed, or a speculative
    copy that lost — finishes its files after the driver's commit or abort has swept the job:
    it sees the job ended and removes them; nothing is left and nothing of it becomes visible."""
    client.store.tables.create_table("s", SPLITS)
    job = staged.begin_write(staged.Endpoint(redis_url, storage.uri), "s", None)

    def batch(rows: list[bytes]) -> pa.RecordBatch:
        cols = {c: [b"f"] * len(rows) for c in ("cf", "cq")} | {"vis": [b""] * len(rows), "value": rows}
        return pa.RecordBatch.from_pydict({"row": rows, **cols}, pa.schema([(c, pa.binary()) for c in REQUIRED]))

    in_time = staged.write_task(job, [batch([b"a", b"c"])])
    end = staged.commit_write if ending == "commit" else staged.abort_write
    end(job, [in_time])
    with pytest.raises(KompaktorError, match="ended"):
        staged.write_task(job, [batch([b"d", b"z"])])
    assert leftovers(storage) == []
    assert [e.row for e in client.scan("s")] == ([b"a", b"c"] if ending == "commit" else [])
    assert {rel for rel, _ in storage.list_files("tables")} == table_files(client, "s")


def test_a_pipeline_on_the_admin_user_writes_and_reads_and_the_compactor_user_cannot(
    spark, tmp_path: Path, storage: Storage
) -> None:
    """With Redis users per role (docs/kubernetes.md), a pipeline on the `admin` user — the role
    docs/spark.md names — writes and reads a table through the source; on the `compactor` user,
    which may write nothing of the metadata, the write is refused in one line and leaves
    nothing, and so is the read (it cannot pin its files)."""
    passwords = acl.new_passwords()
    server = RedisProcess(tmp_path / "redis", users=passwords).start()
    try:
        admin = Client(MetadataStore.from_url(server.role_url("admin")), storage)
        admin.store.tables.create_table("acl", SPLITS)
        entries = sorted((Entry(b"r%03d" % i, b"f", b"q", b"", 3, False, b"v") for i in range(40)), key=sort_key)
        as_admin = {"redis": server.role_url("admin"), "storage": storage.uri}
        kspark.write(dataframe(spark, entries), "acl", **as_admin)
        assert rows_of(kspark.read(spark, "acl", **as_admin)) == entries
        files = table_files(admin, "acl")
        as_compactor = {"redis": server.role_url("compactor"), "storage": storage.uri}
        with pytest.raises(Exception, match="denied a command to this user") as refused:
            kspark.write(dataframe(spark, entries[:5]), "acl", **as_compactor)
        assert len(str(refused.value).strip().splitlines()) == 1 and passwords["compactor"] not in str(refused.value)
        with pytest.raises(Exception, match="denied a command to this user"):
            kspark.read(spark, "acl", **as_compactor).collect()
        assert table_files(admin, "acl") == files and leftovers(storage) == []
        assert list(admin.scan("acl")) == entries
    finally:
        server.stop()
