"""`kompaktor table create|config|offline|online|delete|list|split|merge`."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import IO

import click

from kompaktor.cli.common import friendly_errors, open_client, redis_option, storage_option


@click.group()
def table() -> None:
    """Create tables, set their properties, take them offline/online, delete them."""


@table.command("create")
@click.argument("name")
@click.option("--splits", default=None, help="Comma-separated UTF-8 split rows.")
@click.option(
    "--splits-file", type=click.File("rb"), default=None, help="One split row per line, hex-encoded (arbitrary bytes)."
)
@redis_option
@storage_option
@friendly_errors
def create(
    name: str, splits: str | None, splits_file: IO[bytes] | None, redis_url: str, storage_uri: str | None
) -> None:
    """Create table NAME, split into tablets at the given rows."""
    rows: list[bytes] = []
    if splits:
        rows += [s.encode("utf-8") for s in splits.split(",") if s != ""]
    if splits_file is not None:
        for n, line in enumerate(splits_file.read().splitlines(), 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(bytes.fromhex(line.decode("ascii")))
            except ValueError:
                raise ValueError(f"--splits-file line {n}: not hex: {line[:40]!r}") from None
    c = open_client(redis_url, storage_uri)
    tid = c.store.tables.create_table(name, rows)
    click.echo(f"created table {name} (id {tid}) with {len(set(rows)) + 1} tablets")


@table.command("config")
@click.argument("name")
@click.argument("settings", nargs=-1)
@redis_option
@storage_option
@friendly_errors
def config(name: str, settings: tuple[str, ...], redis_url: str, storage_uri: str | None) -> None:
    """Show table NAME's properties, or set KEY=VALUE ones (KEY= removes a property)."""
    c = open_client(redis_url, storage_uri)
    if settings:
        props: dict[str, str | None] = {}
        for s in settings:
            if "=" not in s:
                raise ValueError(f"expected KEY=VALUE, got {s!r}")
            k, v = s.split("=", 1)
            if not k:
                raise ValueError(f"empty property name in {s!r}")
            props[k] = v if v != "" else None
        from kompaktor.policy.tableprops import check_dispatch, dispatch_services, validate_props

        validate_props(props)
        c.store.tables.table_id(name)  # an unknown table is the first thing to hear about
        if dispatch_services(props):
            check_dispatch(props, c.store.fleet.services())
        c.store.tables.set_props(name, props)
    for k, v in sorted(c.store.tables.table(name).props.items()):
        click.echo(f"{k}={v}")


def _state_command(state: str, help_text: str) -> Callable[[str, str, str | None], None]:
    @click.argument("name")
    @redis_option
    @storage_option
    @friendly_errors
    def cmd(name: str, redis_url: str, storage_uri: str | None) -> None:
        open_client(redis_url, storage_uri).store.tables.set_state(name, state)
        click.echo(f"table {name} is {state}")

    cmd.__doc__ = help_text
    return cmd


table.command("offline")(_state_command("OFFLINE", "Take table NAME offline (no compactions commit)."))
table.command("online")(_state_command("ONLINE", "Bring table NAME online."))


@table.command("delete")
@click.argument("name")
@redis_option
@storage_option
@friendly_errors
def delete(name: str, redis_url: str, storage_uri: str | None) -> None:
    """Delete table NAME; its files are garbage-collected."""
    files = open_client(redis_url, storage_uri).store.tables.delete_table(name)
    click.echo(f"deleted table {name} ({len(files)} files left for garbage collection)")


@table.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@redis_option
@storage_option
@friendly_errors
def list_tables(as_json: bool, redis_url: str, storage_uri: str | None) -> None:
    """List tables with their state and tablet count."""
    store = open_client(redis_url, storage_uri).store
    rows = [
        {"name": t.name, "id": t.id, "state": t.state, "tablets": len(store.tables.tablet_ids(t.id))}
        for t in store.tables.tables()
    ]
    if as_json:
        click.echo(json.dumps(rows))
    else:
        for r in rows:
            click.echo(f"{r['name']}\t{r['id']}\t{r['state']}\t{r['tablets']} tablets")


def _rows(values: tuple[str, ...] | list[str], as_hex: bool, what: str = "row") -> list[bytes]:
    out = []
    for v in values:
        if as_hex:
            try:
                out.append(bytes.fromhex(v))
            except ValueError:
                raise ValueError(f"{what} {v!r} is not hex") from None
        else:
            out.append(v.encode("utf-8"))
    return out


@table.command("split")
@click.argument("name")
@click.argument("rows", nargs=-1, required=True)
@click.option("--hex", "as_hex", is_flag=True, help="Rows are hex-encoded bytes instead of UTF-8.")
@redis_option
@storage_option
@friendly_errors
def split(name: str, rows: tuple[str, ...], as_hex: bool, redis_url: str, storage_uri: str | None) -> None:
    """Add split points ROWS to table NAME (refused while an affected tablet has running
    compactions; files are shared, not rewritten)."""
    from kompaktor.metadata import tablet_ops as tabletops

    store = open_client(redis_url, storage_uri).store
    changed = tabletops.split(store, name, _rows(rows, as_hex))
    total = len(store.tables.tablet_ids(store.tables.table_id(name)))
    click.echo(f"split table {name}: {len(changed)} tablets created or changed, {total} tablets")


@table.command("merge")
@click.argument("name")
@click.option("--start", default=None, help="Merge tablets from the one holding this row (default: first).")
@click.option("--end", default=None, help="Merge tablets up to the one holding this row (default: last).")
@click.option("--hex", "as_hex", is_flag=True, help="--start/--end are hex-encoded bytes instead of UTF-8.")
@redis_option
@storage_option
@friendly_errors
def merge(name: str, start: str | None, end: str | None, as_hex: bool, redis_url: str, storage_uri: str | None) -> None:
    """Merge the tablets of table NAME overlapping rows [START, END] into one (refused while one
    of them has running compactions)."""
    from kompaktor.metadata import tablet_ops as tabletops

    lo = None if start is None else _rows([start], as_hex, "--start")[0]
    hi = None if end is None else _rows([end], as_hex, "--end")[0]
    store = open_client(redis_url, storage_uri).store
    merged = tabletops.merge(store, name, lo, hi)
    total = len(store.tables.tablet_ids(store.tables.table_id(name)))
    if merged is None:
        click.echo(f"nothing to merge in table {name}: fewer than two tablets in the range ({total} tablets)")
    else:
        click.echo(f"merged tablets of table {name} into {merged}, {total} tablets")
