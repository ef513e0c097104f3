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
from kompaktor.keys import decode_row, encode_row
from kompaktor.sortedfile import PREFIXES, FileInfo
from kompaktor.storage import TMP_PREFIX, Storage
from kompaktor.store import ONLINE, MetadataStore, Mutation, RunningCompaction, Tablet, TabletChange, now_ms


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


def _settings_for(its: dict[str, Any] | None, props: dict[str, str], full: bool, now: int) -> IteratorSettings:
    its = its or {}
    row_start = its.get("row_start")
    row_end = its.get("row_end")
    return IteratorSettings(
        max_versions=max_versions(props), full=full, now_ms=now,
        ageoff_ttl_ms=its.get("ageoff_ttl_ms"), row_regex=its.get("row_regex"),
        row_start=None if row_start is None else bytes.fromhex(row_start),
        row_end=None if row_end is None else bytes.fromhex(row_end))


def output_naming(table_id: str) -> dict[str, str]:
    """How the reserve mutation names a compaction's output: the template (printf style, filled
    in by mutate.lua) with the full or partial prefix and a new file sequence number."""
    return {"template": f"tables/{table_id}/%s%010x.parquet", "full": PREFIXES["full"], "partial": PREFIXES["partial"]}


def _take_stale_selection(store: MetadataStore, job: Job, files: list[str], now: int, tc: TabletChange) -> None:
    """A SYSTEM job planned over a stale selection's files (PLANNER.md §5): it may take them, and
    clear the selection, only if the selection is still stale; else it is stale itself."""
    table_id = job.tablet.split(";", 1)[0]
    pipe = store.r.pipeline(transaction=False)
    pipe.get(C.tablet_key(job.tablet))
    pipe.hget(C.table_key(table_id), "props")
    raw_tablet, raw_props = store.call(pipe.execute)
    if raw_tablet is None:
        raise ConditionFailed("tablet exists", job.tablet)
    if raw_props is None:
        raise ConditionFailed("table exists", table_id)
    sel = Tablet.from_json(job.tablet, json.loads(raw_tablet)).selection
    if sel is None or not set(files) & set(sel.files):
        tc.require("files_not_selected", files)
    elif sel.stale(json.loads(raw_props), now):
        tc.require("selection_is", sel.id).do("clear_selection")
    else:
        raise ConditionFailed("files not selected", f"{job.tablet} selection {sel.id}")


def try_reserve(store: MetadataStore, job: Job, compactor: str, group: str) -> Reservation:
    """Register a new ECID for ``job`` or raise :class:`ConditionFailed` (the job is stale).

    One conditional mutation, without reading the tablet first: it checks the job against the
    tablet, allocates the output name, decides whether the compaction is full (its files are all
    the tablet's files) and returns that with the tablet's range and the table's properties."""
    its: dict[str, Any] | None = None
    if job.kind == "USER":
        its = user_iterators(store, job.selection) if job.selection is not None else None
        if its is None:
            raise ConditionFailed("user compaction exists", f"{job.selection} was cancelled or finished")
    table_id = job.tablet.split(";", 1)[0]
    files = sorted(job.files, key=file_order_key)
    ecid = new_ecid()
    now = now_ms()
    # the output is chosen by the mutation (output_naming)
    rc = RunningCompaction(ecid, job.kind, tuple(files), group, job.priority, compactor, job.selection, now, "")
    m = Mutation(table=table_id, table_reads=["props"]).require_table(ONLINE)
    tc = m.tablet(job.tablet).require("no_op").require("files_present", files).require("files_free", files)
    if job.kind == "SYSTEM":
        tc.require("no_hold")
        if job.overlaps:
            _take_stale_selection(store, job, files, now, tc)
        else:
            tc.require("files_not_selected", files)
    else:
        tc.require("selection_is", job.selection).require("files_in_selection", files)
    tc.do("add_running", ecid, rc.to_json(), output_naming(table_id))
    out = store.apply(m)
    got = out["reserved"][job.tablet]
    full = bool(got["full"])
    try:
        settings = _settings_for(its, json.loads(out["table"]["props"]), full, now)
    except Exception:
        remove_running(store, job.tablet, ecid)  # e.g. a bad table property: leave no ECID behind
        raise
    return Reservation(ecid, job, table_id, decode_row(got["prev"]), decode_row(got["end"]), tuple(files),
                       got["output"], full, settings, compactor)


def reserve(store: MetadataStore, queues: JobQueues, group: str, compactor: str) -> Reservation | None:
    """Poll ``group``'s queue until a job reserves (returned) or the queue is empty (None)."""
    while True:
        job = queues.poll(group)
        if job is None:
            return None
        try:
            return try_reserve(store, job, compactor, group)
        except ConditionFailed:
            store.incr("stale_jobs_discarded")


def heartbeat(store: MetadataStore, res: Reservation, progress: dict[str, Any]) -> None:
    fields = {"compactor": res.compactor, "updated": time.time(), **progress}
    store.r.hset(C.heartbeat_key(res.ecid), mapping={k: str(v) for k, v in fields.items()})


def last_heartbeat(store: MetadataStore, ecid: str) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in store.r.hgetall(C.heartbeat_key(ecid)).items()}


def commit(store: MetadataStore, res: Reservation, info: FileInfo) -> None:
    """Atomically replace the inputs with the output; raise ConditionFailed if anything changed
    that the compaction depended on (the caller then deletes the output)."""
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
    tc.do("remove_running", res.ecid).do("drop_heartbeat", res.ecid).do("count_commit", res.job.group)
    if res.job.kind != "SYSTEM":  # the selection shrinks, or is complete (mutate.lua decides)
        tc.require("selection_is", res.job.selection).do(
            "selection_done", list(res.inputs), output, res.job.selection if res.job.kind == "USER" else None)
    store.mutate(m)


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
