"""The ratio-based compaction planner (docs/planner.md §2–§4): which files of a tablet to compact, in
which compactor group, at what priority.

Policy only: a pure, deterministic function of its arguments (no clock, randomness, set
iteration order or I/O apart from warnings through :mod:`logging`). It restates Accumulo 4.0's
``RatioBasedCompactionPlanner.makePlan`` and ``CompactionJobPrioritizer`` with Kompaktor's
decisions (docs/planner.md §1). Must not import redis, pyspark, kopf, kubernetes or pydantic.

The hot path works on plain tuples so that a coordinator can plan 100,000 tablets quickly:
a file is ``(size, 0, name)`` and a projected file (the future output of a running or already
chosen compaction) is ``(size, 1, creation_number)``. Tuple order is exactly the §3.1 order:
size ascending, real files before projected ones, then name or creation order.
"""

from __future__ import annotations

import logging
import math
from bisect import bisect_right, insort
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from operator import itemgetter
from typing import TypeAlias

from kompaktor.model.job import PRIORITY_MAX, Kind

__all__ = [
    "DEFAULT_MAX_FILES",
    "OVER_SIZE_MAX",
    "OVER_SIZE_MIN",
    "SYSTEM_MAX",
    "SYSTEM_MIN",
    "USER_MAX",
    "USER_MIN",
    "DEFAULTS",
    "SizeTier",
    "Kind",
    "PlannedJob",
    "PlannerConfigError",
    "PlannerSettings",
    "Running",
    "choose_group",
    "default_candidates",
    "job_priority",
    "plan",
]

log = logging.getLogger(__name__)

#: Priority ranges, inclusive (docs/planner.md §1 decision 3 and §4.6).
SYSTEM_MIN, SYSTEM_MAX = -32768, 0
USER_MIN, USER_MAX = 1, 18767
OVER_SIZE_MIN, OVER_SIZE_MAX = 18768, PRIORITY_MAX

#: maxFilesPerTablet when the configured value is <= 0 (tserver.scan.files.open.max - 1).
DEFAULT_MAX_FILES = 99

#: A real file ``(size, 0, name)`` or a projected file ``(size, 1, creation_number)``.
_Item: TypeAlias = tuple[int, int, "str | int"]
_size_of, _name_of = itemgetter(0), itemgetter(2)


class PlannerConfigError(ValueError):
    """Invalid planner settings; the message starts with the offending setting's name."""


@dataclass(frozen=True, slots=True)
class SizeTier:
    """A size tier of the planner (docs/planner.md's "groups"): jobs up to ``max_size`` bytes go to it;
    ``max_size=None`` is unbounded. A compaction service maps each tier to a compactor group."""

    name: str
    max_size: int | None = None


@dataclass(frozen=True)
class PlannerSettings:
    """The settings of one planning call, validated on construction (docs/planner.md §7).

    Field names are snake_case; error messages use the configuration names (``maxOpen``, ...).
    """

    ratio: float = 3.0
    max_open: int = 10
    max_files_per_tablet: int = 15
    lowest_ratio: float = 1.1
    groups: tuple[SizeTier, ...] = (SizeTier("default"),)
    # Derived in __post_init__: the groups in §4.5 order and the SYSTEM size limit of §3.3.
    _by_size: tuple[SizeTier, ...] = field(init=False, repr=False, compare=False)
    _system_limit: int | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ratio", _check_ratio("ratio", self.ratio))
        object.__setattr__(self, "lowest_ratio", _check_ratio("lowestRatio", self.lowest_ratio))
        if not _is_int(self.max_open) or self.max_open < 2:
            raise PlannerConfigError(f"maxOpen: must be an integer >= 2, got {self.max_open!r}")
        if not _is_int(self.max_files_per_tablet):
            raise PlannerConfigError(f"maxFilesPerTablet: must be an integer, got {self.max_files_per_tablet!r}")
        groups = _check_groups(self.groups)
        object.__setattr__(self, "groups", groups)
        by_size = _sort_groups(groups)
        object.__setattr__(self, "_by_size", by_size)
        object.__setattr__(self, "_system_limit", by_size[-1].max_size)

    @property
    def resolved_max_files(self) -> int:
        """maxFilesPerTablet with a configured value <= 0 resolved to 99."""
        return self.max_files_per_tablet if self.max_files_per_tablet > 0 else DEFAULT_MAX_FILES

    def size_limit(self, kind: Kind) -> int | None:
        """§3.3: the largest group's maxSize for SYSTEM when every group is bounded, else None."""
        return self._system_limit if kind == Kind.SYSTEM else None


