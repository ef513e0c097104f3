"""The life of one external compaction in the metadata: reserve, heartbeat, commit, release.

* **reserve** polls the group's queue and registers an ECID with the job's files in the
  tablet's metadata by a conditional mutation (docs/planner.md §6.4), skipping stale jobs until one
  reserves or the queue is empty — the poll and the mutation in one script call
  (``lua/reserve.lua``) for the kinds in :data:`FOLDED_KINDS`. No job is ever reserved twice: a
  file can be in only one running compaction, and the check and the registration are one atomic
  step.
* **commit** replaces the inputs by the output only if the inputs are still the tablet's files,
  the ECID is still registered and the table is ONLINE (docs/architecture.md invariant 2). A full
  compaction (it dropped delete markers) also raises the tablet's delete horizon, and is refused
  when a file added since it reserved holds a put its markers may hide.
* **release** (failure, cancellation, drain, dead compaction) removes the ECID and the outputs.
"""

from __future__ import annotations

import functools
import json
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from kompaktor.files.storage import Storage
from kompaktor.metadata.store import MetadataStore, Mutation, MutationOutcome, TabletChange
from kompaktor.model.errors import ConditionFailed
from kompaktor.model.iterators import IteratorOptions, IteratorSettings
from kompaktor.model.job import Job
from kompaktor.model.keys import decode_row, encode_row
from kompaktor.model.names import ecid_nonce, file_order_key, output_template, tmp_name
from kompaktor.model.resume import job_fingerprint
from kompaktor.model.tablet import ONLINE, FileInfo, FileMeta, RunningCompaction, Tablet, now_ms, ts_token
from kompaktor.policy.tableprops import max_versions, selection_expiry_ms
from kompaktor.queues.jobqueue import JobQueues

log = logging.getLogger(__name__)


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
    #: the secret that proves a compactor holds this reservation (the coordinator's broker gives
    #: it to the compactor it reserved for, :mod:`kompaktor.coordinator.broker`); empty when the
    #: compactor reserved through the store itself
    cap: str = ""
    #: when the job's tablet was first queued (epoch ms; a re-plan keeps it), if the queue said
    queued_ms: int | None = None

    @property
    def tablet(self) -> str:
        return self.job.tablet

    @property
    def fingerprint(self) -> str:
        """What the merged output depends on (:func:`~kompaktor.model.resume.job_fingerprint`):
        the key of a resumable merge's progress record."""
        job = self.job
        return job_fingerprint(self.tablet, self.prev, self.end, job.files, job.kind, job.selection, self.settings)

    def to_json(self) -> dict[str, Any]:
        """The reservation as JSON (without :attr:`cap`)."""
        st = self.settings
        return {
            "ecid": self.ecid,
            "job": self.job.to_json(),
            "table": self.table,
            "prev": encode_row(self.prev),
            "end": encode_row(self.end),
            "inputs": list(self.inputs),
            "output": self.output,
            "full": self.full,
            "compactor": self.compactor,
            "queued_ms": self.queued_ms,
            "settings": {
                "max_versions": st.max_versions,
                "full": st.full,
                "ageoff_ttl_ms": st.ageoff_ttl_ms,
                "now_ms": st.now_ms,
                "row_regex": st.row_regex,
                "row_start": encode_row(st.row_start),
                "row_end": encode_row(st.row_end),
            },
        }

    @classmethod
    def from_json(cls, d: dict[str, Any], cap: str = "") -> Reservation:
        st = d["settings"]
        settings = IteratorSettings(
            max_versions=int(st["max_versions"]),
            full=bool(st["full"]),
            ageoff_ttl_ms=st["ageoff_ttl_ms"],
            now_ms=int(st["now_ms"]),
            row_regex=st["row_regex"],
            row_start=decode_row(st["row_start"]),
            row_end=decode_row(st["row_end"]),
        )
        return cls(
            str(d["ecid"]),
            Job.from_json(d["job"]),
            str(d["table"]),
            decode_row(d["prev"]),
            decode_row(d["end"]),
            tuple(d["inputs"]),
            str(d["output"]),
            bool(d["full"]),
            settings,
            str(d["compactor"]),
            cap,
            d.get("queued_ms"),
        )

    def tmp_path(self) -> str:
        return tmp_name(self.output, self.ecid)


