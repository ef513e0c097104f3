"""Redis as a test or a benchmark sees it from outside the store: a connection of its own to the
server a metadata store uses, to read keys, damage them on purpose or ask the server about itself.

The store's connection is private to ``kompaktor.metadata``: code outside it, the tests and
benchmarks included, never reaches it. :func:`raw_redis` gives the same server through a separate
client, made as the store makes its own (:func:`kompaktor.connection.connect`: the same URL, TLS,
password and Sentinel), one per store and kept while the store lives.
"""

from __future__ import annotations

import weakref

import redis

from kompaktor.connection import connect
from kompaktor.metadata.store import MetadataStore

_CLIENTS: weakref.WeakKeyDictionary[MetadataStore, redis.Redis] = weakref.WeakKeyDictionary()


def raw_redis(store: MetadataStore) -> redis.Redis:
    """A client of the Redis ``store`` uses (its URL), separate from the store's own connection."""
    if not store.url:
        raise ValueError("this store was made without a URL: there is no server to connect to")
    client = _CLIENTS.get(store)
    if client is None:
        client = _CLIENTS[store] = connect(store.url)
        weakref.finalize(store, client.close)
    return client
