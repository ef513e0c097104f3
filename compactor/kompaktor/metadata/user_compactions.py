"""USER compactions over a table or row range (seed 001), in the metadata store.

Start: a record plus a *hold* on every tablet of the range; the hold stops new SYSTEM
compactions there. The coordinator selects each held tablet's files once none of its compactions
run (the selection remembers the compaction's id) and clears the hold; USER jobs then run over
the selected set until one file remains, and the commit marks the tablet done. Cancel removes the
holds and selections (running USER jobs then fail to commit and their compactors stop them).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypedDict, cast

from kompaktor.metadata.store import MetadataStore, Mutation
from kompaktor.model.errors import ConditionFailed, KompaktorError, UnknownTableError
from kompaktor.model.iterators import IteratorOptions, IteratorSettings
from kompaktor.model.keys import check_row_range, encode_row
from kompaktor.model.tablet import DELETED, ONLINE, Tablet, now_ms

RUNNING, SUCCEEDED, CANCELLED, FAILED = "RUNNING", "SUCCEEDED", "CANCELLED", "FAILED"
#: a finished user compaction's record is kept this long (status, `kompaktor compact --status`),
#: then forgotten: without a bound, every user compaction ever run stayed in Redis and every
#: coordinator pass read them all (found by the soak bench)
RETENTION_S = 7 * 86400


class UserCompactionRow(TypedDict):
    """A user compaction as the status shows it (``kompaktor status --json``'s ``user_compactions``)."""

    id: str
    table: str  # the table's name
    state: str
    tablets_done: int
    tablets_total: int
    message: str


@dataclass(frozen=True)
class UserCompaction:
    id: str
    table: str  # table id
    table_name: str
    state: str
    tablets: tuple[str, ...]
    done: int
    iterators: IteratorOptions
    created_ms: int
    message: str
    ended_ms: int | None = None  # when it left RUNNING

    @property
    def total(self) -> int:
        return len(self.tablets)

    def to_json(self) -> UserCompactionRow:
        return {
            "id": self.id,
            "table": self.table_name,
            "state": self.state,
            "tablets_done": self.done,
            "tablets_total": self.total,
            "message": self.message,
        }


def validate_iterators(its: Mapping[str, object]) -> IteratorOptions:
    """Check USER-compaction iterator options as given; returns them without the unset ones.
    Keys: ageoff_ttl_ms (int), row_regex (str), row_start / row_end (hex strings)."""
    allowed = {"ageoff_ttl_ms", "row_regex", "row_start", "row_end"}
    unknown = set(its) - allowed
    if unknown:
        raise ValueError(f"unknown iterator options {sorted(unknown)}; allowed: {sorted(allowed)}")
    _check_types(its)
    settings = IteratorSettings.from_json(dict(its))  # raises ValueError with a clear message
    lo, hi = settings.row_start, settings.row_end
    if lo is not None and hi is not None and lo >= hi:
        raise ValueError(
            f"empty row range to delete: {lo.decode(errors='replace')!r} is not before "
            f"{hi.decode(errors='replace')!r} (rows in [FROM, TO) are deleted)"
        )
    return cast(IteratorOptions, {k: v for k, v in its.items() if v is not None})


def _check_types(its: Mapping[str, object]) -> None:
    """Each option of the type it must have (an age-off an integer, the others strings; row
    bounds in hex), refused in one line otherwise."""
    ttl = its.get("ageoff_ttl_ms")
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int)):
        raise ValueError(f"iterator option ageoff_ttl_ms must be an integer (milliseconds), got {ttl!r}")
    for name in ("row_regex", "row_start", "row_end"):
        value = its.get(name)
        if value is not None and not isinstance(value, str):
            raise ValueError(f"iterator option {name} must be a string, got {value!r}")
    for name in ("row_start", "row_end"):
        value = its.get(name)
        if isinstance(value, str):
            try:
                bytes.fromhex(value)
            except ValueError:
                raise ValueError(f"iterator option {name} must be hex, got {value!r}") from None


