"""A workload mix no test tunes to (``kompaktor demo --workload mix``, ``bench.soak --workload
mix``), beside the continuous ingest: deletes of random existing keys, puts, imports with
timestamps older than earlier deletes (with and without ``--set-time``), overlapping imports,
splits and merges, and user compactions with an iterator — on a table of their own (created with
a few split points), planned and compacted by the same coordinator and compactors as the ingest's.
Its own table keeps the reference exact: every delete marker that can refuse one of its writes is
one of its own.

Its verification compares the scan with a reference view computed here from the writes the table
accepted (docs/file-format.md: per key the newest put not hidden by a delete marker of the same or
a newer timestamp), never with Kompaktor's iterators. A refused write must have a reason: it held
a put no newer than an accepted delete marker. Each visible key's timestamp and value are
compared, and a key shown twice or a file referenced but missing fails it. A write whose outcome
is unknown (Redis went away while it was acknowledged) makes its keys uncertain: left out of the
comparison and counted, until an acknowledged write settles them (a delete at least as new as
every unknown write of the key, or a put newer than them when none was a delete: either decides
the key's view whatever the unknown writes did). The soak bounds what stays uncertain
(:attr:`MixCheck.uncertain_ok`; docs/verification.md).
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import pyarrow.parquet as pq

from kompaktor.client import Client
from kompaktor.files.sortedfile import entries_to_table
from kompaktor.local.ingest import missing_files
from kompaktor.metadata import tablet_ops, user_compactions
from kompaktor.model.errors import KompaktorError, StoreUnavailable
from kompaktor.model.keys import Entry, sort_key
from kompaktor.policy.deletes import DeleteHorizonError

MIX_CF = b"mix"
CQ = b"v"
#: an age-off far longer than any run: the user compaction's iterator path runs, nothing ages off
AGEOFF_NOTHING_MS = 30 * 86_400_000
#: the most of the checked keys that may stay uncertain (the soak's contract)
UNCERTAIN_MAX = 0.001
#: the time of an unknown write whose time is not known (an import with --set-time): no write settles it
NEVER = 2**63 - 1
ACTIONS = ("delete", "put", "import-old", "import-set-time", "import-overlap", "split", "merge", "user-compaction")
WEIGHTS = (4, 3, 3, 2, 2, 1, 1, 1)


def now_ms() -> int:
    return int(time.time() * 1000)


def value(row: bytes, ts: int) -> bytes:
    return b"%s@%d" % (row, ts)


@dataclass
class MixCheck:
    keys: int  # keys the reference shows
    scanned: int  # mix entries the scan showed (certain keys)
    missing: int  # visible in the reference, not in the scan: lost
    resurrected: int  # in the scan, hidden in the reference: deleted data come back
    wrong: int  # present in both with another version
    uncertain: int  # keys left out (a write's outcome unknown)
    refused: int
    unjustified_refusals: int
    actions: dict[str, int]
    checked: int = 0  # keys the mix wrote to
    duplicated: int = 0  # keys shown more than once
    missing_files: int = 0  # files referenced by the mix's tablets, not in storage
    #: what was found, one line each (the first ten)
    findings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            self.missing == 0
            and self.resurrected == 0
            and self.wrong == 0
            and self.unjustified_refusals == 0
            and self.duplicated == 0
            and self.missing_files == 0
        )

    @property
    def uncertain_ok(self) -> bool:
        """At most :data:`UNCERTAIN_MAX` of the checked keys stayed uncertain."""
        return self.uncertain <= UNCERTAIN_MAX * self.checked


@dataclass
class MixedWorkload:
    client: Client
    table: str
    workdir: Path
    seed: int = 11
    keys: int = 300
    max_splits: int = 6
    #: per key, the writes the table accepted: (timestamp, delete, value)
    accepted: dict[bytes, list[tuple[int, bool, bytes]]] = field(default_factory=lambda: defaultdict(list))
    #: per uncertain key: the newest of its unknown writes' times, whether one was a delete
    uncertain: dict[bytes, tuple[int, bool]] = field(default_factory=dict)
    actions: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    refused: int = 0
    unjustified: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.pool = sorted({format(self.rng.getrandbits(64), "016x").encode() for _ in range(self.keys)})
        if self.table not in {t.name for t in self.client.store.tables.tables()}:
            self.client.store.tables.create_table(self.table, [b"4", b"8", b"c"])
        self.splits = 0
        self.ucomp: str | None = None
        self.workdir.mkdir(parents=True, exist_ok=True)

    # -- one step ----------------------------------------------------------------------------------
    def step(self) -> str:
        """Do one action, chosen at random; returns its name."""
        action = self.rng.choices(ACTIONS, WEIGHTS)[0]
        try:
            getattr(self, "_" + action.replace("-", "_"))()
        except StoreUnavailable:
            pass  # the action's keys were marked uncertain before it was sent
        self.actions[action] += 1
        return action

    def _rows(self, n: int) -> list[bytes]:
        return self.rng.sample(self.pool, min(n, len(self.pool)))

    def _write(self, writes: list[tuple[bytes, int, bool]], how: str) -> None:
        """Flush (``how`` = flush) or import the writes; record them when accepted."""
        entries = [Entry(r, MIX_CF, CQ, b"", ts, d, b"" if d else value(r, ts)) for r, ts, d in writes]
        try:
            if how == "flush":
                self.client.flush(self.table, entries)
            else:
                src = self.workdir / f"mix-{self.rng.getrandbits(32):08x}.parquet"
                pq.write_table(entries_to_table(sorted(entries, key=sort_key)), src)
                try:
                    self.client.import_files(self.table, [str(src)])
                finally:
                    src.unlink(missing_ok=True)
        except DeleteHorizonError:
            self._refused(writes)
            return
        except StoreUnavailable:
            for r, ts, d in writes:
                self._unknown(r, ts, d)
            raise
        for r, ts, d in writes:
            self._accept(r, ts, d, b"" if d else value(r, ts))

    def _unknown(self, row: bytes, ts: int, deleted: bool) -> None:
        """A write of ``row`` whose outcome is unknown: the key is uncertain until settled."""
        was_ts, was_d = self.uncertain.get(row, (ts, deleted))
        self.uncertain[row] = (max(ts, was_ts), was_d or deleted)

    def _accept(self, row: bytes, ts: int, deleted: bool, val: bytes) -> None:
        """An acknowledged write; it settles an uncertain key whose view it decides."""
        self.accepted[row].append((ts, deleted, val))
        unsure = self.uncertain.get(row)
        if unsure is None or unsure[0] == NEVER:
            return
        if (deleted and ts >= unsure[0]) or (not deleted and not unsure[1] and ts > unsure[0]):
            del self.uncertain[row]

    def _refused(self, writes: list[tuple[bytes, int, bool]]) -> None:
        self.refused += 1
        newest_delete = max((ts for es in self.accepted.values() for ts, d, _ in es if d), default=None)
        oldest_put = min((ts for _, ts, d in writes if not d), default=None)
        if newest_delete is None or oldest_put is None or oldest_put > newest_delete:
            self.unjustified += 1

    def _delete(self) -> None:
        """Deletes of random existing keys, at the present."""
        live = [r for r in self.pool if self.accepted.get(r)]
        if live:
            ts = now_ms()
            self._write([(r, ts, True) for r in self.rng.sample(live, min(8, len(live)))], "flush")

    def _put(self) -> None:
        ts = now_ms()
        self._write([(r, ts, False) for r in self._rows(10)], "flush")

    def _import_old(self) -> None:
        """An import of puts older than recent deletes: refused when a dropped marker may hide one."""
        ts = now_ms() - self.rng.randint(1, 60_000)
        self._write([(r, ts, False) for r in self._rows(12)], "import")

    def _import_overlap(self) -> None:
        """Two imports over the same keys, the second newer."""
        rows, ts = self._rows(12), now_ms()
        self._write([(r, ts - 5, False) for r in rows], "import")
        self._write([(r, ts, self.rng.random() < 0.3) for r in rows], "import")

    def _import_set_time(self) -> None:
        """An old import with --set-time; the time it got is read back from the stored file."""
        rows = self._rows(10)
        old = now_ms() - self.rng.randint(1, 60_000)
        entries = [Entry(r, MIX_CF, CQ, b"", old, False, value(r, old)) for r in rows]
        src = self.workdir / f"mix-{self.rng.getrandbits(32):08x}.parquet"
        pq.write_table(entries_to_table(sorted(entries, key=sort_key)), src)
        try:
            paths = self.client.import_files(self.table, [str(src)], set_time=True)
        except StoreUnavailable:
            for r in rows:
                self._unknown(r, NEVER, False)  # its time is unknown: no later write settles it
            raise
        finally:
            src.unlink(missing_ok=True)
        with self.client.storage.open_input(paths[0]) as f:
            (ts,) = {int(t) for t in cast("list[int]", pq.read_table(f, columns=["ts"]).column("ts").to_pylist())}
        for r in rows:
            self._accept(r, ts, False, value(r, old))

    def _split(self) -> None:
        if self.splits < self.max_splits:
            try:
                tablet_ops.split(self.client.store, self.table, [self.rng.choice(self.pool)])
                self.splits += 1
            except tablet_ops.TabletOpRefused:
                pass

    def _merge(self) -> None:
        a, b = sorted(self._rows(2))
        try:
            tablet_ops.merge(self.client.store, self.table, a, b)
        except tablet_ops.TabletOpRefused:
            pass

    def _user_compaction(self) -> None:
        """A user compaction with an iterator (an age-off that ages nothing off), one at a time."""
        if self.ucomp is not None and user_compactions.get(self.client.store, self.ucomp).state == "RUNNING":
            return
        try:
            self.ucomp = user_compactions.start(
                self.client.store, self.table, iterators={"ageoff_ttl_ms": AGEOFF_NOTHING_MS}
            )
        except KompaktorError:
            pass  # e.g. a split pending: next time

    # -- verification ------------------------------------------------------------------------------
    def reference(self) -> dict[bytes, tuple[int, bytes]]:
        """Per certain key, the timestamp and value of its visible put (absent: nothing visible)."""
        out = {}
        for row, writes in self.accepted.items():
            if row in self.uncertain:
                continue
            newest_delete = max((ts for ts, d, _ in writes if d), default=None)
            puts = [(ts, v) for ts, d, v in writes if not d and (newest_delete is None or ts > newest_delete)]
            if puts:
                out[row] = max(puts)
        return out

    def check(self) -> MixCheck:
        want = self.reference()
        gone = missing_files(self.client, self.table)
        got: dict[bytes, tuple[int, bytes]] = {}
        twice: list[bytes] = []
        for e in [] if gone else self.client.scan(self.table):  # a scan would fail on a missing file
            if e.cf == MIX_CF and e.row not in self.uncertain:
                if e.row in got:
                    twice.append(e.row)
                got[e.row] = (e.ts, e.value)
        return MixCheck(
            keys=len(want),
            scanned=len(got),
            missing=0 if gone else len(want.keys() - got.keys()),
            resurrected=len(got.keys() - want.keys()),
            wrong=sum(1 for r in want.keys() & got.keys() if want[r] != got[r]),
            uncertain=len(self.uncertain),
            refused=self.refused,
            unjustified_refusals=self.unjustified,
            actions=dict(self.actions),
            checked=len(self.accepted.keys() | self.uncertain.keys()),
            duplicated=len(twice),
            missing_files=len(gone),
            findings=(gone + _findings(want, got, twice))[:10],
        )


def _show(v: tuple[int, bytes] | None) -> str:
    return "nothing" if v is None else f"ts {v[0]} value {v[1][:40]!r}"


def _findings(
    want: dict[bytes, tuple[int, bytes]], got: dict[bytes, tuple[int, bytes]], twice: list[bytes]
) -> list[str]:
    """One line per key the scan shows otherwise than the reference (the first ten)."""
    out = [f"key {r.decode(errors='replace')} shown twice" for r in twice[:10]]
    for r in sorted(want.keys() | got.keys()):
        if want.get(r) != got.get(r) and len(out) < 10:
            out.append(
                f"key {r.decode(errors='replace')}: expected {_show(want.get(r))}, scan shows {_show(got.get(r))}"
            )
    return out


def mix_summary(c: MixCheck) -> dict[str, object]:
    """The mix's lines of a run's summary."""
    return {
        "mix: actions": ", ".join(f"{k} {v}" for k, v in sorted(c.actions.items())),
        "mix: keys visible (reference)": c.keys,
        "mix: keys lost": c.missing,
        "mix: deleted keys resurrected": c.resurrected,
        "mix: keys at another version": c.wrong,
        "mix: writes refused (delete horizon)": c.refused,
        "mix: refusals without a reason": c.unjustified_refusals,
        "mix: keys uncertain (outcome unknown)": f"{c.uncertain} of {c.checked}",
        "mix: keys shown twice": c.duplicated,
        "mix: referenced files missing": c.missing_files,
        **({"mix: found": "; ".join(c.findings)} if c.findings else {}),
    }
