"""Click commands behind ``kompaktor crds`` and ``kompaktor operator`` (wired in kompaktor/cli.py).

Owns: command-line parsing only. ``crds`` is pure file generation; ``operator`` imports kopf
and the handlers lazily, so ``kompaktor crds`` stays fast and needs no cluster.
"""

from __future__ import annotations

from pathlib import Path

import click


@click.command("crds")
@click.option(
    "--out",
    "out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("crds"),
    show_default=True,
    help="directory for the CRD YAML (examples go to OUT/examples)",
)
@click.option(
    "--chart",
    "chart",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Helm chart whose files/crds/ gets the same CRDs [default: OUT/../helm/kompaktor if present]",
)
@click.option("--check", is_flag=True, help="write nothing; exit 1 if a generated file is out of date")
def crds(out: Path, chart: Path | None, check: bool) -> None:
    """Generate the CustomResourceDefinitions from the pydantic models."""
    from kompaktor_operator import crdgen

    if chart is None:
        candidate = out.resolve().parent / "helm" / "kompaktor"
        chart = candidate if candidate.is_dir() else None
    targets = [out] + ([chart / "files" / "crds"] if chart is not None else [])
    if check:
        stale = [str(p) for t in targets for p in crdgen.stale(t, examples=t == out)]
        if stale:
            raise click.ClickException("out of date (run `make crds`): " + ", ".join(stale))
        click.echo("CRDs are up to date")
        return
    for target in targets:
        for path in crdgen.write(target, examples=target == out):
            click.echo(str(path))


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
    import asyncio
    import importlib.util
    import logging
    import os

    if importlib.util.find_spec("kopf") is None:
        raise click.ClickException("the operator needs kopf, which is not installed: pip install 'kompaktor[operator]'")
    import kopf

    os.environ["KOMPAKTOR_REDIS_URL"] = redis_url
    # kopf's own format: a timestamp, and the object each message is about ("[ns/name]")
    kopf.configure(verbose=verbose, log_prefix=True)

    from kompaktor_operator import handlers

    if metrics_port >= 0:
        from prometheus_client import start_http_server

        from kompaktor_operator.metrics import metrics

        start_http_server(metrics_port, addr=metrics_host, registry=metrics().registry)
        logging.getLogger("kompaktor.operator").info("serving /metrics on %s:%d", metrics_host, metrics_port)

    asyncio.run(
        handlers.run(
            namespaces=list(namespaces) or None,
            liveness_endpoint=liveness or None,
        )
    )