#: how long an outside request id (a Compaction resource's uid) stays bound to its compaction
REQUEST_TTL_S = 30 * 86400


def start(
    store: MetadataStore,
    table: str,
    start_row: bytes | None = None,
    end_row: bytes | None = None,
    iterators: Mapping[str, object] | None = None,
    *,
    request_id: str | None = None,
) -> str:
    """Start a user compaction; returns its id. With ``request_id`` (e.g. a Compaction resource's
    uid) the start happens once per request: a replay, or a concurrent second start, returns the
    id of the first.

    The start is one atomic mutation: the record, its entry in the list the coordinator visits,
    the request binding and every tablet's hold are written together or not at all. A crash at
    any point therefore leaves either no compaction (the caller may simply retry) or one that the
    coordinator advances to its end."""
    check_row_range(start_row, end_row, "row range to compact")
    its = validate_iterators(iterators or {})
    if request_id is not None:
        known = store.ucomps.request_claimed(request_id)
        if known is not None:
            return known
    info = store.tables.table(table)
    if info.state != ONLINE:
        raise KompaktorError(f"table {table!r} is {info.state}; user compactions need it ONLINE")
    tablets = store.tables.tablets_in_range(info.id, start_row, end_row)
    cid = f"UC-{store.next_seq('ucomp'):06d}"  # a number taken by a start that then fails stays unused
    record = {
        "table": info.id,
        "table_name": table,
        "state": RUNNING,
        "iterators": json.dumps(its),
        "tablets": json.dumps([t.id for t in tablets]),
        "created": str(now_ms()),
        "message": "",
    }
    m = Mutation(table=info.id).require_table(ONLINE)
    if request_id is not None:
        m.table_conds.append(["request_free", request_id])
    m.table_ops.append(["ucomp_register", cid, record, request_id, REQUEST_TTL_S])
    for t in tablets:
        # still the same tablet (a split or merge since it was read changes its start)
        m.tablet(t.id).require("range", encode_row(t.prev)).require("no_op").require("no_hold").do("set_hold", cid)
    try:
        store.mutate(m)
    except ConditionFailed as exc:
        if exc.condition == "request free":  # a concurrent start of the same request won
            return exc.detail
        raise KompaktorError(f"cannot start a user compaction on {table!r}: {exc}") from exc
    return cid


def get(store: MetadataStore, cid: str) -> UserCompaction:
    rec = store.ucomps.user_compaction(cid)
    if rec is None:
        raise KompaktorError(f"unknown user compaction {cid!r}")
    h, done = rec
    return UserCompaction(
        cid,
        h["table"],
        h["table_name"],
        h["state"],
        tuple(json.loads(h["tablets"])),
        done,
        json.loads(h["iterators"]),
        int(h["created"]),
        h.get("message", ""),
        int(h["ended"]) if h.get("ended") else None,
    )


def all_compactions(store: MetadataStore) -> list[UserCompaction]:
    return [get(store, c) for c in store.ucomps.list_user_compactions()]


def set_state(store: MetadataStore, cid: str, state: str, message: str = "") -> None:
    store.ucomps.put_user_compaction(cid, {"state": state, "message": message, "ended": now_ms()})


def cancel(store: MetadataStore, cid: str, message: str = "cancelled") -> None:
    """Cancel: no new USER jobs; holds and selections removed; running jobs stop. The state
    changes first; if the caller dies before every hold is released, the coordinator's next pass
    (:func:`advance`) releases the rest."""
    uc = get(store, cid)
    if uc.state != RUNNING:
        return
    set_state(store, cid, CANCELLED, message)
    _release(store, get(store, cid))


