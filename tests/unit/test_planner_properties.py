"""Property tests of the planner (docs/planner.md §2, §4.6) with hypothesis.

Besides the invariants of §2, the planner is compared with a literal, slow transcription of
§3–§4 below (`reference_plan`): the real planner finds the first productive window in one pass
instead of running §3.4 on every window, and this checks that shortcut changes nothing.
"""

from __future__ import annotations

import random
from bisect import insort
from collections.abc import Mapping, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from kompaktor.policy.planner import (
    OVER_SIZE_MAX,
    OVER_SIZE_MIN,
    SYSTEM_MAX,
    SYSTEM_MIN,
    USER_MAX,
    USER_MIN,
    Kind,
    PlannedJob,
    PlannerSettings,
    Running,
    SizeTier,
    choose_group,
    job_priority,
    plan,
)

Item = tuple[int, int, "str | int"]  # (size, 0, name) or (size, 1, creation number), as §3.1 orders them
Tablet = tuple[Kind, PlannerSettings, dict[str, int], list[str], list[Running]]


# --------------------------------------------------------------------------- literal reference of §3–§4


def ref_best_prefix(window: list[Item], ratio: float) -> list[Item]:
    """§3.4, step by step."""
    good, answer, answer_out = -1, None, 0
    total = window[0][0]
    for c in range(1, len(window)):
        total += window[c][0]
        if float(window[c][0]) * ratio < float(total):
            good = c
        elif good == c - 1:
            if answer is None or answer_out > window[good][0]:
                answer, answer_out = window[: good + 1], total - window[c][0]
            else:
                break
    if good == len(window) - 1 and (answer is None or answer_out > window[-1][0]):
        answer = window
    return answer or []


def ref_limited(items: list[Item], limit: int | None) -> list[Item]:
    """§3.3."""
    ordered = sorted(items)
    if limit is None:
        return ordered
    kept, total = [], 0
    for item in ordered:
        if total + item[0] > limit:
            break
        total += item[0]
        kept.append(item)
    return kept


def ref_find(items: list[Item], ratio: float, max_open: int, limit: int | None) -> list[Item]:
    """§3.5: every window in turn."""
    if len(items) <= 1:
        return []
    limited = ref_limited(items, limit)
    if len(limited) <= 1:
        return []
    w = min(len(limited), max_open)
    for start in range(len(limited) - w + 1):
        found = ref_best_prefix(limited[start : start + w], ratio)
        if found:
            return found
    return []


def ref_lower_ratio(cands: list[Item], limit: int | None, max_open: int, lowest: float) -> list[Item]:
    """§4.4."""
    limited = ref_limited(cands, limit)
    if len(limited) < 2:
        return []
    w = min(len(limited), max_open)
    chosen, best = None, 0.0
    for start in range(len(limited) - w + 1):
        window = limited[start : start + w]
        for i in range(1, w):
            if window[i][0] == 0:
                continue
            needed = sum(item[0] for item in window[: i + 1]) / window[i][0]
            if chosen is None or needed >= best:
                chosen, best = window[: i + 1], needed
    return chosen if chosen is not None and best > lowest else []


