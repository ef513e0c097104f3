"""Redis users per role: each component connects with only the commands and keys its code uses.

Roles
  ``compactor``    reads Kompaktor's keys and writes none of them: it pushes requests onto the
                   coordinator's broker list (``kzb:requests``), pops the answers
                   (``kzb:reply:*``, names only the asker knows) and waits for work (``BLPOP``
                   on ``kz:wake:*``). Its reservations, heartbeats, progress, commits, releases,
                   failures and history records are made by the broker
                   (:mod:`kompaktor.coordinator.broker`), which acts only for the holder of a
                   reservation and writes a job's record into its own group's history alone.
                   No ``FCALL`` (Redis runs a function's commands with its caller's rights, so a
                   user that may commit through a function may also write the tablets
                   directly), no ``EVAL``, no ``CONFIG``, ``FLUSH*``,
                   ``DEBUG``, ``MODULE``, ``KEYS``, ``SHUTDOWN``, no key outside ``kz:*`` and its
                   two ``kzb:`` lists, no Pub/Sub.
  ``coordinator``  the writes of Kompaktor's structures (its passes and the broker), through the
                   functions it loads (``FUNCTION LOAD``/``LIST``) and plain commands, and
                   ``CONFIG GET`` (the durability it can rely on).
  ``operator``     the same writes without ``FUNCTION LIST`` (it writes groups and services,
                   starts and cancels user compactions; its first write on a server that lost
                   the libraries loads them).
  ``admin``        the ``kompaktor`` CLI of the people running it: the coordinator's rights.

Each right is one the role's code sends (``tests/integration/test_redis_rights.py``, which
records them with Redis's command counters: compactor, coordinator, operator), and what the
compactor may not do is refused by the server (``tests/integration/test_compactor_rights.py``).

Pure: the rules as text, new passwords, and URLs with a role's user in them.
"""

from __future__ import annotations

import hashlib
import secrets
from urllib.parse import quote, urlsplit, urlunsplit

from kompaktor import keyspace

ROLES = ("compactor", "coordinator", "operator", "admin")

#: what every role needs: connecting (not CLIENT KILL, PAUSE or LIST: dangerous), transactions,
#: INFO (replication role, persistence)
_BASE = ("+@connection", "+@transaction", "-@dangerous", "+info")
#: the roles that write: Kompaktor's functions
_FCALL = ("+fcall",)
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
#: the reads every role has, and the writes every role that writes has (public for the rights test)
SHARED_READS, SHARED_WRITES = _READS, _WRITES
#: the compactor's only writes, each an ACL selector (these commands on these keys only): its
#: requests to the broker (pushed: it may not read the list), the answers (popped), wake-ups
_ASK = (
    f"(~{keyspace.BROKER} +lpush)",
    f"(~{keyspace.reply_key('*')} +blpop)",
    f"(~{keyspace.wake_key('*')} +blpop)",
)
#: the compaction history (:mod:`kompaktor.metadata.history`): an ACL selector, so that these
#: commands reach the history's streams (``kz:history:*``) and no other key. The coordinator
#: appends (XADD, then XTRIM by age: its broker for the compactors' jobs, its pass for compactions
#: found dead) and reads it, as admin does; the compactor may not touch it (0.2.0's compactors
#: appended their jobs' records themselves, to any group's stream)
_HISTORY_KEYS = f"~{keyspace.history_key('*')}"
_HISTORY_READ_WRITE = f"({_HISTORY_KEYS} +xadd +xtrim +xrevrange)"
#: the history's appends (the broker's for the compactors' jobs; the coordinator's for compactions found dead)
HISTORY_APPEND = f"({_HISTORY_KEYS} +xadd +xtrim)"
#: what only the roles that load code and decide durability get
_LEADER = ("+function|load", "+function|list", "+config|get")
#: the coordinator's broker: it waits for compactors' requests
_BROKER = ("+blmpop",)
#: the operator's: a write of its on a server without the functions loads them (never lists
#: them: only the coordinator's pass does); the durability it can rely on
_OPERATOR = ("+function|load", "+config|get")

RIGHTS: dict[str, tuple[str, ...]] = {
    "compactor": _BASE + _READS + _ASK,
    "coordinator": _BASE + _FCALL + _READS + _WRITES + _LEADER + _BROKER + (_HISTORY_READ_WRITE,),
    "operator": _BASE + _FCALL + _READS + _WRITES + _OPERATOR,
    "admin": _BASE + _FCALL + _READS + _WRITES + _LEADER + (_HISTORY_READ_WRITE,),
}
#: the keys a role's commands outside selectors reach: the compactor's only to read
KEYS: dict[str, str] = {
    "compactor": f"%R~{keyspace.PREFIX}*",
    "coordinator": f"~{keyspace.PREFIX}* ~{keyspace.BROKER_PREFIX}*",
}


def new_passwords() -> dict[str, str]:
    """A random password per role."""
    return {role: secrets.token_urlsafe(18) for role in ROLES}


def rights(role: str) -> str:
    """What ``role`` may touch, as ACL rules: only Kompaktor's keys, no channels, its commands."""
    if role not in RIGHTS:
        raise ValueError(f"unknown Redis role {role!r}: one of {', '.join(ROLES)}")
    return " ".join((KEYS.get(role, f"~{keyspace.PREFIX}*"), "resetchannels", "-@all", *RIGHTS[role]))


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
