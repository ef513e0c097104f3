"""Python's sort_key and Arrow's ARROW_SORT_KEYS give the same total order on random keys,
including bytes >= 0x80 (unsigned comparison), empty fields, prefixes, extreme timestamps and
delete markers. (Spark's orderBy is checked against the same order in
tests/integration/test_sort_order_spark.py.)"""

from __future__ import annotations

import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from kompaktor.files.arrowstack import first_unsorted
from kompaktor.files.sortedfile import entries_to_table, table_to_entries
from kompaktor.model.keys import ARROW_SORT_KEYS, INT64_MAX, INT64_MIN, Entry, sort_key

field = st.one_of(
    st.sampled_from([b"", b"\x00", b"\x7f", b"\x80", b"\xff", b"a", b"a\x00", b"\xff\x00"]), st.binary(max_size=4)
)
keys = st.builds(
    lambda r, f, q, v, ts, d: Entry(r, f, q, v, ts, d, b"" if d else b"v"),
    field,
    field,
    field,
    st.sampled_from([b"", b"A", b"\xe9"]),
    st.one_of(st.integers(-3, 3), st.sampled_from([INT64_MIN, INT64_MAX])),
    st.booleans(),
)


@settings(max_examples=300, deadline=None)
@given(es=st.lists(keys, max_size=60))
def test_arrow_sort_matches_python_sort_key(es):
    table = entries_to_table(es)
    by_arrow = list(table_to_entries(table.take(pc.sort_indices(table, sort_keys=ARROW_SORT_KEYS))))
    by_python = sorted(es, key=sort_key)
    assert [sort_key(e) for e in by_arrow] == [sort_key(e) for e in by_python]
    assert first_unsorted(entries_to_table(by_python)) is None


def test_unsigned_bytes_order():
    es = [Entry(r, b"", b"", b"", 0, False, b"") for r in (b"\xff", b"\x80", b"\x7f", b"", b"\x00", b"\x80\x00")]
    table = entries_to_table(es)
    rows = table.take(pc.sort_indices(table, sort_keys=ARROW_SORT_KEYS)).column("row").to_pylist()
    assert rows == [b"", b"\x00", b"\x7f", b"\x80", b"\x80\x00", b"\xff"] == sorted(r.row for r in es)
