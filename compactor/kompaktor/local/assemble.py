"""`kompaktor up` and `kompaktor demo` put together: the composition root of each local process.

The click commands (:mod:`kompaktor.cli.local`) only parse their options into :class:`UpSettings`
or :class:`DemoSettings` and call :func:`run_up` or :func:`run_local_demo`, which own everything
else: the checks before anything starts (each refused in one line), the local cluster or the demo
run, what is printed, how a signal stops it, and the exit status. What they print goes through
``say(line, to_stderr)``, as the coordinator's root does (:mod:`kompaktor.coordinator.assemble`).
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kompaktor.local import UP_STATUS_PORT
from kompaktor.local.cluster import LocalCluster
from kompaktor.local.config import DEMO_CONFIG, load_config
from kompaktor.local.procs import Interrupted, interruptible

if TYPE_CHECKING:
    from kompaktor.local.demo import DemoOptions

#: prints one line, on stderr when the second argument is true
Say = Callable[[str, bool], None]


@dataclass(frozen=True)
class UpSettings:
    """What `kompaktor up` is told."""

    config_text: str = DEMO_CONFIG  # CompactionService and CompactorGroup documents
    redis_url: str | None = None  # None: an embedded Redis
    data_dir: str = ".kompaktor"
    storage: str | None = None  # data files here instead of under data_dir
    ha: bool = False
    #: the status page's port of 127.0.0.1 (None: UP_STATUS_PORT if free, else any; 0: any; -1: none)
    status_port: int | None = None


@dataclass(frozen=True)
class DemoSettings:
    """What `kompaktor demo` is told (:class:`kompaktor.local.demo.DemoOptions` holds the run's)."""

    entries: int = 150_000
    tablets: int = 4
    compactors: int | None = None
    duration_s: float = 45.0
    batch: int = 1500
    burst_entries: int = 50_000
    burst_files: int = 40
    config_text: str = DEMO_CONFIG
    data_dir: str | None = None  # None: a temporary directory
    storage: str | None = None
    chaos: bool = False
    chaos_seed: int = 7
    ha: bool = False
    workload: str = "plain"
    as_json: bool = False  # the summary as JSON on stdout, alone
    status_port: int | None = 0  # None: no status page


def run_up(settings: UpSettings, say: Say) -> int:
    """Run Redis, the coordinator and autoscaled compactors until a signal; the exit status.
    Ctrl-C, SIGTERM and a hang-up stop everything the same way: drain the compactors, stop the
    coordinator and Redis; a second signal kills them at once."""
    cfg = load_config(settings.config_text)
    check_storage(settings.storage, empty=False)  # its own data is checked once Redis is up (the installation)
    status_port = up_status_port(settings.status_port)
    cluster = LocalCluster(
        cfg,
        Path(settings.data_dir),
        redis_url=settings.redis_url,
        ha=settings.ha,
        storage=settings.storage,
        status_port=None if status_port < 0 else status_port,
    )
    with interruptible(on_second=cluster.kill) as received:
        try:
            _serve_up(cluster, say)
        except Interrupted as sig:
            # Ctrl-C and SIGTERM are the way to stop `up`: exit 0; a hang-up is not
            return sig.exit_code if received[0] == signal.SIGHUP else 0
    return 0


def up_status_port(asked: int | None) -> int:
    """The status page's port: ``UP_STATUS_PORT`` when free and none was asked (else any free
    one, 0); a port asked for that is taken is refused in one line before anything starts."""
    if asked is None:
        return UP_STATUS_PORT if port_free(UP_STATUS_PORT) else 0
    if asked > 0 and not port_free(asked):
        raise ValueError(f"--status-port {asked}: in use; give another port, 0 (any) or -1 (none)")
    return asked


def _serve_up(cluster: LocalCluster, say: Say) -> None:
    """Start the cluster, say where it is, autoscale until interrupted; stop it however that ends."""
    started = False
    try:
        cluster.start()
        started = True
        from kompaktor.model.redact import redact_url

        say(
            f"kompaktor is up: KOMPAKTOR_REDIS_URL={redact_url(cluster.url)} KOMPAKTOR_STORAGE={cluster.storage_uri}",
            False,
        )
        if cluster.status_url:
            say(f"status page: {cluster.status_url}", False)
        say("Ctrl-C stops everything cleanly (compactors drain first).", False)
        while True:
            time.sleep(1.0)
            cluster.autoscale()
    finally:
        if started:  # a refusal at start is its one line alone
            with contextlib.suppress(OSError):
                say("stopping: draining compactors…", False)
        try:
            cluster.stop()
        except BaseException:
            cluster.kill()
            raise


def run_local_demo(settings: DemoSettings, say: Say) -> int:
    """Check the demo's sizes and storage, run it (:func:`kompaktor.local.demo.run_demo`), print
    its summary; the exit status: 0 only when verified, a signal's when interrupted (every process
    stopped, the temporary directory removed)."""
    from kompaktor.local.demo import print_summary, run_demo

    check_demo_sizes(settings)
    check_storage(settings.storage)
    t0 = time.monotonic()
    try:
        res = run_demo(demo_options(settings, say))
    except Interrupted as sig:
        with contextlib.suppress(OSError):
            kept = "" if settings.data_dir else ", temporary data removed"
            say(f"stopped by {sig}: every process stopped{kept}", True)
        return sig.exit_code
    if settings.as_json:
        say(json.dumps(res.summary), False)
    else:
        print_summary(res)
        say(f"done in {time.monotonic() - t0:.0f}s: verified = {res.summary['verified']}", False)
    if res.data_kept and not settings.data_dir:
        say(f"verification failed: data and process logs kept in {res.data_kept}", True)
    return 0 if res.verified else 1


def demo_options(s: DemoSettings, say: Say) -> DemoOptions:
    """The demo run's options: the settings, live progress on a terminal (never with JSON), and
    the status page's address said once it is up (on stderr with JSON: stdout is the summary alone)."""
    from kompaktor.local.demo import DemoOptions

    return DemoOptions(
        storage=s.storage,
        entries=s.entries,
        tablets=s.tablets,
        compactors=s.compactors,
        duration_s=s.duration_s,
        batch=s.batch,
        burst_entries=s.burst_entries,
        burst_files=s.burst_files,
        data_dir=s.data_dir,
        live=not s.as_json and sys.stdout.isatty(),
        config_text=s.config_text,
        chaos=s.chaos,
        chaos_seed=s.chaos_seed,
        ha=s.ha,
        workload=s.workload,
        status_port=s.status_port,
        on_status_page=lambda url: say(f"status page (while the demo runs): {url}", s.as_json),
    )


def check_demo_sizes(s: DemoSettings) -> None:
    """The demo's sizes, each refused in one line when it cannot be run."""
    if s.entries < 1 or s.tablets < 1 or s.duration_s <= 0 or s.batch < 1:
        raise ValueError("--entries, --tablets, --batch must be >= 1 and --duration > 0")
    if s.burst_entries < 0 or s.burst_files < 1:
        raise ValueError("--burst-entries must be >= 0 and --burst-files >= 1")
    if s.compactors is not None and s.compactors < 1:
        raise ValueError("--compactors must be >= 1")


def port_free(port: int) -> bool:
    """Whether ``port`` of 127.0.0.1 is free now: a status port already taken is one line before
    anything starts (else the coordinator would fail to start alone, after Redis and the compactors)."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def check_storage(uri: str | None, *, empty: bool = True) -> None:
    """A storage URI the filesystem layer cannot open is one line before anything starts; so is
    one that already holds tables, with ``empty`` (a demo verifies every file under ``tables/``;
    ``up`` restarts on its own data, and refuses another installation's once Redis is up)."""
    if uri is None:
        return
    from kompaktor.files.storage import Storage
    from kompaktor.model.errors import StorageError
    from kompaktor.model.names import TABLES_DIR

    try:
        storage = Storage.from_uri(uri)
        present = storage.list_files(TABLES_DIR)
    except (OSError, ValueError) as exc:
        raise StorageError(f"storage {uri}: {' '.join(str(exc).split())}") from None
    if present and empty:
        raise StorageError(
            f"storage {uri}: already holds {len(present)} file(s) under {TABLES_DIR}/; give an empty prefix"
        )
    storage.check_writable()