@dataclass(frozen=True, slots=True)
class Running:
    """A compaction running on the tablet: its kind and input files."""

    kind: Kind
    files: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PlannedJob:
    """One job of a plan. ``files`` are sorted by size, then name."""

    kind: Kind
    group: str
    priority: int
    files: tuple[str, ...]


# --------------------------------------------------------------------------- validation


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_ratio(name: str, value: object) -> float:
    number = math.nan
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:
            pass
    if not math.isfinite(number):
        raise PlannerConfigError(f"{name}: must be a finite number >= 1, got {value!r}")
    if number < 1:
        raise PlannerConfigError(f"{name}: must be >= 1, got {value!r}")
    return number


def _check_groups(groups: object) -> tuple[SizeTier, ...]:
    if isinstance(groups, str | bytes | Mapping) or not isinstance(groups, Iterable):
        raise PlannerConfigError(f"groups: must be a list of groups, got {groups!r}")
    groups = tuple(groups)
    if not groups:
        raise PlannerConfigError("groups: at least one group is required")
    names: dict[str, int] = {}
    sizes: dict[int, int] = {}
    unbounded = -1
    for i, group in enumerate(groups):
        if not isinstance(group, SizeTier):
            raise PlannerConfigError(f"groups[{i}]: must be a SizeTier, got {group!r}")
        if not isinstance(group.name, str) or not group.name:
            raise PlannerConfigError(f"groups[{i}].name: a non-empty name is required")
        if group.name in names:
            raise PlannerConfigError(
                f"groups[{i}].name: duplicate group name {group.name!r} (also groups[{names[group.name]}])"
            )
        names[group.name] = i
        size = group.max_size
        if size is None:
            if unbounded >= 0:
                raise PlannerConfigError(
                    f"groups[{i}].maxSize: more than one unbounded group "
                    f"({groups[unbounded].name!r} and {group.name!r})"
                )
            unbounded = i
            continue
        if not _is_int(size):
            raise PlannerConfigError(f"groups[{i}].maxSize: must be integer bytes, got {size!r}")
        if size <= 0:
            raise PlannerConfigError(f"groups[{i}].maxSize: must be > 0, got {size}")
        if size in sizes:
            raise PlannerConfigError(f"groups[{i}].maxSize: duplicate maxSize {size} (also groups[{sizes[size]}])")
        sizes[size] = i
    return groups


def _sort_groups(groups: Iterable[SizeTier]) -> tuple[SizeTier, ...]:
    """§4.5 step 1: maxSize ascending, the unbounded group last (stable for ties)."""
    return tuple(sorted(groups, key=lambda g: (g.max_size is None, g.max_size or 0)))


# --------------------------------------------------------------------------- building blocks


def _find(work: list[_Item], ratio: float, max_open: int, limit: int | None) -> tuple[int, int] | None:
    """§3.5 ``find`` over ``work`` (already in §3.1 order): the chosen set as a slice, or None.

    Equivalent to applying §3.4 to every window in turn, but locates the first productive window
    in one pass: window s yields a set exactly when one of its prefixes meets the ratio (§3.4
    then always answers), and if the prefix s..j meets the ratio so does s'..j for every s' < s
    (a larger sum, the same largest file). So the first productive window is the start of the
    first j whose longest window prefix ending at j meets the ratio; §3.4 runs on that window only.
    """
    n = len(work)
    if n <= 1:
        return None
    sizes = [item[0] for item in work]
    pre = [0, *accumulate(sizes)]  # pre[i] = sum(sizes[:i])
    if limit is not None and pre[n] > limit:
        n = bisect_right(pre, limit) - 1  # §3.3: keep the prefix whose sum stays <= limit
        if n <= 1:
            return None
    w = n if n < max_open else max_open
    start = -1
    for j in range(1, n):
        s = j - w + 1 if j >= w else 0
        if sizes[j] * ratio < float(pre[j + 1] - pre[s]):
            start = s
            break
    if start < 0:
        return None
    # §3.4 on the window sizes[start : start + w].
    good = -1
    answer = -1
    answer_out = 0
    total = sizes[start]
    for c in range(1, w):
        current = sizes[start + c]
        total += current
        if current * ratio < float(total):
            good = c
        elif good == c - 1:
            if answer < 0 or answer_out > sizes[start + good]:
                answer = good
                answer_out = total - current
            else:
                break
    if good == w - 1 and (answer < 0 or answer_out > sizes[start + good]):
        answer = good
    return start, start + answer + 1


def _forced_sets(sorted_candidates: list[_Item], max_open: int) -> list[list[_Item]]:
    """§4.3 ``findMaximalRequiredSetToCompact`` over candidates in §3.1 order."""
    n = len(sorted_candidates)
    if n <= max_open:
        return [sorted_candidates]
    batches = n // max_open - 1
    if batches > 0:
        return [sorted_candidates[i * max_open : (i + 1) * max_open] for i in range(batches)]
    return [sorted_candidates[: n - max_open + 1]]


