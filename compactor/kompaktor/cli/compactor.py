"""`kompaktor compactor --group G`: one compactor process (one per pod)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

import click

from kompaktor.cli.common import (
    friendly_errors,
    history_options,
    options,
    redis_option,
    setup_logging,
    storage_option,
)
from kompaktor.model.engines import ENGINES
from kompaktor.policy.services import DEFAULT_DRAIN_GRACE_S, DEFAULT_ENGINE, DEFAULT_SPARK_MASTER

if TYPE_CHECKING:
    from kompaktor.worker.assemble import CompactorOptions


#: the options of `kompaktor compactor`, in the order --help lists them; each is a field of
#: :class:`kompaktor.worker.assemble.CompactorOptions`, by the same name
OPTIONS = (
    click.option("--group", required=True, help="Compactor group whose queue this compactor serves."),
    click.option(
        "--id",
        "compactor_id",
        envvar="POD_NAME",
        default=None,
        help="Compactor id (env POD_NAME; default host name and pid).",
    ),
    click.option(
        "--engine",
        type=click.Choice(ENGINES),
        default=None,
        help=f"Merge engine; overrides the group's (default: the group's, else {DEFAULT_ENGINE}).",
    ),
    click.option(
        "--spark-master",
        default=None,
        help=f"spark.master; overrides the group's (default: the group's, else {DEFAULT_SPARK_MASTER}).",
    ),
    click.option(
        "--spark-conf", multiple=True, help="Extra Spark configuration KEY=VALUE, over the group's (repeatable)."
    ),
    click.option("--driver-memory", default=None, help="spark.driver.memory; overrides the group's."),
    click.option(
        "--drain-grace",
        type=float,
        default=None,
        help=f"Seconds a drain may wait for the current job; overrides the group's (default: the group's, "
        f"else {DEFAULT_DRAIN_GRACE_S}).",
    ),
    click.option(
        "--http-port",
        type=int,
        default=8080,
        show_default=True,
        help="Port for /healthz, /readyz, /drain and /metrics (0: any free port, -1: off).",
    ),
    click.option(
        "--http-host",
        envvar="KOMPAKTOR_HTTP_HOST",
        default="0.0.0.0",
        show_default=True,
        help="Address the HTTP endpoints listen on (env KOMPAKTOR_HTTP_HOST).",
    ),
    click.option(
        "--drain-token-file",
        envvar="KOMPAKTOR_DRAIN_TOKEN_FILE",
        default=None,
        help="File holding the token that authorizes POST /drain from elsewhere than loopback "
        "(env KOMPAKTOR_DRAIN_TOKEN_FILE; or the token itself in env KOMPAKTOR_DRAIN_TOKEN). "
        "Without one, only the pod itself (127.0.0.1) may drain it over HTTP.",
    ),
    click.option(
        "--settings-digest",
        envvar="KOMPAKTOR_SETTINGS_DIGEST",
        default=None,
        hidden=True,
        help="Digest of the group settings the pod was made for (set by the operator): without a "
        "configuration of the group in Redis the compactor does not start.",
    ),
    click.option(
        "--stay-drained",
        is_flag=True,
        envvar="KOMPAKTOR_STAY_DRAINED",
        help="Once drained, stay up and take no job until SIGTERM, and keep the drain mark in Redis "
        "when exiting, so that a restarted process with the same --id takes no job either (what a "
        "compactor pod runs: the kubelet restarts a container that exits before its pod is deleted).",
    ),
    click.option(
        "--broker",
        is_flag=True,
        envvar="KOMPAKTOR_BROKER",
        help="Ask the coordinator to make this compactor's writes (reserve, heartbeat, commit, release): "
        "what a compactor pod runs, with a Redis user that may only read and ask (docs/security.md). "
        "Without it the compactor writes with its own Redis user's rights.",
    ),
    click.option("--max-jobs", type=int, default=None, hidden=True),
    history_options(group=True),
    redis_option,
    storage_option,
)


@click.command()
@options(*OPTIONS)
@friendly_errors
def compactor(**params: Any) -> None:
    """Run one compactor: reserve a job of GROUP, merge it, commit, repeat; drain on SIGTERM.

    The group's settings (engine, Spark master and conf, driver memory, drain grace, resume) come from its
    configuration in Redis, which the operator (or `kompaktor up`) writes from the CompactorGroup;
    the options below override them for a compactor run by hand."""
    from kompaktor.worker.assemble import run_compactor

    setup_logging()
    sys.exit(run_compactor(compactor_options(**params)))


def compactor_options(**params: Any) -> CompactorOptions:
    """The options of `kompaktor compactor` (click's parameters) as the process's settings: each
    option is the field of the same name."""
    from kompaktor.worker.assemble import CompactorOptions

    return CompactorOptions(**params)


@click.command()
@click.option("--port", type=int, default=8080, show_default=True, help="The compactor's HTTP port.")
@click.option(
    "--host",
    envvar="KOMPAKTOR_HTTP_HOST",
    default="127.0.0.1",
    show_default=True,
    help="The compactor's address (env KOMPAKTOR_HTTP_HOST).",
)
@click.option(
    "--token-file",
    envvar="KOMPAKTOR_DRAIN_TOKEN_FILE",
    default=None,
    help="Send the drain token in this file (env KOMPAKTOR_DRAIN_TOKEN_FILE, or the token in "
    "env KOMPAKTOR_DRAIN_TOKEN); needed unless the compactor is reached at 127.0.0.1.",
)
@friendly_errors
def drain(port: int, host: str, token_file: str | None) -> None:
    """Ask a compactor to drain (POST /drain): it takes no new job and finishes or releases the
    current one within its grace period. The compactor pod's preStop hook runs this."""
    import urllib.error

    from kompaktor.model.errors import KompaktorError
    from kompaktor.worker.http import TOKEN_ENV, request_drain, token_source

    token = token_source(os.environ.get(TOKEN_ENV), token_file)()
    try:
        click.echo(request_drain(port, host, token=token))
    except urllib.error.HTTPError as exc:
        raise KompaktorError(
            f"the compactor on {host}:{port} refused to drain: HTTP {exc.code} "
            f"{exc.read().decode(errors='replace').strip()}"
        ) from exc
    except OSError as exc:
        raise KompaktorError(f"no compactor answered on {host}:{port}: {exc}") from exc
