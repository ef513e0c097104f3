"""The life of one external compaction in the metadata: reserve, heartbeat, commit, release.

* **reserve** polls the group's queue and registers an ECID with the job's files in the
  tablet's metadata by a conditional mutation (PLANNER.md §6.4), skipping stale jobs until one
  reserves or the queue is empty. No job is ever reserved twice: a file can be in only one
  running compaction, and the check and the registration are one atomic step.
* **commit** replaces the inputs by the output only if the inputs are still the tablet's files,
  the ECID is still registered and the table is ONLINE (DESIGN.md invariant 2).
* **release** (failure, cancellation, drain, dead compaction) removes the ECID and the outputs.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from kompaktor import contract as C
from kompaktor.client import file_order_key, max_versions
from kompaktor.errors import ConditionFailed
from kompaktor.iterators import IteratorSettings
from kompaktor.jobqueue import Job, JobQueues
from kompaktor.keys import encode_row
from kompaktor.sortedfile import PREFIXES, FileInfo
from kompaktor.storage import TMP_PREFIX, Storage
from kompaktor.store import ONLINE, MetadataStore, Mutation, RunningCompaction, TableInfo, Tablet, now_ms


@dataclass(frozen=True)
class Reservation:
    """Everything a compactor needs to run and commit one reserved job."""

    ecid: str
    job: Job
    table: str  # table id
    prev: bytes | None
    end: bytes | None
    inputs: tuple[str, ...]  # oldest first
    output: str
    full: bool
    settings: IteratorSettings
    compactor: str

    @property
    def tablet(self) -> str:
        return self.job.tablet

    def tmp_path(self) -> str:
        d, name = self.output.rsplit("/", 1)
        return f"{d}/{TMP_PREFIX}{self.ecid}_{name}"


def fingerprint(tablet: str, files: list[str] | tuple[str, ...]) -> str:
    """Identity of a job for failure counting: same tablet and same files."""
    return hashlib.sha1(json.dumps([tablet, sorted(files)]).encode()).hexdigest()[:16]


def new_ecid() -> str:
    return f"ECID-{uuid.uuid4().hex[:16]}"


def user_iterators(store: MetadataStore, cid: str) -> dict[str, Any] | None:
    """A user compaction's iterator options, or None when it no longer exists / was cancelled."""
    h = store.r.hgetall(C.ucomp_key(cid))
    if not h or h.get(b"state", b"").decode() not in ("RUNNING",):
        return None
    return json.loads(h.get(b"iterators", b"{}"))


def _settings_for(store: MetadataStore, job: Job, props: dict[str, str], full: bool, now: int) -> IteratorSettings:
    its: dict[str, Any] = {}
    if job.kind == "USER" and job.selection:
        its = user_iterators(store, job.selection) or {}
    row_start = its.get("row_start")
    row_end = its.get("row_end")
    return IteratorSettings(
        max_versions=max_versions(props), full=full, now_ms=now,
        ageoff_ttl_ms=its.get("ageoff_ttl_ms"), row_regex=its.get("row_regex"),
        row_start=None if row_start is None else bytes.fromhex(row_start),
        row_end=None if row_end is None else bytes.fromhex(row_end))


def try_reserve(store: MetadataStore, job: Job, compactor: str, group: str) -> Reservation:
    """Register a new ECID for ``job`` or raise :class:`ConditionFailed` (the job is stale)."""
    if job.kind == "USER" and (job.selection is None or user_iterators(store, job.selection) is None):
        raise ConditionFailed("user compaction exists", f"{job.selection} was cancelled or finished")
    # One round trip for the tablet, its table and a file sequence number (the table id is the
    # tablet id's prefix); the conditional mutation below re-checks everything that matters.
    table_id = job.tablet.split(";", 1)[0]
    pipe = store.r.pipeline(transaction=False)
    pipe.get(C.tablet_key(job.tablet))
    pipe.hgetall(C.table_key(table_id))
    pipe.hincrby(C.SEQ, "file", 1)
    raw_tablet, raw_table, seq = store.call(pipe.execute)
    if raw_tablet is None:
        raise ConditionFailed("tablet exists", job.tablet)
    t = Tablet.from_json(job.tablet, json.loads(raw_tablet))
    if not raw_table:
        raise ConditionFailed("table exists", t.table)
    info = TableInfo(t.table, raw_table[b"name"].decode(), raw_table[b"state"].decode(),
                     json.loads(raw_table[b"props"]))
    files = sorted(job.files, key=file_order_key)
    full = set(files) == set(t.files)
    ecid = new_ecid()
    output = f"tables/{t.table}/{PREFIXES['full' if full else 'partial']}{int(seq):010x}.parquet"
    now = now_ms()
    settings = _settings_for(store, job, info.props, full, now)
    rc = RunningCompaction(ecid, job.kind, tuple(files), group, job.priority, compactor, job.selection, now, output)
    m = Mutation(table=t.table).require_table(ONLINE)
    tc = m.tablet(t.id).require("no_op").require("files_present", files).require("files_free", files)
    tc.require("range", encode_row(t.prev))  # a split/merge since the read keeps the id, not the range
    if full:
        tc.require("files_exactly", files)
    if job.kind == "SYSTEM":
        tc.require("no_hold")
        sel = t.selection
        if sel is not None and set(files) & set(sel.files):
            if job.overlaps and sel.stale(info.props, now):
                tc.require("selection_is", sel.id).do("clear_selection")
            else:
                raise ConditionFailed("files not selected", f"{job.tablet} selection {sel.id}")
        else:
            tc.require("files_not_selected", files)
    else:
        tc.require("selection_is", job.selection).require("files_in_selection", files)
    tc.do("add_running", ecid, rc.to_json())
    store.mutate(m)
    return Reservation(ecid, job, t.table, t.prev, t.end, tuple(files), output, full, settings, compactor)