def _lower_ratio_set(
    sorted_candidates: list[_Item], limit: int | None, max_open: int, lowest_ratio: float, max_files: int
) -> list[_Item] | None:
    """§4.4 ``findFilesToCompactWithLowerRatio``: the window prefix needing the highest ratio."""
    sizes = [item[0] for item in sorted_candidates]
    pre = [0, *accumulate(sizes)]
    n = len(sizes)
    if limit is not None and pre[n] > limit:
        n = bisect_right(pre, limit) - 1
    if n < 2:
        return None
    w = min(n, max_open)
    best = 0.0
    chosen: tuple[int, int] | None = None
    zero_sized: set[str | int] = set()
    for s in range(n - w + 1):
        base = pre[s]
        for i in range(s + 1, s + w):
            size = sizes[i]
            if size == 0:
                zero_sized.add(sorted_candidates[i][2])
                continue
            needed = (pre[i + 1] - base) / size
            if chosen is None or needed >= best:
                best = needed
                chosen = (s, i + 1)
    if zero_sized:
        log.warning(
            "lower-ratio search skipped %d file(s) of size 0 as the largest of a set: %s",
            len(zero_sized),
            ", ".join(sorted(map(str, zero_sized))),
        )
    if chosen is not None and best > lowest_ratio:
        return sorted_candidates[chosen[0] : chosen[1]]
    log.warning(
        "tablet has %d files, over its limit of %d, and no set of files to compact meets a ratio "
        "above lowestRatio %s (best %s); operator intervention may be needed",
        len(sorted_candidates),
        max_files,
        lowest_ratio,
        best if chosen is not None else "none",
    )
    return None


# --------------------------------------------------------------------------- public API


def choose_group(groups: Iterable[SizeTier], total_size: int) -> str:
    """§4.5: the first group, by maxSize ascending with the unbounded one last, that is unbounded or
    has ``total_size < maxSize``; when none qualifies, the group with the largest maxSize."""
    return _choose_sorted(_sort_groups(groups), total_size)


def _choose_sorted(by_size: tuple[SizeTier, ...], total_size: int) -> str:
    if not by_size:
        raise ValueError("choose_group needs at least one group")
    for group in by_size:
        if group.max_size is None or total_size < group.max_size:
            return group.name
    return by_size[-1].name


def job_priority(kind: Kind | str, total_files: int, job_files: int, max_files_per_tablet: int) -> int:
    """§4.6: a job's priority from the tablet's file count and the job's.

    USER jobs land in 1..18767; SYSTEM and SELECTOR jobs in 18768..20767 (TABLE_OVER_SIZE) when
    the tablet holds more than ``max_files_per_tablet`` files (a value <= 0 means 99), otherwise
    in -32768..0.
    """
    if kind == Kind.USER:
        return min(USER_MAX, USER_MIN + total_files + job_files)
    max_files = max_files_per_tablet if max_files_per_tablet > 0 else DEFAULT_MAX_FILES
    if total_files > max_files:
        return min(OVER_SIZE_MAX, OVER_SIZE_MIN + job_files + (total_files - max_files))
    return min(SYSTEM_MAX, SYSTEM_MIN + total_files + job_files)


def default_candidates(
    kind: Kind | str,
    all_files: Mapping[str, int] | Collection[str],
    running: Sequence[Running],
    selected: Collection[str] | None,
) -> list[str]:
    """§5 / §8: the candidates when the caller gives none, sorted by name.

    SYSTEM: every file minus the inputs of running compactions of any kind minus ``selected``.
    USER and SELECTOR: ``selected`` minus running inputs; no selection (None) gives no candidates.
    """
    busy: set[str] = set()
    for compaction in running:
        busy.update(compaction.files)
    if kind == Kind.SYSTEM:
        if selected:
            busy.update(selected)
        return sorted(name for name in all_files if name not in busy)
    if selected is None:
        return []
    return sorted(set(selected).difference(busy))


