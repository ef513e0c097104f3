"""`kompaktor up` and `kompaktor demo`: the system on one machine."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time

import click

from kompaktor.cli.common import friendly_errors


@click.command()
@click.option("--config", "config_path", type=click.File("r"), default=None,
              help="YAML with CompactionService and CompactorGroup documents (default: the demo's two groups).")
@click.option("--redis", "redis_url", default=None, help="Use this Redis instead of an embedded one.")
@click.option("--data-dir", default=".kompaktor", show_default=True,
              help="Embedded Redis data (AOF), data files and process logs.")
@friendly_errors
def up(config_path, redis_url: str | None, data_dir: str) -> None:
    """Run Redis, the coordinator and autoscaled compactors locally until Ctrl-C."""
    from kompaktor.local.cluster import LocalCluster
    from kompaktor.local.config import DEMO_CONFIG, load_config

    cfg = load_config(config_path.read() if config_path else DEMO_CONFIG)
    stop = threading.Event()
    # Ctrl-C (SIGINT) and SIGTERM only ask to stop; the loop below then drains and exits 0.
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    cluster = LocalCluster(cfg, data_dir, redis_url=redis_url)
    try:
        cluster.start()
        from kompaktor.model.redact import redact_url

        click.echo(f"kompaktor is up: KOMPAKTOR_REDIS_URL={redact_url(cluster.url)} "
                   f"KOMPAKTOR_STORAGE={cluster.storage_uri}")
        click.echo("Ctrl-C stops everything cleanly (compactors drain first).")
        while not stop.wait(1.0):
            cluster.autoscale()
    finally:
        click.echo("stopping: draining compactors…")
        cluster.stop()


@click.command()
@click.option("--entries", type=int, default=200_000, show_default=True,
              help="Entries to ingest, spread evenly over --duration.")
@click.option("--tablets", type=int, default=4, show_default=True, help="Tablets of the demo table.")
@click.option("--compactors", type=int, default=None, help="Most compactor processes per group.")
@click.option("--duration", type=float, default=60.0, show_default=True, help="Seconds of ingest.")
@click.option("--batch", type=int, default=1500, show_default=True, help="Entries per flush.")
@click.option("--config", "config_path", type=click.File("r"), default=None, help="Local YAML (as for `up`).")
@click.option("--data-dir", default=None, help="Keep data here (default: a temporary directory).")
@click.option("--chaos", is_flag=True,
              help="Inject faults on a fixed-seed schedule: SIGKILL and SIGTERM busy compactors, restart the "
                   "coordinator, restart Redis once; then check that nothing was lost or left behind.")
@click.option("--seed", type=int, default=7, show_default=True, help="Seed of the chaos schedule.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@friendly_errors
def demo(entries: int, tablets: int, compactors: int | None, duration: float, batch: int, config_path,
         data_dir: str | None, chaos: bool, seed: int, as_json: bool) -> None:
    """Continuous ingest while autoscaled compactors keep files per tablet down; then verify that
    nothing was lost. Exit 0 only when verified."""
    from kompaktor.local.config import DEMO_CONFIG
    from kompaktor.local.demo import DemoOptions, print_summary, run_demo

    if entries < 1 or tablets < 1 or duration <= 0 or batch < 1:
        raise ValueError("--entries, --tablets, --batch must be >= 1 and --duration > 0")
    t0 = time.monotonic()
    res = run_demo(DemoOptions(entries=entries, tablets=tablets, compactors=compactors, duration_s=duration,
                               batch=batch, data_dir=data_dir, live=not as_json and sys.stdout.isatty(),
                               config_text=config_path.read() if config_path else DEMO_CONFIG,
                               chaos=chaos, chaos_seed=seed))
    if as_json:
        click.echo(json.dumps(res.summary))
    else:
        print_summary(res)
        click.echo(f"done in {time.monotonic() - t0:.0f}s: verified = {res.summary['verified']}")
    sys.exit(0 if res.verified else 1)
