"""Kompaktor tables in PySpark pipelines (docs/spark.md): the ``kompaktor`` data source
(:mod:`kompaktor.spark.source`) and :func:`write`, which partitions and sorts a DataFrame the way
the table is split before writing it as one atomic import.

Imports nothing of Spark until called: ``import kompaktor.spark`` is cheap."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from kompaktor.model import errors

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: Kompaktor's key order as Spark sorts (binary columns compare as unsigned bytes in Spark too)
SORT_COLUMNS = (("row", True), ("cf", True), ("cq", True), ("vis", True), ("ts", False), ("deleted", False))
#: the column :func:`write` partitions on (dropped before the write)
TABLET_COLUMN = "_kompaktor_tablet"
#: the last line of a Kompaktor error's traceback, as Spark quotes it in its own exceptions
_QUOTED_ERROR = re.compile(r"^kompaktor\.model\.errors\.(\w+): (.+)$", re.MULTILINE)


def unwrapped(exc: Exception) -> Exception:
    """The Kompaktor error that Spark wrapped (with its Python traceback) into ``exc``, as its own
    one-line exception; ``exc`` itself when it quotes none."""
    found = _QUOTED_ERROR.findall(str(exc))
    if not found:
        return exc
    name, message = found[-1]
    cls: object = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, errors.KompaktorError) and "__init__" not in vars(cls):
        return cls(message)  # a class built from its message alone
    return errors.KompaktorError(message)


def register(spark: SparkSession) -> None:
    """Make ``format("kompaktor")`` known to ``spark`` (once per session; again is harmless)."""
    from kompaktor.spark.source import KompaktorDataSource

    spark.dataSource.register(KompaktorDataSource)


def read(spark: SparkSession, table: str, **options: str) -> DataFrame:
    """``spark.read.format("kompaktor").option("table", table).options(**options).load()``, with
    the option ``pushdown`` set from ``spark.sql.python.filterPushdown.enabled`` unless given."""
    register(spark)
    pushdown = str(spark.conf.get("spark.sql.python.filterPushdown.enabled", "false")).lower()
    options = {"pushdown": pushdown, **options}
    return spark.read.format("kompaktor").option("table", table).options(**options).load()


def write(
    df: DataFrame, table: str, *, write_id: str | None = None, partitions: int | None = None, **options: str
) -> None:
    """Append ``df`` (row, cf, cq, vis, value; ts and deleted optional: ts defaults to the write's
    time) to ``table`` as one atomic import: range-partitioned on the table's tablet splits, then
    on rows within them, and sorted within partitions in Kompaktor's key order, so that each task
    writes sorted files of one tablet each. ``partitions`` (default: the session's default
    parallelism) is how many tasks write when the table has fewer tablets: a table of one tablet
    is not written by one task. With ``write_id``, a retried job imports once."""
    from pyspark.sql import functions as F

    from kompaktor.model.tablet import now_ms
    from kompaktor.spark.source import endpoint
    from kompaktor.spark.staged import check_columns

    check_columns(df.columns)
    if "ts" not in df.columns:
        df = df.withColumn("ts", F.lit(now_ms()).cast("bigint"))
    if "deleted" not in df.columns:
        df = df.withColumn("deleted", F.lit(False))
    client = endpoint({k: v for k, v in options.items() if k in ("redis", "storage")}).client()
    splits = [t.end for t in client.store.tables.tablets(client.store.tables.table_id(table)) if t.end is not None]
    tablet = sum((F.when(F.col("row") > F.lit(s), 1).otherwise(0) for s in splits), F.lit(0))
    order = [F.col(c).asc() if up else F.col(c).desc() for c, up in SORT_COLUMNS]
    tasks = max(len(splits) + 1, partitions or df.sparkSession.sparkContext.defaultParallelism)
    shaped = (
        df.withColumn(TABLET_COLUMN, tablet)
        .repartitionByRange(tasks, TABLET_COLUMN, "row")
        .sortWithinPartitions(TABLET_COLUMN, *order)
        .drop(TABLET_COLUMN)
    )
    register(df.sparkSession)
    out = shaped.write.format("kompaktor").option("table", table).options(**options)
    if write_id is not None:
        out = out.option("write_id", write_id)
    try:
        out.mode("append").save()
    except Exception as exc:  # Spark's wrapping of an error of the driver's or a task's
        raise unwrapped(exc) from None
