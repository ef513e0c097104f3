"""Adding jobs in batches (docs/planner.md §6.2, issue 4 §6): one queue_add.lua call per batch of
tablets, sent while the caller prepares the next batch, gives exactly the state of one add per
tablet; a flushed script or a connection lost with a batch in flight does not lose the batch."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import redis
from redis.connection import Connection

from kompaktor.model.job import Job
from kompaktor.queues import jobqueue
from kompaktor.queues.jobqueue import JobQueues
from tests.support.rawredis import raw_redis
from tests.support.snapshot import snapshot

pytestmark = pytest.mark.redis


def job(tablet: str, priority: int, nfiles: int, group: str, tag: str) -> Job:
    return Job(tablet, "SYSTEM", priority, group, {f"{tablet}/{tag}f{i}": 100 for i in range(nfiles)})


def random_plans(rng: random.Random, step: int) -> list[tuple[str, list[Job]]]:
    plans = []
    for n in range(rng.randint(1, 12)):
        t = f"t{rng.randint(0, 9)}"  # a tablet may come more than once in a batch
        plans.append(
            (
                t,
                [
                    job(
                        t,
                        rng.choice([-5, 0, 1, 2, 3, 7]),
                        rng.randint(1, 3),
                        rng.choice(["g1", "g2"]),
                        f"{step}.{n}.{k}.",
                    )
                    for k in range(rng.randint(0, 4))
                ],
            )
        )
    return plans


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_batches_give_the_state_of_one_add_per_tablet(
    redis_url: str, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bounds of 1 to 6 make rejections and evictions common, also of a tablet's own jobs and of
    tablets earlier in the same batch; polls in between change the last entries."""
    monkeypatch.setattr(jobqueue, "time", SimpleNamespace(time=lambda: 1_700_000_000.0))  # same "added"
    rng = random.Random(seed)
    one, batched = (redis.Redis.from_url(redis_url.rsplit("/", 1)[0] + f"/{db}") for db in (1, 2))
    q1, qb = JobQueues(one), JobQueues(batched)
    for _trial in range(25):
        one.flushdb()
        batched.flushdb()
        bound = rng.randint(1, 6)
        q1.resize(bound)
        qb.resize(bound)
        for step in range(6):
            plans = random_plans(rng, step)
            gen = step + 1
            admitted = sum(q1.add(t, jobs, gen) for t, jobs in plans)
            assert qb.add_many(plans, gen, chunk=rng.randint(1, 5)) == admitted
            assert snapshot(batched) == snapshot(one)
            if rng.random() < 0.3:
                for g in ("g1", "g2"):
                    assert qb.poll(g) == q1.poll(g)
    one.close()
    batched.close()


def test_add_after_the_functions_were_flushed(store) -> None:
    """A server that lost Kompaktor's functions (a new one, FUNCTION FLUSH) gets them again from a
    role that may load code: the batches in flight and those after all land."""
    q = store.queues
    assert q.add_many([("a", [job("a", 1, 1, "g", "")])]) == 1
    raw_redis(store).function_flush()
    assert q.add_many([("b", [job("b", 2, 1, "g", "")]), ("c", [job("c", 3, 1, "g", "")])], chunk=1) == 2
    assert [j.tablet for j in q.jobs("g")] == ["c", "b", "a"]


def test_reply_lost_with_a_batch_in_flight(store, monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch is sent again (as redis-py resends any command after a broken connection): adds
    replace a tablet's entries, so the queue holds each job once."""
    q = store.queues
    q.add("a", [job("a", 5, 1, "g", "old")])
    read, lost = Connection.read_response, []

    def read_or_lose(conn: Connection, *args, **kwargs):
        if not lost:  # the first reply read: the batch's
            lost.append(conn)
            conn.disconnect()
            raise redis.ConnectionError("connection lost")
        return read(conn, *args, **kwargs)

    with q.adding(gen=1) as adder:
        monkeypatch.setattr(Connection, "read_response", read_or_lose)
        adder.send([("a", [job("a", 1, 1, "g", "")]), ("b", [job("b", 2, 2, "g", "")])])
    assert lost and adder.admitted == 2
    assert [(j.tablet, j.priority) for j in q.jobs("g")] == [("b", 2), ("a", 1)]
    assert q.queued_tablets("g") == {"a", "b"}
