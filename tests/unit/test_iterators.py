"""Merge semantics (kompaktor.model.iterators): versions, delete markers, partial compactions, filters.
Hand-written examples plus a hypothesis comparison with a brute-force model written here from
the rules in docs/architecture.md / the module docstring (not from the implementation)."""

from __future__ import annotations

import re
from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kompaktor.model.iterators import SCAN, IteratorSettings, apply_stack, merge_sources, merged_view
from kompaktor.model.keys import Entry, is_sorted, sort_key
from tests.support.strategies import iterator_settings


def put(row: bytes, ts: int, value: bytes = b"", cf: bytes = b"f", cq: bytes = b"q", vis: bytes = b"") -> Entry:
    return Entry(row, cf, cq, vis, ts, False, value or b"v%d" % ts)


def delete(row: bytes, ts: int, cf: bytes = b"f", cq: bytes = b"q", vis: bytes = b"") -> Entry:
    return Entry(row, cf, cq, vis, ts, True, b"")


def view(*sources: list[Entry], **kw) -> list[Entry]:
    return list(merged_view([sorted(s, key=sort_key) for s in sources], IteratorSettings(**kw)))


# -- examples -----------------------------------------------------------------------------------
def test_newest_version_wins_by_default() -> None:
    assert view([put(b"r", 1), put(b"r", 3)], [put(b"r", 2)]) == [put(b"r", 3)]


def test_max_versions_keeps_the_newest_n() -> None:
    src = [put(b"r", t) for t in range(5)]
    assert view(src, max_versions=3) == [put(b"r", 4), put(b"r", 3), put(b"r", 2)]
    assert view(src, max_versions=10) == sorted(src, key=sort_key)


def test_versions_are_per_column_key() -> None:
    src = [put(b"r", 1, cq=b"a"), put(b"r", 2, cq=b"a"), put(b"r", 1, cq=b"b"), put(b"r", 1, vis=b"x")]
    assert view(src) == [put(b"r", 2, cq=b"a"), put(b"r", 1, cq=b"b"), put(b"r", 1, vis=b"x")]


def test_identical_keys_newest_source_wins() -> None:
    old, new = put(b"r", 5, b"old"), put(b"r", 5, b"new")
    assert view([old], [new]) == [new]
    assert view([old], [new], max_versions=2) == [new, old]
    assert list(merge_sources([[old], [new]])) == [new, old]


def test_delete_hides_older_and_same_timestamp_but_not_newer() -> None:
    src = [put(b"r", 9), put(b"r", 5), put(b"r", 4)]
    assert view(src, [delete(b"r", 5)], max_versions=5) == [put(b"r", 9)]
    # a put with exactly the marker's timestamp is hidden, whichever source it is in
    assert view([delete(b"r", 5)], [put(b"r", 5)]) == []
    assert view([put(b"r", 5)], [delete(b"r", 5)]) == []


def test_delete_only_hides_its_own_column_key() -> None:
    src = [put(b"r", 1, cq=b"a"), put(b"r", 1, cq=b"b"), put(b"s", 1, cq=b"a")]
    assert view(src, [delete(b"r", 2, cq=b"a")]) == [put(b"r", 1, cq=b"b"), put(b"s", 1, cq=b"a")]


def test_scan_and_full_compaction_drop_markers_partial_keeps_the_newest() -> None:
    src = [delete(b"r", 7), delete(b"r", 3), put(b"r", 2), put(b"s", 1)]
    assert view(src) == [put(b"s", 1)]
    assert view(src, full=False) == [delete(b"r", 7), put(b"s", 1)]
    # an older marker in a newer source is still hidden by the newest marker
    assert view([delete(b"r", 7)], [delete(b"r", 3)], full=False) == [delete(b"r", 7)]
    # puts newer than the marker survive alongside it
    assert view([put(b"r", 8), delete(b"r", 7), put(b"r", 6)], full=False, max_versions=3) == [
        put(b"r", 8),
        delete(b"r", 7),
    ]


def test_ageoff_drops_old_puts_but_not_markers() -> None:
    s = dict(ageoff_ttl_ms=100, now_ms=1000)  # cutoff 900: ts < 900 goes
    src = [put(b"r", 950), put(b"r", 900), put(b"r", 899), put(b"s", 1)]
    assert view(src, max_versions=5, **s) == [put(b"r", 950), put(b"r", 900)]
    assert view([delete(b"r", 10)], full=False, **s) == [delete(b"r", 10)]
    assert IteratorSettings(**s).ageoff_cutoff == 900


def test_ageoff_does_not_resurrect_older_versions() -> None:
    # the aged-off newest version does not count, the older one is aged off too
    assert view([put(b"r", 50), put(b"r", 40)], ageoff_ttl_ms=10, now_ms=100) == []


def test_row_filters() -> None:
    src = [put(b"a", 1), put(b"b1", 1), put(b"b2", 1), put(b"c", 1), put(b"\xff", 1)]
    assert view(src, row_regex="^b") == [put(b"a", 1), put(b"c", 1), put(b"\xff", 1)]
    assert view(src, row_start=b"b", row_end=b"c") == [put(b"a", 1), put(b"c", 1), put(b"\xff", 1)]
    assert view(src, row_start=b"c") == [put(b"a", 1), put(b"b1", 1), put(b"b2", 1)]
    assert view(src, row_end=b"b2") == [put(b"b2", 1), put(b"c", 1), put(b"\xff", 1)]
    # markers are not filtered: a partial compaction must still carry them
    assert view([delete(b"b1", 1)], row_regex="^b", full=False) == [delete(b"b1", 1)]


