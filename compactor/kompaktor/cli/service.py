"""`kompaktor service`: apply CompactionService / CompactorGroup documents without a cluster."""

from __future__ import annotations

from typing import IO

import click

from kompaktor.cli.common import friendly_errors, open_client, redis_option, storage_option


@click.group()
def service() -> None:
    """Store compaction services and compactor groups where the coordinator reads them."""


@service.command("apply")
@click.argument("path", type=click.File("r"))
@redis_option
@storage_option
@friendly_errors
def apply(path: IO[str], redis_url: str, storage_uri: str | None) -> None:
    """Validate and store the CompactionService and CompactorGroup documents of a YAML file."""
    from kompaktor.local.config import load_config

    cfg = load_config(path.read())
    store = open_client(redis_url, storage_uri).store
    for g in cfg.groups.values():
        store.fleet.put_group(g)
    for s in cfg.services.values():
        store.fleet.put_service(s)
    click.echo(f"applied {len(cfg.services)} services and {len(cfg.groups)} groups")


@service.command("list")
@redis_option
@storage_option
@friendly_errors
def list_services(redis_url: str, storage_uri: str | None) -> None:
    """Show the stored services and groups."""
    store = open_client(redis_url, storage_uri).store
    for s in store.fleet.services().values():
        tiers = ", ".join(f"{t.name}<{t.max_size or '∞'}→{t.group}" for t in s.tiers)
        click.echo(f"service {s.name}: ratio {s.ratio}, maxOpen {s.max_open}, tables {list(s.tables)}; {tiers}")
    for g in store.fleet.groups().values():
        click.echo(
            f"group {g.name}: replicas {g.min_replicas}..{g.max_replicas}, "
            f"{g.jobs_per_replica} jobs/replica, engine {g.engine}"
        )
