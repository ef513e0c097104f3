"""Per-group bounded priority queues of compaction jobs, in Redis (docs/planner.md §6).

One sorted set per group whose members sort lexicographically by (inverted priority, inverted
file count, sequence), i.e. priority descending, then files descending, then FIFO. Each
operation is one Lua script, so replace, insert and evict are atomic. Queues are a cache of
what the metadata implies: the coordinator can always rebuild them.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any, cast

import orjson
import redis

from kompaktor import keyspace as C
from kompaktor.connection import SentCommand, pack_command, redis_errors, text
from kompaktor.model.job import PRIORITY_MAX, Job
from kompaktor.policy.tableprops import QUOTA, QUOTA_STEP_MAX
from kompaktor.redisfunctions import LuaFunction, LuaLibrary, missing_function

DEFAULT_MAX = 10_000
#: the default bound of a group's queue in bytes of input (1 TiB): whichever of the two bounds is
#: hit first applies (docs/planner.md "6. Job queues"); ``JobQueues.set_max_bytes`` changes it, 0 removes it
DEFAULT_MAX_BYTES = 1 << 40
#: an entry records its job's input bytes in 15 digits
MAX_ENTRY_BYTES = 10**15 - 1


#: how a queue operation's Redis failures are raised (a decorator, or a ``with`` block): as
#: Kompaktor's errors, by the connection layer's one mapping (:class:`redis_errors`)
mapped = redis_errors("the queues' address")


#: wake-up tokens kept per group (one per job queued, at most this many) and how long
WAKE_MAX = 16
WAKE_TTL_MS = 30_000
#: one BLPOP waits at most this long: below the Redis client's socket timeout (5 s), past which
#: the wait would fail as an outage
WAKE_WAIT_MAX_S = 4.0


_LUA_DIR = resources.files("kompaktor.queues").joinpath("lua")


def queue_preamble(*sources: str) -> str:
    """The preamble of a library with the queues' functions: the key names, the constants, the
    queues' shared functions (``lua/lib.lua``: ``refuse_stale`` takes the fencing token off
    ``ARGV``), then ``sources``. The queues' library, and the metadata's (its reserving function
    polls and reserves in one call, ``metadata/lua/reserve.lua``)."""
    return (
        C.lua_prelude(
            PRIORITY_MAX=PRIORITY_MAX,
            WAKE_MAX=WAKE_MAX,
            WAKE_TTL_MS=WAKE_TTL_MS,
            DEFAULT_MAX_BYTES=DEFAULT_MAX_BYTES,
            QUOTA_PROP=QUOTA,
            QUOTA_STEP_MAX=QUOTA_STEP_MAX,
        )
        + _LUA_DIR.joinpath("lib.lua").read_text()
        + "".join(sources)
    )


#: the queues' Redis functions (``lua/queue_<name>.lua``), one library
LIBRARY = LuaLibrary(
    "queues",
    queue_preamble(),
    {name: _LUA_DIR.joinpath(f"queue_{name}.lua").read_text() for name in ("add", "poll", "sweep", "resize", "call")},
)


def _add_args(args: list[Any], tablet: str, jobs: Sequence[Job]) -> None:
    """Append one tablet's jobs to the arguments of ``queue_add.lua``: per group, the group, the
    tablet, the number of jobs, then each job's priority, file count, input bytes and JSON."""
    if len(jobs) == 1:  # most tablets: one job, one group
        args += (jobs[0].group, tablet, 1, *_job_args(jobs[0]))
        return
    by_group: dict[str, list[Job]] = defaultdict(list)
    for j in jobs:
        by_group[j.group].append(j)
    for group, gjobs in by_group.items():
        args += (group, tablet, len(gjobs))
        for j in gjobs:
            args += _job_args(j)


def _job_args(j: Job) -> tuple[int, int, int, bytes]:
    """One job's arguments of ``queue_add.lua``: its priority, file count, input bytes and JSON."""
    return j.priority, len(j.files), min(j.size, MAX_ENTRY_BYTES), orjson.dumps(j.to_json())


def encode_adds(plans: Iterable[tuple[str, Sequence[Job]]]) -> Iterator[list[Any]]:
    """These tablets' jobs as the arguments of ``queue_add.lua`` after its head, one list per
    script call of :data:`ADD_BATCH` tablets at most (:meth:`QueueAdder.send_encoded` sends them;
    made one at a time, so that a call is made while Redis runs the one before). Plain values
    (str, int, bytes): a planning worker encodes its plans and hands over only these."""
    plans = list(plans)
    for i in range(0, len(plans), ADD_BATCH):
        body: list[Any] = []
        for tablet, jobs in plans[i : i + ADD_BATCH]:
            _add_args(body, tablet, jobs)
        if body:
            yield body


