"""`kompaktor import` and `kompaktor scan`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from kompaktor.cli.common import friendly_errors, open_client, parse_row, redis_option, storage_option
from kompaktor.model.errors import KompaktorError
from kompaktor.model.keys import check_row_range

if TYPE_CHECKING:
    from collections.abc import Callable

    import pyarrow as pa


def _check_output(output: str) -> None:
    """``scan -o``: a file name in an existing directory; never a directory, never replaced by one."""
    import os

    if output.endswith(os.sep) or os.path.isdir(output):
        raise KompaktorError(f"-o {output}: is a directory; give the name of a Parquet file to write")
    parent = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(parent):
        raise KompaktorError(f"-o {output}: {parent} is not an existing directory")


def _show(b: bytes) -> str:
    return b.decode("utf-8", "backslashreplace")


@click.command("import")
@click.argument("name")
@click.argument("files", nargs=-1, required=True)
@click.option(
    "--set-time",
    is_flag=True,
    help="Give every entry the import's time (Accumulo's tableTime): never refused for being older "
    "than deletes a full compaction dropped; each key keeps the file's own newest view.",
)
@redis_option
@storage_option
@friendly_errors
def import_files(name: str, files: tuple[str, ...], set_time: bool, redis_url: str, storage_uri: str | None) -> None:
    """Bulk-import sorted Parquet FILES into table NAME. Any refused file changes nothing."""
    c = open_client(redis_url, storage_uri)
    paths = c.import_files(name, list(files), set_time=set_time)
    click.echo(f"imported {len(paths)} files into {name}")


@click.command()
@click.argument("name")
@click.option("--start", default=None, help="First row (inclusive, UTF-8).")
@click.option("--end", default=None, help="Last row (inclusive, UTF-8).")
@click.option("-o", "--output", default=None, help="Write the merged view to this Parquet file (file schema).")
@redis_option
@storage_option
@friendly_errors
def scan(
    name: str, start: str | None, end: str | None, output: str | None, redis_url: str, storage_uri: str | None
) -> None:
    """Print (or write with -o) the merged view of table NAME: newest versions, deletes applied."""
    check_row_range(parse_row(start), parse_row(end), "row range to scan")
    if output:
        _check_output(output)
    c = open_client(redis_url, storage_uri)
    if output:
        _write_scan(lambda: c.read_arrow(name, parse_row(start), parse_row(end)), output)
        return
    entries = c.scan(name, parse_row(start), parse_row(end))
    for e in entries:
        click.echo(f"{_show(e.row)} {_show(e.cf)}:{_show(e.cq)} [{_show(e.vis)}] {e.ts}\t{_show(e.value)}")


def _write_scan(open_reader: Callable[[], pa.RecordBatchReader], output: str) -> None:
    """``scan -o``: the merged view's Arrow batches into one sorted file (already in key order).
    The output is opened before the read pins anything: an output that cannot be written is one
    line with nothing changed in Redis."""
    import os

    import pyarrow as pa

    from kompaktor.files.sortedfile import SortedFileWriter
    from kompaktor.files.storage import Storage

    local = Storage.from_uri(os.path.dirname(os.path.abspath(output)))
    try:
        w = SortedFileWriter(local, os.path.basename(output))
        try:
            for batch in open_reader():
                w.write_table(pa.Table.from_batches([batch]), checked=True)
            info = w.commit()
        except BaseException:
            try:
                w.abort()
            except OSError:
                pass  # the error that made us abort is the one to report
            raise
    except OSError as exc:
        raise KompaktorError(f"-o {output}: cannot write: {getattr(exc, 'strerror', None) or exc}") from exc
    click.echo(f"wrote {info.entries} entries to {output}")
