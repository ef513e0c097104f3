"""Spark's orderBy on the file schema agrees with Python's sort_key (and so with Arrow's
ARROW_SORT_KEYS, tests/unit/test_sort_order.py): binary columns compare as unsigned bytes."""

from __future__ import annotations

import random

import pytest

from kompaktor.files.sortedfile import SCHEMA, entries_to_table
from kompaktor.model.keys import INT64_MAX, INT64_MIN, Entry, sort_key


def spark_sorted(spark, es: list[Entry]) -> list[Entry]:
    from pyspark.sql import functions as F

    df = spark.createDataFrame(entries_to_table(es)).repartition(3)
    df = df.orderBy(
        F.col("row").asc(),
        F.col("cf").asc(),
        F.col("cq").asc(),
        F.col("vis").asc(),
        F.col("ts").desc(),
        F.col("deleted").desc(),
    )
    return [
        Entry(*(bytes(v) if isinstance(v, bytearray) else v for v in (r[n] for n in SCHEMA.names)))
        for r in df.collect()
    ]


@pytest.mark.spark
def test_spark_order_by_matches_sort_key(spark_session):
    """One Spark job over 3,000 random keys drawn from the strategy (one job, not one per
    example: each Spark job costs a second on this machine)."""
    es = _random_keys(3000)
    got = spark_sorted(spark_session, es)
    assert [sort_key(e) for e in got] == [sort_key(e) for e in sorted(es, key=sort_key)]


def _random_keys(n: int, seed: int = 11) -> list[Entry]:
    rng = random.Random(seed)
    pool = [b"", b"\x00", b"\x7f", b"\x80", b"\xff", b"a", b"a\x00", b"\xff\x00"]

    def f() -> bytes:
        return rng.choice(pool) if rng.random() < 0.6 else rng.randbytes(rng.randint(0, 3))

    stamps = [INT64_MIN, INT64_MAX, -1, 0, 1, 2]
    return [
        Entry(f(), f(), f(), rng.choice([b"", b"\xe9"]), rng.choice(stamps), rng.random() < 0.5, b"") for _ in range(n)
    ]


@pytest.mark.spark
def test_spark_unsigned_bytes(spark_session):
    rows = [b"\xff", b"\x80", b"\x7f", b"", b"\x00", b"\x80\x00"]
    got = spark_sorted(spark_session, [Entry(r, b"", b"", b"", 0, False, b"") for r in rows])
    assert [e.row for e in got] == sorted(rows)
