"""Every Redis key name Kompaktor uses, in one place. Imports nothing.

The Lua scripts do not spell key names: :func:`lua_prelude` renders these definitions as a Lua
table ``K`` that is loaded in front of every script. The keyspace assumes one Redis primary (a
script touches a table, its tablets and the group queues together); it does not use Redis Cluster
hash tags.
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
COMMITLOG = PREFIX + "commitlog"  # list of the ECIDs of the last 100,000 commits, once per commit applied
FAILURES = PREFIX + "failures"  # hash: job fingerprint -> JSON {count, last_error, retry_at}
BACKUPS_RUNNING = PREFIX + "backups:running"  # hash: backup id -> expiry (epoch s): backups being taken
RESTORED = PREFIX + "restored"  # string: the backup this Redis was restored from
FORMAT = PREFIX + "format"  # hash: version, installation, step:<name> (metadata/format.py)
IMPORTS = PREFIX + "imports"  # hash: import id -> JSON {table, files, expires}: bulk imports in progress
LEASE = PREFIX + "coordinator:lease"  # string: holder id (with TTL)
FENCE = PREFIX + "coordinator:fence"  # integer fencing token, incremented per takeover
COORDINATOR_SEEN = PREFIX + "coordinator:seen"  # string: when a leader last completed a pass (epoch s)
QUEUE_GENERATION = PREFIX + "queue:generation"
QUEUE_GROUPS = PREFIX + "queue:groups"  # set of group names that have a queue
QUEUE_MAX = PREFIX + "queue:max"  # queue bound (jobs per group)
QUEUE_MAX_BYTES = PREFIX + "queue:maxbytes"  # queue bound (input bytes per group; absent: the default)
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


def running_group_key(group: str) -> str:
    return f"{PREFIX}rgroup:{group}"  # set of ECIDs running in a group (maintained by mutate.lua)


def ucomp_done_key(cid: str) -> str:
    return f"{PREFIX}ucomp:{cid}:done"  # set of tablet ids finished for a user compaction


def history_key(group: str) -> str:
    # stream: one entry per finished compaction of the group (field ``r``: the record as JSON),
    # bounded by count and age (kompaktor.metadata.history); not used by the Lua scripts
    return f"{PREFIX}history:{group}"


def queue_vt_key(group: str) -> str:
    return f"{PREFIX}queue:{group}:vt"  # hash: table id -> virtual time of its last job queued (fairness)


def queue_ages_key(group: str) -> str:
    return f"{PREFIX}queue:{group}:ages"  # sorted set: tablet id -> time its jobs were added (ms)


def wake_key(group: str) -> str:
    # list (TTL 30 s, at most 16 tokens): pushed when jobs are queued for the group; idle
    # compactors wait on it with BLPOP instead of sleeping between polls
    return f"{PREFIX}wake:{group}"


PROGRESS = PREFIX + "progress"  # hash: job fingerprint -> tablet id (index of resumable merges' records)


def progress_key(fingerprint: str) -> str:
    # hash (TTL: metadata.progress.PROGRESS_TTL_S): job (JSON: tablet, inputs, cuts, now_ms),
    # p:<index> (JSON PartRecord) per finished part; not used by the Lua scripts
    return f"{PREFIX}progress:{fingerprint}"


#: the broker's keys, apart from Kompaktor's others: a compactor may read every ``kz:`` key but
#: none of these (a pending request names where its answer — maybe a reservation's secret — goes)
BROKER_PREFIX = "kzb:"
#: list: requests of compactors to the coordinator's broker (a compactor may only push here)
BROKER = BROKER_PREFIX + "requests"


def reply_key(reply_id: str) -> str:
    """List: the broker's answer to one request (a random name only its asker knows)."""
    return f"{BROKER_PREFIX}reply:{reply_id}"


def reservation_key(ecid: str) -> str:
    """String: JSON of a reservation the broker made, with the digest of its holder's secret."""
    return f"{PREFIX}resv:{ecid}"


SPLIT_CHECK = PREFIX + "split:checked"  # string with TTL: auto-split checked every tablet recently


def mutation_key(mutation_id: str) -> str:
    return f"{PREFIX}mut:{mutation_id}"  # string with TTL: outcome of an applied mutation (resends)


def request_key(request_id: str) -> str:
    return f"{PREFIX}operator:compaction:{request_id}"  # string: user compaction id of a Compaction uid


_LUA_CONSTANTS = {
    "tables": TABLES,
    "seq": SEQ,
    "dirty": DIRTY,
    "running": RUNNING,
    "counters": COUNTERS,
    "commits": COMMITS_BY_TABLET,
    "commitlog": COMMITLOG,
    "queue_groups": QUEUE_GROUPS,
    "queue_max": QUEUE_MAX,
    "queue_max_bytes": QUEUE_MAX_BYTES,
    "queue_seq": QUEUE_SEQ,
    "fence": FENCE,
    "lease": LEASE,
    "ucomps": UCOMPS,
    "failures": FAILURES,
    "deadletter": DEADLETTER,
    "queue_generation": QUEUE_GENERATION,
}
_LUA_FUNCTIONS = {
    "table": table_key,
    "tablets": tablets_key,
    "tablet": tablet_key,
    "heartbeat": heartbeat_key,
    "rgroup": running_group_key,
    "ucomp_done": ucomp_done_key,
    "mutation": mutation_key,
    "queue": queue_key,
    "queue_jobs": queue_jobs_key,
    "queue_index": queue_index_key,
    "queue_stats": queue_stats_key,
    "queue_ages": queue_ages_key,
    "ucomp": ucomp_key,
    "request": request_key,
    "wake": wake_key,
    "queue_vt": queue_vt_key,
}


def _lua_str(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def lua_prelude(**constants: int | str) -> str:
    """The key names as the Lua table ``K`` (strings, and functions of the one variable part), plus
    the given integer and string constants as Lua locals, for loading in front of a script."""
    fields = [f"  {name} = {_lua_str(value)}," for name, value in _LUA_CONSTANTS.items()]
    for name, fn in _LUA_FUNCTIONS.items():
        before, after = fn("\0").split("\0")
        tail = f" .. {_lua_str(after)}" if after else ""
        fields.append(f"  {name} = function(x) return {_lua_str(before)} .. x{tail} end,")
    consts = "".join(
        f"local {name} = {_lua_str(value) if isinstance(value, str) else int(value)}\n"
        for name, value in constants.items()
    )
    return "local K = {\n" + "\n".join(fields) + "\n}\n" + consts
