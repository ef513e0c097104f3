"""The coordinator's broker for tests that run compactors with a compactor's Redis user."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from kompaktor import keyspace as C
from kompaktor.coordinator.broker import Broker
from kompaktor.metadata import broker_messages as m
from kompaktor.metadata.brokered import BrokeredJobs
from kompaktor.metadata.store import MetadataStore
from tests.support.rawredis import raw_redis


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


def send_raw(jobs: BrokeredJobs, op: object, wait: float, **args: object) -> m.Envelope:
    """Push a request document as a compactor's user may, whatever it says (a hostile compactor
    is not held to the request types); where its answer comes."""
    env = m.Envelope.new(wait, time.time())
    doc = json.dumps({"op": op, "reply": env.reply, "exp": env.exp, **args})
    raw_redis(jobs.store).lpush(C.BROKER, doc)
    return env


def ask_raw(jobs: BrokeredJobs, op: object, wait: float = 10.0, **args: object) -> object:
    """:func:`send_raw`, then the answer (its error raised)."""
    return jobs.answer(str(op), send_raw(jobs, op, wait, **args), wait)
