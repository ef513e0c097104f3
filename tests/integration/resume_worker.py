"""``kompaktor compactor`` for the resume chaos test (issue 23 §2), run as a script: its engine
(``KOMPAKTOR_TEST_ENGINE``: ``arrow``, resumable at any size, or ``spark`` in ``local[2]``) cuts
small key ranges (``KOMPAKTOR_TEST_RANGE_ENTRIES``), and
once a merge has finished the share ``KOMPAKTOR_TEST_HOLD_AT`` (0..1) of its parts it creates
``<KOMPAKTOR_TEST_HELD>`` (holding ``parts_done parts``) and holds there, so that the test can
SIGKILL the process at a known point of the merge (the engine's read-ahead thread is merging the
next range meanwhile). Timing only: the merge, its parts and its progress records are real."""

from __future__ import annotations

import math
import os
import sys
import threading
from pathlib import Path
from typing import Any


class HoldingEngine:
    def __init__(self, inner: Any, hold_at: float, held: Path) -> None:
        self.inner, self.name = inner, inner.name
        self.hold_at, self.held = hold_at, held

    def merge(self, storage, req, *, progress=None, cancel=None):
        def on_progress(p: dict) -> None:
            if progress is not None:
                progress(p)
            if p["parts"] > 1 and p["parts_done"] >= math.ceil(self.hold_at * p["parts"]):
                tmp = self.held.with_suffix(".tmp")
                tmp.write_text(f"{p['parts_done']} {p['parts']}")
                tmp.rename(self.held)
                threading.Event().wait()  # until SIGKILL

        return self.inner.merge(storage, req, progress=on_progress, cancel=cancel)


def _main() -> None:
    from kompaktor import engines
    from kompaktor.cli import main
    from kompaktor.engines.arrow import ArrowMergeEngine

    hold_at = float(os.environ["KOMPAKTOR_TEST_HOLD_AT"])
    held = Path(os.environ["KOMPAKTOR_TEST_HELD"])
    range_entries = int(os.environ["KOMPAKTOR_TEST_RANGE_ENTRIES"])

    def make_engine(kind: str = "arrow", **kw: Any) -> HoldingEngine:
        if os.environ.get("KOMPAKTOR_TEST_ENGINE", "arrow") == "spark":
            from kompaktor.engines.spark import SparkMergeEngine

            conf = {"spark.default.parallelism": "2", "spark.ui.enabled": "false"}
            inner: Any = SparkMergeEngine("local[2]", conf, task_entries=range_entries, warm=False, resume_min_bytes=0)
        else:
            inner = ArrowMergeEngine(range_entries=range_entries, resume_min_bytes=0)
        return HoldingEngine(inner, hold_at, held)

    engines.make_engine = make_engine
    sys.argv[0] = "kompaktor"
    sys.exit(main())


if __name__ == "__main__":
    _main()
