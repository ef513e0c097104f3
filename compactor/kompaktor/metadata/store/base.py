"""The store's core: the Redis connection and what every part of the store writes through.

Owns the client, the durability of acknowledged writes (:mod:`kompaktor.connection`), the mapping
of Redis errors (:meth:`StoreCore.call`, through :class:`~kompaktor.connection.redis_errors`), the
function library (each part names its scripts in ``SCRIPTS``; :func:`library` puts them in one,
:meth:`StoreCore.load_scripts` loads it), fencing (:meth:`StoreCore.fenced`), plain writes
(:meth:`StoreCore.write`, fenced inside Redis) and the conditional mutation of tables and tablets
(:meth:`StoreCore.apply`: ``lua/mutate.lua``; what a mutation says is
:mod:`~kompaktor.metadata.store.mutation`). The parts of the store (:mod:`kompaktor.metadata.store`)
each hold the one core of their store; nothing here knows tables, files or compactions.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from importlib import resources
from typing import Any, ClassVar, ParamSpec, Required, TypedDict, TypeVar, cast

import redis

from kompaktor import keyspace
from kompaktor.connection import (
    Durability,
    durable_pipeline,
    explain,
    is_sentinel_url,
    redis_errors,
    server_version,
)
from kompaktor.metadata.store.mutation import Mutation
from kompaktor.model.errors import ConditionFailed, Fenced, StoreUnavailable
from kompaktor.model.redact import redact_url
from kompaktor.queues.jobqueue import JobQueues, queue_preamble
from kompaktor.redisfunctions import LuaFunction, LuaLibrary, load_missing, missing_function

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
#: the most a single call reads or pops of a structure that grows with the instance (a table's
#: tablets, the dirty set): Redis runs one command at a time, so bigger calls hold everyone up
SCAN_CHUNK = 10_000
# A coordinator's plain writes (sets, hashes, counters): applied only while its fencing token
# (ARGV[1]) is the newest, all of them atomically. ARGV[2] = JSON list of commands.
_FENCED_WRITE = """
local tok = tonumber(ARGV[1])
local cur = tonumber(redis.call('GET', K.fence) or '0')
if cur > tok then
  return redis.error_reply('FENCED fencing token ' .. ARGV[1] .. ' is stale: coordinator ' .. cur .. ' took over')
