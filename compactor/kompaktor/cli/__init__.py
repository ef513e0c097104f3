"""The `kompaktor` console command.

One click group; each subcommand lives in its own module and is imported only when it runs, so
`kompaktor plan` does not pay for importing PySpark and `kompaktor --help` stays fast.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

#: subcommand name -> "module:attribute" of a click command or group.
COMMANDS: dict[str, str] = {
    "table": "kompaktor.cli.table:table",
    "import": "kompaktor.cli.data:import_files",
    "scan": "kompaktor.cli.data:scan",
    "plan": "kompaktor.cli.plan:plan",
    "merge": "kompaktor.cli.merge:merge",
    "compact": "kompaktor.cli.compact:compact",
    "compactor": "kompaktor.cli.compactor:compactor",
    "drain": "kompaktor.cli.compactor:drain",
    "coordinator": "kompaktor.cli.coordinator:coordinator",
    "service": "kompaktor.cli.service:service",
    "up": "kompaktor.cli.local:up",
    "demo": "kompaktor.cli.local:demo",
    "status": "kompaktor.cli.status:status",
    "history": "kompaktor.cli.history:history",
    "crds": "kompaktor.cli.crds:crds",
    "backup": "kompaktor.cli.backup:backup",
    "restore": "kompaktor.cli.backup:restore",
    # the operator's command, imported only when it runs (`kompaktor` never imports the operator's
    # package otherwise; the import-linter contract in pyproject.toml says so)
    "operator": "kompaktor_operator.commands:operator",
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                return None  # not built yet in this checkout
            raise
        command: click.Command = getattr(module, attr)
        return command

    def invoke(self, ctx: click.Context) -> Any:
        # The top-level error rule (cli.common.friendly_errors) around every subcommand, also
        # those that do not apply it themselves (the operator's) and the lazy import above.
        from kompaktor.cli.common import friendly_errors

        return friendly_errors(super().invoke)(ctx)


@click.group(cls=LazyGroup)
@click.version_option(package_name="kompaktor")
@click.option(
    "--debug",
    is_flag=True,
    envvar="KOMPAKTOR_DEBUG",
    help="Show the traceback of an error instead of one line (env KOMPAKTOR_DEBUG=1).",
)
def main(debug: bool) -> None:
    """Kompaktor: external compactions for sorted key/value tables.

    Errors are one line on stderr: exit status 1 for a problem with the input or the environment
    (a file, a table, Redis), 70 for an internal error (`--debug` shows its traceback)."""