def plan(
    kind: Kind | str,
    settings: PlannerSettings,
    all_files: Mapping[str, int],
    candidates: Iterable[str],
    running: Sequence[Running] = (),
) -> list[PlannedJob]:
    """docs/planner.md §4 ``makePlan``: the jobs for one tablet, in the order they were emitted.

    ``all_files`` maps every file of the tablet to its size in bytes; ``candidates`` are the
    files this plan may use (see :func:`default_candidates`); ``running`` lists the tablet's
    running compactions of every kind. Raises :class:`ValueError` when a candidate or running
    file is not in ``all_files`` or a candidate is repeated.
    """
    if kind.__class__ is not Kind:
        kind = Kind(kind)
    cands = _sorted_candidates(all_files, candidates)
    if not cands:
        return []
    limit = settings._system_limit if kind is Kind.SYSTEM else None
    work, created, same_kind_running = _with_running(cands, kind, all_files, running)
    jobs = _multi_job_loop(work, created, settings.ratio, settings.max_open, limit)
    if kind is not Kind.SYSTEM:
        jobs = _user_fallbacks(jobs, cands, settings, same_kind_running)
    elif not jobs and not running and len(all_files) == len(cands):
        jobs = _lower_ratio_fallback(cands, settings, limit)
    return _planned(kind, settings, len(all_files), jobs)


def _sorted_candidates(all_files: Mapping[str, int], candidates: Iterable[str]) -> list[_Item]:
    """The candidates as (size, 0, name), smallest first; unknown or repeated ones refused."""
    try:
        cands: list[_Item] = [(all_files[name], 0, name) for name in candidates]
    except KeyError as exc:
        raise ValueError(f"candidate {exc.args[0]!r} is not one of the tablet's files") from None
    if len({item[2] for item in cands}) != len(cands):
        raise ValueError("candidates must not repeat a file")
    cands.sort()
    return cands


def _with_running(
    cands: list[_Item], kind: Kind, all_files: Mapping[str, int], running: Sequence[Running]
) -> tuple[list[_Item], int, bool]:
    """§4 step 2: the candidates plus one projected file per running job of the plan's kind;
    how many were projected, and whether any job of this kind runs."""
    work = cands.copy()
    created = 0
    for compaction in running:
        if compaction.kind == kind:
            try:
                size = sum(all_files[name] for name in compaction.files)
            except KeyError as exc:
                raise ValueError(f"running file {exc.args[0]!r} is not one of the tablet's files") from None
            insort(work, (size, 1, created))
            created += 1
    return work, created, created > 0


def _multi_job_loop(
    work: list[_Item], created: int, ratio: float, max_open: int, limit: int | None
) -> list[list[_Item]]:
    """§4 step 3: find a set, replace it by its projected output, repeat. Every projected file in
    ``work`` is in P; a set containing one (it waits on a running or earlier job) is not a job."""
    jobs: list[list[_Item]] = []
    while (found := _find(work, ratio, max_open, limit)) is not None:
        a, b = found
        chosen = work[a:b]
        del work[a:b]
        if not any(item[1] for item in chosen):
            jobs.append(chosen)
        insort(work, (sum(item[0] for item in chosen), 1, created))
        created += 1
        if b - a < max_open and jobs:
            break
    return jobs


def _user_fallbacks(
    jobs: list[list[_Item]], cands: list[_Item], settings: PlannerSettings, same_kind_running: bool
) -> list[list[_Item]]:
    """USER and SELECTOR plans: §4.2's look-ahead (only when |candidates| <= maxOpen, decision 2),
    and §4.3's forced sets when the ratio is never met and no job of this kind runs."""
    max_open = settings.max_open
    if len(jobs) == 1 and len(jobs[0]) < len(cands) <= max_open:
        in_job = {item[2] for item in jobs[0]}
        after = [item for item in cands if item[2] not in in_job]
        insort(after, (sum(item[0] for item in jobs[0]), 1, 0))
        if _find(after, settings.ratio, max_open, None) is None:
            jobs = [cands]
    if not jobs and not same_kind_running:
        jobs = _forced_sets(cands, max_open)
    return jobs


def _lower_ratio_fallback(cands: list[_Item], settings: PlannerSettings, limit: int | None) -> list[list[_Item]]:
    """SYSTEM plans of an idle tablet over its file limit: a set at a lowered ratio, if any."""
    max_files = settings.resolved_max_files
    if len(cands) <= max_files:
        return []
    lower = _lower_ratio_set(cands, limit, settings.max_open, settings.lowest_ratio, max_files)
    return [] if lower is None else [lower]


def _planned(kind: Kind, settings: PlannerSettings, total_files: int, jobs: list[list[_Item]]) -> list[PlannedJob]:
    """The jobs with their group (by size) and priority."""
    max_files = settings.resolved_max_files
    by_size = settings._by_size
    return [
        PlannedJob(
            kind,
            _choose_sorted(by_size, sum(map(_size_of, job))),
            job_priority(kind, total_files, len(job), max_files),
            tuple(map(_name_of, job)),
        )
        for job in jobs
    ]


#: The planner defaults: services, custom resources and the CLI take theirs from here.
DEFAULTS = PlannerSettings()
