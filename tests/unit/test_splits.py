"""Split and merge geometry (kompaktor.policy.splits), pure: where an automatic split cuts, how a
split divides a tablet's files and a merge adds them up, when a split or merge must wait or would
be unsafe. The splits and merges themselves, on a real Redis, are
tests/integration/test_tablet_ops.py."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kompaktor.model.tablet import FileMeta, RunningCompaction, Selection, TableInfo, Tablet
from kompaktor.policy.splits import (
    SPLIT_PENDING,
    RowLine,
    choose_split_row,
    file_shares,
    merged_files,
    show_row,
    split_blocker,
    split_parts,
    split_threshold,
    tablet_size,
    unsafe_merge,
)


def _tablet(
    files: dict[str, FileMeta],
    prev: bytes | None = None,
    end: bytes | None = None,
    *,
    tid: str = "1;~",
    running: dict[str, RunningCompaction] | None = None,
    selection: Selection | None = None,
    hold: str | None = None,
    op: str | None = None,
) -> Tablet:
    return Tablet(tid, "1", prev, end, files, running or {}, selection, hold, op, 0)


# -- choosing split rows -------------------------------------------------------------------------
def test_choose_split_row_from_first_last_rows_and_sizes() -> None:
    one = _tablet({"a": FileMeta(1000, 100, 0, b"a", b"z")})
    row = choose_split_row(one)
    assert row is not None and b"l" < row < b"o"
    # a big file over the first half and a small one over the second: the middle of the data
    # lies inside the big file's span
    two = _tablet({"a": FileMeta(900, 1, 0, b"a", b"m"), "b": FileMeta(100, 1, 0, b"n", b"z")})
    row = choose_split_row(two)
    assert row is not None and b"a" < row < b"m"
    # clipped to the tablet: the split row lies in (prev, end) and before the last row
    clipped = _tablet({"a": FileMeta(1000, 1, 0, b"a", b"z")}, prev=b"p", end=b"t")
    row = choose_split_row(clipped)
    assert row is not None and b"p" < row < b"t"
    # rows with a long common prefix still split
    long = _tablet({"a": FileMeta(10, 1, 0, b"x" * 40 + b"a", b"x" * 40 + b"z")})
    row = choose_split_row(long)
    assert row is not None and (b"x" * 40 + b"a") <= row < (b"x" * 40 + b"z")
    # cannot split: one row, or nothing
    assert choose_split_row(_tablet({"a": FileMeta(10, 1, 0, b"k", b"k")})) is None
    assert choose_split_row(_tablet({})) is None
    assert choose_split_row(_tablet({"a": FileMeta(10, 1, 0, b"k", b"q")}, prev=b"q")) is None


rows = st.binary(min_size=1, max_size=12)


@given(st.lists(rows, min_size=2, max_size=8), rows, rows)
def test_the_row_line_is_monotone(given_rows: list[bytes], a: bytes, b: bytes) -> None:
    """Rows sort like their positions (rows outside the given ones count as the nearest end)."""
    line = RowLine(given_rows)
    a, b = sorted((a, b))
    assert line.pos(min(given_rows)) <= line.pos(a) <= line.pos(b) <= line.pos(max(given_rows))
    assert line.pos(min(given_rows)) < line.pos(max(given_rows)) or min(given_rows) == max(given_rows)


@given(st.lists(st.tuples(rows, rows, st.integers(1, 10**9)), min_size=1, max_size=6), st.booleans())
def test_a_chosen_split_row_lies_strictly_inside_the_tablet_and_its_data(
    spans: list[tuple[bytes, bytes, int]], bounded: bool
) -> None:
    files = {f"f{i}": FileMeta(size, 1, 0, min(a, b), max(a, b)) for i, (a, b, size) in enumerate(spans)}
    prev, end = (min(min(a, b) for a, b, _ in spans), max(max(a, b) for a, b, _ in spans)) if bounded else (None, None)
    t = _tablet(files, prev, end)
    row = choose_split_row(t)
    if row is None:
        return
    assert row and (prev is None or row > prev) and (end is None or row < end)
    assert min(min(a, b) for a, b, _ in spans) <= row < max(max(a, b) for a, b, _ in spans)


# -- dividing files ------------------------------------------------------------------------------
def test_a_split_divides_each_file_by_the_part_of_its_rows_each_range_covers() -> None:
    t = _tablet({"a": FileMeta(1000, 100, 10, b"a0", b"a9"), "b": FileMeta(50, 5, 0, b"b0", b"b9")})
    parts = split_parts(t, [b"a4", b"a9"])
    assert [(lo, hi) for lo, hi, _ in parts] == [(None, b"a4"), (b"a4", b"a9"), (b"a9", None)]
    (_, _, first), (_, _, second), (_, _, third) = parts
    assert set(first) == {"a"} and set(second) == {"a"} and set(third) == {"b"}  # by rows
    assert first["a"].size + second["a"].size == 1000
    assert 300 < first["a"].size < 600 and first["a"].first_row == b"a0" and first["a"].last_row == b"a9"
    assert third["b"] == FileMeta(50, 5, 0, b"b0", b"b9")  # wholly in one range: all of it


def test_file_shares_sum_to_one_over_the_ranges_it_overlaps() -> None:
    fm = FileMeta(100, 10, 0, b"c", b"x")
    shares = file_shares(fm, [(None, b"a"), (b"a", b"m"), (b"m", b"z"), (b"z", None)])
    assert shares[0] == 0.0 and shares[3] == 0.0 and abs(sum(shares) - 1.0) < 1e-9
    # one row (no span to interpolate over): an equal share of the ranges it can be in
    assert file_shares(FileMeta(100, 10, 0, None, None), [(None, b"m"), (b"m", None)]) == [0.5, 0.5]
    # a small share keeps at least a byte and an entry
    (_, _, tiny), _ = split_parts(_tablet({"a": FileMeta(3, 1, 0, b"a", b"z")}), [b"a\x01"])
    assert tiny["a"].size >= 1 and tiny["a"].entries >= 1


def test_merging_adds_the_shares_up_again() -> None:
    t = _tablet({"a": FileMeta(1000, 100, 10, b"a", b"z"), "b": FileMeta(7, 1, 0, b"q", b"r")})
    parts = split_parts(t, [b"m"])
    group = [_tablet(files, lo, hi, tid=f"1;{i}") for i, (lo, hi, files) in enumerate(parts)]
    merged = merged_files(group)
    assert set(merged) == {"a", "b"}
    assert abs(merged["a"].size - 1000) <= 1 and abs(merged["a"].entries - 100) <= 1
    assert merged["b"] == t.files["b"]
    assert tablet_size(t) == 1007


# -- when a split or merge must wait, or would be unsafe -------------------------------------------
def test_what_blocks_a_split_or_merge() -> None:
    free = _tablet({})
    assert split_blocker(free) is None
    assert split_blocker(_tablet({}, op=SPLIT_PENDING)) is None  # the split it waits for may go
    running = RunningCompaction("E1", "SYSTEM", ("a",), "g", 1, "c", None, 0, "o")
    assert split_blocker(_tablet({}, running={"E1": running})) == "1 compaction(s) running (E1)"
    assert split_blocker(_tablet({}, hold="U1")) == "user compaction U1 pending"
    assert split_blocker(_tablet({}, selection=Selection("U2", "USER", ("a",)))) == (
        "USER compaction U2 has selected files"
    )
    assert split_blocker(_tablet({}, op="merge")) == "operation 'merge' in progress"


def test_a_merge_is_unsafe_when_a_tablet_already_compacted_away_a_shared_file() -> None:
    shared = FileMeta(10, 2, 0, b"a", b"m")
    a = _tablet({"f": shared}, None, b"g", tid="1;67")
    b = _tablet({"g": FileMeta(5, 1, 0, b"h", b"h")}, b"g", None)  # f's rows of B compacted into g
    why = unsafe_merge([a, b])
    assert why is not None and "file f (rows 'a'..'m') is still read by tablet 1;67" in why
    assert unsafe_merge([a, _tablet({"f": shared}, b"g", None)]) is None


def test_rows_in_messages_and_the_threshold() -> None:
    assert show_row(None) == "-inf/+inf"
    assert show_row(b"row1") == "'row1'"
    assert show_row(b"\x00\xff") == "0x00ff"
    assert split_threshold(TableInfo("1", "t", "ONLINE", {})) == 1 << 30
    assert split_threshold(TableInfo("1", "t", "ONLINE", {"table.split.threshold": "64M"})) == 64 << 20
