"""The process's one SparkSession: created on first use, then reused by every merge.

JVM and session start-up cost 5–8 s and a first job a few more (measured on a 2-core machine), so a
compactor creates the session once, before its first job, and keeps it for its whole life.
``master`` is the group's (``local[*]`` in the pod by default, ``kompaktor.policy.services``); a
group's configuration can point it at a Spark cluster or Spark-on-Kubernetes (``k8s://…``) with
any extra Spark conf.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import socket
import sys
import tempfile
import threading
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from kompaktor.engines.api import MergeError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

_lock = threading.Lock()
#: the master, the conf and the driver memory a session was made with
_Settings = tuple[str, tuple[tuple[str, str], ...], str | None]

_session: SparkSession | None = None
_settings: _Settings | None = None
_warm: SparkSession | None = None

#: Defaults for a compactor's session; the caller's conf wins.
DEFAULT_CONF: dict[str, str] = {
    "spark.app.name": "kompaktor-compactor",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.python.worker.reuse": "true",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.task.maxFailures": "2",
}

_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


def _log4j_file(local_dir: str) -> str:
    path = os.path.join(local_dir, "kompaktor-log4j2.properties")
    if not os.path.exists(path):
        with open(path, "w") as f:
            f.write(_LOG4J2)
    return path


#: seconds to wait for a standalone master's port before giving up on it
MASTER_PROBE_TIMEOUT_S = 5.0


class SparkUnavailable(MergeError):
    """The Spark master (cluster) the engine is configured for cannot be reached."""


def probe_master(master: str, timeout: float = MASTER_PROBE_TIMEOUT_S) -> None:
    """For a standalone master (``spark://host:port[,host:port…]``), check that one of its
    addresses accepts a connection, so that a dead URL is one clear error now instead of
    Spark's own minute of registration retries. Other masters (``local``, ``k8s://``, ``yarn``)
    are left to Spark."""
    if not master.startswith("spark://"):
        return
    errors = []
    for hostport in master[len("spark://") :].split(","):
        host, _, port = hostport.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
                return
        except ValueError:
            raise SparkUnavailable(f"Spark master URL {master!r} is not spark://HOST:PORT") from None
        except OSError as exc:
            errors.append(f"{hostport}: {exc.strerror or exc}")
    raise SparkUnavailable(f"Spark master {master} does not answer ({'; '.join(errors)})")


def get_session(master: str, conf: Mapping[str, str] | None = None, driver_memory: str | None = None) -> SparkSession:
    """The process's SparkSession, created on the first call. Later calls return the same
    session; if they ask for a different master or conf, a warning says the first one stays
    (a JVM's Spark settings cannot change while it runs)."""
    global _session, _settings
    conf = dict(conf or {})
    wanted: _Settings = (master, tuple(sorted(conf.items())), driver_memory)
    with _lock:
        if _session is not None and _settings is not None and not _session.sparkContext._jsc.sc().isStopped():
            if (
                master != _settings[0]
                or (conf and wanted[1] != _settings[1])
                or (driver_memory and driver_memory != _settings[2])
            ):
                log.warning("SparkSession already running with %s; ignoring %s", _settings, wanted)
            return _session
        probe_master(master)
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
        from pyspark.sql import SparkSession

        local_dir = conf.get("spark.local.dir") or os.environ.get("KOMPAKTOR_SPARK_LOCAL_DIR")
        if not local_dir:
            local_dir = tempfile.mkdtemp(prefix="kompaktor-spark-")
            atexit.register(shutil.rmtree, local_dir, True)
        os.makedirs(local_dir, exist_ok=True)
        merged = dict(DEFAULT_CONF)
        java_opts = f"-Dlog4j2.configurationFile=file:{_log4j_file(local_dir)}"
        merged["spark.driver.extraJavaOptions"] = java_opts
        merged["spark.local.dir"] = local_dir
        merged.update(conf)
        if driver_memory:
            merged["spark.driver.memory"] = driver_memory
        builder = SparkSession.builder.master(master)
        for k, v in merged.items():
            builder = builder.config(k, v)
        session = builder.getOrCreate()
        session.sparkContext.setLogLevel("ERROR")
        _session, _settings = session, wanted
        return session


def _import_merge_modules(_it: Iterable[int]) -> list[int]:
    import kompaktor.engines.arrow  # noqa: F401  (pyarrow, numpy and the merge code)

    return [os.getpid()]


def warm_up(session: SparkSession) -> None:
    """Start the Python workers and import the merge code in them once, so that the first
    job does not pay for it (a compactor calls this before taking its first job)."""
    global _warm
    if _warm is session:
        return
    sc = session.sparkContext
    n = max(1, sc.defaultParallelism)
    sc.parallelize(range(n), n).mapPartitions(_import_merge_modules).collect()
    _warm = session


def stop_session() -> None:
    global _session, _settings
    with _lock:
        if _session is not None:
            _session.stop()
        _session, _settings = None, None