def _release(store: MetadataStore, uc: UserCompaction) -> None:
    """Remove a cancelled compaction's holds and selections and its queued jobs; then mark it
    released (``released`` field)."""
    for tid in uc.tablets:
        t = store.tables.tablet(tid)
        if t is None:
            continue
        m = Mutation()
        tc = m.tablet(tid)
        if t.hold == uc.id:
            tc.require("hold_is", uc.id).do("clear_hold")
        elif t.selection is not None and t.selection.id == uc.id:
            tc.require("selection_is", uc.id).do("clear_selection")
        else:
            continue
        try:
            store.mutate(m)
        except ConditionFailed:
            pass  # changed under us; the coordinator's pass cleans up what is left
    # Queued USER jobs go too (reservation would discard them anyway). Other queued jobs of these
    # tablets go with them; the tablets are marked dirty so the next pass re-plans those.
    store.queues.remove_tablets(uc.tablets)
    store.bookkeeping.mark_dirty(uc.tablets)
    store.ucomps.put_user_compaction(uc.id, {"released": "1"})


def wait(store: MetadataStore, cid: str, timeout: float, poll: float = 0.2) -> UserCompaction:
    deadline = time.monotonic() + timeout
    while True:
        uc = get(store, cid)
        if uc.state != RUNNING or time.monotonic() > deadline:
            return uc
        time.sleep(poll)


def select_files(
    store: MetadataStore, t: Tablet, files: list[str], kind: str, sel_id: str, hold: str | None = None
) -> bool:
    """Record a USER or SELECTOR selection of ``files`` on an idle tablet (clearing the user
    compaction's hold when ``hold`` is given). False when the tablet changed meanwhile."""
    m = Mutation(table=t.table).require_table(ONLINE)
    tc = m.tablet(t.id).require("no_running").require("no_selection").require("no_op")
    if hold is not None:
        tc.require("hold_is", hold).do("clear_hold")
    else:
        tc.require("no_hold").require("version", t.version)
    tc.do("set_selection", {"id": sel_id, "kind": kind, "files": sorted(files), "done": 0, "created": now_ms()})
    try:
        store.mutate(m)
        return True
    except ConditionFailed:
        return False


def advance(store: MetadataStore, *, retention_s: float = RETENTION_S) -> None:
    """One coordinator step of every running user compaction: cancel those whose table is no
    longer ONLINE; select the files of each held tablet once none of its compactions run (a
    tablet without files is done at once); mark the compaction SUCCEEDED when every tablet is.
    Finished ones are forgotten ``retention_s`` after they ended."""
    now = now_ms()
    for cid in store.ucomps.list_user_compactions():
        try:
            uc = get(store, cid)
        except KompaktorError:  # forgotten half-way (its id left): finish forgetting it
            store.ucomps.forget_user_compaction(cid)
            continue
        if uc.state != RUNNING:
            if uc.state == CANCELLED and store.ucomps.user_compaction_field(uc.id, "released") is None:
                _release(store, uc)  # a cancel that stopped half-way (crash): finish it
                continue
            if uc.ended_ms is not None and now - uc.ended_ms >= retention_s * 1000:
                store.ucomps.forget_user_compaction(uc.id)
            continue
        try:
            state = store.tables.table_info(uc.table).state
        except UnknownTableError:
            state = DELETED
        if state != ONLINE:
            cancel(store, uc.id, f"table is {state}")
            continue
        for t in store.tables.get_tablets(list(uc.tablets)):
            if t.hold != uc.id or t.running:
                continue
            if not t.files:
                m = Mutation()
                m.tablet(t.id).require("hold_is", uc.id).do("clear_hold").do("ucomp_done", uc.id)
                try:
                    store.mutate(m)
                except ConditionFailed:
                    pass
                continue
            if t.selection is None:
                select_files(store, t, list(t.files), "USER", uc.id, hold=uc.id)
        uc = get(store, uc.id)
        if uc.done >= uc.total:
            set_state(store, uc.id, SUCCEEDED, f"{uc.done}/{uc.total} tablets compacted")
