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
"""

from __future__ import annotations

import bisect
import itertools
import logging
from collections.abc import Iterable, Sequence

from kompaktor.metadata.store import MetadataStore, Mutation
from kompaktor.model.errors import ConditionFailed, KompaktorError
from kompaktor.model.keys import encode_row, span_overlaps
from kompaktor.model.tablet import ONLINE, FileMeta, TableInfo, Tablet, end_token, tablet_id
from kompaktor.policy.sizes import parse_accumulo_size
from kompaktor.policy.tableprops import SPLIT_THRESHOLD
from kompaktor.queues.jobqueue import JobQueues

log = logging.getLogger("kompaktor.metadata.tablet_ops")

DEFAULT_SPLIT_THRESHOLD = "1G"
SPLIT_PENDING = "split-pending"  # tablet op: an automatic split waits for running compactions
FULL_CHECK_S = 30.0  # auto_split looks at every tablet this often, else at the dirty ones
MAX_AUTO_SPLITS = 256  # splits per auto_split pass (the rest waits for the next pass)
_ATTEMPTS = 5  # re-reads when a tablet changed between reading and mutating
_POS_BYTES = 16  # row bytes (after a common prefix) used to place rows on a line


class TabletOpRefused(KompaktorError):
    """A split or merge that cannot happen now (running compactions, user compaction pending,
    table not ONLINE, unsafe merge); nothing was changed."""


# -- helpers -----------------------------------------------------------------------------------
def _show(row: bytes | None) -> str:
    if row is None:
        return "-inf/+inf"
    try:
        text = row.decode("utf-8")
        if text.isprintable():
            return repr(text)
    except UnicodeDecodeError:
        pass
    return "0x" + row.hex()


def _blocker(t: Tablet) -> str | None:
    """Why tablet ``t`` cannot be split or merged now, or None."""
    if t.running:
        return f"{len(t.running)} compaction(s) running ({', '.join(sorted(t.running))})"
    if t.hold is not None:
        return f"user compaction {t.hold} pending"
    if t.selection is not None:
        return f"{t.selection.kind} compaction {t.selection.id} has selected files"
    if t.op is not None and t.op != SPLIT_PENDING:
        return f"operation {t.op!r} in progress"
    return None


def _guard(m: Mutation, t: Tablet):
    """Conditions that make the change apply to exactly the tablet that was read."""
    return m.tablet(t.id).require("version", t.version).require("no_running").require("no_hold").require("no_selection")


def _common_prefix(a: bytes, b: bytes) -> bytes:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return a[:n]


class _Line:
    """Rows between the least and the greatest of ``rows`` placed on a number line, for
    interpolation without reading data. After the rows' common prefix each byte position is a
    digit whose radix is the span of byte values the given rows show there (so ASCII digits or
    hex, common in row keys, spread evenly instead of clustering in a sliver of 0..255). The
    mapping is monotone: rows sort like their positions."""

    def __init__(self, rows: Iterable[bytes]) -> None:
        rows = list(rows)
        self.lo, self.hi = min(rows), max(rows)
        self.cp = _common_prefix(self.lo, self.hi)
        n = len(self.cp)
        width = min(_POS_BYTES, max(len(r) for r in rows) - n) or 1
        self.base = []
        self.radix = []
        for i in range(width):
            seen = [r[n + i] for r in rows if len(r) > n + i]
            lo, hi = (min(seen), max(seen)) if seen else (0, 0)
            self.base.append(lo)
            self.radix.append(hi - lo + 2)  # one more digit: "no byte here" sorts first
        self.top = 1
        for r in self.radix:
            self.top *= r

    def pos(self, row: bytes) -> int:
        row = min(max(row, self.lo), self.hi)
        tail = row[len(self.cp) :]
        x, clamp = 0, 0  # clamp: -1 below a digit's range (rest minimal), +1 above (rest maximal)
        for i, (base, radix) in enumerate(zip(self.base, self.radix, strict=True)):
            if clamp < 0:
                d = 0
            elif clamp > 0:
                d = radix - 1
            elif i >= len(tail):
                d, clamp = 0, -1
            else:
                d = tail[i] - base + 1
                if d < 1:
                    d, clamp = 1, -1
                elif d > radix - 1:
                    d, clamp = radix - 1, 1
            x = x * radix + d
        return x

    def row(self, pos: int) -> bytes:
        digits = []
        for radix in reversed(self.radix):
            pos, d = divmod(pos, radix)
            digits.append(d)
        out = bytearray(self.cp)
        for base, d in zip(self.base, reversed(digits), strict=True):
            if d == 0:
                break
            out.append(base + d - 1)
        return bytes(out)


def _shares(fm: FileMeta, ranges: Sequence[tuple[bytes | None, bytes | None]]) -> list[float]:
    """How a file's data in a tablet divides between the consecutive ranges that split the
    tablet, assuming the rows spread evenly between the file's first and last row."""
    over = [span_overlaps(fm.first_row, fm.last_row, lo, hi) for lo, hi in ranges]
    weights = [0.0] * len(ranges)
    if fm.first_row is not None and fm.last_row is not None and fm.first_row < fm.last_row:
        line = _Line(
            [
                fm.first_row,
                fm.last_row,
                *(b for r in ranges for b in r if b is not None and fm.first_row < b < fm.last_row),
            ]
        )
        for i, (lo, hi) in enumerate(ranges):
            if over[i]:
                a = line.pos(lo) if lo is not None else line.pos(fm.first_row)
                b = line.pos(hi) if hi is not None else line.pos(fm.last_row)
                weights[i] = float(max(0, b - a))
    if sum(weights) <= 0:
        weights = [1.0 if o else 0.0 for o in over]
    total = sum(weights)
    return [w / total if total else 0.0 for w in weights]


