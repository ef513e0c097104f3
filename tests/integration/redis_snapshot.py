"""Every key of a Redis database and its value: tests compare two snapshots to show that a
rejected operation changed nothing."""

from __future__ import annotations

import redis


def snapshot(r: redis.Redis) -> dict:
    """Every key and its value, to show that a rejected mutation changed nothing."""
    out = {}
    for k in sorted(r.keys("*")):
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