def new_ecid() -> str:
    return f"ECID-{uuid.uuid4().hex[:16]}"


def user_iterators(store: MetadataStore, cid: str) -> IteratorOptions | None:
    """A user compaction's iterator options, or None when it no longer exists / was cancelled."""
    rec = store.ucomps.user_compaction(cid)
    if rec is None or rec[0].get("state") != "RUNNING":
        return None
    its: IteratorOptions = json.loads(rec[0].get("iterators", "{}"))
    return its


def _settings_for(its: IteratorOptions | None, props: dict[str, str], full: bool, now: int) -> IteratorSettings:
    its = its or {}
    row_start = its.get("row_start")
    row_end = its.get("row_end")
    return IteratorSettings(
        max_versions=max_versions(props),
        full=full,
        now_ms=now,
        ageoff_ttl_ms=its.get("ageoff_ttl_ms"),
        row_regex=its.get("row_regex"),
        row_start=None if row_start is None else bytes.fromhex(row_start),
        row_end=None if row_end is None else bytes.fromhex(row_end),
    )


def _take_stale_selection(store: MetadataStore, job: Job, files: list[str], now: int, tc: TabletChange) -> None:
    """A SYSTEM job planned over a stale selection's files (docs/planner.md §5): it may take them, and
    clear the selection, only if the selection is still stale; else it is stale itself."""
    table_id = job.tablet.split(";", 1)[0]
    tablet, props = store.tables.tablet_and_props(job.tablet, table_id)
    if tablet is None:
        raise ConditionFailed("tablet exists", job.tablet)
    if props is None:
        raise ConditionFailed("table exists", table_id)
    sel = tablet.selection
    if sel is None or not set(files) & set(sel.files):
        tc.require("files_not_selected", files)
    elif sel.stale(selection_expiry_ms(props), now):
        tc.require("selection_is", sel.id).do("clear_selection")
    else:
        raise ConditionFailed("files not selected", f"{job.tablet} selection {sel.id}")


def _reserve_mutation(
    kind: str,
    tablet: str,
    table_id: str,
    files: Any,
    selection: Any,
    priority: Any,
    ecid: str,
    compactor: str,
    group: str,
    now: int,
    overlaps: bool = False,
) -> tuple[Mutation, TabletChange]:
    """The reserving mutation of a job (docs/planner.md §6.4): the one home of its conditions, for
    :func:`try_reserve` and for the templates of the folded poll-and-reserve (:func:`reserve`,
    where ``tablet``, ``table_id``, ``files``, ``selection`` and ``priority`` are placeholders
    ``lua/reserve.lua`` fills with the job's). A SYSTEM job flagged ``overlaps`` still needs the
    stale-selection check (:func:`_take_stale_selection`)."""
    # the output is chosen by the mutation (output_naming)
    rc = RunningCompaction(ecid, kind, (), group, priority, compactor, selection, now, "")
    record = {**rc.to_json(), "files": files}
    m = Mutation(table=table_id, table_reads=["props"]).require_table(ONLINE)
    tc = m.tablet(tablet).require("no_op").require("files_present", files).require("files_free", files)
    if kind == "SYSTEM":
        tc.require("no_hold")
        if not overlaps:
            tc.require("files_not_selected", files)
    else:
        tc.require("selection_is", selection).require("files_in_selection", files)
    tc.do("add_running", ecid, record, output_template(table_id, ecid_nonce(ecid)))
    return m, tc


