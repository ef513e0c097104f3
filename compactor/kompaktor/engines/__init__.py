"""Merge engines: one request in, one committed output file out (:mod:`.api`).

``spark`` (:mod:`.spark`) runs the key ranges of a merge (:mod:`.ranges`) as Spark tasks, in the
pod (``local[*]``) or on a Spark cluster; ``arrow`` (:mod:`.arrow`) runs them in-process, for
groups of small jobs. Both are held to the same conformance tests.

The engines hold no defaults of a group's settings: whoever builds one (the compactor, from its
group's settings in Redis and ``kompaktor.policy.services``; ``kompaktor merge``; a bench) gives
the resolved values, and the engines never import the policy layer (an import contract).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping

from kompaktor.engines.api import MergeEngine
from kompaktor.model.engines import ENGINES
from kompaktor.model.errors import KompaktorError

__all__ = ["ENGINES", "MergeEngine", "make_engine"]


def make_engine(
    kind: str,
    *,
    spark_master: str | None = None,
    spark_conf: Mapping[str, str] | None = None,
    driver_memory: str | None = None,
    resume_min_bytes: int | None = None,
) -> MergeEngine:
    """An engine by name, with the settings its caller resolved. ``spark`` needs ``spark_master``
    and creates (or reuses) the process's one SparkSession now, so a compactor pays the JVM
    start-up once, before its first job. ``resume_min_bytes``: input bytes from which a merge given
    a resume log is resumable (a group's ``spec.resume.minInputSize``; ``None``: never)."""
    if kind == "arrow":
        from kompaktor.engines.arrow import ArrowMergeEngine

        return ArrowMergeEngine(resume_min_bytes=resume_min_bytes)
    if kind == "spark":
        if importlib.util.find_spec("pyspark") is None:
            raise KompaktorError(
                "the spark engine needs PySpark, which is not installed: "
                "pip install 'kompaktor[spark]' (or use the arrow engine)"
            )
        if spark_master is None:
            raise ValueError("the spark engine needs a Spark master (spark_master)")
        from kompaktor.engines.spark import SparkMergeEngine

        return SparkMergeEngine(
            master=spark_master,
            conf=dict(spark_conf or {}),
            driver_memory=driver_memory,
            resume_min_bytes=resume_min_bytes,
        )
    raise ValueError(f"unknown merge engine {kind!r}; expected one of {', '.join(ENGINES)}")
