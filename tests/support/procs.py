"""Process trees, on psutil: what a test started and must see stopped, and the environment a
child Python needs to import what the test imports."""

from __future__ import annotations

import os
import signal
import sys
import time

import psutil

#: a process by its PID *and* start time (a PID alone may be reused once the process is gone)
Key = tuple[int, float]


def _running(p: psutil.Process) -> bool:
    try:
        return p.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False


def descendants(pid: int) -> list[int]:
    """The PIDs of every living descendant of ``pid`` (children before grandchildren); empty
    when ``pid`` is gone. Zombies do not count."""
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [p.pid for p in kids if _running(p)]


def tree(pid: int) -> dict[Key, str]:
    """Every living descendant of ``pid``: (PID, start time) -> its command line."""
    out: dict[Key, str] = {}
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return out
    for p in kids:
        try:
            if _running(p):
                out[(p.pid, p.create_time())] = " ".join(p.cmdline())
        except psutil.Error:
            continue
    return out


def alive(procs: dict[Key, str]) -> dict[Key, str]:
    """Those of ``procs`` still running (the same PID *and* start time, not a zombie)."""
    out = {}
    for key, cmd in procs.items():
        try:
            p = psutil.Process(key[0])
            if p.create_time() == key[1] and _running(p):
                out[key] = cmd
        except psutil.Error:
            continue
    return out


def kill(procs: dict[Key, str]) -> None:
    """SIGKILL those of ``procs`` still running (by PID, start time checked)."""
    for pid, _start in alive(procs):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_gone(pid: int, timeout: float = 30.0) -> None:
    """Until ``pid`` is gone or a zombie (an orphan init has still to reap), at most ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if not _running(psutil.Process(pid)):
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.05)


def python_env(**extra: str) -> dict[str, str]:
    """This environment, with ``PYTHONPATH`` set to this interpreter's ``sys.path`` (so a child
    ``python`` imports ``kompaktor`` and ``tests`` from where the test does) and ``extra`` added."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), **extra}
