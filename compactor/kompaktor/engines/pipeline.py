"""Key ranges run on several threads, read in order, finished in order (docs/architecture.md "How
fast the Arrow engine merges").

The inputs of a merge are read forward by one set of cursors (:class:`~kompaktor.engines.ranges.InputCursor`),
so ranges must be *read* one after the other; what follows — merging, applying the iterator
stack, encoding — is independent per range and runs in pyarrow's kernels and Parquet writer,
which release the GIL. :func:`run_ordered` gives each of ``workers`` threads a whole range: it
waits for its turn to read (range i after range i-1), reads, then merges and encodes while the
next thread reads; the caller gets the results in range order. At most ``workers`` ranges are in
flight (read and not yet handed back and consumed), which bounds memory: ``workers`` times what
one range holds.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Generator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from kompaktor.files.phases import phase

T = TypeVar("T")
R = TypeVar("R")

__all__ = ["run_ordered"]


class _Stopped(Exception):
    """A range's task gave up waiting for its turn: an earlier range failed or the run was closed."""


def run_ordered(
    n: int, read: Callable[[int], T], work: Callable[[int, T], R], workers: int, name: str = "ranges"
) -> Generator[R, None, None]:
    """``work(i, read(i))`` for i in 0..n-1 on ``workers`` threads, ``read`` called in order and
    never concurrently, results yielded in order. A range is started only when fewer than
    ``workers`` are in flight (a yielded result counts until the caller asks for the next one).
    The first failure (in range order) is raised; closing the generator stops the rest."""
    workers = max(1, min(workers, n))
    turn = 0
    failed = False
    cond = threading.Condition()

    def task(i: int) -> R:
        nonlocal turn, failed
        with cond:
            with phase("wait_turn"):
                while turn != i and not failed:
                    cond.wait()
            if failed:
                raise _Stopped
            try:
                data = read(i)
            except BaseException:
                failed = True
                cond.notify_all()
                raise
            turn += 1
            cond.notify_all()
        return work(i, data)

    pool = ThreadPoolExecutor(workers, thread_name_prefix=name)
    futs: deque[Future[R]] = deque()
    try:
        nxt = 0
        for _ in range(n):
            while nxt < n and len(futs) < workers:
                futs.append(pool.submit(task, nxt))
                nxt += 1
            yield futs.popleft().result()
    finally:
        with cond:
            failed = True
            cond.notify_all()
        pool.shutdown(wait=True, cancel_futures=True)
