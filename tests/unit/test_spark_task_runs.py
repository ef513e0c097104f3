"""How the Spark engine cuts a merge's ranges into tasks (issue 23 §1): a big row group is read
forward once by one task for the ranges it holds, never decoded from its start by every range's
task; small row groups keep one task per range."""

from kompaktor.engines.ranges import InputMeta
from kompaktor.engines.spark import largest_group_entries, task_runs


def _meta(name: str, group_entries: list[int], group_index: tuple[int, ...] = ()) -> InputMeta:
    groups = tuple((b"%08d" % i, b"%08d" % (i + 1), n, n * 80) for i, n in enumerate(group_entries))
    return InputMeta(name, 1, sum(group_entries), groups, True, group_index=group_index)


def _tasks(n: int, skip: set[int] = frozenset()) -> list[tuple[int, bytes | None, bytes | None, str]]:
    return [(i, None, None, f"part-{i}") for i in range(n) if i not in skip]


def test_small_row_groups_keep_one_task_per_range() -> None:
    metas = [_meta(f"F{i}", [65_536] * 8) for i in range(8)]  # 512K entries each, 64K-row groups
    runs = task_runs(_tasks(8), metas, target_entries=500_000, slots=2)
    assert runs == [(t,) for t in _tasks(8)]


def test_one_big_row_group_per_input_is_read_by_as_many_tasks_as_slots() -> None:
    metas = [_meta(f"F{i}", [2_000_000]) for i in range(8)]  # 16M entries, one group per file
    runs = task_runs(_tasks(8), metas, target_entries=2_000_000, slots=2)
    assert [[t[0] for t in r] for r in runs] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_row_groups_of_few_big_entries_are_read_forward_once_too() -> None:
    """value4k at 16M: 62,500 entries of 4 KiB per row group is few entries, but 256 MB — the
    plan cuts it into ranges by bytes, so by entries alone every range's task decoded it from its
    start (measured: 1.9 s for the last range against 0.7 s for the first)."""
    metas = [InputMeta(f"F{i}", 1, 62_500, ((b"a", b"z", 62_500, 256 << 20),), True) for i in range(8)]
    runs = task_runs(_tasks(8), metas, target_entries=250_000, slots=2)
    assert [[t[0] for t in r] for r in runs] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_every_range_is_in_exactly_one_run_in_order() -> None:
    metas = [_meta("F", [10_000_000])]
    for n in range(1, 30):
        for slots in (1, 2, 3, 8):
            runs = task_runs(_tasks(n), metas, target_entries=100, slots=slots)
            flat = [t[0] for r in runs for t in r]
            assert flat == list(range(n))
            assert len(runs) <= max(slots, 1) or n <= slots


def test_runs_never_cross_a_range_a_resumed_merge_reuses() -> None:
    metas = [_meta("F", [10_000_000])]
    runs = task_runs(_tasks(10, skip={3, 4}), metas, target_entries=100, slots=2)
    for r in runs:
        idx = [t[0] for t in r]
        assert idx == list(range(idx[0], idx[0] + len(idx)))  # consecutive ranges only
    assert sorted(t[0] for r in runs for t in r) == [0, 1, 2, 5, 6, 7, 8, 9]


def test_sampled_segments_count_as_their_row_group() -> None:
    # a 1M-entry row group sampled into four segments is still one big row group
    m = _meta("F", [250_000] * 4, group_index=(0, 0, 0, 0))
    assert largest_group_entries([m]) == 1_000_000
    assert largest_group_entries([InputMeta("G", 1, 777, (), False)]) == 777  # no statistics: one group
