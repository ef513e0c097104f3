"""`kompaktor up` and `kompaktor demo`: the system on one machine. Each command only parses its
options into its settings; :mod:`kompaktor.local.assemble` runs them."""

from __future__ import annotations

import sys
from typing import IO, TYPE_CHECKING, Any

import click

from kompaktor.cli.common import friendly_errors, options
from kompaktor.local import UP_STATUS_PORT

if TYPE_CHECKING:
    from kompaktor.local.assemble import DemoSettings, UpSettings

#: where `up` and `demo` keep data files, when not under the data directory
_storage_option = click.option(
    "--storage",
    default=None,
    metavar="URI",
    help="Data files here instead of under the data directory: a pyarrow.fs URI such as s3://bucket/prefix "
    "(an empty prefix; credentials and AWS_ENDPOINT_URL from the environment).",
)

#: the options of `kompaktor up`, in the order --help lists them
UP_OPTIONS = (
    click.option(
        "--config",
        "config_path",
        type=click.File("r"),
        default=None,
        help="YAML with CompactionService and CompactorGroup documents (default: the demo's two groups).",
    ),
    click.option("--redis", "redis_url", default=None, help="Use this Redis instead of an embedded one."),
    click.option(
        "--data-dir",
        default=".kompaktor",
        show_default=True,
        help="Embedded Redis data (AOF), data files and process logs.",
    ),
    _storage_option,
    click.option(
        "--ha",
        is_flag=True,
        help="Embedded Redis as a primary, a replica and three sentinels (redis+sentinel:// URL): "
        "writes are acknowledged once on two nodes, and survive the loss of either.",
    ),
    click.option(
        "--status-port",
        type=click.IntRange(min=-1, max=65535),
        default=None,
        help=f"Port of 127.0.0.1 where the coordinator serves the status page (/status) and /metrics "
        f"(default: {UP_STATUS_PORT}, else any free port; 0: any free port; -1: none). The address is printed.",
    ),
)

#: the options of `kompaktor demo`, in the order --help lists them
DEMO_OPTIONS = (
    click.option(
        "--entries",
        type=int,
        default=150_000,
        show_default=True,
        help="Entries of steady ingest, spread evenly over --duration.",
    ),
    click.option("--tablets", type=int, default=4, show_default=True, help="Tablets of the demo table."),
    click.option("--compactors", type=int, default=None, help="Most compactor processes per group."),
    click.option("--duration", type=float, default=45.0, show_default=True, help="Seconds of steady ingest."),
    click.option("--batch", type=int, default=1500, show_default=True, help="Entries per flush."),
    click.option(
        "--burst-entries",
        type=int,
        default=50_000,
        show_default=True,
        help="After the steady ingest, bulk-import this many more entries at once (0: no burst).",
    ),
    click.option(
        "--burst-files",
        type=int,
        default=40,
        show_default=True,
        help="Files of the burst import, each spanning every tablet.",
    ),
    click.option("--config", "config_path", type=click.File("r"), default=None, help="Local YAML (as for `up`)."),
    click.option(
        "--data-dir",
        default=None,
        help="Keep data here (default: a temporary directory, removed at the end unless verification fails).",
    ),
    _storage_option,
    click.option(
        "--chaos",
        is_flag=True,
        help="Inject faults on a fixed-seed schedule: SIGKILL and SIGTERM busy compactors, restart the "
        "coordinator, SIGKILL the Redis primary mid-ingest and mid-commit (Sentinel promotes the "
        "replica); then check that nothing acknowledged was lost, applied twice or left behind.",
    ),
    click.option("--seed", type=int, default=7, show_default=True, help="Seed of the chaos schedule."),
    click.option(
        "--ha/--single-redis",
        "ha",
        default=None,
        help="Redis as a primary, a replica and three sentinels (default with --chaos, whose Redis faults "
        "are then SIGKILLs of the primary mid-ingest and mid-commit), or one redis-server (default "
        "without --chaos; with --chaos it is restarted once).",
    ),
    click.option(
        "--workload",
        type=click.Choice(["plain", "mix"]),
        default="plain",
        show_default=True,
        help="plain: the continuous ingest; mix: beside it deletes of existing keys, imports older than "
        "earlier deletes (with and without --set-time), overlapping imports, splits, merges and user "
        "compactions, verified against a reference view.",
    ),
    click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON."),
    click.option(
        "--status-port",
        type=click.IntRange(min=-1, max=65535),
        default=0,
        help="Port of 127.0.0.1 where the coordinator serves the status page while the demo runs "
        "(default: a free port, printed at start; -1: none).",
    ),
)


@click.command()
@options(*UP_OPTIONS)
@friendly_errors
def up(**params: Any) -> None:
    """Run Redis, the coordinator and autoscaled compactors locally until Ctrl-C."""
    from kompaktor.local.assemble import run_up

    sys.exit(run_up(up_settings(**params), _say))


def up_settings(
    config_path: IO[str] | None,
    redis_url: str | None,
    data_dir: str,
    storage: str | None,
    ha: bool,
    status_port: int | None,
) -> UpSettings:
    """The options of `kompaktor up` (click's parameters) as its settings."""
    from kompaktor.local.assemble import UpSettings

    config = {} if config_path is None else {"config_text": config_path.read()}
    return UpSettings(redis_url=redis_url, data_dir=data_dir, storage=storage, ha=ha, status_port=status_port, **config)


@click.command()
@options(*DEMO_OPTIONS)
@friendly_errors
def demo(**params: Any) -> None:
    """Continuous ingest, then a burst of imported files, while autoscaled compactors keep files per
    tablet down; then verify that nothing was lost. Exit 0 only when verified. Ctrl-C, SIGTERM and
    a hang-up stop every process the demo started and remove its temporary directory."""
    from kompaktor.local.assemble import run_local_demo

    sys.exit(run_local_demo(demo_settings(**params), _say))


def demo_settings(
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
) -> DemoSettings:
    """The options of `kompaktor demo` (click's parameters) as its settings: Redis HA by default
    with --chaos, no status page for port -1."""
    from kompaktor.local.assemble import DemoSettings

    config = {} if config_path is None else {"config_text": config_path.read()}
    return DemoSettings(
        entries=entries,
        tablets=tablets,
        compactors=compactors,
        duration_s=duration,
        batch=batch,
        burst_entries=burst_entries,
        burst_files=burst_files,
        data_dir=data_dir,
        storage=storage,
        chaos=chaos,
        chaos_seed=seed,
        ha=chaos if ha is None else ha,
        workload=workload,
        as_json=as_json,
        status_port=None if status_port < 0 else status_port,
        **config,
    )


def _say(line: str, to_stderr: bool) -> None:
    click.echo(line, err=to_stderr)