def try_reserve(
    store: MetadataStore, job: Job, compactor: str, group: str, queued_ms: int | None = None
) -> Reservation:
    """Register a new ECID for ``job`` or raise :class:`ConditionFailed` (the job is stale).

    One conditional mutation, without reading the tablet first: it checks the job against the
    tablet, allocates the output name, decides whether the compaction is full (its files are all
    the tablet's files) and returns that with the tablet's range and the table's properties."""
    its: IteratorOptions | None = None
    if job.kind == "USER":
        its = user_iterators(store, job.selection) if job.selection is not None else None
        if its is None:
            raise ConditionFailed("user compaction exists", f"{job.selection} was cancelled or finished")
    table_id = job.tablet.split(";", 1)[0]
    files = sorted(job.files, key=file_order_key)
    ecid = new_ecid()
    now = now_ms()
    m, tc = _reserve_mutation(
        job.kind,
        job.tablet,
        table_id,
        tuple(files),
        job.selection,
        job.priority,
        ecid,
        compactor,
        group,
        now,
        job.overlaps,
    )
    if job.kind == "SYSTEM" and job.overlaps:
        _take_stale_selection(store, job, files, now, tc)
    return _reservation(store, job, ecid, compactor, its, now, store.apply(m), queued_ms)


def _reservation(
    store: MetadataStore,
    job: Job,
    ecid: str,
    compactor: str,
    its: IteratorOptions | None,
    now: int,
    out: MutationOutcome,
    queued_ms: int | None = None,
) -> Reservation:
    """The :class:`Reservation` a reserving mutation's outcome ``out`` describes."""
    got = out["reserved"][job.tablet]
    full = bool(got["full"])
    try:
        settings = _settings_for(its, json.loads(out["table"]["props"]), full, now)
    except Exception:
        remove_running(store, job.tablet, ecid)  # e.g. a bad table property: leave no ECID behind
        raise
    return Reservation(
        ecid,
        job,
        job.tablet.split(";", 1)[0],
        decode_row(got["prev"]),
        decode_row(got["end"]),
        tuple(sorted(job.files, key=file_order_key)),
        got["output"],
        full,
        settings,
        compactor,
        queued_ms=queued_ms,
    )


#: the job kinds the folded poll-and-reserve reserves inside Redis (:func:`reserve`); the others —
#: USER jobs (they need the user compaction's iterators) and SYSTEM jobs flagged overlaps-selection
#: (the stale-selection check reads the tablet first) — come back popped, and are reserved here
FOLDED_KINDS = ("SYSTEM", "SELECTOR")


#: the ECID the templates are built with, then replaced by placeholders (:func:`_templates`)
_TEMPLATE_ECID = "ECID-" + "0" * 16
_TEMPLATE_NONCE = ecid_nonce(_TEMPLATE_ECID)


@functools.lru_cache(maxsize=256)
def _templates(compactor: str, group: str) -> Mapping[str, str]:
    """The reserving mutation of each folded kind, with placeholders for the job's values and the
    call's ECID and time (filled by ``lua/reserve.lua``): the same text for every call of one
    compactor for one group, so Redis decodes each template once (the library keeps it)."""
    out = {}
    for kind in FOLDED_KINDS:
        m, _ = _reserve_mutation(
            kind, "@tablet@", "@tid@", "@files@", "@selection@", "@priority@", _TEMPLATE_ECID, compactor, group, 0
        )
        m.table = "@table@"  # the table id; @tid@ inside the output's name
        spec = json.loads(m.to_json())
        spec["now"] = "@now@"
        for t in spec["tablets"]:
            for op in t["ops"]:
                if op[0] == "add_running":
                    op[1] = "@ecid@"
                    op[2]["started"] = "@now@"
                    op[3]["template"] = op[3]["template"].replace(f"-{_TEMPLATE_NONCE}.", "-@nonce@.")
        out[kind] = json.dumps(spec, separators=(",", ":"))
    return MappingProxyType(out)


def reserve(store: MetadataStore, queues: JobQueues, group: str, compactor: str) -> Reservation | None:
    """Poll ``group``'s queue until a job reserves (returned) or the queue is empty (None).

    One script call polls and reserves (:meth:`MetadataStore.reserve_next`; the queues must be the
    store's Redis), discarding stale jobs inside Redis; a job of a kind it does not reserve
    (not in :data:`FOLDED_KINDS`) is reserved here by :func:`try_reserve`."""
    while True:
        ecid = new_ecid()
        now = now_ms()
        out = store.reserve_next(group, ecid, now, _templates(compactor, group))
        if out.get("more"):
            continue
        raw = out.get("job")
        if raw is None:
            return None
        job = Job.from_json(raw)
        res = out.get("res")
        if res is not None:
            return _reservation(store, job, ecid, compactor, None, now, res, out.get("queued"))
        try:
            return try_reserve(store, job, compactor, group, out.get("queued"))
        except ConditionFailed:
            store.bookkeeping.incr("stale_jobs_discarded")


