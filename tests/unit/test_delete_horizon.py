"""The delete horizon's pure parts (issue 33 §1): timestamp tokens compare as the timestamps do
(the metadata's Lua compares tokens, never doubles), files keep their timestamp bounds through
JSON, a split and a merge, the refusal names the table, the tablet, the horizon and the way out,
``--set-time`` keeps each key's newest entry across batch boundaries, and the table property is
checked."""

from __future__ import annotations

import itertools
import re

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kompaktor.files.settime import TimeSetter
from kompaktor.files.sortedfile import entries_to_table, table_to_entries, ts_bounds
from kompaktor.model.errors import UnsortedError
from kompaktor.model.keys import Entry, sort_key
from kompaktor.model.tablet import TS_MAX, TS_MIN, FileMeta, Tablet, ts_from_token, ts_token
from kompaktor.policy.deletes import oldest_put, refusal, set_time_for
from kompaktor.policy.splits import file_part, merged_files
from kompaktor.policy.tableprops import DELETE_SEMANTICS, keeps_deletes, validate_props

INT64 = st.integers(TS_MIN, TS_MAX)


@given(INT64, INT64)
def test_tokens_compare_as_the_timestamps(a: int, b: int) -> None:
    assert (ts_token(a) < ts_token(b)) == (a < b)
    assert (ts_token(a) == ts_token(b)) == (a == b)
    assert len(ts_token(a)) == 20 and ts_from_token(ts_token(a)) == a


def test_a_timestamp_outside_int64_is_refused() -> None:
    with pytest.raises(ValueError, match="outside int64"):
        ts_token(TS_MAX + 1)


@given(st.one_of(st.none(), INT64), st.one_of(st.none(), INT64))
def test_file_bounds_survive_json_split_and_merge(put_min: int | None, del_max: int | None) -> None:
    fm = FileMeta(100, 10, 2, b"a", b"z", put_min, del_max)
    assert FileMeta.from_json(fm.to_json()) == fm
    part = file_part(fm, 0.5)
    assert (part.put_min, part.del_max) == (put_min, del_max)
    t = tablet(None, b"m", {"f": part})
    u = tablet(b"m", None, {"f": part})
    merged = merged_files([t, u])["f"]
    assert (merged.put_min, merged.del_max, merged.entries) == (put_min, del_max, 10)


def tablet(prev: bytes | None, end: bytes | None, files: dict[str, FileMeta], horizon: int | None = None) -> Tablet:
    return Tablet(f"t;{end.hex() if end else '~'}", "t", prev, end, files, {}, None, None, None, 1, horizon)


def test_refusal_names_table_tablet_horizon_and_the_ways_out() -> None:
    t = tablet(b"c", b"m", {}, horizon=500)
    why = refusal("users", t, {"tables/t/I0000000009.parquet": FileMeta(1, 1, 0, b"d", b"e", 499)})
    assert why is not None and "\n" not in why
    for part in ("'users'", "('c', 'm']", "500", "I0000000009", "499", "--set-time", "table.delete.semantics=accumulo"):
        assert part in why
    assert refusal("users", t, {"f": FileMeta(1, 1, 0, b"d", b"e", 501)}) is None
    assert refusal("users", t, {"f": FileMeta(1, 1, 0, b"d", b"e", 500)}) is not None  # same time: hidden
    assert refusal("users", tablet(None, None, {}), {"f": FileMeta(1, 1, 0, b"d", b"e", 1)}) is None
    # a bound not recorded counts as the oldest possible put
    assert refusal("users", t, {"f": FileMeta(1, 1)}) is not None
    assert oldest_put([FileMeta(1, 1, 0, None, None, 7), FileMeta(1, 1)]) == TS_MIN


def test_set_time_is_after_every_horizon() -> None:
    ts = [tablet(None, b"m", {}, horizon=10), tablet(b"m", None, {}, horizon=5_000)]
    assert set_time_for(ts, 1_000) == 5_001
    assert set_time_for(ts, 9_000) == 9_000
    assert set_time_for([], 9_000) == 9_000


def E(row: bytes, ts: int, deleted: bool = False, cq: bytes = b"q") -> Entry:
    return Entry(row, b"f", cq, b"", ts, deleted, b"" if deleted else b"%s@%d" % (row, ts))


def test_ts_bounds() -> None:
    t = entries_to_table([E(b"a", 9), E(b"a", 4, True), E(b"b", 3), E(b"c", 8, True)])
    assert ts_bounds(t) == (3, 8)
    assert ts_bounds(entries_to_table([E(b"a", 4, True)])) == (TS_MAX, 4)


def set_time(batches: list[list[Entry]], stamp: int) -> list[Entry]:
    s = TimeSetter(stamp, "in.parquet")
    out: list[Entry] = []
    for b in batches:
        out.extend(table_to_entries(s.feed(entries_to_table(b))))
    rest = s.finish()
    if rest is not None:
        out.extend(table_to_entries(rest))
    return out


ENTRIES = st.lists(
    st.builds(E, st.sampled_from([b"a", b"b", b"c"]), st.integers(1, 9), st.booleans(), st.sampled_from([b"x", b"y"])),
    max_size=30,
)


@given(ENTRIES, st.lists(st.integers(0, 30), max_size=4))
def test_set_time_keeps_each_keys_newest_entry_across_batches(entries: list[Entry], cuts: list[int]) -> None:
    entries = sorted(entries, key=sort_key)
    bounds = [0, *sorted(min(c, len(entries)) for c in cuts), len(entries)]
    batches = [entries[a:b] for a, b in itertools.pairwise(bounds)]
    got = set_time(batches, 77)
    newest: dict[tuple[bytes, bytes], Entry] = {}
    for e in entries:  # key order: the first entry of a key is its newest
        newest.setdefault((e.row, e.cq), e)
    assert got == [e._replace(ts=77) for e in newest.values()]


def test_set_time_refuses_unsorted_input_across_batches() -> None:
    s = TimeSetter(5, "in.parquet")
    s.feed(entries_to_table([E(b"b", 1)]))
    with pytest.raises(UnsortedError, match=re.escape("in.parquet: entries are not in key order at row 1")):
        s.feed(entries_to_table([E(b"a", 1)]))


def test_set_time_of_nothing() -> None:
    assert TimeSetter(5, "x").finish() is None
    assert TimeSetter(5, "x").feed(entries_to_table([])).num_rows == 0
    assert isinstance(entries_to_table([]), pa.Table)


def test_delete_semantics_property() -> None:
    validate_props({DELETE_SEMANTICS: "accumulo"})
    validate_props({DELETE_SEMANTICS: "kompaktor"})
    with pytest.raises(ValueError, match=re.escape("table.delete.semantics='lax': must be one of kompaktor, accumulo")):
        validate_props({DELETE_SEMANTICS: "lax"})
    assert keeps_deletes({}) and keeps_deletes({DELETE_SEMANTICS: "kompaktor"})
    assert not keeps_deletes({DELETE_SEMANTICS: "accumulo"})