def _part(fm: FileMeta, share: float) -> dict:
    return FileMeta(
        max(1, round(fm.size * share)),
        max(1, round(fm.entries * share)),
        round(fm.deletes * share),
        fm.first_row,
        fm.last_row,
    ).to_json()


# -- split -------------------------------------------------------------------------------------
def _add_split(m: Mutation, t: Tablet, rows: list[bytes]) -> list[str]:
    """Add to ``m`` the split of ``t`` at ``rows`` (sorted, inside the tablet); returns the ids of
    the resulting tablets, in row order. The last one keeps ``t``'s id (its end row)."""
    bounds: list[bytes | None] = [t.prev, *rows, t.end]
    ranges = list(itertools.pairwise(bounds))
    parts: list[dict[str, dict]] = [{} for _ in ranges]
    for path, fm in t.files.items():
        for i, share in enumerate(_shares(fm, ranges)):
            # membership by rows, never by the (estimated) share
            if span_overlaps(fm.first_row, fm.last_row, *ranges[i]):
                parts[i][path] = _part(fm, share)
    ids = []
    for (lo, hi), files in zip(ranges[:-1], parts[:-1], strict=True):
        doc = {"table": t.table, "prev": encode_row(lo), "end": encode_row(hi), "files": files, "running": {}}
        tid = tablet_id(t.table, hi)
        m.tablet(tid).require("absent").do("create", doc, end_token(hi))
        ids.append(tid)
    last = parts[-1]
    tc = _guard(m, t).do("set_range", encode_row(rows[-1]))
    gone = sorted(set(t.files) - set(last))
    if gone:
        tc.do("remove_files", gone)
    if last:
        tc.do("add_files", last)
    if t.op == SPLIT_PENDING:
        tc.do("clear_op")
    ids.append(t.id)
    return ids


def _online(store: MetadataStore, table_name: str) -> TableInfo:
    info = store.table(table_name)
    if info.state != ONLINE:
        raise TabletOpRefused(f"table {table_name!r} is {info.state}; split and merge need it ONLINE")
    return info


def _after(store: MetadataStore, queues: JobQueues | None, old: Iterable[str], new: Iterable[str]) -> None:
    (queues or store.queues).remove_tablets(old)
    store.mark_dirty(new)  # the mutation did too; explicit for readers


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
        tablets = store.tablets(info.id)
        ends = [t.end for t in tablets[:-1]]  # the last tablet's end is None (+inf)
        per: dict[str, tuple[Tablet, list[bytes]]] = {}
        for row in want:
            t = tablets[bisect.bisect_left(ends, row)]
            if t.end == row:
                continue  # already a split point
            per.setdefault(t.id, (t, []))[1].append(row)
        if not per:
            return []
        for t, _ in per.values():
            why = _blocker(t)
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
def _unsafe(group: list[Tablet]) -> str | None:
    for t in group:
        for path, fm in t.files.items():
            for other in group:
                if path not in other.files and span_overlaps(fm.first_row, fm.last_row, other.prev, other.end):
                    return (
                        f"file {path} (rows {_show(fm.first_row)}..{_show(fm.last_row)}) is still read by "
                        f"tablet {t.id} but was already compacted away in tablet {other.id}, whose "
                        "rows it overlaps"
                    )
    return None


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
        raise ValueError(f"merge range start {_show(start)} is after its end {_show(end)}")
    for attempt in range(_ATTEMPTS):
        info = _online(store, table_name)
        group = store.tablets_in_range(info.id, start, end)
        if len(group) < 2:
            return None
        for t in group:
            why = _blocker(t)
            if why:
                raise TabletOpRefused(
                    f"cannot merge tablet {t.id} of {table_name!r} now: {why}; retry when it finishes"
                )
        why = _unsafe(group)
        if why:
            rng = "".join(
                [
                    f" --start {_show(start)}" if start is not None else "",
                    f" --end {_show(end)}" if end is not None else "",
                ]
            )
            raise TabletOpRefused(
                f"cannot merge {table_name!r} safely: {why}. Compact the range first "
                f"(kompaktor compact {table_name}{rng} --wait 600), then merge"
            )
        files: dict[str, FileMeta] = {}
        for t in group:
            for path, fm in t.files.items():
                have = files.get(path)
                files[path] = (
                    fm
                    if have is None
                    else FileMeta(
                        have.size + fm.size,
                        have.entries + fm.entries,
                        have.deletes + fm.deletes,
                        fm.first_row,
                        fm.last_row,
                    )
                )
        last = group[-1]
        m = Mutation(table=info.id).require_table(ONLINE)
        for t in group[:-1]:
            _guard(m, t).do("delete", end_token(t.end))
        tc = _guard(m, last).do("set_range", encode_row(group[0].prev))
        if files:
            tc.do("add_files", {p: fm.to_json() for p, fm in files.items()})
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
def tablet_size(t: Tablet) -> int:
    """The tablet's estimated data size: the sum of its files' (per-tablet) sizes."""
    return sum(fm.size for fm in t.files.values())


