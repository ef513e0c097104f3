"""Garbage collection of data files: what no tablet references and no running compaction will
write, once older than a grace period; and temporary outputs of compactions no longer running.
Files of bulk imports still in progress are left alone whatever their age, and so are the
parts of a resumable merge whose progress record is live (docs/architecture.md "Long merges resume",
:mod:`kompaktor.metadata.progress`): its job can still run and reuse them. Once the record is
pruned (the job changed: tablet split or gone, inputs compacted away, cancelled) or expired, its
parts are temporary files like any other, removed after the grace period.

Files that a retained backup references are spared, and while a backup is being taken nothing
is deleted (:mod:`kompaktor.metadata.backup`): every retained backup restores completely. Flushes
and imports written since the newest backup are spared too (until the next backup), so that
``kompaktor restore --adopt-newer`` finds every write acknowledged after it.

The decision is fenced: before each batch of deletions the collector records it in Redis with
the coordinator's fencing token (:meth:`store.files.record_gc
<kompaktor.metadata.store.files.FileStore.record_gc>`), and a coordinator that has been replaced is
refused there and deletes nothing more.

On an object store the listing is the expensive part (one LIST request per 1,000 objects). A pass
of the coordinator is therefore bounded: it lists table directories one after the other, from
where the previous pass stopped (:class:`GcCursor`), until it has listed ``max_objects``, and
keeps in memory only the references into the directories it listed. A one-shot collection (no
cursor) lists everything."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from kompaktor.files.storage import Storage
from kompaktor.metadata import backup, progress
from kompaktor.metadata.compactions import running_compactions
from kompaktor.metadata.store import MetadataStore
from kompaktor.model.names import TABLES_DIR, resume_fingerprint_prefix, resume_tag, tmp_tag

log = logging.getLogger("kompaktor.coordinator")

#: files deleted per fenced decision
GC_BATCH = 100
#: objects a coordinator's pass lists at most (it stops after the table directory crossing this)
GC_PASS_OBJECTS = 50_000


@dataclass
class GcCursor:
    """Where the coordinator's garbage collection resumes: after this table directory."""

    last: str = ""


def collect_garbage(
    store: MetadataStore,
    storage: Storage,
    grace_s: float,
    check: Callable[[], None] = lambda: None,
    cursor: GcCursor | None = None,
    max_objects: int = GC_PASS_OBJECTS,
) -> list[str]:
    """Delete unreferenced files older than ``grace_s``; returns what was deleted. ``check`` is
    called before each batch and may raise to stop (the coordinator's lease check). With a
    ``cursor``, list table directories from where it points until ``max_objects`` were listed,
    and move it; without, list them all."""
    started = time.time()
    running = running_compactions(store)
    live, _pruned = progress.prune(store)
    resumable = {resume_fingerprint_prefix(resume_tag(fp)) for fp in live}
    dirs = storage.list_dirs(TABLES_DIR)
    if cursor is not None:  # resume after the last directory handled, wrapping around
        dirs = [d for d in dirs if d > cursor.last] + [d for d in dirs if d <= cursor.last]
    listed: list[tuple[str, float]] = []
    for d in dirs:
        listed.extend(storage.list_files(f"{TABLES_DIR}/{d}"))
        if cursor is not None:
            cursor.last = d
            if len(listed) >= max_objects:
                break
    prefixes = tuple({rel.rsplit("/", 1)[0] + "/" for rel, _ in listed})
    referenced: set[str] = set()
    if prefixes:
        for t in store.tables.iter_all_tablets():
            referenced.update(f for f in t.files if f.startswith(prefixes))
    for _tid, rc in running.values():
        if rc is not None:
            referenced.add(rc.output)
    now = time.time()
    written = dict(listed)  # file -> when it was written (mtime)
    candidates = []
    for rel, mtime in listed:
        if now - mtime < grace_s:
            continue
        tag = tmp_tag(rel)
        if tag is not None:
            if tag in running:
                continue
            fp = resume_fingerprint_prefix(tag)
            if fp is not None and fp in resumable:
                continue  # a part of a job that can still resume
        elif rel in referenced:
            continue
        candidates.append(rel)
    deleted: list[str] = []
    if candidates:
        # a backup being taken may reference any of them: nothing this pass. Checked before the
        # backups' files are read, so a backup that ends in between is among them
        if store.files.backup_running():
            log.info("garbage collection waits: a backup is being taken")
            return deleted
        retained = backup.list_backups(storage)  # one LIST of backups/
        spared = backup.referenced_by_backups(storage, retained)
        since = backup.newer_than_backups(retained)
        candidates = [
            rel
            for rel in candidates
            if rel not in spared and not (since is not None and written[rel] >= since and backup.is_write(rel))
        ]
    for i in range(0, len(candidates), GC_BATCH):
        check()
        # imports in progress when this pass began, or since (one that registered its files
        # after the references were read is seen here; its record outlives it for a while)
        staged_tags, staged_files = store.files.imports_since(started)
        batch = [
            rel for rel in candidates[i : i + GC_BATCH] if rel not in staged_files and tmp_tag(rel) not in staged_tags
        ]
        if not batch:
            continue
        store.files.record_gc(len(batch))  # fenced: raises Fenced, nothing deleted, if replaced
        try:
            for rel in batch:
                if storage.delete(rel):
                    deleted.append(rel)
        except OSError as exc:  # the storage cannot delete now (read-only, unreachable): next pass
            log.warning("garbage collection stopped for this pass: %s", " ".join(str(exc).split()))
            return deleted
    store.files.forget_imports_before(started - grace_s)  # records of imports long gone (crashed)
    return deleted
