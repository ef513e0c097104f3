"""Tablet lifecycle: split and merge tablets by editing their metadata (seeds 002 and 003).

Files are never rewritten. A split gives each new tablet the files whose rows (first/last row)
can overlap its range; a merge gives the merged tablet the union of its tablets' files. Every
tablet reads only its own rows (prev, end] of each file (scans: :meth:`Client.tablet_sources`;
compactions: ``MergeRequest(prev, end)``), so the merged view of every row is the same before
and after. Each split or merge is ONE conditional mutation: the old tablets are checked by
version and deleted or re-ranged, the new ones created with ``absent``; afterwards the old
tablets' queued jobs are removed and the new tablets are dirty (the coordinator re-plans them).

Running compactions: a split or merge is **refused** (:class:`TabletOpRefused`) while any of its
tablets has a running compaction, a pending user compaction (hold) or selected files; nothing
changes and the caller may retry. Automatic splits do not starve behind a busy tablet: a tablet
over the threshold that cannot split yet is marked ``op=split-pending``, which stops new
compactions there (reserve requires ``no_op``; the planner skips it); the running ones finish,
and the next pass splits it and clears the mark. A compaction reserved just before a split or
merge cannot commit against the changed tablet: commit checks the ECID (gone with a deleted
tablet) and the tablet's range (``range`` condition, for the tablet that keeps its id), so it
fails cleanly and the compactor deletes its output.

Merging is refused when it would be unsafe without rewriting files: if a tablet of the range no
longer holds a file whose rows overlap it (a compaction there already replaced the file's rows),
the merged tablet would read those outdated rows again. Accumulo 2 "chops" such files first; here
the person runs a user compaction of the range (``kompaktor compact NAME --start --end``), which
leaves each tablet only files of its own rows, and merges then.

File sizes in tablet metadata are per-tablet estimates, as in Accumulo: a split divides a shared
file's size, entries and deletes between the new tablets by the part of the file's row span each
covers; a merge adds them up again. Automatic splitting compares a tablet's summed sizes with the
table property ``table.split.threshold`` (default 1G, Accumulo's).

This module reads, decides and writes; the decisions themselves — may a tablet split or merge
now, is a merge safe, how a split divides the files, where an automatic split cuts — are pure
functions of the tablets' metadata in :mod:`kompaktor.policy.splits`.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Iterable
from typing import cast

from kompaktor.metadata.store import MetadataStore, Mutation
from kompaktor.metadata.store.mutation import TabletChange
from kompaktor.model.errors import ConditionFailed, KompaktorError
from kompaktor.model.keys import encode_row
from kompaktor.model.tablet import ONLINE, TableInfo, Tablet, end_token, tablet_id, ts_token
from kompaktor.policy.splits import (
    DEFAULT_SPLIT_THRESHOLD,
    SPLIT_PENDING,
    choose_split_row,
    merged_files,
    show_row,
    split_blocker,
    split_parts,
    split_threshold,
    tablet_size,
    unsafe_merge,
)
from kompaktor.policy.tableprops import SPLIT_THRESHOLD
from kompaktor.queues.jobqueue import JobQueues

log = logging.getLogger("kompaktor.metadata.tablet_ops")

# the geometry (pure) is kompaktor.policy.splits; these names stay importable from here
__all__ = [
    "DEFAULT_SPLIT_THRESHOLD",
    "FULL_CHECK_S",
    "MAX_AUTO_SPLITS",
    "SPLIT_PENDING",
    "TabletOpRefused",
    "auto_split",
    "choose_split_row",
    "merge",
    "split",
    "split_threshold",
    "tablet_size",
]

FULL_CHECK_S = 30.0  # auto_split looks at every tablet this often, else at the dirty ones
MAX_AUTO_SPLITS = 256  # splits per auto_split pass (the rest waits for the next pass)
_ATTEMPTS = 5  # re-reads when a tablet changed between reading and mutating


class TabletOpRefused(KompaktorError):
    """A split or merge that cannot happen now (running compactions, user compaction pending,
    table not ONLINE, unsafe merge); nothing was changed."""


# -- helpers -----------------------------------------------------------------------------------
def _guard(m: Mutation, t: Tablet) -> TabletChange:
    """Conditions that make the change apply to exactly the tablet that was read."""
    return m.tablet(t.id).require("version", t.version).require("no_running").require("no_hold").require("no_selection")


# -- split -------------------------------------------------------------------------------------
def _add_split(m: Mutation, t: Tablet, rows: list[bytes]) -> list[str]:
    """Add to ``m`` the split of ``t`` at ``rows`` (sorted, inside the tablet; the files divided by
    :func:`~kompaktor.policy.splits.split_parts`); returns the ids of the resulting tablets, in row
    order. The last one keeps ``t``'s id (its end row)."""
    parts = split_parts(t, rows)
    ids = []
    for lo, hi, files in parts[:-1]:
        doc = {
            "table": t.table,
            "prev": encode_row(lo),
            "end": encode_row(hi),
            "files": {path: fm.to_json() for path, fm in files.items()},
            "running": {},
        }
        if t.horizon is not None:  # the new tablets inherit the deletes dropped in their rows
            doc["dh"] = ts_token(t.horizon)
        tid = tablet_id(t.table, hi)
        m.tablet(tid).require("absent").do("create", doc, end_token(hi))
        ids.append(tid)
    last = parts[-1][2]
    tc = _guard(m, t).do("set_range", encode_row(rows[-1]))
    gone = sorted(set(t.files) - set(last))
    if gone:
        tc.do("remove_files", gone)
    if last:
        tc.do("add_files", {path: fm.to_json() for path, fm in last.items()})
    if t.op == SPLIT_PENDING:
        tc.do("clear_op")
    ids.append(t.id)
    return ids


