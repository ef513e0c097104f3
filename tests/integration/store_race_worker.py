"""Code run in spawned processes by test_store.py's races (a plain module so that
multiprocessing's spawn start method can import it in the child)."""

from __future__ import annotations

import time


def running_doc(files: list[str], group: str = "g") -> dict:
    return {
        "kind": "SYSTEM",
        "files": files,
        "group": group,
        "priority": 1,
        "compactor": "c",
        "started": 0,
        "output": "out",
    }


def claim(url: str, tablet_ids: list[str], files: list[str], ecid: str, barrier) -> str:
    """Try once to register ``ecid`` on ``files`` in every tablet, in one mutation."""
    from kompaktor.metadata.store import MetadataStore, Mutation
    from kompaktor.model.errors import ConditionFailed

    store = MetadataStore.from_url(url)
    try:
        m = Mutation()
        for t in tablet_ids:
            m.tablet(t).require("files_present", files).require("files_free", files).do(
                "add_running", ecid, running_doc(files)
            )
        barrier.wait(timeout=60)
        try:
            store.mutate(m)
            return "won"
        except ConditionFailed as exc:
            return exc.condition
    finally:
        store.close()


def add_files_cas(url: str, tablet_id: str, prefix: str, count: int, barrier, deadline_s: float = 60) -> int:
    """Add ``count`` files one at a time, each with a compare-and-set on the tablet's version,
    retrying on conflict. Returns how many conflicts it saw."""
    from kompaktor.metadata.store import MetadataStore, Mutation
    from kompaktor.model.errors import ConditionFailed

    store = MetadataStore.from_url(url)
    conflicts = 0
    deadline = time.monotonic() + deadline_s
    try:
        barrier.wait(timeout=60)
        for i in range(count):
            while True:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{prefix}: gave up after {conflicts} conflicts")
                t = store.tables.tablet(tablet_id)
                m = Mutation()
                m.tablet(tablet_id).require("version", t.version).do(
                    "add_files", {f"{prefix}-{i}": {"size": 1, "entries": 1}}
                )
                try:
                    store.mutate(m)
                    break
                except ConditionFailed as exc:
                    assert exc.condition == "tablet unchanged", exc
                    conflicts += 1
        return conflicts
    finally:
        store.close()
