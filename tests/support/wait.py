"""One poll with a deadline, for threads and subprocesses (:func:`poll`) and for asyncio
(:func:`apoll`): never a fixed sleep as synchronisation."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable, Generator
from typing import Any, TypeVar

T = TypeVar("T")


class PollTimeout(AssertionError, TimeoutError):
    """The condition did not hold before the deadline: a test failure (``AssertionError``) that
    code expecting a ``TimeoutError`` also catches."""


def _tries(
    check: Callable[[], T],
    what: str,
    timeout: float,
    ignore: type[BaseException] | tuple[type[BaseException], ...],
    alive: tuple[subprocess.Popen[Any], ...] = (),
) -> Generator[None, None, T]:
    """Call ``check`` once per step, yielding while it is falsy; return its value (the
    generator's ``StopIteration.value``), or raise :class:`PollTimeout` past the deadline."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            got = check()
            if got:
                return got
        except ignore as exc:
            last = exc
        for p in alive:
            assert p.poll() is None, f"{p.args!r} exited with {p.returncode} while waiting for {what}"
        if time.monotonic() > deadline:
            raise PollTimeout(f"timed out after {timeout:g}s waiting for {what}" + (f": {last!r}" if last else ""))
        yield


def poll(
    check: Callable[[], T],
    what: str,
    timeout: float = 60.0,
    every: float = 0.05,
    *,
    ignore: type[BaseException] | tuple[type[BaseException], ...] = (),
    alive: tuple[subprocess.Popen[Any], ...] = (),
) -> T:
    """Call ``check`` until it returns something truthy and return that; raise
    :class:`PollTimeout` naming ``what`` after ``timeout`` seconds. An exception in ``ignore``
    counts as "not yet" (the last one is in the failure); a process in ``alive`` that exits
    fails at once, naming its exit code."""
    tries = _tries(check, what, timeout, ignore, alive)
    while True:
        try:
            next(tries)
        except StopIteration as done:
            return done.value
        time.sleep(every)


async def apoll(
    check: Callable[[], T],
    what: str,
    timeout: float = 60.0,
    every: float = 0.05,
    *,
    ignore: type[BaseException] | tuple[type[BaseException], ...] = (),
) -> T:
    """:func:`poll` inside an event loop: sleeps with ``asyncio.sleep`` so the loop runs on."""
    tries = _tries(check, what, timeout, ignore)
    while True:
        try:
            next(tries)
        except StopIteration as done:
            return done.value
        await asyncio.sleep(every)