def _online(store: MetadataStore, table_name: str) -> TableInfo:
    info = store.tables.table(table_name)
    if info.state != ONLINE:
        raise TabletOpRefused(f"table {table_name!r} is {info.state}; split and merge need it ONLINE")
    return info


def _after(store: MetadataStore, queues: JobQueues | None, old: Iterable[str], new: Iterable[str]) -> None:
    (queues or store.queues).remove_tablets(old)
    store.bookkeeping.mark_dirty(new)  # the mutation did too; explicit for readers


def split(
    store: MetadataStore, table_name: str, rows: Iterable[bytes], *, queues: JobQueues | None = None
) -> list[str]:
    """Add split points ``rows`` to the table, in one atomic mutation. Rows that already end a
    tablet are ignored. Returns the ids of the tablets that were created or changed (empty when
    nothing changed). Raises :class:`TabletOpRefused` when a tablet to split is busy."""
    want = sorted(set(rows))
    if any(not isinstance(r, bytes) or not r for r in want):
        raise ValueError("split rows must be non-empty byte strings")
    for attempt in range(_ATTEMPTS):
        info = _online(store, table_name)
        tablets = store.tables.tablets(info.id)
        ends = cast("list[bytes]", [t.end for t in tablets[:-1]])  # the last tablet's end is None (+inf)
        per: dict[str, tuple[Tablet, list[bytes]]] = {}
        for row in want:
            t = tablets[bisect.bisect_left(ends, row)]
            if t.end == row:
                continue  # already a split point
            per.setdefault(t.id, (t, []))[1].append(row)
        if not per:
            return []
        for t, _ in per.values():
            why = split_blocker(t)
            if why:
                raise TabletOpRefused(
                    f"cannot split tablet {t.id} of {table_name!r} now: {why}; retry when it finishes"
                )
        m = Mutation(table=info.id).require_table(ONLINE)
        new: list[str] = []
        for t, trows in per.values():
            new.extend(_add_split(m, t, trows))
        try:
            store.mutate(m)
        except ConditionFailed as exc:
            if attempt + 1 < _ATTEMPTS:
                continue  # a tablet changed meanwhile: read again (and refuse if now busy)
            raise TabletOpRefused(f"cannot split {table_name!r}: its tablets keep changing ({exc})") from exc
        _after(store, queues, per, new)
        log.info("split %s at %d row(s): %d tablets", table_name, len(want), len(new))
        return new
    raise AssertionError("unreachable")


