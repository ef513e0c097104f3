"""`kompaktor coordinator`: the (leader-elected) coordinator process."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from kompaktor.cli.common import (
    friendly_errors,
    history_options,
    options,
    redis_option,
    setup_logging,
    storage_option,
)

if TYPE_CHECKING:
    from kompaktor.coordinator.assemble import CoordinatorOptions


#: the options of `kompaktor coordinator`, in the order --help lists them
OPTIONS = (
    click.option(
        "--metrics-port",
        type=int,
        default=9090,
        show_default=True,
        help="Port for /metrics (queue depth per group: the autoscaling signal) and /status (the status "
        "page); 0: any free port, -1: off.",
    ),
    click.option(
        "--metrics-host",
        default="0.0.0.0",
        show_default=True,
        envvar="KOMPAKTOR_METRICS_HOST",
        help="Address /metrics and /status listen on (env KOMPAKTOR_METRICS_HOST).",
    ),
    click.option(
        "--full-scan-interval",
        type=float,
        default=30.0,
        show_default=True,
        help="Seconds between full scans of all tablets.",
    ),
    click.option(
        "--dead-after",
        type=float,
        default=30.0,
        show_default=True,
        help="Seconds without a heartbeat after which a compaction is dead.",
    ),
    click.option(
        "--gc-grace",
        type=float,
        default=300.0,
        show_default=True,
        help="Seconds an unreferenced file is kept before garbage collection.",
    ),
    click.option("--gc-interval", type=float, default=60.0, show_default=True),
    click.option(
        "--lease",
        "lease_s",
        type=click.FloatRange(min=0.5),
        default=10.0,
        show_default=True,
        help="Seconds of the leader's lease; a stopped leader is replaced this long after its last renewal.",
    ),
    click.option(
        "--plan-workers",
        type=click.IntRange(min=0, max=64),
        default=None,
        help="Worker processes that plan shares of a full pass over 50,000 tablets or more "
        "(default: one per core beyond the first, at most 3; 0: plan in one thread).",
    ),
    click.option(
        "--backup-interval",
        type=click.FloatRange(min=0),
        default=0.0,
        show_default=True,
        help="Seconds between backups of the metadata to storage under backups/ (0: none; docs/backup.md).",
    ),
    click.option(
        "--bootstrap-from",
        default=None,
        envvar="KOMPAKTOR_BOOTSTRAP_FROM",
        help="At start, restore this backup (an id, or `latest`) if Redis holds no tables and was never "
        "restored: a new install starting from a backup (docs/backup.md).",
    ),
    click.option("--backup-keep", type=click.IntRange(min=1), default=7, show_default=True, help="Backups retained."),
    click.option(
        "--backup-max-age",
        type=click.FloatRange(min=0),
        default=None,
        help="Seconds after which a backup is deleted (the newest is always kept).",
    ),
    history_options(),
    redis_option,
    storage_option,
)


@click.command()
@options(*OPTIONS)
@friendly_errors
def coordinator(**params: Any) -> None:
    """Plan tablets into group queues, run user compactions, detect dead compactions, collect
    garbage. Several may run; one leads (Redis lease), the others wait."""
    from kompaktor.coordinator.assemble import run_coordinator

    setup_logging()
    run_coordinator(coordinator_options(**params), lambda line: click.echo(line, err=True))


def coordinator_options(
    metrics_port: int,
    metrics_host: str,
    full_scan_interval: float,
    dead_after: float,
    gc_grace: float,
    gc_interval: float,
    lease_s: float,
    plan_workers: int | None,
    backup_interval: float,
    backup_keep: int,
    backup_max_age: float | None,
    bootstrap_from: str | None,
    history_records: int,
    history_age: float,
    redis_url: str,
    storage_uri: str | None,
) -> CoordinatorOptions:
    """The options of `kompaktor coordinator` (click's parameters) as the process's settings."""
    from kompaktor.coordinator.assemble import CoordinatorOptions
    from kompaktor.coordinator.core import CoordinatorSettings
    from kompaktor.metadata.history import HistoryLimits

    settings = CoordinatorSettings(
        full_scan_s=full_scan_interval,
        dead_after_s=dead_after,
        gc_grace_s=gc_grace,
        gc_interval_s=gc_interval,
        lease_ms=int(lease_s * 1000),
        backup_interval_s=backup_interval,
        backup_keep=backup_keep,
        backup_max_age_s=backup_max_age,
        history_limits=HistoryLimits(history_records, history_age),
        **({} if plan_workers is None else {"plan_workers": plan_workers}),
    )
    return CoordinatorOptions(redis_url, storage_uri, settings, metrics_port, metrics_host, bootstrap_from)
