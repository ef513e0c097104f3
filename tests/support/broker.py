"""The coordinator's broker for tests that run compactors with a compactor's Redis user."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from kompaktor.coordinator.broker import Broker
from kompaktor.metadata.brokered import BrokeredJobs
from kompaktor.metadata.store import MetadataStore


@contextmanager
def running_broker(coordinator_url: str, threads: int = 1, group_key: str | None = None) -> Iterator[Broker]:
    """A broker serving with the coordinator's user until the block ends (its threads joined)."""
    broker = Broker(MetadataStore.from_url(coordinator_url), group_key)
    stop = threading.Event()
    serving = broker.start(stop, threads=threads, wait_s=0.1)
    try:
        yield broker
    finally:
        stop.set()
        for th in serving:
            th.join(10)


def brokered(compactor_url: str) -> tuple[MetadataStore, BrokeredJobs]:
    """A compactor's store on its own user, and its writes through the broker."""
    store = MetadataStore.from_url(compactor_url)
    return store, BrokeredJobs(store, timeout_s=10.0)
