"""User compactions' records in the metadata store (``kz:ucomps``, ``kz:ucomp:<id>``, their
finished tablets, and the request ids that started them).

The protocol — start (record, binding and holds in one mutation), select, cancel, finish — is
:mod:`kompaktor.metadata.user_compactions`; this part only reads and writes the records.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from kompaktor import keyspace
from kompaktor.connection import text

if TYPE_CHECKING:
    from kompaktor.metadata.store.base import StoreCore


class UserCompactionStore:
    """The records of user compactions."""

    def __init__(self, core: StoreCore) -> None:
        self._core = core
        self._r = core.client

    def put_user_compaction(self, cid: str, fields: Mapping[str, str | int]) -> None:
        self._core.write(("HSET", keyspace.ucomp_key(cid), *[x for kv in fields.items() for x in kv]))

    def user_compaction(self, cid: str) -> tuple[dict[str, str], int] | None:
        """The record of a user compaction and its number of finished tablets, or None."""
        p = self._r.pipeline(transaction=False)
        p.hgetall(keyspace.ucomp_key(cid))
        p.scard(keyspace.ucomp_done_key(cid))
        h, done = self._core.call(p.execute)
        if not h:
            return None
        return {k.decode(): v.decode() for k, v in h.items()}, int(done)

    def user_compaction_field(self, cid: str, name: str) -> str | None:
        raw = self._core.call(self._r.hget, keyspace.ucomp_key(cid), name)
        return None if raw is None else text(raw)

    def forget_user_compaction(self, cid: str) -> None:
        """Remove a finished user compaction's record, its finished tablets and its id."""
        self._core.write(("DEL", keyspace.ucomp_key(cid), keyspace.ucomp_done_key(cid)), ("SREM", keyspace.UCOMPS, cid))

    def list_user_compactions(self) -> list[str]:
        return sorted(text(c) for c in self._core.call(self._r.smembers, keyspace.UCOMPS))

    def request_claimed(self, request_id: str) -> str | None:
        raw = self._core.call(self._r.get, keyspace.request_key(request_id))
        return None if raw is None else text(raw)
