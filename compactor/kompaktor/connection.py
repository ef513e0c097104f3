"""Connections to Redis (docs/architecture.md "Durability: what an acknowledgment means", "Redis HA
and failover"): one primary by URL, or whichever primary Sentinel names, and the durability of an acknowledged write.

URLs
  ``redis://[:PASSWORD@]host:port/DB`` and ``rediss://…`` (TLS): one server, which must be a
  primary. ``redis+sentinel://[:PASSWORD@]host:port[,host:port…]/SERVICE[/DB]`` (``rediss+sentinel``
  for TLS to the servers and the sentinels): ask those sentinels for the primary of SERVICE; after
  a failover the client asks again and reconnects to the promoted replica. PASSWORD is the
  servers'; the sentinels' own, when they have one, is the query parameter ``sentinel_password``.

Durability (``KOMPAKTOR_DURABILITY``, or per store)
  An acknowledged write — every metadata mutation: imports, flushes, commits, table changes,
  user compactions' tablet changes — is answered only once Redis says it will survive the loss of
  the node that took it. How is chosen per deployment:

  ``replicas[:N]``  on N replicas (default 1) before the answer: ``WAIT N timeout``. The default
                    for a ``redis+sentinel://`` URL. Fewer replicas within the timeout: the write
                    is reported as not durable (:class:`NotDurable`, outcome unknown: it may or may
                    not survive a failover), never as done.
  ``fsync``         on the primary's disk: the server runs ``appendfsync always`` (it then fsyncs
                    before it replies), or has ``WAITAOF`` (Redis >= 7.2: ``WAITAOF 1 0``). Refused
                    with one line when neither holds (Debian 12's 7.0 under ``everysec``).
  ``auto``          the default for a plain URL: replicas if the primary has any connected, else
                    the server's fsync as above; if the server can do neither (7.0, ``everysec``,
                    no replica) writes go on and the store says so once in the log: up to a second
                    of acknowledged writes can be lost with the node.
  ``none``          no wait (benchmarks, throw-away data).

  The wait follows a tiny write of a key of its own (:data:`BARRIER`) in the same round trip as the
  mutation: ``WAIT``/``WAITAOF`` wait for the replication offset of the connection's last write,
  so the barrier covers every write before it — also a mutation whose reply was lost and which a
  retry answered from its recorded outcome without writing again.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from contextlib import ContextDecorator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit

import redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.client import Pipeline
from redis.connection import Connection
from redis.retry import Retry
from redis.sentinel import Sentinel

from kompaktor import keyspace as C
from kompaktor.model.errors import Fenced, NotPermitted, StoreUnavailable
from kompaktor.model.redact import redact_text, redact_url

_hiredis_pack: Callable[[tuple[Any, ...]], Any] | None
try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # redis-py packs the commands itself
    _hiredis_pack = None

T = TypeVar("T")

log = logging.getLogger("kompaktor.connection")

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
BARRIER = C.PREFIX + "durable"  # string: written before each WAIT (see the module's docstring)
DEFAULT_WAIT_MS = 2000  # below the client's socket timeout (5 s): a short WAIT is an error, not a hang
DURABILITY_ENV = "KOMPAKTOR_DURABILITY"
WAIT_ENV = "KOMPAKTOR_DURABILITY_TIMEOUT_MS"


def text(reply: bytes | str) -> str:
    """A Redis reply as ``str``. Kompaktor's clients leave responses undecoded (``bytes``);
    redis-py's types say ``bytes | str``, as they cannot see ``decode_responses``."""
    return reply.decode() if isinstance(reply, bytes) else reply


class NotDurable(StoreUnavailable):
    """Redis applied a write but could not confirm it durable in time: its outcome is unknown."""


