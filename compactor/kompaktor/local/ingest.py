"""Continuous ingest and its verification, in the style of Accumulo's continuous-ingest test.

Every entry's row is a random 16-hex-digit number; its value names the row written just before
it in the same chain (the first of a chain names nothing). Entries are flushed as many small
sorted files per tablet while compactions run. Verification first checks that every file the
tablets reference exists, then scans the table: every referenced row exists (an UNDEFINED
reference means lost data), the linked rows are exactly those acknowledged, each shown once, with
the timestamp, visibility and value it was acknowledged with (a value changed into another
existing row, or emptied into a chain's head, fails), and the ephemeral rows are live or deleted as
written (docs/verification.md).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable
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
    #: per acknowledged linked row, a fingerprint of its newest write (:func:`fingerprint`)
    written: dict[bytes, int] = field(default_factory=dict)
    ephemeral_live: set[bytes] = field(default_factory=set)  # written, not deleted: must be visible
    ephemeral_deleted: set[bytes] = field(default_factory=set)  # deleted: must stay invisible

    @property
    def rate(self) -> float:
        return self.entries / max(1e-9, time.monotonic() - self.started)

    def acknowledged(self, entries: list[Entry]) -> None:
        """Record linked entries the table acknowledged: each row's newest write is what a scan
        must show."""
        for e in entries:
            self.written[e.row] = fingerprint(e)


def fingerprint(e: Entry) -> int:
    """What verification compares of a linked entry: its timestamp, visibility and value."""
    return hash((e.ts, e.vis, e.value))


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
        self.stats.acknowledged(entries[:links])
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
        self.stats.acknowledged([e for part in parts for e in part])
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


#: the findings a verification names (the counts cover them all)
FINDINGS_SHOWN = 10


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
    changed: int = 0  # linked rows shown with another timestamp, visibility or value
    duplicated: int = 0  # linked rows shown more than once (an older version beside the newest)
    missing_files: int = 0  # files the tablets reference that storage does not hold
    #: what was found, one line each (the first :data:`FINDINGS_SHOWN`)
    findings: list[str] = field(default_factory=list)


def _show(e: Entry) -> str:
    return f"ts {e.ts} vis {e.vis!r} value {e.value[:20]!r}"


def missing_files(client: Client, table: str) -> list[str]:
    """The files the table's tablets reference that storage does not hold, one line each."""
    tid = client.store.tables.table_id(table)
    return [
        f"file {f} of tablet {t.id} is referenced but missing"
        for t in client.store.tables.tablets(tid)
        for f in sorted(t.files)
        if not client.storage.exists(f)
    ]


def verify(client: Client, table: str, stats: IngestStats) -> Verification:
    """Check every referenced file, then scan everything: every referenced row exists, the linked
    rows are exactly those acknowledged, each once and as acknowledged (timestamp, visibility,
    value), live ephemeral rows are all there and no deleted one came back."""
    gone = missing_files(client, table)
    if gone:  # the scan would fail on them: what they held is lost
        return Verification(
            0, len(stats.written), 0, 0, 0, 0, 0, False, missing_files=len(gone), findings=gone[:FINDINGS_SHOWN]
        )
    s = _scan(client, table, stats)
    written = stats.written.keys()
    undefined, unexpected = s.refs - s.seen, s.seen - written
    resurrected = s.eph & stats.ephemeral_deleted
    s.findings += _named("acknowledged, not found", written - s.seen)
    s.findings += _named("found, never acknowledged", unexpected)
    s.findings += _named("referenced, not found", undefined)
    s.findings += [f"deleted row {r.decode(errors='replace')} visible again" for r in sorted(resurrected)]
    lost_eph = len(stats.ephemeral_live - s.eph)
    ok = (
        not undefined
        and not unexpected
        and s.n == len(written)
        and s.seen == written
        and lost_eph == 0
        and not resurrected
        and s.eph == stats.ephemeral_live
        and s.changed == 0
        and s.duplicated == 0
    )
    counts = (s.n, len(written), len(s.refs), len(undefined), len(unexpected), lost_eph, len(resurrected))
    return Verification(*counts, ok, s.changed, s.duplicated, 0, s.findings[:FINDINGS_SHOWN])


@dataclass
class _Scanned:
    """What a scan of the ingest's rows showed: linked rows seen, the rows their values reference,
    ephemeral rows seen, and each linked row not as acknowledged or shown twice."""

    seen: set[bytes] = field(default_factory=set)
    refs: set[bytes] = field(default_factory=set)
    eph: set[bytes] = field(default_factory=set)
    findings: list[str] = field(default_factory=list)
    n: int = 0
    changed: int = 0
    duplicated: int = 0


def _scan(client: Client, table: str, stats: IngestStats) -> _Scanned:
    s = _Scanned()
    for e in client.scan(table):
        if e.cf == EPHEMERAL_CF:
            s.eph.add(e.row)
            continue
        if e.cf != CF:
            continue  # another workload's (kompaktor.local.mix), verified on its own
        s.n += 1
        if e.row in s.seen:
            s.duplicated += 1
            s.findings.append(f"row {e.row.decode(errors='replace')} shown twice ({_show(e)})")
        s.seen.add(e.row)
        want = stats.written.get(e.row)
        if want is not None and want != fingerprint(e):
            s.changed += 1
            s.findings.append(f"row {e.row.decode(errors='replace')} shown with {_show(e)}: not as acknowledged")
        if e.value:
            s.refs.add(e.value)
    return s


def _named(what: str, rows: Iterable[bytes]) -> list[str]:
    """The first rows of ``rows`` (at most :data:`FINDINGS_SHOWN`), each on its line."""
    return [f"row {r.decode(errors='replace')} {what}" for r in sorted(rows)[:FINDINGS_SHOWN]]