def reserve(store: MetadataStore, queues: JobQueues, group: str, compactor: str) -> Reservation | None:
    """Poll ``group``'s queue until a job reserves (returned) or the queue is empty (None)."""
    while True:
        job = queues.poll(group)
        if job is None:
            return None
        try:
            return try_reserve(store, job, compactor, group)
        except ConditionFailed as exc:
            if exc.condition == "files unchanged":
                continue  # new files arrived: the tablet is dirty and will be re-planned
            store.incr("stale_jobs_discarded")
            continue


def heartbeat(store: MetadataStore, res: Reservation, progress: dict[str, Any]) -> None:
    fields = {"compactor": res.compactor, "updated": time.time(), **progress}
    store.r.hset(C.heartbeat_key(res.ecid), mapping={k: str(v) for k, v in fields.items()})


def last_heartbeat(store: MetadataStore, ecid: str) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in store.r.hgetall(C.heartbeat_key(ecid)).items()}


def commit(store: MetadataStore, res: Reservation, info: FileInfo) -> None:
    """Atomically replace the inputs with the output; raise ConditionFailed if anything changed
    that the compaction depended on (the caller then deletes the output)."""
    t = store.tablet(res.tablet) if res.job.kind != "SYSTEM" else None
    m = Mutation(table=res.table).require_table(ONLINE)
    tc = m.tablet(res.tablet).require("ecid", res.ecid).require("files_present", list(res.inputs))
    tc.require("range", encode_row(res.prev))
    tc.do("remove_files", list(res.inputs))
    output = None
    if info.entries > 0:
        output = res.output
        tc.do("add_files", {res.output: {"size": info.size, "entries": info.entries, "deletes": info.deletes,
                                        "first": info.first_row.hex() if info.first_row is not None else None,
                                        "last": info.last_row.hex() if info.last_row is not None else None}})
    tc.do("remove_running", res.ecid)
    if res.job.kind != "SYSTEM":
        tc.require("selection_is", res.job.selection)
        sel = t.selection if t is not None else None
        remaining = set(sel.files) if sel is not None else set()
        if remaining <= set(res.inputs):
            tc.do("clear_selection")
            if res.job.kind == "USER":
                tc.do("ucomp_done", res.job.selection)
        else:
            tc.do("selection_replace", list(res.inputs), output)
    store.mutate(m)
    pipe = store.r.pipeline(transaction=False)
    pipe.delete(C.heartbeat_key(res.ecid))
    pipe.hincrby(C.COUNTERS, "compactions_committed", 1)
    pipe.hincrby(C.COUNTERS, f"committed:{res.job.group}", 1)
    pipe.hincrby(C.COMMITS_BY_TABLET, res.tablet, 1)
    store.call(pipe.execute)


def release(store: MetadataStore, storage: Storage, res: Reservation, *, reason: str) -> bool:
    """Undo a reservation: remove the ECID (if still registered) and any output. Returns whether
    the ECID was still registered."""
    removed = remove_running(store, res.tablet, res.ecid)
    delete_outputs(storage, res.output, res.ecid)
    store.r.delete(C.heartbeat_key(res.ecid))
    store.mark_dirty([res.tablet])
    return removed


def remove_running(store: MetadataStore, tablet_id: str, ecid: str) -> bool:
    m = Mutation()
    m.tablet(tablet_id).require("ecid", ecid).do("remove_running", ecid)
    try:
        store.mutate(m)
        return True
    except ConditionFailed:
        store.r.hdel(C.RUNNING, ecid)  # index entry of a tablet that is gone
        return False


def delete_outputs(storage: Storage, output: str, ecid: str) -> None:
    d, name = output.rsplit("/", 1)
    storage.delete(f"{d}/{TMP_PREFIX}{ecid}_{name}")
    storage.delete(output)


def running_compactions(store: MetadataStore) -> dict[str, tuple[str, RunningCompaction | None]]:
    """ECID -> (tablet id, its record or None when the index is stale)."""
    idx = {k.decode(): v.decode() for k, v in store.r.hgetall(C.RUNNING).items()}
    tablets = {t.id: t for t in store.get_tablets(sorted(set(idx.values())))}
    out: dict[str, tuple[str, RunningCompaction | None]] = {}
    for ecid, tid in idx.items():
        t: Tablet | None = tablets.get(tid)
        out[ecid] = (tid, t.running.get(ecid) if t else None)
    return out
