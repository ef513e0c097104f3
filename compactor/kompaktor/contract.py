"""Every Redis key name Kompaktor uses, in one place. Imports nothing but the standard library.

Keys of one table share the hash tag ``{t<id>}`` where that matters for scripts touching a
table and its tablets together.
"""

from __future__ import annotations

PREFIX = "kz:"

TABLES = PREFIX + "tables"  # hash: table name -> table id
SEQ = PREFIX + "seq"  # hash of counters: table ids, file names, ECIDs, user compaction ids
DIRTY = PREFIX + "dirty"  # set of tablet ids changed since they were last planned
RUNNING = PREFIX + "running"  # hash: ECID -> tablet id (index of running compactions)
SERVICES = PREFIX + "services"  # hash: service name -> JSON ServiceConfig
GROUPS = PREFIX + "groups"  # hash: group name -> JSON GroupConfig
COUNTERS = PREFIX + "counters"  # hash of global counters (dead compactions, commits, ...)
UCOMPS = PREFIX + "ucomps"  # set of user compaction ids
DEADLETTER = PREFIX + "deadletter"  # hash: job fingerprint -> JSON (failed too often)
DEADLOG = PREFIX + "deadlog"  # list of the ECIDs of the last 10,000 dead compactions detected
COMMITS_BY_TABLET = PREFIX + "commits"  # hash: tablet id -> compactions committed on it
FAILURES = PREFIX + "failures"  # hash: job fingerprint -> JSON {count, last_error, retry_at}
LEASE = PREFIX + "coordinator:lease"  # string: holder id (with TTL)
FENCE = PREFIX + "coordinator:fence"  # integer fencing token, incremented per takeover
QUEUE_GENERATION = PREFIX + "queue:generation"
QUEUE_GROUPS = PREFIX + "queue:groups"  # set of group names that have a queue
QUEUE_MAX = PREFIX + "queue:max"  # queue bound (jobs per group)
QUEUE_SEQ = PREFIX + "queue:seq"


def table_key(tid: str) -> str:
    return f"{PREFIX}table:{tid}"  # hash: name, state, props (JSON), created


def tablets_key(tid: str) -> str:
    return f"{PREFIX}table:{tid}:tablets"  # sorted set (score 0), members = end tokens, lex order


def tablet_key(tablet_id: str) -> str:
    return f"{PREFIX}tablet:{tablet_id}"  # string: JSON tablet document


def heartbeat_key(ecid: str) -> str:
    return f"{PREFIX}hb:{ecid}"  # hash: compactor, updated (s), progress fields


def compactors_key(group: str) -> str:
    return f"{PREFIX}compactors:{group}"  # hash: compactor id -> JSON {state, ecid, last_seen}


def drain_key(compactor_id: str) -> str:
    return f"{PREFIX}drain:{compactor_id}"  # string flag: drain requested


def ucomp_key(cid: str) -> str:
    return f"{PREFIX}ucomp:{cid}"  # hash: user compaction


def queue_key(group: str) -> str:
    return f"{PREFIX}queue:{group}"  # sorted set of entry ids, ordered lexicographically


def queue_jobs_key(group: str) -> str:
    return f"{PREFIX}queue:{group}:jobs"  # hash: entry id -> JSON job


def queue_index_key(group: str) -> str:
    return f"{PREFIX}queue:{group}:tablets"  # hash: tablet id -> JSON {gen, ids, added}


def queue_stats_key(group: str) -> str:
    return f"{PREFIX}queue:{group}:stats"  # hash: rejected, dequeued


# Tablet ids: "<table id>;<end token>", where the end token is the end row in lowercase hex,
# or "~" for the last tablet (unbounded end): hex sorts like the bytes, and "~" after any hex.
LAST = "~"


def end_token(end: bytes | None) -> str:
    return LAST if end is None else end.hex()


def tablet_id(tid: str, end: bytes | None) -> str:
    return f"{tid};{end_token(end)}"


def running_group_key(group: str) -> str:
    return f"{PREFIX}rgroup:{group}"  # set of ECIDs running in a group (maintained by mutate.lua)


def ucomp_done_key(cid: str) -> str:
    return f"{PREFIX}ucomp:{cid}:done"  # set of tablet ids finished for a user compaction


def queue_ages_key(group: str) -> str:
    return f"{PREFIX}queue:{group}:ages"  # sorted set: tablet id -> time its jobs were added (ms)


SPLIT_CHECK = PREFIX + "split:checked"  # string with TTL: auto-split checked every tablet recently