def choose_split_row(t: Tablet) -> bytes | None:
    """A row that splits the tablet's data about in half by size, from its files' first/last rows
    and sizes only (no scan): each file's size is spread evenly over its row span within the
    tablet, and the row where half the total lies is interpolated. None when the tablet cannot be
    split (no files, or all its data in one row)."""
    spans: list[tuple[bytes, bytes, int]] = []
    for fm in t.files.values():
        if (
            fm.first_row is None
            or fm.last_row is None
            or fm.size <= 0
            or not span_overlaps(fm.first_row, fm.last_row, t.prev, t.end)
        ):
            continue
        lo = fm.first_row if t.prev is None or fm.first_row > t.prev else t.prev
        hi = fm.last_row if t.end is None or fm.last_row <= t.end else t.end
        spans.append((lo, hi, fm.size))
    if not spans:
        return None
    gmin, gmax = min(s[0] for s in spans), max(s[1] for s in spans)
    if gmin >= gmax:
        return None
    # the files' own first/last rows too: a clipped span's ends alone may show too few digits
    line = _Line(
        [r for lo, hi, _ in spans for r in (lo, hi)]
        + [r for fm in t.files.values() for r in (fm.first_row, fm.last_row) if r is not None]
    )
    placed = [(line.pos(lo), line.pos(hi), size) for lo, hi, size in spans]
    total = sum(s for _, _, s in placed)

    def below(x: int) -> float:  # size at or before position x
        acc = 0.0
        for a, b, s in placed:
            if x >= b:
                acc += s
            elif x >= a and b > a:
                acc += s * (x - a) / (b - a)
        return acc

    def ok(row: bytes) -> bool:
        return (
            bool(row)
            and (t.prev is None or row > t.prev)
            and row >= gmin
            and row < gmax
            and (t.end is None or row < t.end)
        )

    lo_p, hi_p = line.pos(gmin), line.pos(gmax)
    while lo_p < hi_p:  # smallest position with half the size at or before it
        mid = (lo_p + hi_p) // 2
        if below(mid) >= total / 2:
            hi_p = mid
        else:
            lo_p = mid + 1
    row = line.row(lo_p)
    if ok(row):
        return row
    # fall back to the files' own first/last rows, the one dividing the size most evenly
    cands = sorted({r for lo, hi, _ in spans for r in (lo, hi) if ok(r)})
    if not cands:
        return None
    return min(cands, key=lambda r: abs(below(line.pos(r)) - total / 2))


def split_threshold(info: TableInfo) -> int:
    return parse_accumulo_size(info.props.get(SPLIT_THRESHOLD, DEFAULT_SPLIT_THRESHOLD))


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
        ids = store.all_tablet_ids() if store.claim_split_check(FULL_CHECK_S) else store.dirty_ids()
    else:
        ids = sorted(set(tablet_ids))
    tables = {t.id: t for t in store.tables()}
    thresholds: dict[str, int | None] = {}
    for tid, info in tables.items():
        try:
            thresholds[tid] = split_threshold(info) if info.state == ONLINE else None
        except ValueError as exc:
            log.warning("table %s: bad %s, not splitting: %s", info.name, SPLIT_THRESHOLD, exc)
            thresholds[tid] = None
    out: list[str] = []
    work = store.get_tablets(ids)
    splits = 0
    while work and splits < MAX_AUTO_SPLITS:
        t = work.pop()
        limit = thresholds.get(t.table)
        row = choose_split_row(t) if limit is not None and tablet_size(t) > limit else None
        if row is None:
            if t.op == SPLIT_PENDING:
                _clear_pending(store, t)  # no longer needs (or cannot take) a split
            continue
        if _blocker(t):
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
        log.info("auto-split %s (%d bytes > %d) at %s", t.id, tablet_size(t), limit, _show(row))
        out.extend(new)
        work.extend(store.get_tablets(new))
    return out
