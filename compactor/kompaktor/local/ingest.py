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
from pathlib import Path

import pyarrow.parquet as pq

from kompaktor.client import Client
from kompaktor.model.keys import Entry, sort_key

CF = b"meta"
CQ = b"link"
EPHEMERAL_CF = b"tmp"  # rows written and deleted again later: a delete must never be undone


def split_points(tablets: int) -> list[bytes]:
    """Evenly spaced split rows over the 16-hex-digit row space."""
    return [format(i * (16**4) // tablets, "04x").encode() for i in range(1, tablets)]


@dataclass
class IngestStats:
    entries: int = 0
    flushes: int = 0
    files: int = 0  # flushed
    imported_files: int = 0
    started: float = field(default_factory=time.monotonic)
    rows: set[bytes] = field(default_factory=set)
    ephemeral_live: set[bytes] = field(default_factory=set)  # written, not deleted: must be visible
    ephemeral_deleted: set[bytes] = field(default_factory=set)  # deleted: must stay invisible

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
    ephemeral: int = 20  # per flush: write this many ephemeral rows, delete those of 3 flushes ago
    flush_attempts: int = 10  # a flush retried this often (with backoff up to 2 s) while Redis is away
    stats: IngestStats = field(default_factory=IngestStats)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.prev: bytes = b""
        self.in_chain = 0
        self.last_ts = 0
        self.pending: list[list[bytes]] = []

    def _row(self) -> bytes:
        while True:
            row = format(self.rng.getrandbits(64), "016x").encode()
            if row not in self.stats.rows:
                self.stats.rows.add(row)
                return row

    def flush_once(self) -> int:
        entries = []
        ts = max(int(time.time() * 1000), self.last_ts + 1)
        self.last_ts = ts
        for _ in range(self.batch):
            row = self._row()
            entries.append(Entry(row, CF, CQ, b"", ts, False, self.prev))
            self.in_chain += 1
            if self.in_chain >= self.chain:
                self.prev, self.in_chain = b"", 0
            else:
                self.prev = row
        links = len(entries)
        fresh = [format(self.rng.getrandbits(64), "016x").encode() for _ in range(self.ephemeral)]
        entries += [Entry(r, EPHEMERAL_CF, CQ, b"", ts, False, b"x") for r in fresh]
        self.pending.append(fresh)
        doomed = self.pending.pop(0) if len(self.pending) > 3 else []
        entries += [Entry(r, EPHEMERAL_CF, CQ, b"", ts, True, b"") for r in doomed]
        files = self._flush_retrying(entries, self.flush_attempts)
        self.stats.ephemeral_live.update(fresh)
        self.stats.ephemeral_live.difference_update(doomed)
        self.stats.ephemeral_deleted.update(doomed)
        self.stats.entries += links
        self.stats.flushes += 1
        self.stats.files += len(files)
        return len(entries)

    def _flush_retrying(self, entries: list[Entry], attempts: int = 10) -> list[str]:
        """Flush; if Redis is restarting, retry with backoff (a retried flush may register the same
        entries twice, which is harmless: identical keys collapse into one version)."""
        from kompaktor.model.errors import StoreUnavailable

        for n in range(attempts):
            try:
                return self.client.flush(self.table, entries)
            except StoreUnavailable:
                if n == attempts - 1:
                    raise
                time.sleep(min(2.0, 0.1 * 2**n))
        return []

    def import_burst(self, entries: int, files: int, workdir: Path) -> list[str]:
        """A bulk import of ``entries`` more linked entries (the same chains, so verification
        covers them) as ``files`` Parquet files, each spanning the whole row space: one mutation
        adds every file to every tablet, which is what fills the queues at once. Returns the
        imported files' names in storage."""
        from kompaktor.files.sortedfile import entries_to_table

        workdir.mkdir(parents=True, exist_ok=True)
        ts = max(int(time.time() * 1000), self.last_ts + 1)
        self.last_ts = ts
        parts: list[list[Entry]] = [[] for _ in range(max(1, files))]
        rows: list[bytes] = []
        for i in range(entries):
            row = self._row()
            rows.append(row)
            parts[i % len(parts)].append(Entry(row, CF, CQ, b"", ts, False, self.prev))
            self.in_chain += 1
            if self.in_chain >= self.chain:
                self.prev, self.in_chain = b"", 0
            else:
                self.prev = row
        sources: list[str] = []
        for n, part in enumerate(p for p in parts if p):
            src = workdir / f"burst-{n:03d}.parquet"
            pq.write_table(entries_to_table(sorted(part, key=sort_key)), src)
            sources.append(str(src))
        try:
            imported = self.client.import_files(self.table, sources)
        except BaseException:
            self.stats.rows.difference_update(rows)  # refused: nothing of it is in the table
            raise
        finally:
            for name in sources:
                Path(name).unlink(missing_ok=True)
        self.stats.entries += len(rows)
        self.stats.imported_files += len(imported)
        return imported

    def run(
        self,
        *,
        entries: int,
        duration_s: float,
        should_stop: Callable[[], bool] = lambda: False,
        on_flush: Callable[[IngestStats], None] = lambda s: None,
        paced: bool = True,
    ) -> IngestStats:
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
    entries: int  # linked entries scanned
    expected: int
    referenced: int
    undefined: int  # referenced rows that do not exist: lost data
    unexpected: int  # rows that were never written
    lost_ephemeral: int  # live ephemeral rows missing
    resurrected: int  # deleted ephemeral rows visible again
    ok: bool


def verify(client: Client, table: str, stats: IngestStats) -> Verification:
    """Scan everything: every referenced row exists, the linked rows are exactly those written,
    live ephemeral rows are all there and no deleted one came back."""
    seen: set[bytes] = set()
    refs: set[bytes] = set()
    eph: set[bytes] = set()
    n = 0
    for e in client.scan(table):
        if e.cf == EPHEMERAL_CF:
            eph.add(e.row)
            continue
        if e.cf != CF:
            continue  # another workload's (kompaktor.local.mix), verified on its own
        n += 1
        seen.add(e.row)
        if e.value:
            refs.add(e.value)
    written = stats.rows
    undefined = len(refs - seen)
    unexpected = len(seen - written)
    lost_eph = len(stats.ephemeral_live - eph)
    resurrected = len(eph & stats.ephemeral_deleted)
    ok = (
        undefined == 0
        and unexpected == 0
        and n == len(written)
        and seen == written
        and lost_eph == 0
        and resurrected == 0
        and eph == stats.ephemeral_live
    )
    return Verification(n, len(written), len(refs), undefined, unexpected, lost_eph, resurrected, ok)
