"""The one key order (issue 3 §2): Python's sort_key and Arrow's sort with ARROW_SORT_KEYS agree,
including bytes >= 0x80, empty fields, extreme timestamps and delete markers.
(The Spark leg lives in test_sort_order.py.)"""

from __future__ import annotations

import itertools

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from kompaktor.files.sortedfile import entries_to_table, table_to_entries
from kompaktor.model.keys import (
    ARROW_SORT_KEYS,
    INT64_MAX,
    INT64_MIN,
    Entry,
    decode_row,
    encode_row,
    is_sorted,
    row_in_range,
    sort_key,
    span_overlaps,
)
from kompaktor.model.tablet import end_token

# Few distinct short values so equal prefixes, equal keys and ties are common; plus arbitrary bytes.
field = st.one_of(
    st.sampled_from([b"", b"\x00", b"\x7f", b"\x80", b"\xff", b"a", b"a\x00", b"a\xff", b"\xff\x00"]),
    st.binary(max_size=4),
)
stamp = st.one_of(
    st.sampled_from([INT64_MIN, -1, 0, 1, INT64_MAX]), st.integers(INT64_MIN, INT64_MAX), st.integers(-3, 3)
)
entry = st.builds(Entry, field, field, field, field, stamp, st.booleans(), st.binary(max_size=3))


def arrow_order(entries: list[Entry]) -> list[tuple]:
    table = entries_to_table(entries)
    idx = pc.sort_indices(table, sort_keys=ARROW_SORT_KEYS).to_pylist()
    return [sort_key(entries[i]) for i in idx]


@settings(max_examples=200, deadline=None)
@given(st.lists(entry, max_size=60))
def test_python_and_arrow_sort_agree(entries: list[Entry]) -> None:
    python = [sort_key(e) for e in sorted(entries, key=sort_key)]
    assert arrow_order(entries) == python
    # Table.sort_by, the other Arrow entry point, too.
    by = entries_to_table(entries).sort_by(ARROW_SORT_KEYS)
    assert [sort_key(e) for e in table_to_entries(by)] == python
    assert is_sorted(sorted(entries, key=sort_key))


@settings(max_examples=100, deadline=None)
@given(st.lists(entry, min_size=2, max_size=30))
def test_is_sorted_matches_sorting(entries: list[Entry]) -> None:
    keys = [sort_key(e) for e in entries]
    assert is_sorted(entries) == (keys == sorted(keys))


def test_order_rules_by_example() -> None:
    def e(row=b"r", cf=b"", cq=b"", vis=b"", ts=0, deleted=False):
        return Entry(row, cf, cq, vis, ts, deleted, b"")

    expected = [
        e(row=b""),  # empty row first
        e(row=b"\x00"),
        e(row=b"r", cf=b"", ts=5),
        e(row=b"r", cf=b"a", ts=INT64_MAX),  # family before timestamp
        e(row=b"r", cf=b"a", cq=b"q", vis=b"", ts=INT64_MAX),
        e(row=b"r", cf=b"a", cq=b"q", vis=b"\x80", ts=9, deleted=True),  # delete marker first ...
        e(row=b"r", cf=b"a", cq=b"q", vis=b"\x80", ts=9),  # ... for the same key and timestamp
        e(row=b"r", cf=b"a", cq=b"q", vis=b"\x80", ts=0),  # newest first
        e(row=b"r", cf=b"a", cq=b"q", vis=b"\x80", ts=-1),
        e(row=b"r", cf=b"a", cq=b"q", vis=b"\x80", ts=INT64_MIN),
        e(row=b"\x7f"),
        e(row=b"\x80"),  # unsigned: 0x80 after 0x7f
        e(row=b"\xff"),
        e(row=b"\xff\x00"),  # a prefix sorts before its extensions
    ]
    shuffled = expected[::2] + expected[1::2]
    assert sorted(shuffled, key=sort_key) == expected
    assert arrow_order(shuffled) == [sort_key(x) for x in expected]


def test_arrow_sort_keys_cover_the_schema() -> None:
    assert [c for c, _ in ARROW_SORT_KEYS] == ["row", "cf", "cq", "vis", "ts", "deleted"]
    t = entries_to_table([])
    assert t.schema.field("row").type == pa.binary()


@given(st.binary(max_size=6), st.binary(max_size=6))
def test_row_encoding_round_trips_and_keeps_order(a: bytes, b: bytes) -> None:
    assert decode_row(encode_row(a)) == a
    assert (encode_row(a) < encode_row(b)) == (a < b)
    # tablet ids (end tokens) sort like their end rows, and the last tablet ("~") after every row
    assert (end_token(a) < end_token(b)) == (a < b)
    assert end_token(a) < end_token(None)
    assert encode_row(None) is None and decode_row(None) is None


@given(st.binary(max_size=3), st.one_of(st.none(), st.binary(max_size=3)), st.one_of(st.none(), st.binary(max_size=3)))
def test_row_in_range_is_exclusive_start_inclusive_end(row: bytes, prev: bytes | None, end: bytes | None) -> None:
    expected = (prev is None or row > prev) and (end is None or row <= end)
    assert row_in_range(row, prev, end) == expected
    if end is not None:
        assert row_in_range(end, prev, end) == (prev is None or end > prev)
    if prev is not None:
        assert not row_in_range(prev, prev, end)


_SMALL = st.one_of(st.none(), st.lists(st.integers(0, 3), max_size=2).map(bytes))
#: every row of up to 3 bytes from 0..4: a row lies between (and beyond) any two _SMALL values
_ROWS = [bytes(t) for n in range(4) for t in itertools.product(range(5), repeat=n)]


@given(_SMALL, _SMALL, _SMALL, _SMALL)
def test_span_overlaps_means_some_row_of_the_span_is_in_the_range(first, last, prev, end) -> None:
    """span_overlaps is the one overlap rule: true exactly when a row in [first, last] (None =
    unbounded on that side) lies in (prev, end], for every non-empty span and range."""
    if (first is not None and last is not None and first > last) or (
        prev is not None and end is not None and prev >= end
    ):
        return
    inside = any(
        (first is None or r >= first) and (last is None or r <= last) and row_in_range(r, prev, end) for r in _ROWS
    )
    assert span_overlaps(first, last, prev, end) == inside
