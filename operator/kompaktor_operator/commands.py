"""The click command behind ``kompaktor operator`` (wired in ``kompaktor.cli.COMMANDS``).

Owns: command-line parsing only; it imports kopf and the handlers when it runs. The ``kompaktor``
package never imports this package: its CLI names this command by a string that it imports on
first use (``kompaktor crds`` lives in ``kompaktor.cli.crds``, the CRDs come from
``kompaktor.resources``).
"""

from __future__ import annotations

import click


@click.command("operator")
@click.option(
    "-n",
    "--namespace",
    "namespaces",
    multiple=True,
    help="namespace to watch (repeatable; globs allowed); default: all namespaces",
)
@click.option(
    "--liveness",
    default="http://0.0.0.0:8080/healthz",
    show_default=True,
    help="kopf liveness endpoint URL ('' to disable)",
)
@click.option(
    "--redis",
    "redis_url",
    envvar="KOMPAKTOR_REDIS_URL",
    required=True,
    help="Redis URL of the metadata store and queues [env KOMPAKTOR_REDIS_URL]",
)
@click.option(
    "--metrics-port",
    type=int,
    default=-1,
    show_default=True,
    envvar="KOMPAKTOR_OPERATOR_METRICS_PORT",
    help="Port for the operator's own /metrics (reconciles, scale decisions, external metrics API "
    "requests); -1: off [env KOMPAKTOR_OPERATOR_METRICS_PORT]",
)
@click.option(
    "--metrics-host",
    default="0.0.0.0",
    show_default=True,
    envvar="KOMPAKTOR_OPERATOR_METRICS_HOST",
    help="Address the operator's /metrics listens on [env KOMPAKTOR_OPERATOR_METRICS_HOST]",
)
@click.option("--verbose", is_flag=True, help="debug logging")
def operator(
    namespaces: tuple[str, ...], liveness: str, redis_url: str, metrics_port: int, metrics_host: str, verbose: bool
) -> None:
    """Run the Kubernetes operator (kopf) in the foreground."""
    # long with its decorators only, one per option: the body parses and runs
    import asyncio
    import importlib.util
    import logging

    if importlib.util.find_spec("kopf") is None:
        raise click.ClickException("the operator needs kopf, which is not installed: pip install 'kompaktor[operator]'")
    import kopf

    # kopf's own format: a timestamp, and the object each message is about ("[ns/name]")
    kopf.configure(verbose=verbose, log_prefix=True)

    from kompaktor_operator import handlers
    from kompaktor_operator.runtime import Runtime

    rt = Runtime.from_env(redis_url=redis_url)
    if metrics_port >= 0:
        from prometheus_client import start_http_server

        start_http_server(metrics_port, addr=metrics_host, registry=rt.metrics.registry)
        logging.getLogger("kompaktor.operator").info("serving /metrics on %s:%d", metrics_host, metrics_port)

    asyncio.run(
        handlers.run(
            runtime=rt,
            namespaces=list(namespaces) or None,
            liveness_endpoint=liveness or None,
        )
    )
