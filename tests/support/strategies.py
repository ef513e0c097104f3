"""Hypothesis strategies shared by the property tests of the merge semantics."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

from kompaktor.model.iterators import IteratorSettings


def iterator_settings(
    rows: Sequence[bytes], regexes: Sequence[str], max_ttl: int, max_now: int, none_regex_weight: int = 1
) -> st.SearchStrategy[IteratorSettings]:
    """Iterator settings over small rows: 1–3 versions, full or partial, an age-off TTL up to
    ``max_ttl`` at a time up to ``max_now``, a row regex from ``regexes`` (none ``none_regex_weight``
    times as often as each regex list draw) and row bounds from ``rows``."""
    bounds = st.one_of(st.none(), st.sampled_from(list(rows)))
    return st.builds(
        IteratorSettings,
        max_versions=st.integers(1, 3),
        full=st.booleans(),
        ageoff_ttl_ms=st.one_of(st.none(), st.integers(0, max_ttl)),
        now_ms=st.integers(0, max_now),
        row_regex=st.one_of(*[st.none()] * none_regex_weight, st.sampled_from(list(regexes))),
        row_start=bounds,
        row_end=bounds,
    )
