"""Redis users per role: each component connects with only the commands and keys its code uses.

Roles
  ``compactor``    reads its job and the tablets, heartbeats and commits through the functions the
                   coordinator loaded (``FCALL``), waits for work (``BLPOP``) — and nothing else:
                   no ``EVAL``, ``SCRIPT LOAD`` or ``FUNCTION LOAD`` (no code of its own in Redis), no ``CONFIG``,
                   ``FLUSH*``, ``DEBUG``, ``MODULE``, ``KEYS``, ``SHUTDOWN``, no key outside ``kz:*``,
                   no Pub/Sub.
  ``coordinator``  the compactor's rights, plus ``FUNCTION LOAD`` and ``FUNCTION LIST`` (it loads
                   Kompaktor's function libraries where Redis lacks them, :mod:`kompaktor.redisfunctions`)
                   and ``CONFIG GET`` (the durability it can rely on).
  ``operator``     the compactor's rights, plus ``FUNCTION LOAD`` (its first write on a server that
                   lost the libraries loads them) and ``CONFIG GET`` (it writes groups and services,
                   starts and cancels user compactions through the same functions).
  ``admin``        the ``kompaktor`` CLI of the people running it: the coordinator's rights.

Each right is one the role's code sends (``tests/integration/test_redis_rights.py``, which
records them with Redis's command counters: compactor, coordinator, operator).

The compaction history's streams (``kz:history:<group>``) are reached through an ACL selector of
their own: the compactor may ``XADD`` and ``XTRIM`` there (it records the jobs it finished) and
nowhere else; the coordinator (its status page) and admin may also read them (``XREVRANGE``).

Redis runs a function's commands with the rights of the user calling it, so a user that may run
the commit function may also run its commands (``HSET`` on ``kz:*``) directly: the ACL bounds what a
compromised compactor can reach (no code execution on the Redis host through ``CONFIG SET``, no
``FLUSHALL``, no key outside Kompaktor's), not which ``kz:`` keys it writes.

Pure: the rules as text, new passwords, and URLs with a role's user in them.
"""

from __future__ import annotations

import hashlib
import secrets
from urllib.parse import quote, urlsplit, urlunsplit

from kompaktor import keyspace as C

ROLES = ("compactor", "coordinator", "operator", "admin")

#: what every role needs: connecting (not CLIENT KILL, PAUSE or LIST: dangerous), transactions,
#: the durability barrier's WAIT, INFO (replication role, persistence), Kompaktor's functions
_BASE = ("+@connection", "+@transaction", "-@dangerous", "+info", "+fcall")
#: reads of Kompaktor's structures: each one the code sends (tests/integration/test_redis_rights.py)
_READS = (
    "+get",
    "+mget",
    "+exists",
    "+type",
    "+hget",
    "+hmget",
    "+hgetall",
    "+hkeys",
    "+hvals",
    "+hlen",
    "+hexists",
    "+smembers",
    "+scard",
    "+zrange",
    "+zcard",
    "+zscore",
    "+lrange",
)
#: the writes the scripts and the clients make
_WRITES = (
    "+set",
    "+del",
    "+unlink",
    "+incr",
    "+expire",
    "+pexpire",
    "+hset",
    "+hdel",
    "+hincrby",
    "+sadd",
    "+srem",
    "+spop",
    "+zadd",
    "+zrem",
    "+zpopmin",
    "+lpush",
    "+rpush",
    "+ltrim",
    "+blpop",
)
#: the compaction history (:mod:`kompaktor.metadata.history`): an ACL selector, so that these
#: commands reach the history's streams (``kz:history:*``) and no other key. The compactor only
#: appends (XADD, then XTRIM by age); the other roles read it as well
_HISTORY_KEYS = f"~{C.history_key('*')}"
_HISTORY_WRITE = f"({_HISTORY_KEYS} +xadd +xtrim)"
_HISTORY_READ_WRITE = f"({_HISTORY_KEYS} +xadd +xtrim +xrevrange)"
#: what only the roles that load code and decide durability get
_LEADER = ("+function|load", "+function|list", "+config|get")
#: the operator's: a write of its on a server without the functions loads them (never lists
#: them: only the coordinator's pass does); the durability it can rely on
_OPERATOR = ("+function|load", "+config|get")

RIGHTS: dict[str, tuple[str, ...]] = {
    "compactor": _BASE + _READS + _WRITES + (_HISTORY_WRITE,),
    "coordinator": _BASE + _READS + _WRITES + _LEADER + (_HISTORY_READ_WRITE,),
    "operator": _BASE + _READS + _WRITES + _OPERATOR,
    "admin": _BASE + _READS + _WRITES + _LEADER + (_HISTORY_READ_WRITE,),
}


def new_passwords() -> dict[str, str]:
    """A random password per role."""
    return {role: secrets.token_urlsafe(18) for role in ROLES}


def rights(role: str) -> str:
    """What ``role`` may touch, as ACL rules: only Kompaktor's keys, no channels, its commands."""
    if role not in RIGHTS:
        raise ValueError(f"unknown Redis role {role!r}: one of {', '.join(ROLES)}")
    return " ".join((f"~{C.PREFIX}*", "resetchannels", "-@all", *RIGHTS[role]))


def rule(role: str, password: str) -> str:
    """The ``user`` line of ``role`` for redis.conf or an ACL file: on, its password as a SHA-256
    (never in clear in the file), and its :func:`rights`."""
    digest = hashlib.sha256(password.encode()).hexdigest()
    return f"user {role} reset on #{digest} {rights(role)}"


#: where the chart reads the rights from (one line per role: the role, then its rules)
CHART_FILE = "helm/kompaktor/files/redis-users.acl"


def chart_file() -> str:
    """The text of :data:`CHART_FILE` (``python -m kompaktor.metadata.acl > helm/kompaktor/files/redis-users.acl``)."""
    return "".join(f"{role} {rights(role)}\n" for role in ROLES)


def role_url(url: str, role: str, password: str) -> str:
    """``url`` (redis://, rediss://, redis+sentinel://…) with ``role`` and its password as the
    user part, replacing any user or password it had."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    netloc = f"{quote(role, safe='')}:{quote(password, safe='')}@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


if __name__ == "__main__":
    print(chart_file(), end="")
