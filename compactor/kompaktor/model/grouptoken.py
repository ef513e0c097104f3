"""A compactor group's token: what proves a compactor's request to the coordinator's broker comes
from a compactor of that group (docs/kubernetes.md "A compactor holds no power beyond its own
job"). Derived from a key only the operator and the coordinator hold, so neither stores a token:
the operator puts a group's token in its pods' spec (``KOMPAKTOR_GROUP_TOKEN``), the broker
derives it again to check a request. Pure."""

from __future__ import annotations

import hashlib
import hmac

#: where the operator and the coordinator read the key, and a compactor its group's token
KEY_ENV = "KOMPAKTOR_GROUP_KEY"
TOKEN_ENV = "KOMPAKTOR_GROUP_TOKEN"


def group_token(key: str, group: str) -> str:
    """The token of ``group`` under ``key`` (HMAC-SHA256, hex)."""
    return hmac.new(key.encode(), f"kompaktor-group:{group}".encode(), hashlib.sha256).hexdigest()


def holds(key: str, group: str, token: object) -> bool:
    """Whether ``token`` is ``group``'s (in constant time)."""
    return isinstance(token, str) and hmac.compare_digest(token, group_token(key, group))