def heartbeat(store: MetadataStore, res: Reservation, progress: Mapping[str, object]) -> None:
    store.running.put_heartbeat(res.ecid, {"compactor": res.compactor, "updated": time.time(), **progress})


def commit(store: MetadataStore, res: Reservation, info: FileInfo | FileMeta) -> None:
    """Atomically replace the inputs with the output (``info``: what its writer, or a read of its
    footer, says of it); raise ConditionFailed if anything changed that the compaction depended on
    (the caller then deletes the output)."""
    meta = info if isinstance(info, FileMeta) else info.meta
    m = Mutation(table=res.table).require_table(ONLINE)
    # the ECID still registered and its files (the inputs, recorded when it reserved) all present
    tc = m.tablet(res.tablet).require("ecid_inputs_present", res.ecid)
    tc.require("range", encode_row(res.prev))
    # files registered before timestamp bounds were: their delete markers count as this old
    unknown = ts_token(now_ms())
    if res.full:  # it dropped delete markers: none may hide a put of a file added since it reserved
        tc.require("hides_nothing", res.ecid, unknown)
    output = res.output if meta.entries > 0 else None
    # the inputs out, the output in (its timestamp bounds from the inputs'), the delete horizon up
    tc.do("compacted", res.ecid, output, meta.to_json() if output else None, res.full, unknown)
    tc.do("remove_running", res.ecid).do("drop_heartbeat", res.ecid).do("count_commit", res.job.group, res.ecid)
    if res.job.kind != "SYSTEM":  # the selection shrinks, or is complete (mutate.lua decides)
        tc.require("selection_is", res.job.selection).do(
            "selection_done", list(res.inputs), output, res.job.selection if res.job.kind == "USER" else None
        )
    store.mutate(m)


def release(store: MetadataStore, storage: Storage, res: Reservation) -> bool:
    """Undo a reservation: remove the ECID (if still registered) and any output. Returns whether
    the ECID was still registered."""
    removed = release_metadata(store, res)
    delete_outputs(storage, res.output, res.ecid)
    return removed


def release_metadata(store: MetadataStore, res: Reservation) -> bool:
    """The metadata half of :func:`release`: the ECID and its heartbeat gone, the tablet to plan
    again. Returns whether the ECID was still registered."""
    removed = remove_running(store, res.tablet, res.ecid)
    store.running.drop_heartbeat(res.ecid)
    store.bookkeeping.mark_dirty([res.tablet])
    return removed


def remove_running(store: MetadataStore, tablet_id: str, ecid: str) -> bool:
    m = Mutation()
    m.tablet(tablet_id).require("ecid", ecid).do("remove_running", ecid)
    try:
        store.mutate(m)
        return True
    except ConditionFailed:
        store.running.forget_running(ecid)  # index entry of a tablet that is gone
        return False


def delete_outputs(storage: Storage, output: str, ecid: str) -> None:
    """Remove what a compaction may have written. A store that cannot be reached leaves them:
    unreferenced, under the ECID's names, the garbage collector removes them after its grace."""
    for rel in (tmp_name(output, ecid), output):
        try:
            storage.delete(rel)
        except OSError as exc:
            log.warning("%s: left for the garbage collector (storage: %s)", rel, " ".join(str(exc).split()))


def running_compactions(store: MetadataStore) -> dict[str, tuple[str, RunningCompaction | None]]:
    """ECID -> (tablet id, its record or None when the index is stale)."""
    idx = store.running.running_index()
    tablets = {t.id: t for t in store.tables.get_tablets(sorted(set(idx.values())))}
    out: dict[str, tuple[str, RunningCompaction | None]] = {}
    for ecid, tid in idx.items():
        t: Tablet | None = tablets.get(tid)
        out[ecid] = (tid, t.running.get(ecid) if t else None)
    return out