#: tablets per queue_add call. Redis runs one command at a time; a call of 1,000 tablets' jobs ran
#: for ~20 ms, holding every compactor's commit up meanwhile; 200 keeps a call to a few ms, and the
#: next call is prepared while Redis runs this one
ADD_BATCH = 200


class QueueAdder:
    """Adds batches of tablets' jobs (:meth:`JobQueues.add_many`), one script call per batch, sent
    without waiting for its reply: the caller prepares the next batch while Redis runs this one
    (at most one batch in flight). :attr:`admitted` counts the jobs admitted by the batches applied."""

    def __init__(self, client: redis.Redis, script: LuaFunction, gen: int, max_size: int, fence: str = "") -> None:
        self._script = script
        self._pool = client.connection_pool
        self._head = [fence, gen, max_size, int(time.time() * 1000)]
        self._pending: tuple[SentCommand, list[Any]] | None = None
        self.admitted = 0

    def send(self, plans: Iterable[tuple[str, Sequence[Job]]]) -> None:
        """Queue these tablets' jobs, in script calls of :data:`ADD_BATCH` tablets at most."""
        self.send_encoded(encode_adds(plans))

    def send_encoded(self, adds: Iterable[list[Any]]) -> None:
        """Queue jobs encoded by :func:`encode_adds` (perhaps in another process), one script call each."""
        for body in adds:
            self._send(body)

    def _send(self, body: list[Any]) -> None:
        if not body:
            return
        args = self._head + body
        conn = self._pool.get_connection()

        def prepare() -> Any:
            packed = pack_command(conn, "FCALL", self._script.name, 0, *args)
            self.wait()  # for the batch before, on another connection
            return packed

        sent = SentCommand.send(self._pool, conn, prepare)
        if sent is None:
            self.admitted += int(self._script(args=args))  # with the client's retries
            return
        self._pending = (sent, args)

    def wait(self) -> None:
        """Wait until the batch in flight, if any, has been applied."""
        if self._pending is None:
            return
        (sent, args), self._pending = self._pending, None
        # no reply when the connection failed (the call below retries, as redis-py retries any
        # command) or the server lacks the library (a new one, FUNCTION FLUSH: the call loads it)
        res = sent.read(missing_function)
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
    #: bytes of input the queued jobs read
    bytes: int = 0

    @property
    def depth(self) -> int:
        """The autoscaling signal: queued plus running jobs."""
        return self.queued + self.running


