"""`kompaktor compact`: start, watch or cancel a USER compaction."""

from __future__ import annotations

import json
from typing import Any

import click

from kompaktor.cli.common import friendly_errors, open_client, parse_row, redis_option, storage_option


@click.command()
@click.argument("name", required=False)
@click.option("--start", default=None, help="First row of the range (UTF-8).")
@click.option("--end", default=None, help="Last row of the range (UTF-8).")
@click.option("--ageoff-ttl", type=int, default=None, help="Drop entries older than this many milliseconds.")
@click.option("--row-regex", default=None, help="Delete entries whose row matches this regex.")
@click.option("--delete-rows-from", default=None, help="Delete rows in [FROM, TO) (UTF-8).")
@click.option("--delete-rows-to", default=None)
@click.option("--cancel", "cancel_id", default=None, help="Cancel the user compaction with this id.")
@click.option("--status", "status_id", default=None, help="Show the progress of this user compaction.")
@click.option("--wait", "wait_s", type=float, default=None, help="Wait up to this many seconds for it to end.")
@redis_option
@storage_option
@friendly_errors
def compact(
    name: str | None,
    start: str | None,
    end: str | None,
    ageoff_ttl: int | None,
    row_regex: str | None,
    delete_rows_from: str | None,
    delete_rows_to: str | None,
    cancel_id: str | None,
    status_id: str | None,
    wait_s: float | None,
    redis_url: str,
    storage_uri: str | None,
) -> None:
    """Compact table NAME (or a row range) into one file per tablet, with optional iterators."""
    from kompaktor.metadata import user_compactions as uc

    store = open_client(redis_url, storage_uri).store
    if cancel_id:
        uc.cancel(store, cancel_id)
        click.echo(json.dumps(uc.get(store, cancel_id).to_json()))
        return
    if status_id:
        cid = status_id
    else:
        if not name:
            raise ValueError("give a table NAME, or --cancel ID / --status ID")
        its: dict[str, Any] = {"ageoff_ttl_ms": ageoff_ttl, "row_regex": row_regex}
        if delete_rows_from is not None or delete_rows_to is not None:
            its["row_start"] = None if delete_rows_from is None else delete_rows_from.encode().hex()
            its["row_end"] = None if delete_rows_to is None else delete_rows_to.encode().hex()
        cid = uc.start(store, name, parse_row(start), parse_row(end), its)
    if wait_s is not None:
        result = uc.wait(store, cid, wait_s)
        click.echo(json.dumps(result.to_json()))
        if result.state != uc.SUCCEEDED:
            raise SystemExit(1)
        return
    click.echo(json.dumps(uc.get(store, cid).to_json()))
