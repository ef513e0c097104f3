"""Options and error handling shared by every subcommand."""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import click

from kompaktor.files.storage import default_storage_uri
from kompaktor.metadata.store import DEFAULT_REDIS_URL
from kompaktor.model.errors import KompaktorError
from kompaktor.model.redact import redact_text

if TYPE_CHECKING:
    from kompaktor.client import Client

#: a command function, as click's decorators take and give it back
F = TypeVar("F", bound=Callable[..., Any])
P = ParamSpec("P")
R = TypeVar("R")


def redis_option(fn: F) -> F:
    return click.option(
        "--redis",
        "redis_url",
        envvar="KOMPAKTOR_REDIS_URL",
        default=DEFAULT_REDIS_URL,
        show_default=True,
        help="Redis URL of the metadata store (env KOMPAKTOR_REDIS_URL).",
    )(fn)


def storage_option(fn: F) -> F:
    return click.option(
        "--storage",
        "storage_uri",
        envvar="KOMPAKTOR_STORAGE",
        default=None,
        help=f"Where data files live: a directory, s3://… or hdfs://… "
        f"(env KOMPAKTOR_STORAGE; default {default_storage_uri()}).",
    )(fn)


def options(*decorators: Callable[[F], F]) -> Callable[[F], F]:
    """Click option decorators as one, in the order ``--help`` lists them (the first given is the
    first listed, as if written one above the other): a command keeps its options in a tuple
    beside it, and its function holds only the parsing."""

    def apply(fn: F) -> F:
        for decorate in reversed(decorators):
            fn = decorate(fn)
        return fn

    return apply


_UNSET = ", for a group without configuration in Redis (a CompactorGroup's spec.history applies to its group)."


def history_options(group: bool = False) -> Callable[[F], F]:
    """``--history-records`` and ``--history-age``: how much of each group's compaction history a
    process that writes it keeps (:class:`kompaktor.metadata.history.HistoryLimits`). ``group``:
    the process serves one group, whose configuration (the CompactorGroup's ``spec.history``)
    gives the bounds; the options, when given, override it (None when not given). Otherwise (the
    coordinator) they bound the groups that have no configuration; a configured group's apply."""
    from kompaktor.metadata.history import DEFAULT_MAX_AGE_S, DEFAULT_MAX_RECORDS

    def add(fn: F) -> F:
        fn = click.option(
            "--history-records",
            type=click.IntRange(min=1),
            envvar="KOMPAKTOR_HISTORY_RECORDS",
            default=None if group else DEFAULT_MAX_RECORDS,
            show_default=not group,
            help="Records of finished compactions kept per group, about (env KOMPAKTOR_HISTORY_RECORDS)"
            + (f"; overrides the group's (default: the group's, else {DEFAULT_MAX_RECORDS})." if group else _UNSET),
        )(fn)
        return click.option(
            "--history-age",
            type=click.FloatRange(min=0, min_open=True),
            envvar="KOMPAKTOR_HISTORY_AGE",
            default=None if group else DEFAULT_MAX_AGE_S,
            show_default=not group,
            help="Seconds a record of a finished compaction is kept, about (env KOMPAKTOR_HISTORY_AGE)"
            + (f"; overrides the group's (default: the group's, else {DEFAULT_MAX_AGE_S:g})." if group else _UNSET),
        )(fn)

    return add


#: exceptions that mean "the input or the environment is wrong", not "Kompaktor is broken": one
#: line ``error: …`` and exit status 1. Redis errors reach the CLI as StoreUnavailable (a
#: KompaktorError); file system errors (missing, read-only, not a directory, a directory where a
#: file goes) are OSError, pyarrow's included; bad values are ValueError.
USER_ERRORS: tuple[type[BaseException], ...] = (KompaktorError, ValueError, OSError)

#: exit status of an unexpected internal error (sysexits' EX_SOFTWARE)
INTERNAL_ERROR = 70


def debug_enabled() -> bool:
    """``kompaktor --debug …`` (or KOMPAKTOR_DEBUG=1): let tracebacks through."""
    ctx = click.get_current_context(silent=True)
    root = ctx.find_root() if ctx is not None else None
    if root is not None and root.params.get("debug"):
        return True
    return os.environ.get("KOMPAKTOR_DEBUG", "") not in ("", "0")


def report_error(exc: BaseException) -> int:
    """Print one line for ``exc`` on stderr (secrets redacted) and return the exit status."""
    if isinstance(exc, USER_ERRORS):
        text = str(exc) or type(exc).__name__
        if isinstance(exc, OSError) and exc.filename is not None and str(exc.filename) not in text:
            text = f"{exc.filename}: {text}"
        click.echo(f"error: {redact_text(text)}", err=True)
        return 1
    detail = redact_text(f"{type(exc).__name__}: {exc}".splitlines()[0])
    click.echo(f"error: internal error ({detail}); run `kompaktor --debug …` for the traceback", err=True)
    return INTERNAL_ERROR


def friendly_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """The CLI's top-level rule (applied to every command by the click group, and by this
    decorator to each subcommand): no traceback reaches the user. An input or environment
    problem is one line ``error: …`` and exit status 1; anything else is one line saying it is an
    internal error, pointing at ``--debug`` (which shows the traceback), exit status 70. Click's
    own exits and usage errors pass through."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except (click.exceptions.Exit, click.ClickException, click.Abort, KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:
            if debug_enabled():
                raise
            sys.exit(report_error(exc))

    return wrapper


class RedactingFormatter(logging.Formatter):
    """Log lines (message and traceback) with every URL's credentials replaced by ``***``."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record))


def setup_logging() -> None:
    """Logging of the long-running commands (coordinator, compactor): stderr, level from
    KOMPAKTOR_LOG, every line redacted."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(RedactingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=os.environ.get("KOMPAKTOR_LOG", "INFO"), handlers=[handler])


def open_client(redis_url: str, storage_uri: str | None) -> Client:
    from kompaktor.client import Client
    from kompaktor.files.storage import Storage
    from kompaktor.metadata.format import open_checked
    from kompaktor.metadata.store import MetadataStore

    store = MetadataStore.from_url(redis_url)
    store.ping()
    open_checked(store, "kompaktor command")
    return Client(store, Storage.from_uri(storage_uri))


def parse_row(text: str | None) -> bytes | None:
    return None if text is None else text.encode("utf-8")
