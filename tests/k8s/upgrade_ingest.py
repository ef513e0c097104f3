"""Continuous ingest with its own record of what was acknowledged, for the upgrade test: the
independent reference a scan is checked against (never the code under test).

Each batch writes new rows, one per tablet, and every other batch also deletes the rows of an
earlier acknowledged batch (delete markers, newer than the puts they hide). A flush that raises
leaves its rows *unsure*: Redis may have applied it before the error (a lost reply while its pod
restarts), so either outcome is right for them, and nothing is deleted on top of them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kompaktor.model.keys import Entry

#: the ingest table's tablets: rows r0-… to r7-…, split before r1 … r7
LANES = 8
SPLITS = [f"r{j}" for j in range(1, LANES)]


def row(lane: int, batch: int) -> bytes:
    return f"r{lane}-{batch:06d}".encode()


@dataclass
class Verdict:
    lost: list[bytes]  # acknowledged, not deleted, and missing or with another value
    resurrected: list[bytes]  # acknowledged deletes that a scan shows again
    unknown: list[bytes]  # rows nobody wrote

    @property
    def clean(self) -> bool:
        return not (self.lost or self.resurrected or self.unknown)


@dataclass
class Reference:
    puts: dict[bytes, bytes] = field(default_factory=dict)
    deletes: set[bytes] = field(default_factory=set)
    unsure: set[bytes] = field(default_factory=set)

    def copy(self) -> Reference:
        return Reference(dict(self.puts), set(self.deletes), set(self.unsure))

    def check(self, scanned: dict[bytes, bytes], later: Iterable[bytes] = ()) -> Verdict:
        """``scanned`` against this record; ``later``: rows written after it was taken (a backup
        may hold them or not)."""
        free = self.unsure | set(later)
        settled = self.deletes | free
        lost = [r for r, v in self.puts.items() if r not in settled and scanned.get(r) != v]
        back = [r for r in self.deletes if r in scanned and r not in free]
        unknown = [r for r in scanned if r not in self.puts and r not in free]
        return Verdict(sorted(lost), sorted(back), sorted(unknown))


class Ingest:
    """Flushes a batch through ``flush`` every ``pace`` seconds in a thread until :meth:`stop`;
    :meth:`verify` pauses it for a scan."""

    def __init__(
        self,
        flush: Callable[[list[Entry]], object],
        scan: Callable[[], dict[bytes, bytes]],
        pace: float = 0.3,
    ) -> None:
        self.flush, self.scan, self.pace = flush, scan, pace
        self.ref = Reference()
        self.batches = 0
        self.errors: list[str] = []
        self.verdicts: list[Verdict] = []  # the periodic checks that could scan
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="ingest", daemon=True)

    def start(self) -> Ingest:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(120)
        assert not self.thread.is_alive(), "the ingest thread did not stop"

    def _batch(self, i: int) -> tuple[dict[bytes, bytes], list[bytes]]:
        puts = {row(j, i): f"v{i}-{j}".encode() for j in range(LANES)}
        old = [row(j, i - 4) for j in range(LANES)]
        gone = (
            old if i >= 4 and i % 2 == 0 and all(r in self.ref.puts and r not in self.ref.unsure for r in old) else []
        )
        return puts, gone

    def _run(self) -> None:
        i = 0
        while not self._stop.wait(self.pace):
            with self.lock:
                puts, gone = self._batch(i)
                stamp = 1000 + i
                entries = [Entry(r, b"f", b"q", b"", stamp, False, v) for r, v in puts.items()]
                entries += [Entry(r, b"f", b"q", b"", stamp, True, b"") for r in gone]
                try:
                    self.flush(entries)
                except Exception as exc:  # an outcome unknown: either is right for these rows
                    self.errors.append(f"{time.strftime('%H:%M:%S')} batch {i}: {type(exc).__name__}: {exc}"[:300])
                    self.ref.unsure.update(puts, gone)
                else:
                    self.ref.puts.update(puts)
                    self.ref.deletes.update(gone)
                self.batches = i = i + 1
            if i % 20 == 0:
                self._check()

    def _check(self) -> None:
        try:
            self.verify()
        except Exception as exc:  # Redis restarting: this check is skipped, the next one runs
            self.errors.append(f"{time.strftime('%H:%M:%S')} scan: {type(exc).__name__}: {exc}"[:300])

    def verify(self) -> Verdict:
        """A scan against the record, the ingest paused meanwhile."""
        with self.lock:
            verdict = self.ref.check(self.scan())
        self.verdicts.append(verdict)
        return verdict
