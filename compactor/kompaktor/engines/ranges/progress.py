"""What every engine does around the ranges: open a merge (refuse one cancelled before it started,
read the inputs' footers) and report its progress.

Part of :mod:`kompaktor.engines.ranges`; imports only :mod:`.inputs`.
"""

from __future__ import annotations

import threading
import time
from typing import Unpack

from kompaktor.engines.api import MergeCancelled, MergeProgress, MergeRequest, ResumeFigures
from kompaktor.engines.ranges.inputs import InputMeta, inspect_inputs
from kompaktor.files.storage import Storage


def open_merge(
    storage: Storage, req: MergeRequest, cancel: threading.Event | None
) -> tuple[float, list[InputMeta], int]:
    """What every engine does first: refuse a request cancelled before it started, read the
    inputs' footers. Returns the start time, the inputs' metadata and their total bytes."""
    started = time.monotonic()
    if cancel is not None and cancel.is_set():
        raise MergeCancelled(f"merge into {req.output} cancelled before it started")
    metas = inspect_inputs(storage, req.inputs)
    return started, metas, sum(m.size for m in metas)


def progress_dict(
    entries_read: int,
    entries_written: int,
    bytes_read: int,
    bytes_written: int,
    parts_done: int,
    parts: int,
    started: float,
    **resume: Unpack[ResumeFigures],
) -> MergeProgress:
    """A merge's progress report; a resumable merge adds its :class:`ResumeFigures`."""
    return {
        "entries_read": entries_read,
        "entries_written": entries_written,
        "bytes_read": bytes_read,
        "bytes_written": bytes_written,
        "parts_done": parts_done,
        "parts": parts,
        "elapsed_s": round(time.monotonic() - started, 3),
        **resume,
    }
