"""Options and error handling shared by every subcommand."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import click

from kompaktor.files.storage import default_storage_uri
from kompaktor.metadata.store import DEFAULT_REDIS_URL
from kompaktor.model.errors import KompaktorError


def redis_option(fn: Callable) -> Callable:
    return click.option("--redis", "redis_url", envvar="KOMPAKTOR_REDIS_URL", default=DEFAULT_REDIS_URL,
                        show_default=True, help="Redis URL of the metadata store (env KOMPAKTOR_REDIS_URL).")(fn)


def storage_option(fn: Callable) -> Callable:
    return click.option("--storage", "storage_uri", envvar="KOMPAKTOR_STORAGE", default=None,
                        help=f"Where data files live: a directory, s3://… or hdfs://… "
                             f"(env KOMPAKTOR_STORAGE; default {default_storage_uri()}).")(fn)


def friendly_errors(fn: Callable) -> Callable:
    """Turn Kompaktor and value errors into one line on stderr and exit status 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (KompaktorError, ValueError) as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)

    return wrapper


def open_client(redis_url: str, storage_uri: str | None):
    from kompaktor.client import Client
    from kompaktor.files.storage import Storage
    from kompaktor.metadata.store import MetadataStore

    store = MetadataStore.from_url(redis_url)
    store.ping()
    return Client(store, Storage.from_uri(storage_uri))


def parse_row(text: str | None) -> bytes | None:
    return None if text is None else text.encode("utf-8")
