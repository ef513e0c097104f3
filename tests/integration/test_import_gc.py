"""Staged files of a bulk import in progress are not garbage (issue 15 §6), against a real
redis-server: an import that runs longer than the collector's grace period keeps its files; an
import that died loses its protection once its record expires."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kompaktor.client import Client
from kompaktor.coordinator.gc import collect_garbage
from kompaktor.files.sortedfile import entries_to_table
from kompaktor.files.storage import Storage
from kompaktor.metadata.store import MetadataStore
from kompaktor.model.names import TMP_PREFIX, tmp_name
from tests.support.entries import entries
from tests.support.wait import poll

pytestmark = pytest.mark.redis

GRACE_S = 300.0


def source(path: Path, first: int, rows: int, group: int) -> str:
    rows_written = entries(range(first, first + rows), prefix="r", width=8, ts=1, value=lambda r: b"v" * 32)
    pq.write_table(entries_to_table(rows_written), path, row_group_size=group)
    return str(path)


def staged(storage: Storage) -> list[str]:
    return [rel for rel, _ in storage.list_files("tables") if TMP_PREFIX in rel]


def test_import_longer_than_the_grace_period_keeps_its_staged_files(
    client: Client, storage: Storage, tmp_path: Path
) -> None:
    """While a multi-file import is staging, its staged files are made older than the grace
    period and the collector runs: it deletes none of them, and the import completes with every
    row."""
    client.store.tables.create_table("t")
    srcs = [source(tmp_path / "s0.parquet", 0, 2_000, 2_000)]
    srcs += [source(tmp_path / f"s{k}.parquet", k * 200_000, 200_000, 2_000) for k in (1, 2)]  # slow to stage
    box: dict[str, object] = {}
    imp = threading.Thread(target=lambda: box.setdefault("files", client.import_files("t", srcs)))
    imp.start()
    poll(lambda: staged(storage) or not imp.is_alive(), "the import's first staged file", timeout=60, every=0.005)
    old = time.time() - 2 * GRACE_S
    during = staged(storage)
    for rel in during:
        os.utime(storage.path(rel), (old, old))
    deleted = collect_garbage(client.store, storage, GRACE_S)
    in_progress = imp.is_alive()
    imp.join(timeout=120)
    assert during and in_progress, "the collector did not run while the import was staging"
    assert deleted == []
    assert len(box["files"]) == 3
    assert sum(1 for _ in client.scan("t")) == 402_000


def test_a_dead_imports_files_are_collected_after_its_record_expires(store: MetadataStore, storage: Storage) -> None:
    tid = store.tables.create_table("t")
    final = f"tables/{tid}/I0000000001-0123456789abcdef.parquet"
    tmp = tmp_name(f"tables/{tid}/I0000000002-0123456789abcdef.parquet", "IMPdead")
    storage.ensure_dir(f"tables/{tid}")
    for rel in (final, tmp):
        Path(storage.path(rel)).write_bytes(b"x")
    store.files.register_import("IMPdead", tid, [final], ttl_s=60)
    assert collect_garbage(store, storage, 0) == []  # alive: protected whatever the files' age
    store.files.register_import("IMPdead", tid, [final], ttl_s=-1)  # its last sign of life was a while ago
    assert sorted(collect_garbage(store, storage, 0)) == sorted([final, tmp])
    assert store.files.imports_since(0) == (set(), set())  # and the record itself is gone
