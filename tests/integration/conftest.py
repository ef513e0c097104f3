"""Fixtures for integration tests: one SparkSession for the whole test session.

Spark's JVM start costs seconds, and this machine has 2 cores: every Spark test shares this
session (``local[2]``, small shuffle partitions, UI off). The merge engines reuse it through
:func:`kompaktor.engines.session.get_session`, which returns the process's existing session.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

SPARK_MASTER = "local[2]"


@pytest.fixture(scope="session")
def spark_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from kompaktor.engines import session as spark

    local_dir = tmp_path_factory.mktemp("spark-local")
    session = spark.get_session(
        SPARK_MASTER,
        {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2", "spark.local.dir": str(local_dir)},
    )
    yield session
    spark.stop_session()


@pytest.fixture(scope="session")
def spark_engine(spark_session):
    """The Spark merge engine on the session's SparkSession, planning small tasks so that
    small test inputs are still cut into several key ranges."""
    from kompaktor.engines.spark import SparkMergeEngine

    return SparkMergeEngine(SPARK_MASTER, task_entries=8)
