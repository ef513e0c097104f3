"""Child processes of local mode that never outlive it.

Every child (the embedded redis-server, the coordinator, compactors) is started

* in its own session and process group, so a terminal's Ctrl-C or hang-up reaches only this
  process, which then stops the children in order (compactors drain first), and so the group —
  a compactor with its Spark JVM — can be swept with one signal once the compactor is gone;
* with a parent-death signal (Linux ``prctl(PR_SET_PDEATHSIG, SIGKILL)``, set between fork and
  exec): if this process dies without cleaning up, SIGKILLed included, the kernel kills every
  child. A compactor's Spark JVM is a grandchild; it exits when the compactor's end of its stdin
  pipe closes (pyspark's gateway watches it), and Spark's Python daemon exits with the JVM.

The kernel sends the parent-death signal when the *thread* that forked the child ends, not the
process. Children are therefore all forked by one spawner thread that lives as long as the
process: a child started by a short-lived thread (the autoscaler's, the chaos schedule's) would
otherwise be killed the moment that thread finished.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

PR_SET_PDEATHSIG = 1

_prctl: Callable[..., int] | None = None
if sys.platform.startswith("linux"):
    try:
        _prctl = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).prctl
        _prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
        _prctl.restype = ctypes.c_int
    except (OSError, AttributeError):  # no libc prctl: children still get their own process group
        _prctl = None


def _die_with(parent: int, sig: int) -> Callable[[], None]:
    """A ``preexec_fn``: ask for ``sig`` when the forking thread ends; if the parent is already
    gone (it died between fork and here), die at once."""

    def preexec() -> None:
        if _prctl is not None:
            _prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


#: what the spawner thread runs, and where the child goes
_Request = tuple[Callable[[], "subprocess.Popen[Any]"], "Future[subprocess.Popen[Any]]"]


class _Spawner:
    """The one thread that forks every child (see the module docstring)."""

    def __init__(self) -> None:
        self.requests: queue.SimpleQueue[_Request] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="kompaktor-spawner", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            start, fut = self.requests.get()
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(start())
            except BaseException as exc:  # handed to the caller
                fut.set_exception(exc)

    def submit(self, start: Callable[[], subprocess.Popen[Any]]) -> subprocess.Popen[Any]:
        fut: Future[subprocess.Popen[Any]] = Future()
        self.requests.put((start, fut))
        return fut.result()


_spawner: _Spawner | None = None
_spawner_lock = threading.Lock()


def spawn(args: list[str], *, deathsig: int = signal.SIGKILL, **popen_kwargs: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(args, ...)`` for a child that dies with this process: own session and
    process group, parent-death signal ``deathsig``."""
    global _spawner
    with _spawner_lock:
        if _spawner is None or not _spawner.thread.is_alive():
            _spawner = _Spawner()
        sp = _spawner
    parent = os.getpid()
    popen_kwargs.setdefault("start_new_session", True)
    return sp.submit(lambda: subprocess.Popen(args, preexec_fn=_die_with(parent, deathsig), **popen_kwargs))


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    """Signal a child's process group (what is left of it: e.g. a Spark JVM after its compactor
    exited). A group that no longer exists is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_popen(p: subprocess.Popen[Any], timeout: float, sig: int = signal.SIGTERM) -> int:
    """Signal ``p``, wait up to ``timeout`` seconds, then SIGKILL it; sweep its process group
    either way. Returns its exit status."""
    if p.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(sig)
        try:
            p.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    kill_group(p.pid)
    return p.returncode


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP arrived: stop every child, clean up, exit ``128 + signum``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def interruptible(on_second: Callable[[], None] | None = None) -> Iterator[list[int]]:
    """Within the block the first of SIGINT, SIGTERM or SIGHUP raises :class:`Interrupted` in the
    main thread, so ``finally`` blocks stop the children in order. A hang-up also points stdout
    and stderr at /dev/null (the terminal is gone; writing to it would fail the clean-up). A later
    signal does not interrupt the clean-up; it calls ``on_second`` (e.g. to kill the children at
    once instead of draining them). Yields the list of signals received."""
    received: list[int] = []

    def handler(signum: int, _frame: Any) -> None:
        received.append(signum)
        if signum == signal.SIGHUP:
            with contextlib.suppress(OSError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 1)
                os.dup2(devnull, 2)
                os.close(devnull)
        if len(received) == 1:
            raise Interrupted(signum)
        if on_second is not None:
            on_second()

    if threading.current_thread() is not threading.main_thread():
        yield received  # signal handlers can only be set from the main thread
        return
    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield received
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
