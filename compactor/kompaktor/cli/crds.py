"""`kompaktor crds`: write the CustomResourceDefinitions generated from the pydantic models.

Pure file generation (``kompaktor.resources.crdgen``): needs no cluster and no operator.
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
    from kompaktor.resources import crdgen

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
