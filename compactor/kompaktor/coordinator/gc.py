"""Garbage collection of data files: what no tablet references and no running compaction will
write, once older than a grace period; and temporary outputs of compactions no longer running."""

from __future__ import annotations

import time

from kompaktor.files.storage import Storage
from kompaktor.metadata.compactions import running_compactions
from kompaktor.metadata.store import MetadataStore
from kompaktor.model.names import TABLES_DIR, tmp_tag


def collect_garbage(store: MetadataStore, storage: Storage, grace_s: float) -> list[str]:
    """Delete unreferenced files older than ``grace_s``; returns what was deleted."""
    running = running_compactions(store)
    referenced: set[str] = set()
    for t in store.iter_all_tablets():
        referenced.update(t.files)
    for _tid, rc in running.values():
        if rc is not None:
            referenced.add(rc.output)
    now = time.time()
    deleted = []
    for rel, mtime in storage.list_files(TABLES_DIR):
        if now - mtime < grace_s:
            continue
        tag = tmp_tag(rel)
        if tag is not None:
            if tag in running:
                continue
        elif rel in referenced:
            continue
        if storage.delete(rel):
            deleted.append(rel)
    if deleted:
        store.incr("gc_deleted", len(deleted))
    return deleted
