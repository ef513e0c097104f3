"""`kompaktor backup create|list|verify|delete` and `kompaktor restore` (docs/backup.md)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import TYPE_CHECKING

import click

from kompaktor.cli.common import friendly_errors, open_client, redis_option, storage_option

if TYPE_CHECKING:
    from kompaktor.metadata.backup import Restored


@click.group()
def backup() -> None:
    """Backups of the metadata (tables, tablets and their files, user compactions, services and
    groups), written to the data storage under backups/."""


@backup.command("create")
@click.option("--keep", type=int, default=None, help="Then delete all but the newest KEEP backups.")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
@redis_option
@storage_option
@friendly_errors
def create(keep: int | None, as_json: bool, redis_url: str, storage_uri: str | None) -> None:
    """Take a backup now."""
    from kompaktor.metadata import backup as b

    if keep is not None and keep < 1:
        raise ValueError("--keep must be >= 1")
    c = open_client(redis_url, storage_uri)
    m = b.create(c.store, c.storage)
    pruned = b.prune(c.storage, keep) if keep is not None else []
    if as_json:
        click.echo(json.dumps(asdict(m)))
        return
    click.echo(
        f"backup {m.id}: {m.tables} tables, {m.tablets} tablets, {m.files} files referenced, "
        f"{m.bytes} bytes, taken in {m.took_s:.2f} s" + (f"; deleted {len(pruned)} older" if pruned else "")
    )


@backup.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@storage_option
@friendly_errors
def list_cmd(as_json: bool, storage_uri: str | None) -> None:
    """The complete backups, oldest first."""
    from kompaktor.files.storage import Storage
    from kompaktor.metadata import backup as b

    ms = b.list_backups(Storage.from_uri(storage_uri))
    if as_json:
        click.echo(json.dumps([asdict(m) for m in ms]))
        return
    if not ms:
        click.echo("no backups")
    for m in ms:
        click.echo(f"{m.id}  {m.tables} tables  {m.tablets} tablets  {m.files} files  {m.bytes} bytes")


@backup.command("verify")
@click.argument("backup_id")
@storage_option
@friendly_errors
def verify(backup_id: str, storage_uri: str | None) -> None:
    """Check a backup's (or `latest`'s) checksums and that every file it references exists (exit 1
    if not)."""
    from kompaktor.files.storage import Storage
    from kompaktor.metadata import backup as b

    storage = Storage.from_uri(storage_uri)
    v = b.verify(storage, b.resolve(storage, backup_id))
    if not v.ok:
        raise click.ClickException(
            f"backup {backup_id}: {len(v.missing)} referenced files are missing (first: {v.missing[0]})"
        )
    click.echo(f"backup {backup_id}: checksums match, all {v.manifest.files} files present")


@backup.command("delete")
@click.argument("backup_id")
@storage_option
@friendly_errors
def delete(backup_id: str, storage_uri: str | None) -> None:
    """Delete a backup (the files it alone kept become garbage)."""
    from kompaktor.files.storage import Storage
    from kompaktor.metadata import backup as b

    b.delete(Storage.from_uri(storage_uri), backup_id)
    click.echo(f"deleted backup {backup_id}")


@click.command()
@click.argument("backup_id")
@click.option(
    "--adopt-newer",
    is_flag=True,
    help="Also register again the flushes and imports written after the backup (docs/backup.md).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@redis_option
@storage_option
@friendly_errors
def restore(backup_id: str, adopt_newer: bool, as_json: bool, redis_url: str, storage_uri: str | None) -> None:
    """Restore BACKUP_ID (or `latest`) into an empty Redis; list what it cannot bring back."""
    from kompaktor.metadata import backup as b

    c = open_client(redis_url, storage_uri)
    r = b.restore(c.store, c.storage, backup_id, adopt_newer=adopt_newer)
    if as_json:
        click.echo(json.dumps(_outcome(r)))
        return
    click.echo(f"restored backup {r.manifest.id}: {r.tables} tables, {r.tablets} tablets, {r.files} files")
    if r.adopted:
        click.echo(f"adopted {len(r.adopted)} flushes and imports the restored view lacked (written after the backup)")
    if r.superseded:
        click.echo(
            f"{len(r.superseded)} more files in storage hold nothing the restored view lacks "
            "(inputs of compactions and their outputs); the garbage collector removes them"
        )
    if r.not_adopted:
        click.echo(f"not brought back: {len(r.not_adopted)} files:")
        for f, why in r.not_adopted.items():
            click.echo(f"  {f}: {why}")


def _outcome(r: Restored) -> dict[str, object]:
    """``restore --json``: the lists, and how many files each holds."""
    return {
        "backup": r.manifest.id,
        "tables": r.tables,
        "tablets": r.tablets,
        "files": r.files,
        "unreferenced": r.unreferenced,
        "adopted": r.adopted,
        "not_adopted": r.not_adopted,
        "counts": {
            "unreferenced": len(r.unreferenced),
            "adopted": len(r.adopted),
            "superseded": len(r.superseded),
            "not_brought_back": len(r.not_adopted),
        },
    }
