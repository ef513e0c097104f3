"""Per-group bounded priority queues of compaction jobs, in Redis (PLANNER.md §6).

One sorted set per group whose members sort lexicographically by (inverted priority, inverted
file count, sequence), i.e. priority descending, then files descending, then FIFO. Each
operation is one Lua script, so replace, insert and evict are atomic. Queues are a cache of
what the metadata implies: the coordinator can always rebuild them.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import orjson
import redis
from redis.commands.core import Script
from redis.connection import Connection
from redis.exceptions import NoScriptError

from kompaktor import contract as C

DEFAULT_MAX = 10_000


def _lua(name: str) -> str:
    return resources.files("kompaktor").joinpath(f"lua/{name}.lua").read_text()


@dataclass(frozen=True)
class Job:
    """A queued compaction job."""

    tablet: str
    kind: str
    priority: int
    group: str
    files: dict[str, int]  # name -> size in bytes
    service: str = "default"
    selection: str | None = None  # USER/SELECTOR selection id
    overlaps: bool = False  # SYSTEM job overlapping a stale selection (§6.4 rule 5)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"tablet": self.tablet, "kind": self.kind, "priority": self.priority,
                             "group": self.group, "files": self.files, "service": self.service}
        if self.selection is not None:
            d["selection"] = self.selection
        if self.overlaps:
            d["overlaps"] = True
        if self.extra:
            d["extra"] = self.extra
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Job:
        return cls(d["tablet"], d["kind"], int(d["priority"]), d["group"], dict(d["files"] or {}),
                   d.get("service", "default"), d.get("selection"), bool(d.get("overlaps", False)),
                   dict(d.get("extra") or {}))

    @property
    def size(self) -> int:
        return sum(self.files.values())


def _add_args(args: list[Any], tablet: str, jobs: Sequence[Job]) -> None:
    """Append one tablet's jobs to the arguments of ``queue_add.lua``: per group, the group, the
    tablet, the number of jobs, then each job's priority, file count and JSON."""
    by_group: dict[str, list[Job]] = defaultdict(list)
    for j in jobs:
        by_group[j.group].append(j)
    for group, gjobs in by_group.items():
        args += (group, tablet, len(gjobs))
        for j in gjobs:
            args += (j.priority, len(j.files), orjson.dumps(j.to_json()))


class QueueAdder:
    """Adds batches of tablets' jobs (:meth:`JobQueues.add_many`), one script call per batch, sent
    without waiting for its reply: the caller prepares the next batch while Redis runs this one
    (at most one batch in flight). :attr:`admitted` counts the jobs admitted by the batches applied."""

    def __init__(self, client: redis.Redis, script: Script, gen: int, max_size: int) -> None:
        self._script = script
        self._pool = client.connection_pool
        self._head = [gen, max_size, int(time.time() * 1000)]
        self._pending: tuple[Connection, list[Any]] | None = None
        self.admitted = 0

    def send(self, plans: Iterable[tuple[str, Sequence[Job]]]) -> None:
        args = self._head.copy()
        for tablet, jobs in plans:
            _add_args(args, tablet, jobs)
        if len(args) == len(self._head):
            return
        conn = self._pool.get_connection()
        try:
            packed = conn.pack_command("EVALSHA", self._script.sha, 0, *args)
            self.wait()  # for the batch before, on another connection
        except BaseException:
            self._pool.release(conn)
            raise
        try:
            conn.send_packed_command(packed)
        except (redis.ConnectionError, redis.TimeoutError):
            conn.disconnect()
            self._pool.release(conn)
            self.admitted += int(self._script(args=args))  # with the client's retries
            return
        except BaseException:
            conn.disconnect()
            self._pool.release(conn)
            raise
        self._pending = (conn, args)

    def wait(self) -> None:
        """Wait until the batch in flight, if any, has been applied."""
        if self._pending is None:
            return
        (conn, args), self._pending = self._pending, None
        try:
            res = conn.read_response()
        except NoScriptError:  # Redis restarted or flushed its scripts: the call below loads it
            res = None
        except (redis.ConnectionError, redis.TimeoutError):
            conn.disconnect()
            res = None  # the call below retries, as redis-py retries any command
        except redis.ResponseError:
            raise
        except BaseException:
            conn.disconnect()  # interrupted mid-reply: the connection is out of step
            raise
        finally:
            self._pool.release(conn)
        if res is None:
            res = self._script(args=args)
        self.admitted += int(res)


@dataclass(frozen=True)
class QueueStats:
    queued: int
    running: int
    rejected: int
    dequeued: int
    dead_lettered: int
    oldest_age_s: float
    lowest_priority: int

    @property
    def depth(self) -> int:
        """The autoscaling signal: queued plus running jobs."""
        return self.queued + self.running


