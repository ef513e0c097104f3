"""A compactor-side Spark driver in its own process, for the cluster tests (issue 17 §2).

The test process already holds a ``local[2]`` SparkSession (one per process), so the driver of
the standalone cluster runs here: it creates its engine the way a compactor does
(:func:`kompaktor.engines.make_engine` with a group's master, conf and driver memory) and
answers JSON commands, one per line on stdin, with JSON lines on the original stdout (Spark's
own output goes to stderr):

- ``{"op": "merge", "id", "storage", "inputs", "output", "cancel_after_parts"}``: starts a merge
  in a thread; later ``{"event": "done", "id", "entries_written"}`` or ``{"event": "done", "id",
  "error": <str>, "type": <class name>}``
- ``{"op": "stages"}``: the session's active stages from its status tracker
- ``{"op": "executors"}``: executors registered with the driver (without the driver)
- ``{"op": "tasks", "group"}``: every task attempt of the app's finished stages from the
  driver's REST API (executor id, index, attempt, status)
- ``{"op": "conf"}``: the session's SparkConf
- ``{"op": "roundtrip", "redis", "storage", "table", "entries"}``: the entries (row, cf, cq, vis,
  value as hex; ts; deleted) written to the table with ``kompaktor.spark.write`` from a DataFrame
  spread over 4 partitions, then the table read back with the ``kompaktor`` source; ``{"event":
  "roundtrip", "rows": [...]}`` (the read's rows, in the same form) or ``{"event": "roundtrip",
  "error", "type"}``
- ``{"op": "quit"}``
"""

from __future__ import annotations

import json
import os
import sys
import threading
import urllib.request

OUT = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)  # everything else (JVM, py4j) to stderr
_lock = threading.Lock()


def emit(obj: dict) -> None:
    with _lock:
        OUT.write(json.dumps(obj) + "\n")


def main() -> None:
    setup = json.loads(sys.argv[1])
    from kompaktor.engines import make_engine
    from kompaktor.engines.api import MergeRequest
    from kompaktor.files.storage import Storage
    from kompaktor.model.iterators import IteratorSettings

    conf = dict(setup.get("conf", {}))
    conf.setdefault("spark.ui.enabled", "true")  # the REST API of task attempts
    conf.setdefault("spark.ui.port", "0")
    try:
        eng = make_engine(
            "spark", spark_master=setup["master"], spark_conf=conf, driver_memory=setup.get("driver_memory")
        )
    except Exception as exc:
        emit({"event": "failed", "error": str(exc), "type": type(exc).__name__})
        return
    eng.task_entries = setup.get("task_entries")
    if "no_executor_timeout" in setup:
        eng.no_executor_timeout = setup["no_executor_timeout"]
    sc = eng.sc
    emit({"event": "ready", "app": sc.applicationId, "ui": sc.uiWebUrl})

    def merge(cmd: dict) -> None:
        cancel = threading.Event()
        k = cmd.get("cancel_after_parts")

        def progress(p: dict) -> None:
            if k is not None and p["parts_done"] >= k:
                cancel.set()

        storage = Storage.from_uri(cmd["storage"])
        req = MergeRequest(
            tuple(cmd["inputs"]),
            cmd["output"],
            None,
            None,
            IteratorSettings(max_versions=1, full=True),
            cmd.get("tag", "ECID-C"),
        )
        try:
            res = eng.merge(storage, req, progress=progress, cancel=cancel)
            emit({"event": "done", "id": cmd["id"], "entries_written": res.entries_written})
        except BaseException as exc:
            emit({"event": "done", "id": cmd["id"], "error": str(exc), "type": type(exc).__name__})

    def roundtrip(cmd: dict) -> None:
        from pyspark.sql import SparkSession

        import kompaktor.spark as kspark

        spark = SparkSession.builder.getOrCreate()  # the engine's session
        conn = {"redis": cmd["redis"], "storage": cmd["storage"]}
        data = [(*(bytes.fromhex(x) for x in e[:4]), e[4], e[5], bytes.fromhex(e[6])) for e in cmd["entries"]]
        schema = "row binary, cf binary, cq binary, vis binary, ts bigint, deleted boolean, value binary"
        try:
            kspark.write(spark.createDataFrame(data, schema).repartition(4), cmd["table"], **conn)
            got = kspark.read(spark, cmd["table"], **conn).collect()
        except Exception as exc:
            emit({"event": "roundtrip", "error": str(exc), "type": type(exc).__name__})
            return
        rows = [
            [bytes(r[c]).hex() for c in ("row", "cf", "cq", "vis")] + [r.ts, r.deleted, bytes(r.value).hex()]
            for r in got
        ]
        emit({"event": "roundtrip", "rows": rows})

    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "roundtrip":
            roundtrip(cmd)
        elif op == "merge":
            threading.Thread(target=merge, args=(cmd,), daemon=True).start()
        elif op == "stages":
            tr = sc.statusTracker()
            stages = []
            for sid in tr.getActiveStageIds():
                st = tr.getStageInfo(sid)
                if st is not None:
                    stages.append(
                        {
                            "stage": sid,
                            "total": st.numTasks,
                            "active": st.numActiveTasks,
                            "completed": st.numCompletedTasks,
                            "failed": st.numFailedTasks,
                        }
                    )
            emit({"event": "stages", "stages": stages})
        elif op == "executors":
            emit({"event": "executors", "n": eng.executors()})
        elif op == "tasks":
            url = f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}/stages?details=true"
            with urllib.request.urlopen(url, timeout=120) as r:  # slow on a loaded machine
                data = json.load(r)
            tasks = []
            for st in data:
                for t in (st.get("tasks") or {}).values():
                    tasks.append(
                        {
                            "stage": st["stageId"],
                            "stage_status": st["status"],
                            "index": t["index"],
                            "attempt": t["attempt"],
                            "executor": t["executorId"],
                            "status": t["status"],
                            "name": st.get("name", ""),
                        }
                    )
            emit({"event": "tasks", "tasks": tasks})
        elif op == "conf":
            emit({"event": "conf", "conf": dict(sc.getConf().getAll())})
        elif op == "quit":
            break
    from kompaktor.engines.session import stop_session

    stop_session()


if __name__ == "__main__":
    main()