end
local out = {}
for i, c in ipairs(cjson.decode(ARGV[2])) do out[i] = redis.call(unpack(c)) end
return out
"""
_LUA_DIR = resources.files("kompaktor.metadata").joinpath("lua")
#: the preamble of the metadata's function library: the key names, the queues' shared functions,
#: mutate(spec), the conditional mutation (``lua/mutate.lua``), and reserve_next(ARGV), poll and
#: reserve in one call (``lua/reserve.lua``)
PREAMBLE = queue_preamble(*(_LUA_DIR.joinpath(f).read_text() for f in ("mutate.lua", "reserve.lua")))
#: the conditional mutation: ARGV[1] = the spec as JSON (:meth:`Mutation.to_json`)
_MUTATE = "return (mutate(cjson.decode(ARGV[1])))"
#: poll and reserve in one call (:meth:`StoreCore.reserve_next`)
_RESERVE = "return reserve_next(ARGV)"
#: the most stale jobs one reserving call discards before it answers (the client calls again):
#: Redis runs one script at a time, so a long run of stale jobs is cut into short calls
RESERVE_MAX_STALE = 16
#: the oldest Redis Kompaktor runs on: function libraries (``FUNCTION LOAD``, ``FCALL``)
MIN_REDIS = (7, 0)

P = ParamSpec("P")
R = TypeVar("R")


class ReservedTablet(TypedDict):
    """What ``add_running`` with output naming chose for one tablet (``lua/mutate.lua``)."""

    output: str
    full: bool
    prev: str | None  # the tablet's range, rows hex-encoded (``keys.decode_row``)
    end: str | None


class MutationOutcome(TypedDict, total=False):
    """A conditional mutation's outcome (``lua/mutate.lua``): applied, with the tablets' new
    versions, the ``table_reads`` fields and the reservations; or refused, with the condition that
    failed (the store raises then: callers of :meth:`StoreCore.apply` see only applied ones)."""

    ok: Required[bool]
    versions: list[int]
    table: dict[str, str]
    reserved: dict[str, ReservedTablet]
    cond: str
    tablet: str
    detail: str


class ReserveOutcome(TypedDict, total=False):
    """A poll-and-reserve's outcome (``lua/reserve.lua``): stale jobs discarded, the job polled
    (absent: the queue was empty), when its tablet was first queued (ms), the reserving mutation's
    outcome (absent: the caller reserves the job) and whether to call again."""

    n: int
    job: dict[str, Any]  # a Job's JSON (``Job.from_json``)
    queued: int
    res: MutationOutcome
    more: bool


class StoreCore:
    """The connection, the function library and the write paths every part of the metadata store
    uses. One per store (a fenced store has its own, on the same connection)."""

    #: the core's own Lua: attribute name -> a function's body (a script's text, run after the
    #: library's :data:`PREAMBLE`). Each part declares its own ``SCRIPTS`` too; the store's library
    #: holds them all (:func:`library`)
    SCRIPTS: ClassVar[dict[str, str]] = {"_mutate": _MUTATE, "_reserve": _RESERVE, "_fenced_write": _FENCED_WRITE}
    #: :data:`SCAN_CHUNK`, read by the parts through their core (a test makes it small)
    scan_chunk: ClassVar[int] = SCAN_CHUNK

    def __init__(
        self,
        client: redis.Redis,
        url: str,
        library: LuaLibrary,
        *,
        fence: Callable[[], int | None] | None = None,
        durability: Durability | None = None,
    ) -> None:
        #: the connection: the parts', and the protocols' of :mod:`kompaktor.metadata`, nobody else's
        self.client = client
        self.url = url
        #: how an acknowledged write is made durable (docs/architecture.md "Durability: what an
        #: acknowledgment means", :mod:`kompaktor.connection`)
        self.durability = durability or Durability(sentinel=is_sentinel_url(url))
        #: the fencing token every write through this core carries (:meth:`fenced`), or None
        self.fence = fence
        #: what Redis failures mean, raised in their place (:meth:`call`)
        self._errors = redis_errors(url or "the given URL", url=url)
        #: the store's function library: the core's and every part's ``SCRIPTS`` (:func:`library`)
        self.library = library
        self._mutate = self.function("_mutate")
        self._reserve = self.function("_reserve")
        self._fenced_write = self.function("_fenced_write")

    def function(self, name: str) -> LuaFunction:
        """The library's function ``name`` (a key of some ``SCRIPTS``), bound to the connection."""
        return self.library.bind(self.client, name)

    def load_scripts(self) -> int:
        """Load the store's and the queues' function libraries where Redis does not hold them (a new
        server, ``FUNCTION FLUSH``): compactors call functions and may not load them (their Redis
        user has ``FCALL`` only, :mod:`kompaktor.metadata.acl`). One round trip when nothing is
        missing; returns how many libraries were loaded. The coordinator calls it on every pass."""
        return int(self.call(load_missing, self.client, [self.library, *JobQueues.libraries()]))

    def fenced(self, token: Callable[[], int | None]) -> StoreCore:
        """A core on the same connection whose every write (mutations, scripts, sets, counters)
        carries the fencing token ``token()`` and is refused atomically, inside Redis, with
        :class:`Fenced` once a newer token exists. While ``token()`` is None (a coordinator that
        never led) the writes are not fenced. The durability is this core's (the same object: a
        coordinator given one keeps it on every write it makes as leader)."""
        return StoreCore(self.client, self.url, self.library, fence=token, durability=self.durability)

    def write(self, *commands: tuple[Any, ...]) -> list[Any]:
        """Run write commands atomically (MULTI/EXEC); through a fenced core, only while its
        fencing token is the newest. Returns their replies."""
        token = None if self.fence is None else self.fence()
        if token is None:
            p = self.client.pipeline(transaction=True)
            for cmd in commands:
                p.execute_command(*cmd)
            return list(self.call(p.execute))
        cmds = json.dumps([[str(a) for a in cmd] for cmd in commands])
        return list(self.call(self._fenced_write, args=[token, cmds]))

    def token(self) -> str:
        """The fencing token as a script's argument: ``""`` when writes are not fenced."""
        token = None if self.fence is None else self.fence()
        return "" if token is None else str(token)

    def close(self) -> None:
        self.client.close()

    # -- plumbing -------------------------------------------------------------------------
    def call(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Run a Redis call; what Redis failures mean is raised in their place
        (:class:`~kompaktor.connection.redis_errors`): :class:`StoreUnavailable` (with the URL,
        redacted) when Redis cannot be used, including a wrong password and a database index the
        server does not have, :class:`Fenced`."""
        with self._errors:
            return fn(*args, **kwargs)

    def durable(self) -> None:
        """Return once every write made so far (by anyone) is durable as :attr:`durability` asks
        (one barrier write and the wait); for writes outside :meth:`apply` that a caller
        acknowledges. Raises :class:`~kompaktor.connection.NotDurable` if not confirmed."""
        self.call(durable_pipeline, self.client, self.durability, lambda pipe: None)

    def _eval_durable(self, arg: str) -> Any:
        """mutate.lua on ``arg``, answered only once the write is durable (docs/architecture.md
        "Durability: what an acknowledgment means"): the barrier and WAIT / WAITAOF the store's
        durability asks for follow in the same round trip."""

        def run(pipe: redis.client.Pipeline) -> None:
            pipe.fcall(self._mutate.name, 0, arg)

        try:
            return self.call(durable_pipeline, self.client, self.durability, run)[0]
        except redis.ResponseError as exc:
            if not missing_function(exc):
                raise
        self.call(self.library.load, self.client)  # a server without the library (a new one, FUNCTION FLUSH)
        return self.call(durable_pipeline, self.client, self.durability, run)[0]

    def ping(self) -> None:
        """The store answers, is a primary and runs functions (Redis >= 7.0): a replica given as the
        primary, or an older Redis, is refused in one line here, before anything reads stale data
        from it or tries to write to it."""
        self.call(self.client.ping)
        if self.call(self.client.info, "replication").get("role") != "master":
            raise StoreUnavailable(explain(self.url, redis.ReadOnlyError("READONLY")) or "not a primary")
        server = self.call(self.client.info, "server")
        if server_version(server) < MIN_REDIS:
            raise StoreUnavailable(
                f"Redis at {redact_url(self.url or 'the given URL')} is version "
                f"{server.get('redis_version') or 'unknown'}: Kompaktor "
                f"needs Redis >= {'.'.join(map(str, MIN_REDIS))} (its code runs as Redis functions)"
            )
        self.call(self.durability.plan, self.client)  # a durability the server cannot give: refused now

    def mutate(self, m: Mutation) -> list[int]:
        """Apply a conditional mutation atomically; raise :class:`ConditionFailed` if any condition
        fails (then nothing changed). Returns the new versions of the tablets."""
        return list(self.apply(m).get("versions") or [])

    def apply(self, m: Mutation) -> MutationOutcome:
        """:meth:`mutate`, returning the script's whole outcome: ``versions``, ``table`` (the
        mutation's ``table_reads``) and ``reserved`` (what ``add_running`` with output naming chose,
        per tablet id)."""
        # One id per call: redis-py resends the same arguments when it retries after a broken
        # connection, and the script then answers with the first attempt's outcome.
        fence = None if self.fence is None else self.fence()
        res: MutationOutcome = json.loads(self._eval_durable(m.to_json(uuid.uuid4().hex, fence)))
        if not res["ok"] and res["cond"] == "fenced":
            raise Fenced(res.get("detail") or "stale fencing token")
        if not res["ok"]:
            detail = res.get("detail") or ""
            if res.get("tablet"):
                detail = f"{detail} on tablet {res['tablet']}".strip()
            raise ConditionFailed(res["cond"], detail)
        return res

    def reserve_next(
        self, group: str, ecid: str, now: int, templates: Mapping[str, str], max_stale: int = RESERVE_MAX_STALE
    ) -> ReserveOutcome:
        """Poll ``group``'s queue and reserve its job in one atomic call (``lua/reserve.lua``):
        ``templates`` maps a job key (its kind, ``+overlaps`` for a job flagged so) to the
        reserving mutation's spec with placeholders (:meth:`Mutation.to_json`; the job's values,
        and ``ecid`` and ``now`` (ms) the reservation's); a refused job is
        discarded (counted in ``stale_jobs_discarded``) and the next one polled, up to
        ``max_stale``. Returns ``n`` (stale jobs discarded), ``job`` (the job polled, as JSON;
        absent when the queue was empty), ``res`` (the mutation's outcome, when reserved; absent
        for a job whose key has no template: the caller reserves it) and ``more`` (the stale
        bound was reached: call again). One id per call: resent after a broken connection, the
        call answers with the first attempt's outcome.

        Answered once a reservation is durable (:meth:`durable`, a second round trip only where the
        store's durability waits for a replica or an fsync); a poll that reserved nothing waits for
        nothing, as a queue poll never did (an idle compactor's poll stays one quick call while a
        replica is down)."""
        args: list[Any] = [self.token(), group, uuid.uuid4().hex, max_stale, ecid, now]
        for key, spec in templates.items():
            args += (key, spec)
        out = json.loads(self.call(self._reserve, args=args))
        if not isinstance(out, dict):
            return {}
        if "res" in out:
            self.durable()
        return cast(ReserveOutcome, out)

    def next_seq(self, name: str) -> int:
        return int(self.call(self.client.hincrby, keyspace.SEQ, name, 1))


def library(*parts: type) -> LuaLibrary:
    """The function library of a store made of ``parts``: :data:`PREAMBLE`, then the core's
    ``SCRIPTS`` and every part's, each a function (:mod:`kompaktor.redisfunctions`). A name given
    twice is refused."""
    bodies: dict[str, str] = {}
    for c in (StoreCore, *parts):
        scripts: dict[str, str] = vars(c).get("SCRIPTS", {})
        if twice := bodies.keys() & scripts.keys():
            raise ValueError(f"scripts named twice: {sorted(twice)}")
        bodies.update(scripts)
    return LuaLibrary("metadata", PREAMBLE, bodies)
