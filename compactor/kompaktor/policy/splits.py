"""Split and merge geometry: pure decisions over tablets' metadata, no I/O (seeds 002 and 003).

What :mod:`kompaktor.metadata.tablet_ops` needs to decide before it writes one mutation:

- whether a tablet may be split or merged now (:func:`split_blocker`) and whether a merge would
  bring back rows a compaction already replaced (:func:`unsafe_merge`);
- how a split divides the tablet's files (:func:`split_parts`): each new tablet gets the files
  whose rows can overlap its range, with the file's size, entries and deletes divided by the part
  of its row span each range covers (:func:`file_shares`, estimates as in Accumulo); a merge adds
  them up again (:func:`merged_files`);
- where an automatic split cuts (:func:`choose_split_row`: the row halving the tablet's data by
  size, from the files' first/last rows and sizes only) and when (:func:`tablet_size` over
  :func:`split_threshold`).

Rows are placed on a number line (:class:`RowLine`) to interpolate between them without reading
data. Imports only ``model`` and ``policy``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

from kompaktor.model.keys import span_overlaps
from kompaktor.model.tablet import FileMeta, TableInfo, Tablet
from kompaktor.policy.sizes import parse_accumulo_size
from kompaktor.policy.tableprops import SPLIT_THRESHOLD

DEFAULT_SPLIT_THRESHOLD = "1G"
SPLIT_PENDING = "split-pending"  # tablet op: an automatic split waits for running compactions
_POS_BYTES = 16  # row bytes (after a common prefix) used to place rows on a line

#: a range of rows (prev, end], None for unbounded
Range = tuple[bytes | None, bytes | None]


def show_row(row: bytes | None) -> str:
    """A row for a message: quoted text when printable, else hex; ``-inf/+inf`` for None."""
    if row is None:
        return "-inf/+inf"
    try:
        text = row.decode("utf-8")
        if text.isprintable():
            return repr(text)
    except UnicodeDecodeError:
        pass
    return "0x" + row.hex()


def split_blocker(t: Tablet) -> str | None:
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


def _common_prefix(a: bytes, b: bytes) -> bytes:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return a[:n]


class RowLine:
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
        self.base: list[int] = []
        self.radix: list[int] = []
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


def file_shares(fm: FileMeta, ranges: Sequence[Range]) -> list[float]:
    """How a file's data in a tablet divides between the consecutive ranges that split the
    tablet, assuming the rows spread evenly between the file's first and last row."""
    over = [span_overlaps(fm.first_row, fm.last_row, lo, hi) for lo, hi in ranges]
    weights = [0.0] * len(ranges)
    if fm.first_row is not None and fm.last_row is not None and fm.first_row < fm.last_row:
        first, last = fm.first_row, fm.last_row
        line = RowLine([first, last, *(b for r in ranges for b in r if b is not None and first < b < last)])
        for i, (lo, hi) in enumerate(ranges):
            if over[i]:
                a = line.pos(lo) if lo is not None else line.pos(first)
                b = line.pos(hi) if hi is not None else line.pos(last)
                weights[i] = float(max(0, b - a))
    if sum(weights) <= 0:
        weights = [1.0 if o else 0.0 for o in over]
    total = sum(weights)
    return [w / total if total else 0.0 for w in weights]


def file_part(fm: FileMeta, share: float) -> FileMeta:
    """The estimate of ``share`` of a file's data (at least one byte and one entry)."""
    return fm._replace(
        size=max(1, round(fm.size * share)),
        entries=max(1, round(fm.entries * share)),
        deletes=round(fm.deletes * share),
    )


def split_parts(t: Tablet, rows: Sequence[bytes]) -> list[tuple[bytes | None, bytes | None, dict[str, FileMeta]]]:
    """The tablets that splitting ``t`` at ``rows`` (sorted, inside the tablet) makes, in row
    order: each range ``(prev, end]`` with the files whose rows can overlap it, each with its
    estimated part of the file (:func:`file_shares`). Membership is by rows, never by the share."""
    ranges = list(itertools.pairwise([t.prev, *rows, t.end]))
    parts: list[dict[str, FileMeta]] = [{} for _ in ranges]
    for path, fm in t.files.items():
        for i, share in enumerate(file_shares(fm, ranges)):
            if span_overlaps(fm.first_row, fm.last_row, *ranges[i]):
                parts[i][path] = file_part(fm, share)
    return [(lo, hi, files) for (lo, hi), files in zip(ranges, parts, strict=True)]


