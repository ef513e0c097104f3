"""A Redis database's contents, to compare before and after: a rejected or fenced operation
changes nothing."""

from __future__ import annotations

from typing import Any

import redis


def snapshot(r: redis.Redis, match: str = "*", skip: tuple[bytes, ...] = ()) -> dict[bytes, Any]:
    """Every key matching ``match`` (but those in ``skip``) and its value: strings, hashes, sets
    and sorted sets (with scores) as values, any other type as (type, DUMP)."""
    out: dict[bytes, Any] = {}
    for k in sorted(r.scan_iter(match=match)):
        if k in skip:
            continue
        t = r.type(k).decode()
        if t == "string":
            out[k] = r.get(k)
        elif t == "hash":
            out[k] = r.hgetall(k)
        elif t == "set":
            out[k] = r.smembers(k)
        elif t == "zset":
            out[k] = r.zrange(k, 0, -1, withscores=True)
        else:
            out[k] = (t, r.dump(k))
    return out
