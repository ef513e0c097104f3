"""Table-driven tests of the planner (docs/planner.md §2–§5, §7) and the too-many-deletes selector.

Every example docs/planner.md gives is here, named after its section. Files are written with a tiny
DSL in the spirit of Accumulo's ``createCFs("F1", "100M", ...)``: ``tablet("a=33M", "b=1K", "c=7")``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest

from kompaktor.policy.planner import (
    OVER_SIZE_MAX,
    OVER_SIZE_MIN,
    SYSTEM_MAX,
    SYSTEM_MIN,
    USER_MAX,
    USER_MIN,
    Kind,
    PlannedJob,
    PlannerConfigError,
    PlannerSettings,
    Running,
    SizeTier,
    choose_group,
    default_candidates,
    job_priority,
    plan,
)
from kompaktor.policy.selectors import FileStats, too_many_deletes
from kompaktor.policy.sizes import parse_accumulo_size

M = 1 << 20
SYSTEM, USER, SELECTOR = Kind.SYSTEM, Kind.USER, Kind.SELECTOR
DOC_GROUPS = (SizeTier("small", 100 * M), SizeTier("medium", 500 * M), SizeTier("large"))  # Accumulo's doc comment


def tablet(*specs: str) -> dict[str, int]:
    """``tablet("a=33M", "b=7")`` -> {"a": 34603008, "b": 7} (Accumulo-style sizes)."""
    files: dict[str, int] = {}
    for spec in specs:
        name, size = spec.split("=")
        files[name] = parse_accumulo_size(size)
    return files


def numbered(prefix: str, sizes: list[int]) -> dict[str, int]:
    """Files ``prefix00``, ``prefix01``, ... with the given sizes."""
    return {f"{prefix}{i:02d}": size for i, size in enumerate(sizes)}


@dataclass(frozen=True)
class Case:
    """One planning call and its expected jobs as (group, priority, files) or just files."""

    id: str
    kind: Kind
    files: dict[str, int]
    expected: list[tuple[str, ...]]
    settings: PlannerSettings = field(default_factory=PlannerSettings)
    candidates: tuple[str, ...] | None = None  # None: every file
    running: tuple[Running, ...] = ()
    groups_priorities: list[tuple[str, int]] | None = None


def run_case(case: Case) -> list[PlannedJob]:
    candidates = list(case.files) if case.candidates is None else list(case.candidates)
    return plan(case.kind, case.settings, case.files, candidates, case.running)


# --------------------------------------------------------------------------- §3.2 ratio test

RATIO_CASES = [
    # §3.2 example: at r = 3, {17M, 11M, 11M, 11M} fails (51M < 50M is false) ...
    Case("3.2-17M-fails", SYSTEM, tablet("a=17M", "b=11M", "c=11M", "d=11M"), []),
    # ... while {16M, 11M, 11M, 11M} meets it (48M < 49M).
    Case(
        "3.2-16M-meets",
        SYSTEM,
        tablet("a=16M", "b=11M", "c=11M", "d=11M"),
        [("b", "c", "d", "a")],
        groups_priorities=[("default", SYSTEM_MIN + 4 + 4)],
    ),
    # The test is strict: largest * r == sum fails.
    Case("strict-equal-fails", SYSTEM, tablet("a=3", "b=3", "c=3"), []),
    Case("strict-r2-equal-fails", SYSTEM, tablet("a=1", "b=1"), [], PlannerSettings(ratio=2)),
    Case("r1-two-equal-meets", SYSTEM, tablet("a=1", "b=1"), [("a", "b")], PlannerSettings(ratio=1)),
    Case("one-file-nothing", SYSTEM, tablet("a=1"), []),
    # Zero-size files: 0 * r < 0 is false, so a tablet of empty files never meets the ratio.
    Case("zero-sizes", SYSTEM, tablet("a=0", "b=0", "c=0"), []),
    Case("zeros-then-one", SYSTEM, tablet("a=0", "b=0", "c=1"), []),  # 3 < 1 false
    Case("zeros-then-one-r1", SYSTEM, tablet("a=0", "b=1", "c=1"), [("a", "b", "c")], PlannerSettings(ratio=1)),
]


# --------------------------------------------------------------------------- §3.1, §3.4, §3.5

FIND_CASES = [
    # §3.4 example without the 100M file: the four 33M files.
    Case("3.4-four-33M", SYSTEM, tablet("a=33M", "b=33M", "c=33M", "d=33M", "e=99M"), [("a", "b", "c", "d")]),
    # §3.4 example: [33M x4, 99M, 100M] at r = 3 -> the whole set, because 132M > 100M.
    Case(
        "3.4-whole-set",
        SYSTEM,
        tablet("f1=100M", "f2=99M", "f3=33M", "f4=33M", "f5=33M", "f6=33M"),
        [("f3", "f4", "f5", "f6", "f2", "f1")],
        PlannerSettings(groups=DOC_GROUPS),
        groups_priorities=[("medium", -32756)],
    ),
    # The bigger set loses when the small set's output (4) is not greater than its largest (5).
    Case(
        "3.4-small-set-kept",
        SYSTEM,
        numbered("f", [1, 1, 1, 1, 5, 5, 5, 5, 5]),
        [("f00", "f01", "f02", "f03")],
    ),
    # A second ended run is compared with the answer: 4 > 5 is false, so the scan stops.
    Case(
        "3.4-stop-scan",
        SYSTEM,
        numbered("f", [1, 1, 1, 1, 5, 5, 5, 5, 5, 100]),
        [("f00", "f01", "f02", "f03")],
    ),
    # A second ended run replaces the answer when the answer's output (132) > its largest (100).
    Case(
        "3.4-ended-run-replaces",
        SYSTEM,
        numbered("f", [33, 33, 33, 33, 99, 100, 1000]),
        [("f00", "f01", "f02", "f03", "f04", "f05")],
    ),
    # §3.1: equal sizes sort by name (Python string order: "B" < "a" < "b").
    Case("3.1-name-order", SYSTEM, tablet("b=5", "a=5", "B=5", "c=5"), [("B", "a", "b", "c")]),
    # §3.5: windows slide past small files that cannot form a set. maxOpen 3.
    Case(
        "3.5-slide",
        SYSTEM,
        numbered("f", [1, 100, 100, 100, 1000]),
        [("f01", "f02", "f03")],
        PlannerSettings(max_open=3, ratio=2.5),
    ),
    # §3.5: the first window with an answer wins, even if a later one is bigger.
    Case(
        "3.5-first-window",
        SYSTEM,
        numbered("f", [1, 1, 1, 10, 10, 10]),
        [("f00", "f01", "f02")],
        PlannerSettings(max_open=3, ratio=1.5),
    ),
]


# --------------------------------------------------------------------------- §3.3 size limit, §4.5 groups

BOUNDED = (SizeTier("small", 100 * M), SizeTier("medium", 500 * M))

LIMIT_CASES = [
    # A sum equal to the limit is kept; the job reaches the last group through §4.5 step 3.
    Case(
        "3.3-sum-equal-limit",
        SYSTEM,
        numbered("f", [125 * M] * 4),
        [("f00", "f01", "f02", "f03")],
        PlannerSettings(groups=BOUNDED),
        groups_priorities=[("medium", SYSTEM_MIN + 4 + 4)],
    ),
    # The fifth 125M file would push the sum over 500M: cut, then one job of four.
    Case(
        "3.3-cut",
        SYSTEM,
        numbered("f", [125 * M] * 5),
        [("f00", "f01", "f02", "f03")],
        PlannerSettings(groups=BOUNDED),
    ),
    # No limit when a group is unbounded.
    Case(
        "3.3-unbounded-no-limit",
        SYSTEM,
        numbered("f", [125 * M] * 5),
        [("f00", "f01", "f02", "f03", "f04")],
        PlannerSettings(groups=(*BOUNDED, SizeTier("large"))),
        groups_priorities=[("large", SYSTEM_MIN + 5 + 5)],
    ),
    # USER plans are never size-limited; a 625M USER job runs on the largest group (medium).
    Case(
        "3.3-user-no-limit",
        USER,
        numbered("f", [125 * M] * 5),
        [("f00", "f01", "f02", "f03", "f04")],
        PlannerSettings(groups=BOUNDED),
        groups_priorities=[("medium", USER_MIN + 5 + 5)],
    ),
    # Only a prefix of the smallest files survives the limit: the big files are never compacted.
    Case(
        "3.3-big-files-excluded",
        SYSTEM,
        tablet("a=1M", "b=1M", "c=1M", "d=1M", "e=400M", "f=400M", "g=400M", "h=400M"),
        [("a", "b", "c", "d")],
        PlannerSettings(groups=BOUNDED),
        groups_priorities=[("small", SYSTEM_MIN + 8 + 4)],
    ),
    # |L| <= 1 after the cut: nothing.
    Case("3.3-one-left", SYSTEM, tablet("a=300M", "b=300M", "c=300M"), [], PlannerSettings(groups=BOUNDED)),
]


# --------------------------------------------------------------------------- §4 multi-job loop and projections

MULTI_CASES = [
    # 25 x 1M, maxOpen 10: two full sets, then a smaller one, then stop (|S| < maxOpen).
    Case(
        "4.3-multi-job",
        SYSTEM,
        numbered("f", [M] * 25),
        [
            tuple(f"f{i:02d}" for i in range(10)),
            tuple(f"f{i:02d}" for i in range(10, 20)),
            tuple(f"f{i:02d}" for i in range(20, 25)),
        ],
        groups_priorities=[
            ("default", OVER_SIZE_MIN + 10 + 10),
            ("default", OVER_SIZE_MIN + 10 + 10),
            ("default", OVER_SIZE_MIN + 5 + 10),
        ],
    ),
    # Exactly one full set, then the loop goes on and finds nothing more.
    Case("4.3-one-full-set", SYSTEM, numbered("f", [M] * 10), [tuple(f"f{i:02d}" for i in range(10))]),
    # A running SYSTEM job's projected file (2) joins the best set: wait for it, no job.
    Case(
        "4.2-wait-for-running-system",
        SYSTEM,
        tablet("a=3", "b=3", "c=3", "d=3", "x=1", "y=1"),
        [],
        candidates=("a", "b", "c", "d"),
        running=(Running(SYSTEM, ("x", "y")),),
    ),
    # A SYSTEM plan projects only SYSTEM jobs: a running USER job does not make it wait.
    Case(
        "4.2-ignore-running-user",
        SYSTEM,
        tablet("a=3", "b=3", "c=3", "d=3", "x=1", "y=1"),
        [("a", "b", "c", "d")],
        candidates=("a", "b", "c", "d"),
        running=(Running(USER, ("x", "y")),),
        groups_priorities=[("default", SYSTEM_MIN + 6 + 4)],
    ),
    # While nothing is emitted the loop looks past a set that waits on a running job:
    # [2, 2, P=2] waits, then [5, 5, 5] is emitted (maxOpen 3, ratio 2).
    Case(
        "4.3-look-past-waiting-set",
        SYSTEM,
        tablet("a=2", "b=2", "c=5", "d=5", "e=5", "x=1", "y=1"),
        [("c", "d", "e")],
        PlannerSettings(max_open=3, ratio=2),
        candidates=("a", "b", "c", "d", "e"),
        running=(Running(SYSTEM, ("x", "y")),),
        groups_priorities=[("default", SYSTEM_MIN + 7 + 3)],
    ),
    # The same tablet with the running job of another kind: no projection, [b, c, d].
    Case(
        "4.3-no-projection-other-kind",
        SYSTEM,
        tablet("a=2", "b=2", "c=5", "d=5", "e=5", "x=1", "y=1"),
        [("b", "c", "d")],
        PlannerSettings(max_open=3, ratio=2),
        candidates=("a", "b", "c", "d", "e"),
        running=(Running(SELECTOR, ("x", "y")),),
    ),
    # Equal-size real files sort before a projected file (§3.1): [a=2, b=2] meets r=1 first,
    # and the projection (2) is not part of the set. maxOpen 2.
    Case(
        "3.1-real-before-projected",
        SYSTEM,
        tablet("a=2", "b=2", "x=1", "y=1"),
        [("a", "b")],
        PlannerSettings(max_open=2, ratio=1),
        candidates=("a", "b"),
        running=(Running(SYSTEM, ("x", "y")),),
    ),
    # A USER plan runs the ratio step while USER jobs run, and projects them (decision 1).
    Case(
        "4.2-user-projects-running-user",
        USER,
        tablet("a=3", "b=3", "c=3", "d=3", "x=1", "y=1"),
        [],
        candidates=("a", "b", "c", "d"),
        running=(Running(USER, ("x", "y")),),
    ),
    # A SELECTOR plan projects running SELECTOR jobs, not USER ones.
    Case(
        "4.2-selector-projects-selector",
        SELECTOR,
        tablet("a=3", "b=3", "c=3", "d=3", "x=1", "y=1"),
        [],
        candidates=("a", "b", "c", "d"),
        running=(Running(SELECTOR, ("x", "y")),),
    ),
    Case(
        "4.2-selector-ignores-user",
        SELECTOR,
        tablet("a=3", "b=3", "c=3", "d=3", "x=1", "y=1"),
        [("a", "b", "c", "d")],
        candidates=("a", "b", "c", "d"),
        running=(Running(USER, ("x", "y")),),
        groups_priorities=[("default", SYSTEM_MIN + 6 + 4)],  # SELECTOR uses SYSTEM's rule
    ),
]


# --------------------------------------------------------------------------- §4.2 look-ahead

LOOKAHEAD_CASES = [
    # J = [1 x4]; its output 4 with 50 never meets the ratio: compact everything now.
    Case("4.2-swap-in-all", USER, numbered("f", [1, 1, 1, 1, 50]), [("f00", "f01", "f02", "f03", "f04")]),
    Case("4.2-swap-in-all-selector", SELECTOR, numbered("f", [1, 1, 1, 1, 50]), [tuple(f"f{i:02d}" for i in range(5))]),
    # J's output joins a later ratio compaction ([4, 4, 4, P=4] meets r=3): keep J.
    Case("4.2-keep-J", USER, numbered("f", [1, 1, 1, 1, 4, 4, 4]), [("f00", "f01", "f02", "f03")]),
    # SYSTEM plans have no look-ahead.
    Case("4.2-not-system", SYSTEM, numbered("f", [1, 1, 1, 1, 50]), [("f00", "f01", "f02", "f03")]),
    # Decision 2: no look-ahead when |candidates| > maxOpen (4.0 would put 5 files in a maxOpen-4 job).
    Case(
        "4.2-guard-candidates-over-maxopen",
        USER,
        numbered("f", [1, 1, 1, 1, 50]),
        [("f00", "f01", "f02", "f03")],
        PlannerSettings(max_open=4),
    ),
    # |candidates| == maxOpen still gets the look-ahead.
    Case(
        "4.2-candidates-equal-maxopen",
        USER,
        numbered("f", [1, 1, 1, 1, 50]),
        [tuple(f"f{i:02d}" for i in range(5))],
        PlannerSettings(max_open=5),
    ),
    # Only when the loop emitted exactly one job: two full jobs stay as they are.
    Case(
        "4.2-two-jobs-no-lookahead",
        USER,
        numbered("f", [1] * 8 + [100]),
        [("f00", "f01", "f02", "f03"), ("f04", "f05", "f06", "f07")],
        PlannerSettings(max_open=4),
    ),
]


# --------------------------------------------------------------------------- §4.3 forced sets

GEOMETRIC = [10**i for i in range(12)]  # never meets any ratio >= 1.2

FORCED_CASES = [
    # n <= m: one job with all candidates.
    Case("4.3-n-le-m", USER, tablet("a=1", "b=100"), [("a", "b")], groups_priorities=[("default", USER_MIN + 2 + 2)]),
    Case("4.3-single-file", USER, tablet("a=7"), [("a",)], groups_priorities=[("default", USER_MIN + 1 + 1)]),
    Case(
        "4.3-selector-single-file", SELECTOR, tablet("a=7"), [("a",)], groups_priorities=[("default", SYSTEM_MIN + 2)]
    ),
    Case("4.3-n-eq-m", USER, numbered("f", GEOMETRIC[:3]), [("f00", "f01", "f02")], PlannerSettings(max_open=3)),
    # m < n < 2m: one job with the n - m + 1 smallest files (n=5, m=3 -> 3 files, 3 left).
    Case("4.3-m-lt-n-lt-2m", USER, numbered("f", GEOMETRIC[:5]), [("f00", "f01", "f02")], PlannerSettings(max_open=3)),
    Case("4.3-n-eq-m-plus-1", USER, numbered("f", GEOMETRIC[:4]), [("f00", "f01")], PlannerSettings(max_open=3)),
    # n >= 2m: floor(n/m) - 1 batches of m, smallest first.
    Case("4.3-n-eq-2m", USER, numbered("f", GEOMETRIC[:6]), [("f00", "f01", "f02")], PlannerSettings(max_open=3)),
    Case(
        "4.3-n-eq-3m",
        USER,
        numbered("f", GEOMETRIC[:9]),
        [("f00", "f01", "f02"), ("f03", "f04", "f05")],
        PlannerSettings(max_open=3),
    ),
    Case(
        "4.3-n-eq-3m-plus-2",
        SELECTOR,
        numbered("f", GEOMETRIC[:11]),
        [("f00", "f01", "f02"), ("f03", "f04", "f05")],
        PlannerSettings(max_open=3),
    ),
    # Sorted by §3.1, not by input order.
    Case(
        "4.3-sorted",
        USER,
        {"z": 1, "y": 10, "x": 100, "w": 1000, "v": 10000},
        [("z", "y", "x")],
        PlannerSettings(max_open=3),
    ),
    # No forced set while a job of the same kind runs ...
    Case(
        "4.3-not-while-same-kind-runs",
        USER,
        {**numbered("f", GEOMETRIC[:3]), "r": 5},
        [],
        candidates=("f00", "f01", "f02"),
        running=(Running(USER, ("r",)),),
    ),
    # ... but a running job of another kind does not prevent it.
    Case(
        "4.3-other-kind-running",
        USER,
        {**numbered("f", GEOMETRIC[:3]), "r": 5},
        [("f00", "f01", "f02")],
        candidates=("f00", "f01", "f02"),
        running=(Running(SYSTEM, ("r",)),),
        groups_priorities=[("default", USER_MIN + 4 + 3)],
    ),
    Case(
        "4.3-selector-not-while-selector-runs",
        SELECTOR,
        {**numbered("f", GEOMETRIC[:3]), "r": 5},
        [],
        candidates=("f00", "f01", "f02"),
        running=(Running(SELECTOR, ("r",)),),
    ),
    Case(
        "4.3-selector-user-running",
        SELECTOR,
        {**numbered("f", GEOMETRIC[:3]), "r": 5},
        [("f00", "f01", "f02")],
        candidates=("f00", "f01", "f02"),
        running=(Running(USER, ("r",)),),
    ),
    # SYSTEM plans never force.
    Case("4.3-system-never-forced", SYSTEM, numbered("f", GEOMETRIC[:3]), []),
]


# --------------------------------------------------------------------------- §4.4 lower-ratio search

SIXTEEN_EQUAL = numbered("f", [M] * 16)
POWERS_OF_TWO = numbered("f", [2**i for i in range(16)])

LOWER_RATIO_CASES = [
    # 16 powers of two never meet r=3. Every window's full prefix needs 2 - 2**-9 exactly:
    # ties go to the later window, so the ten largest files (f06..f15) are chosen.
    Case(
        "4.4-tie-later-window",
        SYSTEM,
        POWERS_OF_TWO,
        [tuple(f"f{i:02d}" for i in range(6, 16))],
        groups_priorities=[("default", OVER_SIZE_MIN + 10 + (16 - 15))],
    ),
    # With ratio 100, 16 equal files never meet the ratio; needed = prefix length; the longest
    # prefix of the last window wins the tie.
    Case(
        "4.4-tie-equal-files",
        SYSTEM,
        SIXTEEN_EQUAL,
        [tuple(f"f{i:02d}" for i in range(6, 16))],
        PlannerSettings(ratio=100),
    ),
    # Within one window (|L| <= maxOpen), the longest of equal prefixes wins: sizes [1,1,2,4,8,...]
    # give needed 2 for every prefix.
    Case(
        "4.4-tie-longer-prefix",
        SYSTEM,
        numbered("f", [1] + [2**i for i in range(9)]),
        [tuple(f"f{i:02d}" for i in range(10))],
        PlannerSettings(max_files_per_tablet=5),
    ),
    # best must be > lowestRatio: factors of 100 need ~1.0101 < 1.1, so no job.
    Case("4.4-below-lowest-ratio", SYSTEM, numbered("f", [100**i for i in range(16)]), []),
    # ... but with lowestRatio 1.0 (allowed) they compact.
    Case(
        "4.4-lowest-ratio-1",
        SYSTEM,
        numbered("f", [100**i for i in range(16)]),
        [tuple(f"f{i:02d}" for i in range(6, 16))],
        PlannerSettings(lowest_ratio=1.0),
    ),
    # Not when the tablet is at or under maxFilesPerTablet ...
    Case("4.4-not-at-limit", SYSTEM, POWERS_OF_TWO, [], PlannerSettings(max_files_per_tablet=16)),
    # ... where <= 0 means 99.
    Case("4.4-limit-0-means-99", SYSTEM, POWERS_OF_TWO, [], PlannerSettings(max_files_per_tablet=0)),
    Case("4.4-limit-neg-means-99", SYSTEM, POWERS_OF_TWO, [], PlannerSettings(max_files_per_tablet=-1)),
    # ... nor while any compaction runs (even of another kind) ...
    Case(
        "4.4-not-while-running",
        SYSTEM,
        {**POWERS_OF_TWO, "r": 1},
        [],
        candidates=tuple(POWERS_OF_TWO),
        running=(Running(USER, ("r",)),),
    ),
    # ... nor when some files are not candidates (|all| != |candidates|).
    Case("4.4-not-all-candidates", SYSTEM, {**POWERS_OF_TWO, "s": 1}, [], candidates=tuple(POWERS_OF_TWO)),
    # Not for USER plans: they use the forced sets.
    # (n=16, m=10: one job with the n - m + 1 = 7 smallest files.)
    Case("4.4-user-forced-instead", USER, POWERS_OF_TWO, [tuple(f"f{i:02d}" for i in range(7))]),
    # The search uses the size-limited list: only the files up to 600 (sum 1023 > 600 cuts at f09).
    Case(
        "4.4-size-limited",
        SYSTEM,
        POWERS_OF_TWO,
        [tuple(f"f{i:02d}" for i in range(9))],
        PlannerSettings(groups=(SizeTier("only", 600),)),
        groups_priorities=[("only", OVER_SIZE_MIN + 9 + 1)],
    ),
]

ALL_CASES = RATIO_CASES + FIND_CASES + LIMIT_CASES + MULTI_CASES + LOOKAHEAD_CASES + FORCED_CASES + LOWER_RATIO_CASES


@pytest.mark.parametrize("case", ALL_CASES, ids=[case.id for case in ALL_CASES])
def test_plan(case: Case) -> None:
    jobs = run_case(case)
    assert [job.files for job in jobs] == case.expected
    assert all(job.kind is case.kind for job in jobs)
    if case.groups_priorities is not None:
        assert [(job.group, job.priority) for job in jobs] == case.groups_priorities


def test_case_ids_are_unique() -> None:
    ids = [case.id for case in ALL_CASES]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("case", ALL_CASES, ids=[case.id for case in ALL_CASES])
def test_plan_invariants(case: Case) -> None:
    """§2: jobs are disjoint subsets of the candidates, 1..maxOpen files, sorted by size then name."""
    jobs = run_case(case)
    candidates = set(case.files if case.candidates is None else case.candidates)
    seen: set[str] = set()
    for job in jobs:
        assert 1 <= len(job.files) <= case.settings.max_open
        assert set(job.files) <= candidates
        assert seen.isdisjoint(job.files)
        seen.update(job.files)
        assert list(job.files) == sorted(job.files, key=lambda name: (case.files[name], name))


# --------------------------------------------------------------------------- §4.4 warnings


def test_lower_ratio_skips_zero_size_files_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    files = numbered("f", [0] * 14 + [1, 1])
    with caplog.at_level(logging.WARNING, logger="kompaktor.policy.planner"):
        jobs = plan(SYSTEM, PlannerSettings(), files, files)
    # Window 6 (f06..f15): prefix ending at f15 needs 2/1 = 2 > 1.1.
    assert [job.files for job in jobs] == [tuple(f"f{i:02d}" for i in range(6, 16))]
    assert any("size 0" in record.getMessage() for record in caplog.records)


def test_lower_ratio_all_zero_sizes_warns_and_plans_nothing(caplog: pytest.LogCaptureFixture) -> None:
    files = numbered("f", [0] * 16)
    with caplog.at_level(logging.WARNING, logger="kompaktor.policy.planner"):
        assert plan(SYSTEM, PlannerSettings(), files, files) == []
    messages = [record.getMessage() for record in caplog.records]
    assert any("size 0" in message for message in messages)
    assert any("over its limit of 15" in message for message in messages)


def test_lower_ratio_no_job_warns(caplog: pytest.LogCaptureFixture) -> None:
    files = numbered("f", [100**i for i in range(16)])
    with caplog.at_level(logging.WARNING, logger="kompaktor.policy.planner"):
        assert plan(SYSTEM, PlannerSettings(), files, files) == []
    assert any("16 files, over its limit of 15" in record.getMessage() for record in caplog.records)


def test_ordinary_plans_do_not_warn(caplog: pytest.LogCaptureFixture) -> None:
    files = tablet("a=16M", "b=11M", "c=11M", "d=11M")
    with caplog.at_level(logging.DEBUG, logger="kompaktor.policy.planner"):
        plan(SYSTEM, PlannerSettings(), files, files)
    assert caplog.records == []


# --------------------------------------------------------------------------- §8 example through the API


def test_section_8_example() -> None:
    settings = PlannerSettings(
        ratio=3,
        max_open=10,
        max_files_per_tablet=15,
        groups=(
            SizeTier("small", parse_accumulo_size("100M")),
            SizeTier("medium", parse_accumulo_size("500M")),
            SizeTier("large"),
        ),
    )
    files = {
        "f1": 104857600,
        "f2": 103809024,
        "f3": 34603008,
        "f4": 34603008,
        "f5": 34603008,
        "f6": 34603008,
    }
    assert plan(SYSTEM, settings, files, default_candidates(SYSTEM, files, [], None)) == [
        PlannedJob(SYSTEM, "medium", -32756, ("f3", "f4", "f5", "f6", "f2", "f1"))
    ]


def test_kind_may_be_a_string() -> None:
    files = tablet("a=16M", "b=11M", "c=11M", "d=11M")
    jobs = plan("SYSTEM", PlannerSettings(), files, files)  # type: ignore[arg-type]
    assert jobs[0].kind is SYSTEM


def test_no_candidates_no_jobs() -> None:
    assert plan(USER, PlannerSettings(), tablet("a=1"), []) == []


@pytest.mark.parametrize(
    ("candidates", "running", "message"),
    [
        (["a", "zz"], (), "candidate 'zz'"),
        (["a", "a"], (), "repeat"),
        (["a"], (Running(SYSTEM, ("nope",)),), "running file 'nope'"),
    ],
)
def test_plan_rejects_inconsistent_input(candidates: list[str], running: tuple[Running, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan(SYSTEM, PlannerSettings(), tablet("a=1", "b=2"), candidates, running)


def test_plan_does_not_mutate_inputs() -> None:
    files = numbered("f", [M] * 25)
    candidates = list(files)
    running = [Running(SYSTEM, ())]
    snapshot = (dict(files), list(candidates), list(running))
    plan(SYSTEM, PlannerSettings(), files, candidates, running)
    assert (files, candidates, running) == snapshot


# --------------------------------------------------------------------------- §4.5 group choice

DOC_GROUPS_NO_LARGE = (SizeTier("small", 100 * M), SizeTier("medium", 500 * M))


@pytest.mark.parametrize(
    ("groups", "total", "expected"),
    [
        # §4.5 examples: exactly 100M goes to medium, 600M to large ...
        (DOC_GROUPS, 100 * M, "medium"),
        (DOC_GROUPS, 600 * M, "large"),
        # ... and without large, a 600M job goes to medium.
        (DOC_GROUPS_NO_LARGE, 600 * M, "medium"),
        # Strictly below maxSize goes to the group.
        (DOC_GROUPS, 100 * M - 1, "small"),
        (DOC_GROUPS, 0, "small"),
        (DOC_GROUPS, 500 * M - 1, "medium"),
        (DOC_GROUPS, 500 * M, "large"),
        # A SYSTEM sum exactly equal to the largest maxSize reaches the last group (step 3).
        (DOC_GROUPS_NO_LARGE, 500 * M, "medium"),
        # Configuration order does not matter: sorted by maxSize, unbounded last.
        ((SizeTier("large"), SizeTier("medium", 500 * M), SizeTier("small", 100 * M)), 100 * M, "medium"),
        ((SizeTier("large"), SizeTier("medium", 500 * M), SizeTier("small", 100 * M)), 10, "small"),
        ((SizeTier("large"), SizeTier("small", 100 * M)), 10**15, "large"),
        ((SizeTier("only"),), 10**15, "only"),
        ((SizeTier("only", 1),), 10**15, "only"),
    ],
)
def test_choose_group(groups: tuple[SizeTier, ...], total: int, expected: str) -> None:
    assert choose_group(groups, total) == expected
    assert choose_group(list(reversed(groups)), total) == expected


def test_choose_group_needs_groups() -> None:
    with pytest.raises(ValueError):
        choose_group([], 1)


def test_user_job_larger_than_every_group_runs_on_largest() -> None:
    files = numbered("f", [300 * M] * 3)  # 900M: USER forced set, bigger than every maxSize
    jobs = plan(USER, PlannerSettings(groups=DOC_GROUPS_NO_LARGE), files, files)
    assert [(job.group, job.files) for job in jobs] == [("medium", ("f00", "f01", "f02"))]


# --------------------------------------------------------------------------- §4.6 priority


@pytest.mark.parametrize(
    ("kind", "total", "job", "max_files", "expected"),
    [
        # §4.6 examples: a 10-file SYSTEM job, maxFilesPerTablet 15, on 12 and on 20 files.
        (SYSTEM, 12, 10, 15, -32746),
        (SYSTEM, 20, 10, 15, 18783),
        # §8 example: 6 files, one 6-file job.
        (SYSTEM, 6, 6, 15, -32756),
        # SELECTOR uses SYSTEM's rule (and its over-size range).
        (SELECTOR, 12, 10, 15, -32746),
        (SELECTOR, 20, 10, 15, 18783),
        # USER: normal formula in 1..18767, never over-size.
        (USER, 12, 10, 15, 23),
        (USER, 20, 10, 15, 31),
        (USER, 1, 1, 15, 3),
        (USER, 18760, 10, 15, USER_MAX),
        # Exactly at the limit is not over-size.
        (SYSTEM, 15, 10, 15, SYSTEM_MIN + 25),
        (SYSTEM, 16, 1, 15, OVER_SIZE_MIN + 2),
        # Clamps to each range's max.
        (SYSTEM, 5000, 10, 15, OVER_SIZE_MAX),
        (SYSTEM, 40000, 10, 100000, SYSTEM_MAX),
        # maxFilesPerTablet <= 0 means 99.
        (SYSTEM, 99, 2, 0, SYSTEM_MIN + 101),
        (SYSTEM, 100, 2, 0, OVER_SIZE_MIN + 2 + 1),
        (SYSTEM, 100, 2, -5, OVER_SIZE_MIN + 2 + 1),
    ],
)
def test_job_priority(kind: Kind, total: int, job: int, max_files: int, expected: int) -> None:
    assert job_priority(kind, total, job, max_files) == expected
    assert -32768 <= expected <= 32767  # fits a signed 16-bit integer


def test_priority_ranges_are_contiguous_and_disjoint() -> None:
    assert SYSTEM_MAX + 1 == USER_MIN
    assert USER_MAX + 1 == OVER_SIZE_MIN
    assert (SYSTEM_MIN, OVER_SIZE_MAX) == (-32768, 20767)


def test_planner_passes_the_real_max_files_per_tablet() -> None:
    """Decision 3: an ordinary SYSTEM job stays in the SYSTEM range (Accumulo's bug not copied)."""
    files = tablet("a=16M", "b=11M", "c=11M", "d=11M")
    (job,) = plan(SYSTEM, PlannerSettings(max_files_per_tablet=3), files, files)
    assert job.priority == OVER_SIZE_MIN + 4 + 1
    (job,) = plan(SYSTEM, PlannerSettings(), files, files)
    assert SYSTEM_MIN <= job.priority <= SYSTEM_MAX


# --------------------------------------------------------------------------- §5 / §8 default candidates

DC_FILES = tablet("a=1", "b=2", "c=3", "d=4", "e=5")


@pytest.mark.parametrize(
    ("kind", "running", "selected", "expected"),
    [
        (SYSTEM, [], None, ["a", "b", "c", "d", "e"]),
        (SYSTEM, [Running(USER, ("a",)), Running(SYSTEM, ("b",))], None, ["c", "d", "e"]),
        (SYSTEM, [Running(SELECTOR, ("a",))], ["e", "d"], ["b", "c"]),
        (SYSTEM, [], [], ["a", "b", "c", "d", "e"]),
        (USER, [], None, []),
        (SELECTOR, [Running(SYSTEM, ("a",))], None, []),
        (USER, [], ["e", "c"], ["c", "e"]),
        (USER, [Running(USER, ("c",))], ["e", "c"], ["e"]),
        (SELECTOR, [Running(SYSTEM, ("e",))], ["e", "c", "a"], ["a", "c"]),
        (USER, [], [], []),
    ],
)
def test_default_candidates(
    kind: Kind, running: list[Running], selected: list[str] | None, expected: list[str]
) -> None:
    assert default_candidates(kind, DC_FILES, running, selected) == expected


# --------------------------------------------------------------------------- §7 validation


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"groups": ()}, r"^groups: at least one group"),
        ({"groups": []}, r"^groups: at least one group"),
        ({"groups": "default"}, r"^groups: must be a list"),
        ({"groups": ("default",)}, r"^groups\[0\]: must be a SizeTier"),
        ({"groups": (SizeTier(""),)}, r"^groups\[0\]\.name: a non-empty name"),
        ({"groups": (SizeTier(None),)}, r"^groups\[0\]\.name"),  # type: ignore[arg-type]
        ({"groups": (SizeTier("a", 1), SizeTier("a", 2))}, r"^groups\[1\]\.name: duplicate group name 'a'"),
        (
            {"groups": (SizeTier("a"), SizeTier("b", 5), SizeTier("c"))},
            r"^groups\[2\]\.maxSize: more than one unbounded",
        ),
        ({"groups": (SizeTier("a", 5), SizeTier("b", 5))}, r"^groups\[1\]\.maxSize: duplicate maxSize 5"),
        ({"groups": (SizeTier("a", 0),)}, r"^groups\[0\]\.maxSize: must be > 0"),
        ({"groups": (SizeTier("a", -1),)}, r"^groups\[0\]\.maxSize: must be > 0"),
        ({"groups": (SizeTier("a", True),)}, r"^groups\[0\]\.maxSize: must be integer bytes"),
        ({"groups": (SizeTier("a", 1.5),)}, r"^groups\[0\]\.maxSize: must be integer bytes"),  # type: ignore[arg-type]
        ({"groups": (SizeTier("a", "1M"),)}, r"^groups\[0\]\.maxSize: must be integer bytes"),  # type: ignore[arg-type]
        ({"ratio": 0.99}, r"^ratio: must be >= 1"),
        ({"ratio": 0}, r"^ratio: must be >= 1"),
        ({"ratio": float("nan")}, r"^ratio: must be a finite number"),
        ({"ratio": float("inf")}, r"^ratio: must be a finite number"),
        ({"ratio": 10**400}, r"^ratio: must be a finite number"),
        ({"ratio": True}, r"^ratio: must be a finite number"),
        ({"ratio": "3"}, r"^ratio: must be a finite number"),
        ({"max_open": 1}, r"^maxOpen: must be an integer >= 2"),
        ({"max_open": -3}, r"^maxOpen: must be an integer >= 2"),
        ({"max_open": 2.0}, r"^maxOpen: must be an integer >= 2"),
        ({"max_open": True}, r"^maxOpen: must be an integer >= 2"),
        ({"lowest_ratio": 0.5}, r"^lowestRatio: must be >= 1"),
        ({"lowest_ratio": float("nan")}, r"^lowestRatio: must be a finite number"),
        ({"max_files_per_tablet": "15"}, r"^maxFilesPerTablet: must be an integer"),
        ({"max_files_per_tablet": 15.0}, r"^maxFilesPerTablet: must be an integer"),
    ],
)
def test_settings_validation(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(PlannerConfigError, match=message) as info:
        PlannerSettings(**kwargs)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("kwargs", "resolved"),
    [
        ({}, 15),
        ({"max_files_per_tablet": 0}, 99),
        ({"max_files_per_tablet": -7}, 99),
        ({"max_files_per_tablet": 1}, 1),
        ({"ratio": 1, "max_open": 2, "lowest_ratio": 1, "max_files_per_tablet": 200}, 200),
    ],
)
def test_settings_valid(kwargs: dict[str, object], resolved: int) -> None:
    settings = PlannerSettings(**kwargs)  # type: ignore[arg-type]
    assert settings.resolved_max_files == resolved
    assert isinstance(settings.ratio, float)
    assert isinstance(settings.lowest_ratio, float)