def unsafe_merge(group: Sequence[Tablet]) -> str | None:
    """Why merging these (consecutive) tablets would be unsafe without rewriting files, or None:
    a file still read by one tablet but already compacted away in another whose rows it overlaps
    would bring that tablet's outdated rows back."""
    for t in group:
        for path, fm in t.files.items():
            for other in group:
                if path not in other.files and span_overlaps(fm.first_row, fm.last_row, other.prev, other.end):
                    return (
                        f"file {path} (rows {show_row(fm.first_row)}..{show_row(fm.last_row)}) is still read by "
                        f"tablet {t.id} but was already compacted away in tablet {other.id}, whose "
                        "rows it overlaps"
                    )
    return None


def merged_files(group: Sequence[Tablet]) -> dict[str, FileMeta]:
    """The files of the tablet that merging ``group`` makes: their union, a shared file's
    per-tablet estimates added up again."""
    files: dict[str, FileMeta] = {}
    for t in group:
        for path, fm in t.files.items():
            have = files.get(path)
            files[path] = (
                fm
                if have is None
                else fm._replace(
                    size=have.size + fm.size, entries=have.entries + fm.entries, deletes=have.deletes + fm.deletes
                )
            )
    return files


def tablet_size(t: Tablet) -> int:
    """The tablet's estimated data size: the sum of its files' (per-tablet) sizes."""
    return sum(fm.size for fm in t.files.values())


def choose_split_row(t: Tablet) -> bytes | None:
    """A row that splits the tablet's data about in half by size, from its files' first/last rows
    and sizes only (no scan): each file's size is spread evenly over its row span within the
    tablet, and the row where half the total lies is interpolated. None when the tablet cannot be
    split (no files, or all its data in one row)."""
    spans = _spans_in(t)
    if not spans:
        return None
    gmin, gmax = min(s[0] for s in spans), max(s[1] for s in spans)
    if gmin >= gmax:
        return None
    # the files' own first/last rows too: a clipped span's ends alone may show too few digits
    line = RowLine(
        [r for lo, hi, _ in spans for r in (lo, hi)]
        + [r for fm in t.files.values() for r in (fm.first_row, fm.last_row) if r is not None]
    )
    spread = _Spread([(line.pos(lo), line.pos(hi), size) for lo, hi, size in spans])

    def ok(row: bytes) -> bool:
        inside = (t.prev is None or row > t.prev) and (t.end is None or row < t.end)
        return bool(row) and inside and gmin <= row < gmax

    row = line.row(spread.half_way(line.pos(gmin), line.pos(gmax)))
    if ok(row):
        return row
    # fall back to the files' own first/last rows, the one dividing the size most evenly
    cands = sorted({r for lo, hi, _ in spans for r in (lo, hi) if ok(r)})
    if not cands:
        return None
    return min(cands, key=lambda r: abs(spread.below(line.pos(r)) - spread.total / 2))


def _spans_in(t: Tablet) -> list[tuple[bytes, bytes, int]]:
    """Each file's row span clipped to the tablet, with its size (files without rows or bytes,
    or outside the tablet, left out)."""
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
    return spans


class _Spread:
    """Sizes spread evenly over their spans of positions on a :class:`RowLine`."""

    def __init__(self, placed: list[tuple[int, int, int]]) -> None:
        self.placed = placed
        self.total = sum(s for _, _, s in placed)

    def below(self, x: int) -> float:
        """The size at or before position ``x``."""
        acc = 0.0
        for a, b, s in self.placed:
            if x >= b:
                acc += s
            elif x >= a and b > a:
                acc += s * (x - a) / (b - a)
        return acc

    def half_way(self, lo_p: int, hi_p: int) -> int:
        """The smallest position in [lo_p, hi_p] with half the size at or before it."""
        while lo_p < hi_p:
            mid = (lo_p + hi_p) // 2
            if self.below(mid) >= self.total / 2:
                hi_p = mid
            else:
                lo_p = mid + 1
        return lo_p


def split_threshold(info: TableInfo) -> int:
    """The table's ``table.split.threshold`` in bytes (default 1G, Accumulo's); ValueError when
    it does not parse."""
    return parse_accumulo_size(info.props.get(SPLIT_THRESHOLD, DEFAULT_SPLIT_THRESHOLD))
