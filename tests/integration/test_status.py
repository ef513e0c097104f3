"""`kompaktor status` with a real redis-server: a running resumable merge shows its progress
(parts done and reused, bytes not read again, bytes re-read, parts rejected) from its heartbeat;
with none running the output is what it always was."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kompaktor.coordinator import Coordinator
from kompaktor.files.storage import Storage
from kompaktor.metadata import compactions
from kompaktor.metadata.status import gather
from kompaktor.metadata.store import MetadataStore, Mutation
from kompaktor.model.tablet import FileMeta
from tests.support.coordinator import settings
from tests.support.procs import python_env

pytestmark = pytest.mark.redis

#: the keys `kompaktor status --json` has always had
KEYS = {"groups", "tables", "user_compactions", "dead_letters", "retries_pending", "counters"}


def two_running_merges(store: MetadataStore, storage: Storage) -> tuple[compactions.Reservation, ...]:
    """Table t in two tablets of four files each, a compaction reserved on each."""
    store.tables.create_table("t", splits=[b"m"])
    for i, tablet in enumerate(store.tables.tablet_ids(store.tables.table_id("t"))):
        m = Mutation(table=store.tables.table_id("t"))
        m.tablet(tablet).do("add_files", {f"t{i}f{k}": FileMeta(1000 * (i + 1), 10).to_json() for k in range(4)})
        store.mutate(m)
    coord = Coordinator(store, storage, settings())
    assert coord.tick()
    coord.plan_dirty()
    first = compactions.reserve(store, coord.queues, "default", "c-1")
    second = compactions.reserve(store, coord.queues, "default", "c-2")
    assert first is not None and second is not None
    return first, second


def status(redis_url: str, tmp_path: Path, *args: str) -> str:
    env = python_env(KOMPAKTOR_REDIS_URL=redis_url, KOMPAKTOR_STORAGE=str(tmp_path / "files"), COLUMNS="120")
    out = subprocess.run(
        [sys.executable, "-m", "kompaktor", "status", *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_a_running_resumable_merge_shows_its_progress(
    redis_url: str, store: MetadataStore, storage: Storage, tmp_path: Path
) -> None:
    plain, resumable = two_running_merges(store, storage)
    # what the compactors heartbeat: a plain merge's progress, and a resumable one's
    # (engines.ranges.progress_dict; the strings Redis holds)
    compactions.heartbeat(
        store,
        plain,
        {"entries_read": 5, "entries_written": 5, "bytes_read": 100, "bytes_written": 90, "parts_done": 1, "parts": 3},
    )
    before = gather(store)
    assert set(before) == KEYS  # no resumable merge yet: the document scripts read is unchanged
    before_json, before_text = status(redis_url, tmp_path, "--json"), status(redis_url, tmp_path)
    assert "resumable" not in before_json + before_text
    assert set(json.loads(before_json)) == KEYS

    compactions.heartbeat(
        store,
        resumable,
        {
            "entries_read": 20,
            "entries_written": 18,
            "bytes_read": 6000,
            "bytes_written": 700,
            "parts_done": 30,
            "parts": 40,
            "elapsed_s": 1.5,
            "parts_reused": 24,
            "entries_reused": 2400,
            "bytes_reused": 4096,
            "input_bytes_reread": 2048,
            "parts_rejected": 1,
        },
    )
    st = json.loads(status(redis_url, tmp_path, "--json"))
    assert set(st) == {*KEYS, "resumable_merges"}
    (merge,) = st["resumable_merges"]
    assert merge == {
        "ecid": resumable.ecid,
        "table": "t",
        "tablet": resumable.tablet,
        "group": "default",
        "compactor": "c-2",
        "input_bytes": sum(resumable.job.files.values()),
        "parts_done": 30,
        "parts": 40,
        "parts_reused": 24,
        "entries_reused": 2400,
        "bytes_reused": 4096,
        "input_bytes_reread": 2048,
        "parts_rejected": 1,
    }
    # everything else is as it was (only the heartbeat changed)
    assert {k: v for k, v in st.items() if k != "resumable_merges"} == json.loads(before_json)

    text = status(redis_url, tmp_path)
    assert text.startswith(before_text)  # the lines before are byte for byte the same
    added = " ".join(text.removeprefix(before_text).split())
    size = sum(resumable.job.files.values())
    assert added == (
        f"resumable merge {resumable.ecid} on t (group default, compactor c-2): 30/40 parts done, 24 reused "
        f"(4.0 KiB of input not read again), 1 rejected; input re-read 2.0 KiB of {size / 1024:.1f} KiB"
    )

    # the merge ends (committed, released or declared dead): its heartbeat goes, and so does its line
    compactions.release(store, storage, resumable)
    assert set(gather(store)) == KEYS
