"""`kompaktor status`: one screen for an operator (`--json` for scripts)."""

from __future__ import annotations

import json

import click

from kompaktor.cli.common import friendly_errors, open_client, redis_option, storage_option


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@redis_option
@storage_option
@friendly_errors
def status(as_json: bool, redis_url: str, storage_uri: str | None) -> None:
    """Per group: queued, running, compactors alive, dead compactions recovered, oldest queued job
    age. Per table: tablets and files per tablet. User compactions and their progress. Running
    resumable merges (from 1 GiB of input by default): parts done, reused and rejected, input
    bytes not read again and re-read (shown, and in --json, only while one runs)."""
    from kompaktor.metadata.status import gather, render

    st = gather(open_client(redis_url, storage_uri).store)
    if as_json:
        click.echo(json.dumps(st, sort_keys=True))
        return
    from rich.console import Console

    Console().print(render(st))
