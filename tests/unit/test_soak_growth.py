"""The soak's growth figures (issue 24): measured per process from the warm-up to the end, and
for the Redis servers per role — a failover swaps what primary and replica hold, which is not
growth."""

from bench.soak import Sample, growth


def _series(role: str, pid: int, rss: list[float], fds: list[int], start: float = 10.0) -> list[Sample]:
    return [Sample(start + i, role, pid, r, f, 4, 0) for i, (r, f) in enumerate(zip(rss, fds, strict=True))]


def test_a_failover_is_measured_per_role_not_as_one_servers_growth() -> None:
    # minute 10-30: server A primary (13.5 MB own), B replica (12.8); a failover at 20 swaps them
    samples = [
        *_series("redis-primary:by-role", 1, [13.5] * 10, [8] * 10),
        *_series("redis-primary:by-role", 2, [13.6] * 11, [8] * 11, start=20.0),
        *_series("redis-replica:by-role", 2, [12.8] * 10, [7] * 10),
        *_series("redis-replica:by-role", 3, [12.9] * 11, [7] * 11, start=20.0),
    ]
    rss, fds, _threads = growth(samples, warm=10.0)
    assert set(rss) == {"redis-primary", "redis-replica"}
    assert abs(rss["redis-primary"] - 0.74) < 0.01 and fds["redis-primary"] == 0
    assert abs(rss["redis-replica"] - 0.78) < 0.01 and fds["redis-replica"] == 0


def test_a_process_that_grows_is_reported_and_one_killed_early_is_not() -> None:
    samples = [
        *_series("coordinator:100", 100, [100.0 + 2 * i for i in range(21)], [10 + i for i in range(21)]),
        *_series("compactor-small-1:200", 200, [80.0, 400.0], [9, 90]),  # lived 1 of 20 minutes
    ]
    rss, fds, _threads = growth(samples, warm=10.0)
    assert rss == {"coordinator": 40.0} and fds == {"coordinator": 20}