# -- merge -------------------------------------------------------------------------------------
def merge(
    store: MetadataStore,
    table_name: str,
    start: bytes | None = None,
    end: bytes | None = None,
    *,
    queues: JobQueues | None = None,
) -> str | None:
    """Merge the tablets overlapping rows [start, end] (None = unbounded) into one, in one atomic
    mutation. Returns the merged tablet's id, or None when fewer than two tablets overlap.
    Raises :class:`TabletOpRefused` when a tablet is busy or the merge would be unsafe."""
    if start is not None and end is not None and start > end:
        raise ValueError(f"merge range start {show_row(start)} is after its end {show_row(end)}")
    for attempt in range(_ATTEMPTS):
        info = _online(store, table_name)
        group = store.tables.tablets_in_range(info.id, start, end)
        if len(group) < 2:
            return None
        for t in group:
            why = split_blocker(t)
            if why:
                raise TabletOpRefused(
                    f"cannot merge tablet {t.id} of {table_name!r} now: {why}; retry when it finishes"
                )
        why = unsafe_merge(group)
        if why:
            rng = "".join(
                [
                    f" --start {show_row(start)}" if start is not None else "",
                    f" --end {show_row(end)}" if end is not None else "",
                ]
            )
            raise TabletOpRefused(
                f"cannot merge {table_name!r} safely: {why}. Compact the range first "
                f"(kompaktor compact {table_name}{rng} --wait 600), then merge"
            )
        files = merged_files(group)
        last = group[-1]
        m = Mutation(table=info.id).require_table(ONLINE)
        for t in group[:-1]:
            _guard(m, t).do("delete", end_token(t.end))
        tc = _guard(m, last).do("set_range", encode_row(group[0].prev))
        if files:
            tc.do("add_files", {p: fm.to_json() for p, fm in files.items()})
        horizons = [t.horizon for t in group if t.horizon is not None]
        if horizons:  # the merged tablet keeps every delete horizon of its rows: the newest
            tc.do("raise_horizon", ts_token(max(horizons)))
        if last.op == SPLIT_PENDING:
            tc.do("clear_op")
        try:
            store.mutate(m)
        except ConditionFailed as exc:
            if attempt + 1 < _ATTEMPTS:
                continue
            raise TabletOpRefused(f"cannot merge {table_name!r}: its tablets keep changing ({exc})") from exc
        _after(store, queues, [t.id for t in group], [last.id])
        log.info("merged %d tablets of %s into %s", len(group), table_name, last.id)
        return last.id
    raise AssertionError("unreachable")


# -- automatic splits ----------------------------------------------------------------------------
def _mark_pending(store: MetadataStore, t: Tablet) -> bool:
    m = Mutation(table=t.table).require_table(ONLINE)
    m.tablet(t.id).require("version", t.version).require("no_op").do("set_op", SPLIT_PENDING)
    try:
        store.mutate(m)
        return True
    except ConditionFailed:
        return False


def _clear_pending(store: MetadataStore, t: Tablet) -> None:
    m = Mutation()
    m.tablet(t.id).require("version", t.version).do("clear_op")
    try:
        store.mutate(m)
    except ConditionFailed:
        pass  # changed meanwhile: it is dirty and will be looked at again


def auto_split(
    store: MetadataStore, queues: JobQueues | None = None, *, tablet_ids: Iterable[str] | None = None
) -> list[str]:
    """Split tablets whose files exceed their table's ``table.split.threshold``, each at
    :func:`choose_split_row`, until every new tablet is under it (or cannot split). Looks at
    ``tablet_ids``, else at every tablet once per :data:`FULL_CHECK_S` and at the dirty ones in
    between (call it before the coordinator pops the dirty set). A busy tablet is marked
    split-pending and split on a later pass. Returns the ids of the tablets created or changed."""
    queues = queues or store.queues
    if tablet_ids is None:
        ids = (
            store.tables.all_tablet_ids()
            if store.bookkeeping.claim_split_check(FULL_CHECK_S)
            else store.bookkeeping.dirty_ids()
        )
    else:
        ids = sorted(set(tablet_ids))
    tables = {t.id: t for t in store.tables.tables()}
    thresholds: dict[str, int | None] = {}
    for tid, info in tables.items():
        try:
            thresholds[tid] = split_threshold(info) if info.state == ONLINE else None
        except ValueError as exc:
            log.warning("table %s: bad %s, not splitting: %s", info.name, SPLIT_THRESHOLD, exc)
            thresholds[tid] = None
    out: list[str] = []
    work = store.tables.get_tablets(ids)
    splits = 0
    while work and splits < MAX_AUTO_SPLITS:
        t = work.pop()
        limit = thresholds.get(t.table)
        row = choose_split_row(t) if limit is not None and tablet_size(t) > limit else None
        if row is None:
            if t.op == SPLIT_PENDING:
                _clear_pending(store, t)  # no longer needs (or cannot take) a split
            continue
        if split_blocker(t):
            if t.op is None and not t.hold and t.selection is None and _mark_pending(store, t):
                queues.remove_tablets([t.id])
                log.info("tablet %s (%d bytes) will split once its compactions finish", t.id, tablet_size(t))
            continue
        m = Mutation(table=t.table).require_table(ONLINE)
        new = _add_split(m, t, [row])
        try:
            store.mutate(m)
        except ConditionFailed as exc:
            log.info("auto-split of %s skipped, retried later: %s", t.id, exc)
            continue
        splits += 1
        _after(store, queues, [t.id], new)
        log.info("auto-split %s (%d bytes > %d) at %s", t.id, tablet_size(t), limit, show_row(row))
        out.extend(new)
        work.extend(store.tables.get_tablets(new))
    return out