class JobQueues:
    """All group queues in one Redis."""

    def __init__(self, client: redis.Redis) -> None:
        self.r = client
        self._add = client.register_script(_lua("queue_add"))
        self._poll = client.register_script(_lua("queue_poll"))
        self._sweep = client.register_script(_lua("queue_sweep"))
        self._resize = client.register_script(_lua("queue_resize"))

    # -- bound --------------------------------------------------------------------------------
    def max_size(self) -> int:
        raw = self.r.get(C.QUEUE_MAX)
        return DEFAULT_MAX if raw is None else int(raw)

    def resize(self, new_max: int) -> int:
        """Set the bound for every queue; evict (counted as rejected) until each fits."""
        if new_max <= 0:
            raise ValueError(f"queue bound must be > 0, got {new_max}")
        return int(self._resize(args=[new_max]))

    # -- generations ----------------------------------------------------------------------------
    def generation(self) -> int:
        return int(self.r.get(C.QUEUE_GENERATION) or 0)

    def begin_full_scan(self) -> int:
        return int(self.r.incr(C.QUEUE_GENERATION))

    def end_full_scan(self, gen: int) -> int:
        """Remove, in every queue, entries of tablets the pass did not re-plan."""
        return sum(int(self._sweep(args=[g, gen, ""])) for g in self.groups())

    # -- add / poll -----------------------------------------------------------------------------
    def add(self, tablet: str, jobs: Sequence[Job], gen: int | None = None) -> int:
        """Replace the tablet's entries in each group that gets jobs (§6.2). Returns admitted."""
        return self.add_many([(tablet, jobs)], gen) if jobs else 0

    def add_many(self, plans: Sequence[tuple[str, Sequence[Job]]], gen: int | None = None,
                 chunk: int = 1000) -> int:
        """:meth:`add` for many tablets in order: one script call per ``chunk`` tablets."""
        with self.adding(gen) as adder:
            for i in range(0, len(plans), chunk):
                adder.send(plans[i:i + chunk])
        return adder.admitted

    @contextmanager
    def adding(self, gen: int | None = None) -> Iterator[QueueAdder]:
        """A :class:`QueueAdder`; on exit every batch sent has been applied."""
        adder = QueueAdder(self.r, self._add, self.generation() if gen is None else gen, self.max_size())
        try:
            yield adder
        finally:
            adder.wait()

    def poll(self, group: str) -> Job | None:
        raw = self._poll(args=[group])
        return None if raw is None else Job.from_json(json.loads(raw))

    def remove_tablets(self, tablets: Iterable[str]) -> int:
        """Drop every queued job of these tablets, in every group (split, merge, delete)."""
        ids = json.dumps(sorted(set(tablets)))
        return sum(int(self._sweep(args=[g, 0, ids])) for g in self.groups())

    def clear_all(self) -> None:
        """Forget every queue (they are a cache; used by tests and rebuilds)."""
        keys = [k for k in self.r.scan_iter(match=C.PREFIX + "queue:*")]
        if keys:
            self.r.delete(*keys)

    # -- inspection ------------------------------------------------------------------------------
    def groups(self) -> list[str]:
        return sorted(g.decode() for g in self.r.smembers(C.QUEUE_GROUPS))

    def jobs(self, group: str, limit: int = 100) -> list[Job]:
        members = self.r.zrange(C.queue_key(group), 0, limit - 1)
        if not members:
            return []
        raws = self.r.hmget(C.queue_jobs_key(group), members)
        return [Job.from_json(json.loads(r)) for r in raws if r]

    def queued_tablets(self, group: str) -> set[str]:
        return {t.decode() for t in self.r.hkeys(C.queue_index_key(group))}

    def stats(self, group: str) -> QueueStats:
        p = self.r.pipeline(transaction=False)
        p.zcard(C.queue_key(group))
        p.scard(C.running_group_key(group))
        p.hgetall(C.queue_stats_key(group))
        p.zrange(C.queue_ages_key(group), 0, 0, withscores=True)
        p.zrange(C.queue_key(group), -1, -1)
        p.hvals(C.DEADLETTER)
        queued, running, st, oldest, last, dead = p.execute()
        age = 0.0
        if oldest:
            age = max(0.0, time.time() - oldest[0][1] / 1000.0)
        lowest = 20767 - int(last[0][:5]) if last else 0
        dl = sum(1 for d in dead if json.loads(d).get("group") == group)
        return QueueStats(int(queued), int(running), int(st.get(b"rejected", 0)), int(st.get(b"dequeued", 0)),
                          dl, age, lowest)
