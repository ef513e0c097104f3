"""`kompaktor up` and `kompaktor demo`: the system on one machine."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import time
from pathlib import Path
from typing import IO

import click

from kompaktor.cli.common import friendly_errors

#: where `up` and `demo` keep data files, when not under the data directory
_storage_option = click.option(
    "--storage",
    default=None,
    metavar="URI",
    help="Data files here instead of under the data directory: a pyarrow.fs URI such as s3://bucket/prefix "
    "(an empty prefix; credentials and AWS_ENDPOINT_URL from the environment).",
)


#: where `kompaktor up` serves the status page when the port is free
UP_STATUS_PORT = 8090


@click.command()
@click.option(
    "--config",
    "config_path",
    type=click.File("r"),
    default=None,
    help="YAML with CompactionService and CompactorGroup documents (default: the demo's two groups).",
)
@click.option("--redis", "redis_url", default=None, help="Use this Redis instead of an embedded one.")
@click.option(
    "--data-dir",
    default=".kompaktor",
    show_default=True,
    help="Embedded Redis data (AOF), data files and process logs.",
)
@_storage_option
@click.option(
    "--ha",
    is_flag=True,
    help="Embedded Redis as a primary, a replica and three sentinels (redis+sentinel:// URL): "
    "writes are acknowledged once on two nodes, and survive the loss of either.",
)
@click.option(
    "--status-port",
    type=click.IntRange(min=-1, max=65535),
    default=None,
    help=f"Port of 127.0.0.1 where the coordinator serves the status page (/status) and /metrics "
    f"(default: {UP_STATUS_PORT}, else any free port; 0: any free port; -1: none). The address is printed.",
)
@friendly_errors
def up(
    config_path: IO[str] | None,
    redis_url: str | None,
    data_dir: str,
    storage: str | None,
    ha: bool,
    status_port: int | None,
) -> None:
    """Run Redis, the coordinator and autoscaled compactors locally until Ctrl-C."""
    from kompaktor.local.cluster import LocalCluster
    from kompaktor.local.config import DEMO_CONFIG, load_config
    from kompaktor.local.procs import Interrupted, interruptible

    cfg = load_config(config_path.read() if config_path else DEMO_CONFIG)
    _check_storage(storage, empty=False)  # its own data is checked once Redis is up (the installation)
    if status_port is None:
        status_port = UP_STATUS_PORT if _port_free(UP_STATUS_PORT) else 0
    elif status_port > 0 and not _port_free(status_port):
        raise ValueError(f"--status-port {status_port}: in use; give another port, 0 (any) or -1 (none)")
    cluster = LocalCluster(
        cfg,
        Path(data_dir),
        redis_url=redis_url,
        ha=ha,
        storage=storage,
        status_port=None if status_port < 0 else status_port,
    )
    # Ctrl-C, SIGTERM and a hang-up (the terminal closed) stop everything the same way: drain the
    # compactors, stop the coordinator and Redis; a second signal kills them at once
    with interruptible(on_second=cluster.kill) as received:
        started = False
        try:
            try:
                cluster.start()
                started = True
                from kompaktor.model.redact import redact_url

                click.echo(
                    f"kompaktor is up: KOMPAKTOR_REDIS_URL={redact_url(cluster.url)} "
                    f"KOMPAKTOR_STORAGE={cluster.storage_uri}"
                )
                if cluster.status_url:
                    click.echo(f"status page: {cluster.status_url}")
                click.echo("Ctrl-C stops everything cleanly (compactors drain first).")
                while True:
                    time.sleep(1.0)
                    cluster.autoscale()
            finally:
                if started:  # a refusal at start is its one line alone
                    with contextlib.suppress(OSError):
                        click.echo("stopping: draining compactors…")
                try:
                    cluster.stop()
                except BaseException:
                    cluster.kill()
                    raise
        except Interrupted as sig:
            # Ctrl-C and SIGTERM are the way to stop `up`: exit 0; a hang-up is not
            sys.exit(sig.exit_code if received[0] == signal.SIGHUP else 0)


@click.command()
@click.option(
    "--entries",
    type=int,
    default=150_000,
    show_default=True,
    help="Entries of steady ingest, spread evenly over --duration.",
)
@click.option("--tablets", type=int, default=4, show_default=True, help="Tablets of the demo table.")
@click.option("--compactors", type=int, default=None, help="Most compactor processes per group.")
@click.option("--duration", type=float, default=45.0, show_default=True, help="Seconds of steady ingest.")
@click.option("--batch", type=int, default=1500, show_default=True, help="Entries per flush.")
@click.option(
    "--burst-entries",
    type=int,
    default=50_000,
    show_default=True,
    help="After the steady ingest, bulk-import this many more entries at once (0: no burst).",
)
@click.option(
    "--burst-files",
    type=int,
    default=40,
    show_default=True,
    help="Files of the burst import, each spanning every tablet.",
)
@click.option("--config", "config_path", type=click.File("r"), default=None, help="Local YAML (as for `up`).")
@click.option(
    "--data-dir",
    default=None,
    help="Keep data here (default: a temporary directory, removed at the end unless verification fails).",
)
@_storage_option
@click.option(
    "--chaos",
    is_flag=True,
    help="Inject faults on a fixed-seed schedule: SIGKILL and SIGTERM busy compactors, restart the "
    "coordinator, SIGKILL the Redis primary mid-ingest and mid-commit (Sentinel promotes the "
    "replica); then check that nothing acknowledged was lost, applied twice or left behind.",
)
@click.option("--seed", type=int, default=7, show_default=True, help="Seed of the chaos schedule.")
@click.option(
    "--ha/--single-redis",
    "ha",
    default=None,
    help="Redis as a primary, a replica and three sentinels (default with --chaos, whose Redis faults "
    "are then SIGKILLs of the primary mid-ingest and mid-commit), or one redis-server (default "
    "without --chaos; with --chaos it is restarted once).",
)
@click.option(
    "--workload",
    type=click.Choice(["plain", "mix"]),
    default="plain",
    show_default=True,
    help="plain: the continuous ingest; mix: beside it deletes of existing keys, imports older than "
    "earlier deletes (with and without --set-time), overlapping imports, splits, merges and user "
    "compactions, verified against a reference view.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option(
    "--status-port",
    type=click.IntRange(min=-1, max=65535),
    default=0,
    help="Port of 127.0.0.1 where the coordinator serves the status page while the demo runs "
    "(default: a free port, printed at start; -1: none).",
)
@friendly_errors
def demo(
    entries: int,
    tablets: int,
    compactors: int | None,
    duration: float,
    batch: int,
    burst_entries: int,
    burst_files: int,
    config_path: IO[str] | None,
    data_dir: str | None,
    storage: str | None,
    chaos: bool,
    seed: int,
    ha: bool | None,
    workload: str,
    as_json: bool,
    status_port: int,
) -> None:
    """Continuous ingest, then a burst of imported files, while autoscaled compactors keep files per
    tablet down; then verify that nothing was lost. Exit 0 only when verified. Ctrl-C, SIGTERM and
    a hang-up stop every process the demo started and remove its temporary directory."""
    from kompaktor.local.config import DEMO_CONFIG
    from kompaktor.local.demo import DemoOptions, print_summary, run_demo
    from kompaktor.local.procs import Interrupted

    if entries < 1 or tablets < 1 or duration <= 0 or batch < 1:
        raise ValueError("--entries, --tablets, --batch must be >= 1 and --duration > 0")
    if burst_entries < 0 or burst_files < 1:
        raise ValueError("--burst-entries must be >= 0 and --burst-files >= 1")
    if compactors is not None and compactors < 1:
        raise ValueError("--compactors must be >= 1")
    _check_storage(storage)
    t0 = time.monotonic()
    opts = DemoOptions(
        storage=storage,
        entries=entries,
        tablets=tablets,
        compactors=compactors,
        duration_s=duration,
        batch=batch,
        burst_entries=burst_entries,
        burst_files=burst_files,
        data_dir=data_dir,
        live=not as_json and sys.stdout.isatty(),
        config_text=config_path.read() if config_path else DEMO_CONFIG,
        chaos=chaos,
        chaos_seed=seed,
        ha=chaos if ha is None else ha,
        workload=workload,
        status_port=None if status_port < 0 else status_port,
        # on stderr with --json: stdout is the summary alone
        on_status_page=lambda url: click.echo(f"status page (while the demo runs): {url}", err=as_json),
    )
    try:
        res = run_demo(opts)
    except Interrupted as sig:
        with contextlib.suppress(OSError):
            click.echo(
                f"stopped by {sig}: every process stopped" + ("" if data_dir else ", temporary data removed"), err=True
            )
        sys.exit(sig.exit_code)
    if as_json:
        click.echo(json.dumps(res.summary))
    else:
        print_summary(res)
        click.echo(f"done in {time.monotonic() - t0:.0f}s: verified = {res.summary['verified']}")
    if res.data_kept and not data_dir:
        click.echo(f"verification failed: data and process logs kept in {res.data_kept}", err=True)
    sys.exit(0 if res.verified else 1)


def _port_free(port: int) -> bool:
    """Whether ``port`` of 127.0.0.1 is free now: a status port already taken is one line before
    anything starts (else the coordinator would fail to start alone, after Redis and the compactors)."""
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _check_storage(uri: str | None, *, empty: bool = True) -> None:
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