def reference_plan(
    kind: Kind, s: PlannerSettings, files: Mapping[str, int], candidates: list[str], running: Sequence[Running]
) -> list[PlannedJob]:
    """§4 makePlan, literally."""
    if not candidates:
        return []
    bounded = [g.max_size for g in s.groups if g.max_size is not None]
    limit = max(bounded) if kind == Kind.SYSTEM and len(bounded) == len(s.groups) else None
    cands: list[Item] = sorted((files[name], 0, name) for name in candidates)
    work = list(cands)
    created = 0
    for r in running:
        if r.kind == kind:
            work.append((sum(files[f] for f in r.files), 1, created))
            created += 1
    jobs: list[list[Item]] = []
    while True:
        chosen = ref_find(work, s.ratio, s.max_open, limit)
        if not chosen:
            break
        if not any(item[1] for item in chosen):
            jobs.append(chosen)
        for item in chosen:
            work.remove(item)
        work.append((sum(item[0] for item in chosen), 1, created))
        created += 1
        if len(chosen) < s.max_open and jobs:
            break
    same_kind_running = any(r.kind == kind for r in running)
    if kind != Kind.SYSTEM and len(jobs) == 1 and len(jobs[0]) < len(cands) <= s.max_open:
        after = [item for item in cands if item not in jobs[0]]
        insort(after, (sum(item[0] for item in jobs[0]), 1, 0))
        if not ref_find(after, s.ratio, s.max_open, None):
            jobs[0] = cands
    if not jobs:
        if kind != Kind.SYSTEM and not same_kind_running:
            n, m = len(cands), s.max_open
            if n <= m:
                jobs = [cands]
            elif n // m - 1 > 0:
                jobs = [cands[i * m : (i + 1) * m] for i in range(n // m - 1)]
            else:
                jobs = [cands[: n - m + 1]]
        elif kind == Kind.SYSTEM and not running and len(files) == len(cands) and len(files) > s.resolved_max_files:
            lower = ref_lower_ratio(cands, limit, s.max_open, s.lowest_ratio)
            jobs = [lower] if lower else []
    return [
        PlannedJob(
            kind,
            choose_group(s.groups, sum(item[0] for item in job)),
            job_priority(kind, len(files), len(job), s.resolved_max_files),
            tuple(str(item[2]) for item in job),
        )
        for job in jobs
    ]


# --------------------------------------------------------------------------- strategies

SIZES = st.one_of(
    st.sampled_from([0, 1, 2, 3, 4, 5, 8, 10, 11, 16, 17, 33, 99, 100, 1000]),
    st.integers(min_value=0, max_value=10**6),
    st.integers(min_value=90, max_value=110),  # a cluster of similar sizes, which meets ratios
)
NAMES = st.text(alphabet="abcXY_.0", min_size=1, max_size=4)


@st.composite
def planner_settings(draw: st.DrawFn) -> PlannerSettings:
    n_groups = draw(st.integers(1, 3))
    max_sizes: list[int | None] = draw(
        st.lists(st.integers(1, 3000), min_size=n_groups, max_size=n_groups, unique=True)
    )
    if draw(st.booleans()):
        max_sizes[draw(st.integers(0, n_groups - 1))] = None
    return PlannerSettings(
        ratio=draw(st.sampled_from([1, 1.1, 1.5, 2, 2.5, 3, 4, 10])),
        max_open=draw(st.integers(2, 12)),
        max_files_per_tablet=draw(st.integers(-1, 20)),
        lowest_ratio=draw(st.sampled_from([1, 1.05, 1.1, 1.5, 2])),
        groups=tuple(SizeTier(f"g{i}", size) for i, size in enumerate(max_sizes)),
    )


@st.composite
def tablets(draw: st.DrawFn) -> Tablet:
    kind = draw(st.sampled_from(list(Kind)))
    s = draw(planner_settings())
    everything = draw(st.booleans())
    files = draw(st.dictionaries(NAMES, SIZES, min_size=8 if everything else 0, max_size=30))
    names = sorted(files)
    if everything:
        # Every file is a candidate and nothing runs: reaches the forced sets and lower-ratio search.
        return kind, s, files, names, []
    # Each file is a candidate (-1), idle (-2) or in running job 0..3.
    roles = draw(st.lists(st.integers(-2, 3), min_size=len(names), max_size=len(names)))
    kinds = draw(st.lists(st.sampled_from(list(Kind)), min_size=4, max_size=4))
    candidates = [name for name, role in zip(names, roles, strict=True) if role == -1]
    running = [
        Running(kinds[j], tuple(name for name, role in zip(names, roles, strict=True) if role == j)) for j in range(4)
    ]
    return kind, s, files, candidates, [r for r in running if r.files]


# --------------------------------------------------------------------------- properties


@settings(max_examples=400, deadline=None)
@given(tablets())
def test_matches_literal_reference(tablet: Tablet) -> None:
    kind, s, files, candidates, running = tablet
    assert plan(kind, s, files, candidates, running) == reference_plan(kind, s, files, candidates, running)


@settings(max_examples=300, deadline=None)
@given(tablets())
def test_jobs_are_disjoint_subsets_within_bounds(
    tablet: Tablet,
) -> None:
    kind, s, files, candidates, running = tablet
    jobs = plan(kind, s, files, candidates, running)
    seen: set[str] = set()
    group_names = {g.name for g in s.groups}
    bounded = [g.max_size for g in s.groups if g.max_size is not None]
    over_size = len(files) > s.resolved_max_files
    for job in jobs:
        assert job.kind is kind
        assert 1 <= len(job.files) <= s.max_open
        assert set(job.files) <= set(candidates)
        assert seen.isdisjoint(job.files)
        seen.update(job.files)
        assert list(job.files) == sorted(job.files, key=lambda name: (files[name], name))
        assert job.group in group_names
        if kind is Kind.SYSTEM and len(bounded) == len(s.groups):
            assert sum(files[name] for name in job.files) <= max(bounded)
        if kind is Kind.USER:
            assert USER_MIN <= job.priority <= USER_MAX
        elif over_size:
            assert OVER_SIZE_MIN <= job.priority <= OVER_SIZE_MAX
        else:
            assert SYSTEM_MIN <= job.priority <= SYSTEM_MAX


@settings(max_examples=300, deadline=None)
@given(tablets(), st.randoms(use_true_random=False))
def test_deterministic_under_permutation(tablet: Tablet, rnd: random.Random) -> None:
    kind, s, files, candidates, running = tablet
    expected = plan(kind, s, files, candidates, running)
    items = list(files.items())
    rnd.shuffle(items)
    shuffled_candidates = list(candidates)
    rnd.shuffle(shuffled_candidates)
    shuffled_running = [Running(r.kind, tuple(rnd.sample(r.files, len(r.files)))) for r in running]
    rnd.shuffle(shuffled_running)
    assert plan(kind, s, dict(items), shuffled_candidates, shuffled_running) == expected
    assert plan(kind, s, dict(items), iter(shuffled_candidates), tuple(shuffled_running)) == expected


@given(
    st.sampled_from(list(Kind)),
    st.integers(0, 10**6),
    st.integers(1, 10**4),
    st.integers(-5, 10**5),
)
def test_priority_ranges(kind: Kind, total: int, job_files: int, max_files: int) -> None:
    priority = job_priority(kind, total, job_files, max_files)
    resolved = max_files if max_files > 0 else 99
    if kind is Kind.USER:
        assert USER_MIN <= priority <= USER_MAX
    elif total > resolved:
        assert OVER_SIZE_MIN <= priority <= OVER_SIZE_MAX
    else:
        assert SYSTEM_MIN <= priority <= SYSTEM_MAX
    assert -(2**15) <= priority < 2**15