class _Retry(Retry):
    """The client's retries, except for refused credentials: a wrong or missing password does not
    get better with backoff, and the person waiting should hear so at once."""

    def call_with_retry(
        self,
        do: Callable[[], T],
        fail: Callable[[Exception], Any] | Callable[[Exception, int], Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:
        def retryable(exc: Exception) -> bool:
            return not isinstance(exc, redis.AuthenticationError) and (is_retryable is None or is_retryable(exc))

        return super().call_with_retry(do, fail, retryable, with_failure_count)


@dataclass(frozen=True)
class SentinelURL:
    sentinels: list[tuple[str, int]]
    service: str
    db: int
    password: str | None
    username: str | None
    sentinel_password: str | None
    tls: bool
    query: dict[str, str]


def is_sentinel_url(url: str) -> bool:
    return url.split("://", 1)[0].lower() in SENTINEL_SCHEMES


def parse_sentinel_url(url: str) -> SentinelURL:
    """``redis+sentinel://[[user]:password@]host:port[,host:port…]/service[/db][?sentinel_password=…]``."""
    bad = f"invalid Sentinel URL {redact_url(url)!r}"
    parts = urlsplit(url)
    netloc = parts.netloc
    userinfo, _, hosts = netloc.rpartition("@")
    username = password = None
    if userinfo:
        user, _, pw = userinfo.partition(":")
        username, password = (unquote(user) or None), (unquote(pw) or None)
    sentinels: list[tuple[str, int]] = []
    for hp in filter(None, hosts.split(",")):
        host, _, port = hp.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise StoreUnavailable(f"{bad}: each sentinel is host:port, got {hp!r}")
        sentinels.append((host.strip("[]"), int(port)))
    if not sentinels:
        raise StoreUnavailable(f"{bad}: name at least one sentinel (host:port[,host:port…])")
    path = [p for p in parts.path.split("/") if p]
    if not path or len(path) > 2:
        raise StoreUnavailable(f"{bad}: the path is /SERVICE or /SERVICE/DB (the primary's name in Sentinel)")
    db = 0
    if len(path) == 2:
        if not path[1].isdigit():
            raise StoreUnavailable(f"{bad}: the database is a number, got {path[1]!r}")
        db = int(path[1])
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    unknown = sorted(set(query) - {"sentinel_password", "ssl_ca_certs", "ssl_cert_reqs", "ssl_certfile", "ssl_keyfile"})
    if unknown:
        raise StoreUnavailable(f"{bad}: unknown parameter(s) {', '.join(unknown)}")
    return SentinelURL(
        sentinels,
        unquote(path[0]),
        db,
        password,
        username,
        query.pop("sentinel_password", None),
        parts.scheme.lower().startswith("rediss"),
        query,
    )


#: query parameters of a plain ``redis://`` / ``rediss://`` URL (redis-py passes anything else to
#: the connection, which fails on first use with a TypeError), and those only TLS has
_URL_PARAMS = {"db", "client_name", "protocol", "health_check_interval", "socket_timeout", "socket_connect_timeout"}
_TLS_PARAMS = {"ssl_ca_certs", "ssl_cert_reqs", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname", "ssl_ca_path"}


def _check_query(url: str) -> None:
    parts = urlsplit(url)
    keys = set(parse_qs(parts.query, keep_blank_values=True))
    tls = parts.scheme.lower() == "rediss"
    where = f"invalid Redis URL {redact_url(url)!r}"
    if not tls and keys & _TLS_PARAMS:
        raise StoreUnavailable(f"{where}: {', '.join(sorted(keys & _TLS_PARAMS))} needs TLS: use rediss://")
    unknown = sorted(keys - _URL_PARAMS - (_TLS_PARAMS if tls else set()))
    if unknown:
        raise StoreUnavailable(f"{where}: unknown parameter(s) {', '.join(unknown)}")


def connect(url: str, *, retries: int = 6, socket_timeout: float = 5.0) -> redis.Redis:
    """A Redis client on the primary that retries connection errors with exponential backoff, a
    bounded number of times (about 3 s in all by default), then fails. ``rediss://`` URLs use TLS;
    passwords come in the URL (``redis://:pw@host:port/0``). A Sentinel URL gives a client that
    asks the sentinels for the primary, and again after a connection to it fails."""
    common: dict[str, Any] = dict(
        socket_timeout=socket_timeout,
        socket_connect_timeout=socket_timeout,
        retry=_Retry(ExponentialBackoff(cap=1.0, base=0.05), retries),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError],
        health_check_interval=30,
    )
    if is_sentinel_url(url):
        s = parse_sentinel_url(url)
        tls: dict[str, Any] = {"ssl": True, **s.query} if s.tls else {}
        # no retries of its own per sentinel: the client's retry (above) already asks them all again
        sentinel_kwargs: dict[str, Any] = {
            "socket_timeout": socket_timeout,
            "retry": Retry(NoBackoff(), 0),
            "socket_connect_timeout": socket_timeout,
            **tls,
        }
        if s.sentinel_password:
            sentinel_kwargs["password"] = s.sentinel_password
        sentinel = Sentinel(s.sentinels, sentinel_kwargs=sentinel_kwargs)
        primary: redis.Redis = sentinel.master_for(
            s.service, db=s.db, password=s.password, username=s.username, check_connection=True, **common, **tls
        )
        return primary
    _check_query(url)
    try:
        return redis.Redis.from_url(url, **common)
    except ValueError as exc:
        raise StoreUnavailable(f"invalid Redis URL {redact_url(url)!r}: {redact_url(str(exc))}") from exc


#: what redis-py raises when the server cannot be reached (after the client's bounded retries)
#: or refuses the connection (a wrong password is an AuthenticationError, a ConnectionError)
UNREACHABLE = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)


def setup_error(exc: BaseException) -> bool:
    """A server reply that refuses the connection itself rather than a command: a database index
    the server does not have (``SELECT`` while connecting), or credentials it does not take."""
    text = str(exc)
    return isinstance(exc, redis.exceptions.NoPermissionError) or (
        isinstance(exc, redis.ResponseError)
        and ("DB index is out of range" in text or text.startswith(("NOAUTH", "WRONGPASS", "NOPERM")))
    )


def fenced_error(exc: BaseException) -> bool:
    """A script's refusal of a write whose fencing token is stale (another coordinator leads)."""
    return isinstance(exc, redis.ResponseError) and str(exc).startswith("FENCED")


def unreachable(where: str, exc: BaseException) -> StoreUnavailable:
    """The one error for "Redis cannot be used", for the queues and the metadata store alike. The
    address is redacted (:func:`kompaktor.model.redact.redact_url`): no password in any message."""
    where = redact_url(where)
    text = str(exc)
    if text.startswith("NOAUTH") or "Authentication required" in text or "already authenticated" in text:
        return StoreUnavailable(
            f"Redis at {where} requires a password: give it in the Redis URL (redis://:PASSWORD@host:port/db)"
        )
    if isinstance(exc, redis.AuthenticationError) or text.startswith("WRONGPASS"):
        return StoreUnavailable(
            f"Redis at {where} refused the credentials (authentication failed): check the password in the Redis URL"
        )
    if "DB index is out of range" in text:
        return StoreUnavailable(
            f"Redis at {where} has no such database (DB index out of range): "
            "check the number at the end of the Redis URL"
        )
    if text.startswith("NOPERM") or isinstance(exc, redis.exceptions.NoPermissionError):
        return NotPermitted(f"Redis at {where} denied a command to this user: {redact_text(text)}")
    return StoreUnavailable(f"Redis at {where} is unreachable: {redact_text(text)}")


def translate(exc: BaseException, where: str, url: str | None = None) -> BaseException | None:
    """What a Redis client error means to Kompaktor, as the one exception to raise in its place:
    :class:`StoreUnavailable` when Redis cannot be used (unreachable after the client's retries,
    credentials or a database it refuses, a command its user may not run), :class:`Fenced` when a
    script refused a stale coordinator's write; None for anything else (raise the original).
    ``where`` names the address in messages (redacted); given the ``url``, what is not a plain
    outage is said as such (no Sentinel, a replica given as the primary, TLS on one side only)."""
    if isinstance(exc, UNREACHABLE) or (url is not None and isinstance(exc, redis.ReadOnlyError)):
        why = explain(url, exc) if url is not None else None
        return StoreUnavailable(why) if why is not None else unreachable(where, exc)
    if isinstance(exc, redis.ResponseError):
        if setup_error(exc):
            return unreachable(where, exc)
        if fenced_error(exc):
            return Fenced(str(exc))
    return None


class redis_errors(ContextDecorator):
    """The one place where redis-py's errors become Kompaktor's: a block (``with``) or a function
    (decorator) whose :class:`redis.RedisError` is raised as what it means (:func:`translate`,
    chained to the original), or unchanged when it means nothing more. Every Redis adapter (the
    metadata store, the job queues) runs its calls through one. ``where`` and ``url`` are
    :func:`translate`'s. Holds no state per use: one instance serves any number of calls, nested
    or concurrent."""

    def __init__(self, where: str, url: str | None = None) -> None:
        self.where = where
        self.url = url

    def __enter__(self) -> redis_errors:
        return self

    def __exit__(
        self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        if isinstance(exc, redis.RedisError) and (mapped := translate(exc, self.where, url=self.url)) is not None:
            raise mapped from exc
        return False


def explain(url: str, exc: BaseException) -> str | None:
    """One line for what connecting found wrong that is not a plain outage, or None: no sentinel
    reachable or none knowing the service, a replica given as the primary, TLS on one side only."""
    where = redact_url(url)
    text = str(exc)
    if isinstance(exc, redis.sentinel.MasterNotFoundError) or "No master found" in text:
        hosts = ",".join(f"{h}:{p}" for h, p in parse_sentinel_url(url).sentinels) if is_sentinel_url(url) else ""
        return (
            f"no Sentinel at {hosts or where} names a primary for this service: none reachable, or none "
            f"monitors it ({text.split(' : ')[0]}); check the hosts and the service name in {where}"
        )
    if isinstance(exc, redis.ReadOnlyError) or text.startswith(("READONLY", "You can't write against a read only")):
        return (
            f"Redis at {where} is a read-only replica, not the primary: give the primary's address, or a "
            "redis+sentinel:// URL that finds it"
        )
    low = text.lower()
    if (
        url.lower().startswith("rediss://")
        and isinstance(exc, (redis.ConnectionError, redis.TimeoutError))
        and _answers_plain(url)
    ):
        return (
            f"Redis at {where} does not speak TLS (it answers in plain text): use redis:// instead of "
            "rediss://, or turn TLS on in the server"
        )
    if "ssl" in low and any(
        s in low
        for s in (
            "wrong version",
            "record layer",
            "wrong_version",
            "unexpected eof",
            "packet length",
            "http request",
            "unknown protocol",
        )
    ):
        return (
            f"Redis at {where} does not speak TLS: use redis:// (or redis+sentinel://) instead of rediss://, "
            "or turn TLS on in the server"
        )
    if "certificate verify failed" in low:
        return f"Redis at {where}: TLS certificate not trusted ({text.split(':')[-1].strip()}); give ssl_ca_certs"
    if url.lower().startswith(("redis://", "redis+sentinel://")) and (
        "connection closed by server" in low or "connection reset by peer" in low
    ):
        return (
            f"Redis at {where} closed the connection at once: it may require TLS (use rediss:// or "
            "rediss+sentinel://), or it is not a Redis server"
        )
    return None


def _answers_plain(url: str, timeout: float = 1.0) -> bool:
    """Does the server of a ``rediss://`` URL answer a plain-text PING? (A plain server takes a TLS
    handshake for a half-sent command and stays silent, so the client only sees a timeout.)"""
    import socket

    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            reply = sock.recv(64)
    except OSError:
        return False
    return reply.startswith((b"+PONG", b"-NOAUTH", b"-ERR", b"-WRONGPASS"))


# -- durability ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DurabilityPlan:
    """What follows an acknowledged write: ``commands`` (after the barrier write) and what their
    replies must reach; ``label`` says it in words (status, logs, docs)."""

    label: str
    commands: tuple[tuple[Any, ...], ...] = ()
    need: tuple[int, ...] = ()  # per command: the least acceptable reply (WAITAOF: [local, replicas])
    unsafe: bool = False


def server_version(info: dict[str, Any]) -> tuple[int, ...]:
    """The ``redis_version`` of an ``INFO server`` reply as numbers ((7, 0, 15)); empty or (0,) when unknown."""
    return tuple(int(x) for x in str(info.get("redis_version", "0")).split(".")[:3] if x.isdigit())


class Durability:
    """Decides, per server and deployment, how a write is made durable before it is acknowledged;
    re-decided every ``recheck_s`` (replicas come and go with failovers)."""

    def __init__(
        self, mode: str | None = None, *, sentinel: bool = False, timeout_ms: int | None = None, recheck_s: float = 10.0
    ) -> None:
        raw = (mode or os.environ.get(DURABILITY_ENV) or ("replicas" if sentinel else "auto")).strip().lower()
        name, _, arg = raw.partition(":")
        if name not in ("auto", "replicas", "fsync", "none") or (
            arg and (name != "replicas" or not arg.isdigit() or int(arg) < 1)
        ):
            raise StoreUnavailable(
                f"invalid durability {raw!r}: use auto, replicas[:N], fsync or none ({DURABILITY_ENV})"
            )
        self.mode = name
        self.replicas = int(arg) if arg else 1
        self.timeout_ms = int(timeout_ms if timeout_ms is not None else os.environ.get(WAIT_ENV, DEFAULT_WAIT_MS))
        self.recheck_s = recheck_s
        self._plan: DurabilityPlan | None = None
        self._at = 0.0
        self._warned = False

    def plan(self, r: redis.Redis) -> DurabilityPlan:
        if self._plan is None or time.monotonic() - self._at > self.recheck_s:
            self._plan = self._decide(r)
            self._at = time.monotonic()
            if self._plan.unsafe and not self._warned:
                self._warned = True
                log.warning("metadata writes are not durable against losing the Redis node: %s", self._plan.label)
        return self._plan

    def forget(self) -> None:
        """Decide again at the next write (after a reconnect)."""
        self._plan = None

    def _decide(self, r: redis.Redis) -> DurabilityPlan:
        if self.mode == "none":
            return DurabilityPlan("none: no wait (durability off)", unsafe=True)
        repl = r.info("replication")
        if repl.get("role") != "master":
            raise redis.ReadOnlyError("READONLY You can't write against a read only replica.")
        wait = (self.timeout_ms,)
        replicas = int(repl.get("connected_slaves", 0))
        if self.mode == "replicas" or (self.mode == "auto" and replicas > 0):
            n = self.replicas
            return DurabilityPlan(
                f"replicas: WAIT {n} (on {n + 1} nodes before the answer)", (("WAIT", n, *wait),), (n,)
            )
        server = r.info("server")
        persistence = r.info("persistence")
        try:
            fsync = r.config_get("appendfsync").get("appendfsync")
        except redis.ResponseError:  # CONFIG disabled (managed Redis): unknown
            fsync = None
        aof = int(persistence.get("aof_enabled", 0)) == 1
        if aof and fsync == "always":
            return DurabilityPlan("fsync: appendfsync always (fsynced on the primary before the answer)")
        if aof and server_version(server) >= (7, 2):
            return DurabilityPlan(
                "fsync: WAITAOF 1 0 (fsynced on the primary before the answer)", (("WAITAOF", 1, 0, *wait),), (1,)
            )
        why = (
            f"Redis {server.get('redis_version')} with appendonly {'yes' if aof else 'no'}, appendfsync "
            f"{fsync or 'unknown'}, no replica: neither WAITAOF (Redis >= 7.2) nor fsync always"
        )
        if self.mode == "fsync":
            raise StoreUnavailable(f"durability fsync is not possible: {why}; set appendfsync always, or use replicas")
        return DurabilityPlan(
            f"none available ({why}): up to ~1 s of acknowledged writes can be lost with the node", unsafe=True
        )

    def check(self, plan: DurabilityPlan, replies: list[Any]) -> None:
        for cmd, need, got in zip(plan.commands, plan.need, replies, strict=True):
            have = int(got[0] if cmd[0] == "WAITAOF" else got)
            if have < need:
                what = "replica(s)" if cmd[0] == "WAIT" else "local fsync"
                raise NotDurable(
                    f"Redis did not confirm the write durable in {self.timeout_ms} ms ({cmd[0]}: "
                    f"{have} of {need} {what}): it may or may not be kept; retry"
                )


def durable_pipeline(r: redis.Redis, durability: Durability, queue_writes: Callable[[Pipeline], object]) -> list[Any]:
    """Run the writes ``queue_writes(pipe)`` queues, then the barrier and the wait the plan asks
    for, in one round trip on one connection; returns the writes' replies. Raises
    :class:`NotDurable` when the wait came back short."""
    plan = durability.plan(r)
    pipe = r.pipeline(transaction=False)
    queue_writes(pipe)
    n = len(pipe.command_stack)
    if plan.commands:
        pipe.set(BARRIER, "1")
        for cmd in plan.commands:
            pipe.execute_command(*cmd)
    out = pipe.execute()
    if plan.commands:
        durability.check(plan, out[n + 1 :])
    return out[:n]


def pack_command(conn: Connection, *args: Any) -> Any:
    """``conn.pack_command(*args)`` for arguments that are already ``str``, ``int``, ``float`` or
    ``bytes`` (the queue adds, the planning reads): hiredis packs them at once, without redis-py's
    pass over every argument (a tenth of a big planning pass' CPU)."""
    if _hiredis_pack is None:
        return conn.pack_command(*args)
    try:
        return [_hiredis_pack(args)]
    except TypeError:
        return conn.pack_command(*args)  # raises redis-py's own error


class SentCommand:
    """One command sent on a connection of its own without waiting for its reply ("send now,
    read later"): the caller prepares the next one while Redis runs it. When the connection fails
    while sending or reading, it is dropped and there is no reply (None): the caller then runs the
    command again as an ordinary call, with the client's retries and its error mapping."""

    def __init__(self, pool: redis.ConnectionPool, conn: Connection) -> None:
        self._pool = pool
        self._conn: Connection | None = conn

    @classmethod
    def send(cls, pool: redis.ConnectionPool, conn: Connection, prepare: Callable[[], Any]) -> SentCommand | None:
        """Send the command ``prepare()`` packs (:func:`pack_command`) on ``conn``, taken from
        ``pool``; None when the connection failed. ``conn`` goes back to ``pool`` on any failure."""
        try:
            packed = prepare()
        except BaseException:
            pool.release(conn)
            raise
        try:
            conn.send_packed_command(packed)
        except (redis.ConnectionError, redis.TimeoutError):
            conn.disconnect()
            pool.release(conn)
            return None
        except BaseException:
            conn.disconnect()
            pool.release(conn)
            raise
        return cls(pool, conn)

    def read(self, read_again: Callable[[redis.ResponseError], bool] = lambda _exc: True) -> Any:
        """The reply, its connection given back; None when there is none to use: the connection
        failed, or Redis answered an error that ``read_again`` accepts (any other is raised)."""
        conn, self._conn = self._conn, None
        if conn is None:
            return None
        try:
            return conn.read_response()
        except (redis.ConnectionError, redis.TimeoutError):
            conn.disconnect()
            return None
        except redis.ResponseError as exc:
            if not read_again(exc):
                raise
            return None
        except BaseException:
            conn.disconnect()  # interrupted mid-reply: the connection is out of step
            raise
        finally:
            self._pool.release(conn)

    def abandon(self) -> None:
        """Drop the reply if it was never read (the caller stopped early)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.disconnect()
            self._pool.release(conn)
