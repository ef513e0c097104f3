"""The store's base: the Redis connection and what every part of the store writes through.

Owns the client, the durability of acknowledged writes (:mod:`kompaktor.connection`), the mapping
of Redis errors (:meth:`StoreBase.call`, through :class:`~kompaktor.connection.redis_errors`), the
scripts (each part names its own in ``SCRIPTS``; :meth:`StoreBase.load_scripts` loads them all),
fencing (:meth:`StoreBase.fenced`), plain writes (``_write``, fenced inside Redis) and the
conditional mutation of tables and tablets (:meth:`StoreBase.apply`: ``lua/mutate.lua``; what a
mutation says is :mod:`~kompaktor.metadata.store.mutation`). The parts of the store
(:mod:`kompaktor.metadata.store`) build on it; nothing here knows tables, files or compactions.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Callable, Mapping
from importlib import resources
from typing import Any, ClassVar, ParamSpec, Self, TypeVar

import redis

from kompaktor import keyspace as C
from kompaktor.connection import (
    Durability,
    connect,
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
#: poll and reserve in one call (:meth:`StoreBase.reserve_next`)
_RESERVE = "return reserve_next(ARGV)"
#: the most stale jobs one reserving call discards before it answers (the client calls again):
#: Redis runs one script at a time, so a long run of stale jobs is cut into short calls
RESERVE_MAX_STALE = 16
#: the oldest Redis Kompaktor runs on: function libraries (``FUNCTION LOAD``, ``FCALL``)
MIN_REDIS = (7, 0)

P = ParamSpec("P")
R = TypeVar("R")


class StoreBase:
    """The connection, the scripts and the write paths every part of the metadata store uses."""

    #: the Lua this class runs: attribute name -> a function's body (a script's text, run after the
    #: library's :data:`PREAMBLE`). Each part declares its own; the store's library holds those of
    #: every class it is made of (:meth:`library`; :meth:`load_scripts` loads it)
    SCRIPTS: ClassVar[dict[str, str]] = {"_mutate": _MUTATE, "_reserve": _RESERVE, "_fenced_write": _FENCED_WRITE}
    # the SCRIPTS, bound to the connection as attributes in __init__
    _mutate: LuaFunction
    _reserve: LuaFunction
    _fenced_write: LuaFunction
    #: :data:`SCAN_CHUNK`, per class (a test makes it small)
    scan_chunk: ClassVar[int] = SCAN_CHUNK

    def __init__(
        self,
        client: redis.Redis,
        url: str = "",
        *,
        fence: Callable[[], int | None] | None = None,
        durability: Durability | None = None,
    ) -> None:
        self._r = client
        self.url = url
        #: how an acknowledged write is made durable (issue 15 §1, :mod:`kompaktor.connection`)
        self.durability = durability or Durability(sentinel=is_sentinel_url(url))
        #: the fencing token every write of this view carries (:meth:`fenced`), or None
        self._fence = fence
        #: what Redis failures mean, raised in their place (:meth:`call`)
        self._errors = redis_errors(url or "the given URL", url=url)
        self._library = self.library()
        for name in self._library.functions:
            setattr(self, name, self._library.bind(client, name))
        self._queues: JobQueues | None = None

    @classmethod
    def library(cls) -> LuaLibrary:
        """The Redis function library of this store: :data:`PREAMBLE`, then the ``SCRIPTS`` of
        every class it is made of, each a function (:mod:`kompaktor.redisfunctions`)."""
        return _library_of(cls)  # type: ignore[arg-type]  # a class is hashable; typeshed's cache says not

    def load_scripts(self) -> int:
        """Load the store's and the queues' function libraries where Redis does not hold them (a new
        server, ``FUNCTION FLUSH``): compactors call functions and may not load them (their Redis
        user has ``FCALL`` only, :mod:`kompaktor.metadata.acl`). One round trip when nothing is
        missing; returns how many libraries were loaded. The coordinator calls it on every pass."""
        return int(self.call(load_missing, self._r, [self._library, *JobQueues.libraries()]))

    def fenced(self, token: Callable[[], int | None]) -> Self:
        """A view of this store, on the same connection, whose every write (mutations, queue
        scripts, sets, counters) carries the fencing token ``token()`` and is refused atomically,
        inside Redis, with :class:`Fenced` once a newer token exists. The coordinator's store.
        While ``token()`` is None (a coordinator that never led) the writes are not fenced."""
        return type(self)(self._r, self.url, fence=token)

    @property
    def queues(self) -> JobQueues:
        """The job queues, on this store's connection (fenced like this store)."""
        if self._queues is None:
            self._queues = JobQueues(self._r, fence=self._fence)
        return self._queues

    def _write(self, *commands: tuple[Any, ...]) -> list[Any]:
        """Run write commands atomically (MULTI/EXEC); through a fenced view, only while its
        fencing token is the newest. Returns their replies."""
        token = None if self._fence is None else self._fence()
        if token is None:
            p = self._r.pipeline(transaction=True)
            for cmd in commands:
                p.execute_command(*cmd)
            return list(self.call(p.execute))
        cmds = json.dumps([[str(a) for a in cmd] for cmd in commands])
        return list(self.call(self._fenced_write, args=[token, cmds]))

    def _token(self) -> str:
        token = None if self._fence is None else self._fence()
        return "" if token is None else str(token)

    def close(self) -> None:
        self._r.close()

    @classmethod
    def from_url(cls, url: str | None = None) -> Self:
        import os

        url = url or os.environ.get("KOMPAKTOR_REDIS_URL") or DEFAULT_REDIS_URL
        return cls(connect(url), url)

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
        self.call(durable_pipeline, self._r, self.durability, lambda pipe: None)

    def _eval_durable(self, arg: str) -> Any:
        """mutate.lua on ``arg``, answered only once the write is durable (issue 15 §1): the barrier
        and WAIT / WAITAOF the store's durability asks for follow in the same round trip."""

        def run(pipe: redis.client.Pipeline) -> None:
            pipe.fcall(self._mutate.name, 0, arg)

        try:
            return self.call(durable_pipeline, self._r, self.durability, run)[0]
        except redis.ResponseError as exc:
            if not missing_function(exc):
                raise
        self.call(self._library.load, self._r)  # a server without the library (a new one, FUNCTION FLUSH)
        return self.call(durable_pipeline, self._r, self.durability, run)[0]

    def ping(self) -> None:
        """The store answers, is a primary and runs functions (Redis >= 7.0): a replica given as the
        primary, or an older Redis, is refused in one line here, before anything reads stale data
        from it or tries to write to it."""
        self.call(self._r.ping)
        if self.call(self._r.info, "replication").get("role") != "master":
            raise StoreUnavailable(explain(self.url, redis.ReadOnlyError("READONLY")) or "not a primary")
        server = self.call(self._r.info, "server")
        if server_version(server) < MIN_REDIS:
            raise StoreUnavailable(
                f"Redis at {redact_url(self.url or 'the given URL')} is version "
                f"{server.get('redis_version') or 'unknown'}: Kompaktor "
                f"needs Redis >= {'.'.join(map(str, MIN_REDIS))} (its code runs as Redis functions)"
            )
        self.call(self.durability.plan, self._r)  # a durability the server cannot give: refused now

    def mutate(self, m: Mutation) -> list[int]:
        """Apply a conditional mutation atomically; raise :class:`ConditionFailed` if any condition
        fails (then nothing changed). Returns the new versions of the tablets."""
        return list(self.apply(m).get("versions") or [])

    def apply(self, m: Mutation) -> dict[str, Any]:
        """:meth:`mutate`, returning the script's whole outcome: ``versions``, ``table`` (the
        mutation's ``table_reads``) and ``reserved`` (what ``add_running`` with output naming chose,
        per tablet id)."""
        # One id per call: redis-py resends the same arguments when it retries after a broken
        # connection, and the script then answers with the first attempt's outcome.
        fence = None if self._fence is None else self._fence()
        res: dict[str, Any] = json.loads(self._eval_durable(m.to_json(uuid.uuid4().hex, fence)))
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
    ) -> dict[str, Any]:
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
        args: list[Any] = [self._token(), group, uuid.uuid4().hex, max_stale, ecid, now]
        for key, spec in templates.items():
            args += (key, spec)
        out = json.loads(self.call(self._reserve, args=args))
        if not isinstance(out, dict):
            return {}
        if "res" in out:
            self.durable()
        return out

    def next_seq(self, name: str) -> int:
        return int(self.call(self._r.hincrby, C.SEQ, name, 1))


@functools.cache
def _library_of(cls: type[StoreBase]) -> LuaLibrary:
    bodies = {name: body for c in reversed(cls.__mro__) for name, body in vars(c).get("SCRIPTS", {}).items()}
    return LuaLibrary("metadata", PREAMBLE, bodies)
