"""A merge-engine wrapper that controls only *when* a real merge proceeds (test double for
timing): the real engine (Arrow or Spark) reads, merges and writes; after it reports its first
finished part, the wrapper holds in the progress callback until its gate opens or the merge is
cancelled. A cancelled merge then stops the real way (the engine sees ``cancel`` at its next
part boundary, raises MergeCancelled and removes its temporary output).

Run as a script it *is* the ``kompaktor`` CLI, with every engine it makes wrapped this way:
``python gated_engine.py compactor --group G ...``; the gate is the file named by
``KOMPAKTOR_TEST_GATE`` (open once it exists; ``{group}`` in it stands for the compactor's
``--group``) and the wrapper creates ``<gate>.held`` when a merge starts holding. With
``KOMPAKTOR_TEST_GATE_ARMED`` set, merges pass freely until the file it names exists. With
``KOMPAKTOR_TEST_MERGE_SECONDS`` (and no gate) every merge is paced instead: it holds until that
many seconds after it started, standing for a bigger merge (it still stops when cancelled).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


class GatedEngine:
    def __init__(
        self,
        inner: Any,
        gate: Callable[[], bool] | threading.Event,
        *,
        hold_after_parts: int = 1,
        on_hold: Callable[[], None] | None = None,
        after_merge: Callable[[Any], None] | None = None,
        min_seconds: float = 0.0,
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self._gate = gate.is_set if isinstance(gate, threading.Event) else gate
        self.hold_after_parts = hold_after_parts
        self.on_hold = on_hold
        self.after_merge = after_merge  # called with the request once the real merge returned
        self.min_seconds = min_seconds  # a merge holds at least until this long after it started
        self.held = threading.Event()
        self.merged = threading.Event()
        self.cancelled = threading.Event()  # the hold ended because the merge was cancelled

    def merge(self, storage, req, *, progress=None, cancel: threading.Event | None = None):
        passed = False
        until = time.monotonic() + self.min_seconds

        def on_progress(p: dict) -> None:
            nonlocal passed
            if progress is not None:
                progress(p)
            if passed or p.get("parts_done", 0) < self.hold_after_parts:
                return
            passed = True
            self.held.set()
            if self.on_hold is not None:
                self.on_hold()
            stop = cancel or threading.Event()
            while not self._gate() or time.monotonic() < until:
                if stop.wait(0.01):
                    self.cancelled.set()
                    return

        result = self.inner.merge(storage, req, progress=on_progress, cancel=cancel)
        self.merged.set()
        if self.after_merge is not None:
            self.after_merge(req)
        return result


def _main() -> None:
    from kompaktor import engines as engine
    from kompaktor.cli import main

    group = sys.argv[sys.argv.index("--group") + 1] if "--group" in sys.argv else ""
    paced = float(os.environ.get("KOMPAKTOR_TEST_MERGE_SECONDS", "0"))
    gate = Path(os.environ.get("KOMPAKTOR_TEST_GATE", "").replace("{group}", group))
    armed = os.environ.get("KOMPAKTOR_TEST_GATE_ARMED")
    real_make_engine = engine.make_engine

    def is_open() -> bool:
        return paced > 0 or gate.exists() or (armed is not None and not Path(armed).exists())

    def make_engine(kind: str = "spark", **kw: Any) -> GatedEngine:
        held = (lambda: Path(f"{gate}.held").touch()) if not paced else None
        return GatedEngine(real_make_engine(kind, **kw), is_open, on_hold=held, min_seconds=paced)

    engine.make_engine = make_engine
    sys.argv[0] = "kompaktor"
    sys.exit(main())


if __name__ == "__main__":
    _main()