def test_settings_defaults() -> None:
    settings = PlannerSettings()
    assert (settings.ratio, settings.max_open, settings.max_files_per_tablet, settings.lowest_ratio) == (
        3.0,
        10,
        15,
        1.1,
    )
    assert settings.groups == (SizeTier("default"),)
    assert settings.size_limit(SYSTEM) is None


def test_settings_groups_list_becomes_tuple_and_limit() -> None:
    settings = PlannerSettings(groups=[SizeTier("b", 500), SizeTier("a", 100)])  # type: ignore[arg-type]
    assert settings.groups == (SizeTier("b", 500), SizeTier("a", 100))
    assert settings.size_limit(SYSTEM) == 500
    assert settings.size_limit(USER) is None
    assert settings == PlannerSettings(groups=(SizeTier("b", 500), SizeTier("a", 100)))
    assert hash(settings) == hash(PlannerSettings(groups=(SizeTier("b", 500), SizeTier("a", 100))))


# --------------------------------------------------------------------------- §5 too-many-deletes selector


@pytest.mark.parametrize(
    ("files", "kwargs", "expected"),
    [
        ({}, {}, []),  # 0/0
        ({"a": FileStats(100, 0)}, {}, []),
        ({"a": FileStats(100, 20)}, {}, ["a"]),  # 20/80 = 0.25 >= 0.25
        ({"a": FileStats(100, 19)}, {}, []),  # 19/81 < 0.25
        ({"b": FileStats(60, 10), "a": FileStats(40, 10)}, {}, ["a", "b"]),  # totals 20/80: all files
        ({"a": FileStats(10, 10)}, {}, ["a"]),  # deletes over zero non-deletes: infinite
        ({"a": FileStats(0, 0)}, {}, []),  # 0/0
        ({"a": FileStats(5, 10)}, {}, []),  # nonDeletes < 0
        # A file with no delete count adds its entries and no deletes ...
        ({"a": FileStats(100, 30), "b": FileStats(20, None)}, {}, ["a", "b"]),  # 30/90 >= 0.25
        ({"a": FileStats(100, 30), "b": FileStats(100, None)}, {}, []),  # 30/170 < 0.25
        # ... and if it has 0 entries, nothing is selected unless proceed_zero_no_summary.
        ({"a": FileStats(100, 50), "b": FileStats(0, None)}, {}, []),
        ({"a": FileStats(100, 50), "b": FileStats(0, None)}, {"proceed_zero_no_summary": True}, ["a", "b"]),
        ({"a": FileStats(100, 50), "b": FileStats(0, 0)}, {}, ["a", "b"]),
        # Threshold bounds (0, 1].
        ({"a": FileStats(100, 50)}, {"threshold": 1.0}, ["a"]),  # 50/50 = 1
        ({"a": FileStats(100, 49)}, {"threshold": 1}, []),
        ({"a": FileStats(100, 1)}, {"threshold": 0.01}, ["a"]),  # 1/99 >= 0.01
    ],
)
def test_too_many_deletes(files: dict[str, FileStats], kwargs: dict[str, object], expected: list[str]) -> None:
    assert too_many_deletes(files, **kwargs) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("threshold", [0, -0.1, 1.01, float("nan"), float("inf"), True, "0.25"])
def test_too_many_deletes_threshold_range(threshold: object) -> None:
    with pytest.raises(ValueError, match="threshold"):
        too_many_deletes({"a": FileStats(1, 1)}, threshold=threshold)  # type: ignore[arg-type]
