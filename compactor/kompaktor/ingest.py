"""Continuous ingest and its verification, in the style of Accumulo's continuous-ingest test.

Every entry's row is a random 16-hex-digit number; its value names the row written just before
it in the same chain (the first of a chain names nothing). Entries are flushed as many small
sorted files per tablet while compactions run. Verification scans the table and checks that
every referenced row exists (an UNDEFINED reference means lost data) and that the number of
entries equals what was written.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kompaktor.client import Client
from kompaktor.keys import Entry

CF = b"meta"
CQ = b"link"


def split_points(tablets: int) -> list[bytes]:
    """Evenly spaced split rows over the 16-hex-digit row space."""
    return [format(i * (16**4) // tablets, "04x").encode() for i in range(1, tablets)]


@dataclass
class IngestStats:
    entries: int = 0
    flushes: int = 0
    files: int = 0
    started: float = field(default_factory=time.monotonic)
    rows: set[bytes] = field(default_factory=set)

    @property
    def rate(self) -> float:
        return self.entries / max(1e-9, time.monotonic() - self.started)


@dataclass
class ContinuousIngest:
    client: Client
    table: str
    seed: int = 42
    batch: int = 2000
    chain: int = 50  # entries per chain before a new chain starts
    stats: IngestStats = field(default_factory=IngestStats)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.prev: bytes = b""
        self.in_chain = 0

    def _row(self) -> bytes:
        while True:
            row = format(self.rng.getrandbits(64), "016x").encode()
            if row not in self.stats.rows:
                self.stats.rows.add(row)
                return row

    def flush_once(self) -> int:
        entries = []
        ts = int(time.time() * 1000)
        for _ in range(self.batch):
            row = self._row()
            entries.append(Entry(row, CF, CQ, b"", ts, False, self.prev))
            self.in_chain += 1
            if self.in_chain >= self.chain:
                self.prev, self.in_chain = b"", 0
            else:
                self.prev = row
        files = self.client.flush(self.table, entries)
        self.stats.entries += len(entries)
        self.stats.flushes += 1
        self.stats.files += len(files)
        return len(entries)

    def run(self, *, entries: int, duration_s: float, should_stop: Callable[[], bool] = lambda: False,
            on_flush: Callable[[IngestStats], None] = lambda s: None, paced: bool = True) -> IngestStats:
        """Ingest until ``entries`` are written or ``duration_s`` passes. Paced: spread the entries
        evenly over the duration (a steady ingest rate, as in a continuous-ingest test)."""
        start = time.monotonic()
        deadline = start + duration_s
        rate = entries / duration_s
        while self.stats.entries < entries and time.monotonic() < deadline and not should_stop():
            self.flush_once()
            on_flush(self.stats)
            if paced:
                due = start + self.stats.entries / rate
                while not should_stop() and time.monotonic() < min(due, deadline):
                    time.sleep(min(0.05, max(0.0, due - time.monotonic())))
        return self.stats


@dataclass
class Verification:
    entries: int
    expected: int
    referenced: int
    undefined: int
    unexpected: int
    ok: bool


def verify(client: Client, table: str, written: set[bytes]) -> Verification:
    """Scan everything; every referenced row must exist and the rows must be exactly those written."""
    seen: set[bytes] = set()
    refs: set[bytes] = set()
    n = 0
    for e in client.scan(table):
        n += 1
        seen.add(e.row)
        if e.value:
            refs.add(e.value)
    undefined = len(refs - seen)
    unexpected = len(seen - written)
    ok = undefined == 0 and unexpected == 0 and n == len(written) and seen == written
    return Verification(n, len(written), len(refs), undefined, unexpected, ok)
