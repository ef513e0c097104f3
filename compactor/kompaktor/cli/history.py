"""`kompaktor history`: the compactions that finished, newest first (failed ones only with --failed)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

import click

from kompaktor.cli.common import friendly_errors, open_client, redis_option, storage_option

if TYPE_CHECKING:
    from rich.table import Table

    from kompaktor.metadata.status import HistoryRow


@click.command()
@click.option("--table", "table_name", default=None, help="Only compactions of this table.")
@click.option("--group", "groups", multiple=True, help="Only this compactor group (repeatable; default: all).")
@click.option("--failed", is_flag=True, help="Only compactions that did not commit nor were cancelled.")
@click.option(
    "--since",
    default=None,
    help="Only those finished since: a duration back (90s, 15m, 2h, 7d) or an ISO time.",
)
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True, help="At most this many.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document: a list of records.")
@redis_option
@storage_option
@friendly_errors
def history(
    table_name: str | None,
    groups: tuple[str, ...],
    failed: bool,
    since: str | None,
    limit: int,
    as_json: bool,
    redis_url: str,
    storage_uri: str | None,
) -> None:
    """Every compaction that finished — committed, failed, dead-lettered, cancelled, retried (released
    without counting a failure) or killed (its compactor died) — with its inputs, output, durations
    and the reason it failed. Kept per group, bounded by count and age (the compactors' and the
    coordinator's --history-records and --history-age)."""
    from kompaktor.metadata import history as hist
    from kompaktor.metadata.status import history_row

    since_t = None if since is None else hist.parse_since(since)  # a bad value: one line, before Redis
    store = open_client(redis_url, storage_uri).store
    names = {t.id: t.name for t in store.tables.tables()}
    table_id = None
    if table_name is not None:
        ids = {n: i for i, n in names.items()}
        if table_name not in ids:
            raise ValueError(f"no table named {table_name!r}")
        table_id = ids[table_name]
    recs = hist.read(
        store, groups or hist.known_groups(store), since=since_t, table=table_id, failed=failed, limit=limit
    )
    rows = [history_row(r, names.get(r.table, r.table)) for r in recs]
    if as_json:
        click.echo(json.dumps(rows, sort_keys=True))
        return
    if not rows:
        click.echo("no compactions recorded" + (" that match" if (table_name or groups or failed or since) else ""))
        return
    from rich.console import Console

    Console().print(_table(rows))


def _table(rows: list[HistoryRow]) -> Table:
    from rich.table import Table

    from kompaktor.metadata.status import human_bytes

    t = Table(title="compaction history (newest first, times in UTC)")
    cols = (
        "finished",
        "outcome",
        "group",
        "table",
        "tablet",
        "kind",
        "compactor",
        "in",
        "out",
        "deletes dropped",
        "queued",
        "merge",
        "reason",
    )
    for col in cols:
        t.add_column(col)
    for r in rows:
        t.add_row(
            time.strftime("%m-%d %H:%M:%S", time.gmtime(r["finished"])),
            r["outcome"],
            r["group"],
            r["table"],
            r["tablet"],
            r["kind"],
            r["compactor"],
            f"{r['input_files']} files, {human_bytes(r['input_bytes'] or 0)}",
            "-" if r["output_bytes"] is None else human_bytes(r["output_bytes"]),
            "-" if r["deletes_dropped"] is None else f"{r['deletes_dropped']:,}",
            "-" if r["queued_s"] is None else f"{r['queued_s']:.1f}s",
            "-" if r["merge_s"] is None else f"{r['merge_s']:.1f}s",
            r["reason"],
        )
    return t
