"""A Spark write's task cuts its sorted runs at the table's tablet splits (issue 44): one file per
tablet a run touches, so that no file is listed by two tablets and a write into a table of one
tablet may still be spread over many tasks. Checked against a reference written here: a row
belongs to the tablet whose range ``(prev, end]`` holds it."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from kompaktor.spark.staged import at_splits

rows_st = st.lists(st.binary(max_size=3), max_size=40).map(sorted)
splits_st = st.lists(st.binary(min_size=1, max_size=3), max_size=6, unique=True).map(sorted)


def tablet_of(row: bytes, splits: list[bytes]) -> int:
    """The reference: the first tablet whose end is at or after ``row``."""
    return next((i for i, s in enumerate(splits) if row <= s), len(splits))


@given(rows=rows_st, splits=splits_st)
def test_every_piece_is_one_tablet_and_the_pieces_are_the_run(rows: list[bytes], splits: list[bytes]) -> None:
    run = pa.table({"row": pa.array(rows, pa.binary()), "n": pa.array(range(len(rows)), pa.int64())})
    pieces = list(at_splits(run, splits))
    assert all(p.num_rows for p in pieces)
    assert [n for p in pieces for n in p.column("n").to_pylist()] == list(range(len(rows)))
    tablets = [{tablet_of(r, splits) for r in p.column("row").to_pylist()} for p in pieces]
    assert all(len(t) == 1 for t in tablets)
    assert [t.pop() for t in tablets] == sorted({tablet_of(r, splits) for r in rows})


def test_a_row_equal_to_a_split_ends_that_tablet() -> None:
    run = pa.table({"row": pa.array([b"a", b"m", b"m", b"n", b"z"], pa.binary())})
    pieces = [p.column("row").to_pylist() for p in at_splits(run, [b"b", b"m", b"y"])]
    assert pieces == [[b"a"], [b"m", b"m"], [b"n"], [b"z"]]
