"""Where a merge's time goes: thread-seconds per phase, summed over the threads that ran it
(docs/architecture.md "Where a merge's time goes"). Off unless :func:`profiling` is active (the
bench's ``--profile``): :func:`phase` is then a shared no-op context, one global read per call.

The phases of the Arrow engine: ``plan`` (footers, statistics, key ranges, copy runs), ``read``
(a range's rows read and decoded from the inputs' cursors, checked), ``wait_turn`` (a worker
waiting for the range before its own to be read: inputs are read in order), ``merge`` (the
merged order and the iterator stack), ``take`` (the kept entries' columns gathered), ``encode``
(Parquet encoding in memory), ``copy`` (row groups copied through), ``write`` (the encoded ranges
spliced into the output, the footer, the commit) and ``wait`` (the merge's own thread waiting for
the next range's result: the workers are behind).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

__all__ = ["PhaseClock", "phase", "profiling"]


class PhaseClock:
    """Thread-seconds and calls per phase, added to from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seconds: dict[str, float] = {}
        #: CPU seconds of the thread that ran the phase (not of Arrow's own pool threads): on a
        #: loaded machine, what the phase cost rather than how long it waited for a core
        self.cpu: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def add(self, name: str, seconds: float, cpu: float = 0.0) -> None:
        with self._lock:
            self.seconds[name] = self.seconds.get(name, 0.0) + seconds
            self.cpu[name] = self.cpu.get(name, 0.0) + cpu
            self.calls[name] = self.calls.get(name, 0) + 1

    @contextmanager
    def timing(self, name: str) -> Iterator[None]:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t0, time.thread_time() - c0)


_CLOCK: list[PhaseClock | None] = [None]
_OFF: AbstractContextManager[None] = nullcontext()


def phase(name: str) -> AbstractContextManager[None]:
    """Time the block as phase ``name`` when profiling, else nothing."""
    clock = _CLOCK[0]
    return _OFF if clock is None else clock.timing(name)


@contextmanager
def profiling() -> Iterator[PhaseClock]:
    """Every :func:`phase` inside the block (on any thread) adds to the clock it yields."""
    clock = PhaseClock()
    _CLOCK[0] = clock
    try:
        yield clock
    finally:
        _CLOCK[0] = None