class JobQueues:
    """All group queues in one Redis."""

    def __init__(self, client: redis.Redis, *, fence: Callable[[], int | None] | None = None) -> None:
        self._r = client
        #: the fencing token of the coordinator these queues belong to (see lua/lib.lua), or None
        self._fence = fence
        self._add = LIBRARY.bind(client, "add")
        self._poll = LIBRARY.bind(client, "poll")
        self._sweep = LIBRARY.bind(client, "sweep")
        self._resize = LIBRARY.bind(client, "resize")
        self._call = LIBRARY.bind(client, "call")

    def _token(self) -> str:
        token = None if self._fence is None else self._fence()
        return "" if token is None else str(token)

    @staticmethod
    def libraries() -> list[LuaLibrary]:
        """The queues' function library: what :meth:`MetadataStore.load_scripts` loads for the
        roles that may not (compactors: ``FCALL`` only)."""
        return [LIBRARY]

    # -- bound --------------------------------------------------------------------------------
    @mapped
    def max_size(self) -> int:
        raw = self._r.get(C.QUEUE_MAX)
        return DEFAULT_MAX if raw is None else int(raw)

    @mapped
    def max_bytes(self) -> int:
        raw = self._r.get(C.QUEUE_MAX_BYTES)
        return DEFAULT_MAX_BYTES if raw is None else int(raw)

    @mapped
    def set_max_bytes(self, new_max: int) -> None:
        """Set every queue's bound in input bytes (0: none); it applies to the next insertions."""
        if new_max < 0 or new_max > MAX_ENTRY_BYTES:
            raise ValueError(f"queue byte bound must be in [0, {MAX_ENTRY_BYTES}], got {new_max}")
        self._call(args=[self._token(), "SET", C.QUEUE_MAX_BYTES, new_max])

    @mapped
    def resize(self, new_max: int) -> int:
        """Set the bound for every queue; evict (counted as rejected) until each fits."""
        if new_max <= 0:
            raise ValueError(f"queue bound must be > 0, got {new_max}")
        return int(self._resize(args=[self._token(), new_max]))

    # -- generations ----------------------------------------------------------------------------
    @mapped
    def has_generation(self) -> bool:
        """False when the queue keys are gone (never built, lost, or cleared): they must be rebuilt."""
        return bool(self._r.exists(C.QUEUE_GENERATION))

    @mapped
    def generation(self) -> int:
        return int(self._r.get(C.QUEUE_GENERATION) or 0)

    @mapped
    def begin_full_scan(self) -> int:
        return int(self._call(args=[self._token(), "INCR", C.QUEUE_GENERATION]))

    @mapped
    def end_full_scan(self, gen: int) -> int:
        """Remove, in every queue, entries of tablets the pass did not re-plan."""
        return sum(int(self._sweep(args=[self._token(), g, gen, ""])) for g in self.groups())

    # -- add / poll -----------------------------------------------------------------------------
    @mapped
    def add(self, tablet: str, jobs: Sequence[Job], gen: int | None = None) -> int:
        """Replace the tablet's entries in each group that gets jobs (§6.2). Returns admitted."""
        return self.add_many([(tablet, jobs)], gen) if jobs else 0

    @mapped
    def add_many(self, plans: Sequence[tuple[str, Sequence[Job]]], gen: int | None = None, chunk: int = 1000) -> int:
        """:meth:`add` for many tablets in order: one script call per ``chunk`` tablets."""
        with self.adding(gen) as adder:
            for i in range(0, len(plans), chunk):
                adder.send(plans[i : i + chunk])
        return adder.admitted

    @contextmanager
    def adding(self, gen: int | None = None) -> Iterator[QueueAdder]:
        """A :class:`QueueAdder`; on exit every batch sent has been applied."""
        adder = QueueAdder(
            self._r, self._add, self.generation() if gen is None else gen, self.max_size(), self._token()
        )
        with mapped:
            try:
                yield adder
            finally:
                adder.wait()

    @mapped
    def wait_for_work(self, group: str, timeout_s: float) -> bool:
        """Block until a job is queued for ``group`` (a wake-up token, taken) or ``timeout_s``
        passes (at most :data:`WAKE_WAIT_MAX_S`); True when woken. One BLPOP: an idle compactor
        costs Redis no more than a poll."""
        return self._r.blpop([C.wake_key(group)], timeout=min(max(0.01, timeout_s), WAKE_WAIT_MAX_S)) is not None

    @mapped
    def poll(self, group: str) -> Job | None:
        raw = self._poll(args=[self._token(), group])
        return None if raw is None else Job.from_json(json.loads(raw))

    @mapped
    def remove_tablets(self, tablets: Iterable[str]) -> int:
        """Drop every queued job of these tablets, in every group (split, merge, delete)."""
        ids = json.dumps(sorted(set(tablets)))
        return sum(int(self._sweep(args=[self._token(), g, 0, ids])) for g in self.groups())

    @mapped
    def clear_all(self) -> None:
        """Forget every queue and its jobs (they are a cache; used by tests and rebuilds). The
        bound stays (:meth:`resize`), and so does the entry sequence (it only grows); the
        generation goes, so the queues count as lost (:meth:`has_generation`) and the
        coordinator rebuilds them."""
        keep = {C.QUEUE_MAX.encode(), C.QUEUE_MAX_BYTES.encode(), C.QUEUE_SEQ.encode()}
        keys = [k for k in self._r.scan_iter(match=C.PREFIX + "queue:*") if k not in keep]
        if keys:
            self._r.delete(*keys)

    # -- inspection ------------------------------------------------------------------------------
    @mapped
    def groups(self) -> list[str]:
        return sorted(text(g) for g in self._r.smembers(C.QUEUE_GROUPS))

    @mapped
    def jobs(self, group: str, limit: int = 100) -> list[Job]:
        members = cast("list[bytes]", self._r.zrange(C.queue_key(group), 0, limit - 1))
        if not members:
            return []
        raws = self._r.hmget(C.queue_jobs_key(group), members)
        return [Job.from_json(json.loads(r)) for r in raws if r]

    @mapped
    def queued_tablets(self, group: str) -> set[str]:
        return {text(t) for t in self._r.hkeys(C.queue_index_key(group))}

    @mapped
    def stats(self, group: str) -> QueueStats:
        p = self._r.pipeline(transaction=False)
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
        lowest = PRIORITY_MAX - int(last[0][:5]) if last else 0
        dl = sum(1 for d in dead if json.loads(d).get("group") == group)
        return QueueStats(
            int(queued),
            int(running),
            int(st.get(b"rejected", 0)),
            int(st.get(b"dequeued", 0)),
            dl,
            age,
            lowest,
            int(st.get(b"bytes", 0)),
        )
