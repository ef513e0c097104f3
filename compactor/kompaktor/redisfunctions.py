"""Kompaktor's Lua code in Redis, as function libraries (Redis >= 7: ``FUNCTION LOAD``, ``FCALL``).

A library is a preamble — the key names, constants and shared Lua functions, run once when the
library is loaded — and named functions, each the body of what used to be one script. A script
(``EVALSHA``) ran its whole text on every call: the key names and the ~25 shared functions of the
mutation and the queues were built again for each reservation and each commit, about a tenth of a
reserve+commit cycle's Redis time (docs/architecture.md). A function runs its body only.

A library's name carries a digest of its code (``kz_<kind>_<digest>``, its functions
``<library>_<name>``), so two versions of Kompaktor side by side during an upgrade each run their
own code. Redis keeps the libraries in its AOF and RDB and sends them to its replicas: they survive
a restart and a failover. A server that lost them (a new one, ``FUNCTION FLUSH``) gets them again
from the first role allowed to load code (``FUNCTION LOAD``: the coordinator, the operator, the
CLI; :mod:`kompaktor.metadata.acl`) — a compactor's call fails until then, as a missing script's
did. Libraries of older versions are left in Redis (a few tens of KB each; ``FUNCTION DELETE``
removes one once no process of that version runs).

Pure of Kompaktor's structures: the callers (:mod:`kompaktor.queues`, :mod:`kompaktor.metadata`)
give the preamble and the bodies.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import redis

#: what Redis answers to a call of a function it does not hold
_MISSING = "function not found"


def missing_function(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis' answer to a call of a function it does not hold (alone, or as a
    pipeline's: "Command # 1 (FCALL ...) of pipeline caused error: Function not found")."""
    return isinstance(exc, redis.ResponseError) and str(exc).lower().endswith(_MISSING)


class LuaLibrary:
    """A function library: ``preamble`` then one function per ``bodies`` entry (name -> the body,
    run as ``function(KEYS, ARGV) <body> end``: a script's text, its ``return`` included)."""

    def __init__(self, kind: str, preamble: str, bodies: Mapping[str, str]) -> None:
        digest = hashlib.sha1(preamble.encode())
        for name, body in sorted(bodies.items()):
            digest.update(b"\0" + name.encode() + b"\0" + body.encode())
        self.name = f"kz_{kind}_{digest.hexdigest()[:16]}"
        parts = [f"#!lua name={self.name}\n", preamble, "\n"]
        for name, body in bodies.items():
            parts += [f"redis.register_function('{self.function_name(name)}', function(KEYS, ARGV)\n", body, "\nend)\n"]
        self.code = "".join(parts)
        self.functions = tuple(bodies)

    def function_name(self, name: str) -> str:
        return f"{self.name}_{name}"

    def bind(self, client: redis.Redis, name: str) -> LuaFunction:
        if name not in self.functions:
            raise KeyError(f"{self.name} has no function {name!r}")
        return LuaFunction(self, client, name)

    def load(self, client: redis.Redis) -> bool:
        """Load the library unless Redis holds it; whether it was loaded now."""
        try:
            client.function_load(self.code)
        except redis.ResponseError as exc:
            if "already exists" in str(exc):
                return False
            raise
        return True


def load_missing(client: redis.Redis, libraries: Sequence[LuaLibrary]) -> int:
    """Load those of ``libraries`` Redis does not hold: one round trip when it holds them all
    (``FUNCTION LIST``, a pattern per library); returns how many were loaded."""
    pipe = client.pipeline(transaction=False)
    for lib in libraries:
        pipe.function_list(library=lib.name)
    held = pipe.execute()
    return sum(lib.load(client) for lib, found in zip(libraries, held, strict=True) if not found)


class LuaFunction:
    """One function of a library on a client; called like redis-py's ``Script``
    (``f(keys=..., args=...)``). A server that does not hold the library gets it first, where the
    client may load code (else the refusal is raised: a compactor waits for the coordinator)."""

    def __init__(self, library: LuaLibrary, client: redis.Redis, name: str) -> None:
        self.library = library
        self.client = client
        self.name = library.function_name(name)

    def __call__(self, keys: Sequence[Any] = (), args: Sequence[Any] = (), client: redis.Redis | None = None) -> Any:
        c = client or self.client
        try:
            return c.fcall(self.name, len(keys), *keys, *args)
        except redis.ResponseError as exc:
            if not missing_function(exc):
                raise
        self.library.load(c)  # a new server, a restart without persistence, FUNCTION FLUSH
        return c.fcall(self.name, len(keys), *keys, *args)
