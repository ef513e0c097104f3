"""`kompaktor merge`: run one merge by hand on local files, with the compactor's engines."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator

import click

from kompaktor.cli.common import friendly_errors, options
from kompaktor.model.engines import ENGINES
from kompaktor.policy.services import DEFAULT_ENGINE, DEFAULT_SPARK_MASTER


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


#: the arguments and options of `kompaktor merge`, in the order --help lists them
OPTIONS = (
    click.argument("inputs", nargs=-1, required=True, type=click.Path(dir_okay=False)),
    click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Output Parquet file."),
    click.option(
        "--full/--partial",
        default=True,
        show_default=True,
        help="Full: drop delete markers. Partial: keep the newest marker of each key (inputs are a "
        "subset of a tablet's files).",
    ),
    click.option(
        "--max-versions", type=click.IntRange(min=1), default=1, show_default=True, help="Newest versions kept per key."
    ),
    click.option(
        "--ageoff-ttl-ms",
        type=click.IntRange(min=0),
        default=None,
        help="Age-off filter: drop puts older than now minus this many milliseconds.",
    ),
    click.option("--row-regex", default=None, help="Row filter: drop puts whose row matches this regex."),
    click.option("--engine", type=click.Choice(ENGINES), default=DEFAULT_ENGINE, show_default=True),
    click.option(
        "--spark-master", default=DEFAULT_SPARK_MASTER, show_default=True, help="Spark master for --engine spark."
    ),
    click.option("--overwrite", is_flag=True, help="Replace OUTPUT if it exists."),
)


@click.command()
@options(*OPTIONS)
@friendly_errors
def merge(
    inputs: tuple[str, ...],
    output: str,
    full: bool,
    max_versions: int,
    ageoff_ttl_ms: int | None,
    row_regex: str | None,
    engine: str,
    spark_master: str,
    overwrite: bool,
) -> None:
    """Merge sorted Parquet INPUTS (oldest first) into one sorted file OUTPUT, applying
    versioning, deletes and filters exactly as a compaction does."""
    from kompaktor.engines import make_engine
    from kompaktor.engines.api import MergeRequest
    from kompaktor.files.storage import Storage
    from kompaktor.model.iterators import IteratorSettings

    paths, out = _checked_paths(inputs, output, overwrite)
    root = os.path.commonpath([os.path.dirname(p) for p in [*paths, out]])
    rel = [os.path.relpath(p, root) for p in paths]
    settings = IteratorSettings(
        max_versions=max_versions,
        full=full,
        ageoff_ttl_ms=ageoff_ttl_ms,
        now_ms=int(time.time() * 1000),
        row_regex=row_regex,
    )
    req = MergeRequest(
        inputs=tuple(rel),
        output=os.path.relpath(out, root),
        prev=None,
        end=None,
        settings=settings,
        tmp_tag=f"merge-{uuid.uuid4().hex[:12]}",
    )
    t0 = time.perf_counter()
    eng = make_engine(engine, spark_master=spark_master)
    startup = time.perf_counter() - t0
    if os.path.exists(out):
        os.remove(out)
    t1 = time.perf_counter()
    with _named_as_given(rel, paths):
        res = eng.merge(Storage.from_uri(root), req)
    secs = max(time.perf_counter() - t1, 1e-9)
    click.echo(
        f"merged {len(paths)} files ({res.entries_read:,} entries, {_mb(res.bytes_read)}) into {output} "
        f"({res.entries_written:,} entries, {_mb(res.bytes_written)}) with the {engine} engine"
    )
    click.echo(
        f"{secs:.2f}s: {res.entries_read / secs:,.0f} entries/s read, "
        f"{res.bytes_read / 1e6 / secs:.1f} MB/s read"
        + (f"; engine start-up {startup:.2f}s" if engine == "spark" else "")
    )


def _checked_paths(inputs: tuple[str, ...], output: str, overwrite: bool) -> tuple[list[str], str]:
    """The inputs and the output as absolute paths: every input a file, the output none of them
    and absent unless ``overwrite``."""
    from kompaktor.model.errors import BadFileError

    paths = [os.path.abspath(p) for p in inputs]
    out = os.path.abspath(output)
    for p in paths:
        if not os.path.isfile(p):
            raise BadFileError(f"{p}: input file not found")
    if out in paths:
        raise click.UsageError("the output must not be one of the inputs")
    if os.path.exists(out) and not overwrite:
        raise click.UsageError(f"{out} exists (use --overwrite to replace it)")
    return paths, out


@contextlib.contextmanager
def _named_as_given(rel: list[str], paths: list[str]) -> Iterator[None]:
    """A bad input file named as the user gave it, not relative to the merge's storage root."""
    from kompaktor.model.errors import BadFileError

    try:
        yield
    except BadFileError as exc:
        msg = str(exc)
        for r, a in zip(rel, paths, strict=True):
            if msg.startswith(f"{r}:"):
                msg = a + msg[len(r) :]
                break
        raise BadFileError(msg) from exc
