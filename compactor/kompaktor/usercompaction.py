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
from dataclasses import dataclass
from typing import Any

from kompaktor import contract as C
from kompaktor.errors import ConditionFailed, KompaktorError
from kompaktor.iterators import IteratorSettings
from kompaktor.jobqueue import JobQueues
from kompaktor.store import ONLINE, MetadataStore, Mutation, now_ms

RUNNING, SUCCEEDED, CANCELLED, FAILED = "RUNNING", "SUCCEEDED", "CANCELLED", "FAILED"


@dataclass(frozen=True)
class UserCompaction:
    id: str
    table: str  # table id
    table_name: str
    state: str
    tablets: tuple[str, ...]
    done: int
    iterators: dict[str, Any]
    created_ms: int
    message: str

    @property
    def total(self) -> int:
        return len(self.tablets)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "table": self.table_name, "state": self.state, "tablets_done": self.done,
                "tablets_total": self.total, "message": self.message}


def validate_iterators(its: dict[str, Any]) -> dict[str, Any]:
    """Check USER-compaction iterator options; returns the normalised dict.
    Keys: ageoff_ttl_ms (int), row_regex (str), row_start / row_end (hex strings)."""
    allowed = {"ageoff_ttl_ms", "row_regex", "row_start", "row_end"}
    unknown = set(its) - allowed
    if unknown:
        raise ValueError(f"unknown iterator options {sorted(unknown)}; allowed: {sorted(allowed)}")
    IteratorSettings.from_json(its)  # raises ValueError with a clear message
    return {k: v for k, v in its.items() if v is not None}


def start(store: MetadataStore, table: str, start_row: bytes | None = None, end_row: bytes | None = None,
          iterators: dict[str, Any] | None = None) -> str:
    its = validate_iterators(iterators or {})
    info = store.table(table)
    if info.state != ONLINE:
        raise KompaktorError(f"table {table!r} is {info.state}; user compactions need it ONLINE")
    tablets = store.tablets_in_range(info.id, start_row, end_row)
    cid = f"UC-{store.next_seq('ucomp'):06d}"
    m = Mutation(table=info.id).require_table(ONLINE)
    for t in tablets:
        m.tablet(t.id).require("no_op").require("no_hold").do("set_hold", cid)
    store.r.hset(C.ucomp_key(cid), mapping={
        "table": info.id, "table_name": table, "state": RUNNING, "iterators": json.dumps(its),
        "tablets": json.dumps([t.id for t in tablets]), "created": now_ms(), "message": ""})
    try:
        store.mutate(m)
    except ConditionFailed as exc:
        store.r.delete(C.ucomp_key(cid))
        raise KompaktorError(f"cannot start a user compaction on {table!r}: {exc}") from exc
    store.r.sadd(C.UCOMPS, cid)
    return cid


def get(store: MetadataStore, cid: str) -> UserCompaction:
    h = store.r.hgetall(C.ucomp_key(cid))
    if not h:
        raise KompaktorError(f"unknown user compaction {cid!r}")
    return UserCompaction(cid, h[b"table"].decode(), h[b"table_name"].decode(), h[b"state"].decode(),
                          tuple(json.loads(h[b"tablets"])), int(store.r.scard(C.ucomp_done_key(cid))),
                          json.loads(h[b"iterators"]), int(h[b"created"]), h.get(b"message", b"").decode())


def all_compactions(store: MetadataStore) -> list[UserCompaction]:
    return [get(store, c.decode()) for c in sorted(store.r.smembers(C.UCOMPS))]


def set_state(store: MetadataStore, cid: str, state: str, message: str = "") -> None:
    store.r.hset(C.ucomp_key(cid), mapping={"state": state, "message": message, "ended": now_ms()})


def cancel(store: MetadataStore, cid: str, message: str = "cancelled") -> None:
    """Cancel: no new USER jobs; holds and selections removed; running jobs stop."""
    uc = get(store, cid)
    if uc.state != RUNNING:
        return
    set_state(store, cid, CANCELLED, message)
    for tid in uc.tablets:
        t = store.tablet(tid)
        if t is None:
            continue
        m = Mutation()
        tc = m.tablet(tid)
        if t.hold == cid:
            tc.require("hold_is", cid).do("clear_hold")
        elif t.selection is not None and t.selection.id == cid:
            tc.require("selection_is", cid).do("clear_selection")
        else:
            continue
        try:
            store.mutate(m)
        except ConditionFailed:
            pass  # changed under us; the coordinator's pass cleans up what is left
    # Queued USER jobs go too (reservation would discard them anyway). Other queued jobs of these
    # tablets go with them; the tablets are marked dirty so the next pass re-plans those.
    JobQueues(store.r).remove_tablets(uc.tablets)
    store.mark_dirty(uc.tablets)


def wait(store: MetadataStore, cid: str, timeout: float, poll: float = 0.2) -> UserCompaction:
    deadline = time.monotonic() + timeout
    while True:
        uc = get(store, cid)
        if uc.state != RUNNING or time.monotonic() > deadline:
            return uc
        time.sleep(poll)