def test_settings_validation_and_json_round_trip() -> None:
    with pytest.raises(ValueError, match="max_versions"):
        IteratorSettings(max_versions=0)
    with pytest.raises(ValueError, match="ttl"):
        IteratorSettings(ageoff_ttl_ms=-1)
    with pytest.raises(ValueError, match="regex"):
        IteratorSettings(row_regex="(")
    s = IteratorSettings(
        max_versions=3, full=False, ageoff_ttl_ms=5, now_ms=9, row_regex="x+", row_start=b"\x80", row_end=b"\xff\x00"
    )
    assert IteratorSettings.from_json(s.to_json()) == s
    assert IteratorSettings.from_json({}) == SCAN


def test_empty_sources() -> None:
    assert view() == []
    assert view([], []) == []


# -- property test against a brute-force model --------------------------------------------------
def model(sources: list[list[Entry]], s: IteratorSettings) -> list[Entry]:
    """The rules, applied the slow way: group by column key, then decide each group at once."""
    groups: dict[tuple, list[tuple[int, int, Entry]]] = defaultdict(list)
    for si, src in enumerate(sources):
        for pos, e in enumerate(src):
            groups[e.column_key].append((si, pos, e))
    cutoff = None if s.ageoff_ttl_ms is None else s.now_ms - s.ageoff_ttl_ms

    def row_dropped(row: bytes) -> bool:
        if s.row_regex is not None and re.search(s.row_regex.encode(), row):
            return True
        if s.row_start is None and s.row_end is None:
            return False
        return (s.row_start is None or row >= s.row_start) and (s.row_end is None or row < s.row_end)

    out: list[Entry] = []
    for ck in sorted(groups):
        items = groups[ck]
        markers = [(si, pos, e) for si, pos, e in items if e.deleted]
        puts = [(si, pos, e) for si, pos, e in items if not e.deleted]
        newest_marker = None
        if markers:
            # newest timestamp; for equal timestamps the newest source; within a source its first
            newest_marker = min(markers, key=lambda t: (-t[2].ts, -t[0], t[1]))[2]
            puts = [t for t in puts if t[2].ts > newest_marker.ts]
        puts = [t for t in puts if cutoff is None or t[2].ts >= cutoff]
        puts = [t for t in puts if not row_dropped(t[2].row)]
        puts.sort(key=lambda t: (-t[2].ts, -t[0], t[1]))
        out.extend(e for _, _, e in puts[: s.max_versions])
        if newest_marker is not None and not s.full:
            out.append(newest_marker)
    return out


ROWS = [b"", b"a", b"b", b"\x80", b"\xff", b"a\x00"]
small_entry = st.builds(
    Entry,
    st.sampled_from(ROWS),
    st.sampled_from([b"", b"f"]),
    st.sampled_from([b"q", b"\x90"]),
    st.sampled_from([b"", b"x"]),
    st.integers(-2, 4),
    st.booleans(),
    st.binary(max_size=2),
)
sources_st = st.lists(st.lists(small_entry, max_size=12).map(lambda es: sorted(es, key=sort_key)), max_size=4)
settings_st = iterator_settings(ROWS, ["^a", "\\x80", "^$", "b|\\xff"], max_ttl=4, max_now=6)


def tag(sources: list[list[Entry]]) -> list[list[Entry]]:
    """Make every entry distinguishable (value = source, position) so the comparison also checks
    *which* of several identical keys was kept."""
    return [
        [e._replace(value=bytes([si, pos]) + e.value) for pos, e in enumerate(src)] for si, src in enumerate(sources)
    ]


@settings(max_examples=300, deadline=None)
@given(sources_st, settings_st)
def test_merged_view_matches_model(sources: list[list[Entry]], s: IteratorSettings) -> None:
    sources = tag(sources)
    got = list(merged_view(sources, s))
    assert got == model(sources, s)
    assert is_sorted(got)


@settings(max_examples=100, deadline=None)
@given(sources_st)
def test_merge_sources_is_a_stable_sorted_union(sources: list[list[Entry]]) -> None:
    sources = tag(sources)
    merged = list(merge_sources(sources))
    assert sorted(merged) == sorted(e for src in sources for e in src)
    assert is_sorted(merged)


@settings(max_examples=100, deadline=None)
@given(sources_st, st.integers(1, 3))
def test_partial_then_full_equals_full(sources: list[list[Entry]], versions: int) -> None:
    """Compacting the newest files partially (keeping markers), then everything fully, gives what
    one full compaction gives: markers kept by a partial compaction still hide older files."""
    sources = tag(sources)
    full = IteratorSettings(max_versions=versions)
    k = len(sources) // 2
    partial = list(merged_view(sources[k:], IteratorSettings(max_versions=versions, full=False)))
    assert list(merged_view([*sources[:k], partial], full)) == list(merged_view(sources, full))


def test_apply_stack_on_already_merged_input() -> None:
    merged = sorted([put(b"r", 2), put(b"r", 1), delete(b"s", 1), put(b"s", 1)], key=sort_key)
    assert list(apply_stack(merged)) == [put(b"r", 2)]
