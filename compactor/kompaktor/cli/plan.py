"""`kompaktor plan FILE.json`: dry-run the planner on one tablet described in JSON (docs/planner.md §8).

Reads a file (or stdin with ``-``), validates it strictly (the pydantic models of
:mod:`kompaktor.model.plan_input`, then the planner's own rules), runs
:func:`kompaktor.policy.planner.plan` and prints one JSON line ``{"jobs": [...]}``. Invalid input
prints one line on stderr naming the offending key, nothing on stdout, and exits with 2. Touches no
Redis, queues or data files.
"""

from __future__ import annotations

import json
import sys
from typing import NoReturn

import click
from pydantic import ValidationError

from kompaktor.model.plan_input import MAX_BYTES, PlanInput, PlanSettingsInput, first_problem
from kompaktor.policy.planner import (
    DEFAULTS,
    Kind,
    PlannedJob,
    PlannerConfigError,
    PlannerSettings,
    Running,
    SizeTier,
    default_candidates,
)
from kompaktor.policy.planner import plan as make_plan
from kompaktor.policy.sizes import parse_accumulo_size

__all__ = ["MAX_BYTES", "PlanInputError", "parse_plan_input", "plan", "render_jobs", "run_plan"]

EXIT_INVALID = 2


class PlanInputError(ValueError):
    """Invalid `kompaktor plan` input; the message names the offending key where there is one."""


def _settings(given: PlanSettingsInput) -> PlannerSettings:
    """The planner's settings; the planner's own rules raise :class:`PlannerConfigError`."""
    return PlannerSettings(
        ratio=given.ratio,
        max_open=given.max_open,
        max_files_per_tablet=given.max_files_per_tablet,
        lowest_ratio=DEFAULTS.lowest_ratio if given.lowest_ratio is None else given.lowest_ratio,
        groups=tuple(SizeTier(group.name, group.max_size) for group in given.groups),
    )


def parse_plan_input(doc: object) -> tuple[Kind, PlannerSettings, dict[str, int], list[str], list[Running]]:
    """Validate a decoded §8 document (:class:`kompaktor.model.plan_input.PlanInput`): (kind,
    settings, files, candidates, running).

    Raises :class:`PlanInputError` (naming the key) or :class:`PlannerConfigError` (naming the
    setting), both :class:`ValueError`. Of several problems, the first in the order §8 checks
    them is reported: the planner's rules on its settings come after the settings' own keys and
    before the tablet's (files, running, selected, candidates).
    """
    try:
        given = PlanInput.from_document(doc, parse_accumulo_size)
    except ValidationError as exc:
        problem = first_problem(exc)
        if problem.in_tablet and isinstance(doc, dict):  # the settings are well-formed: their rules first
            _settings(PlanSettingsInput.settings_of(doc, parse_accumulo_size))
        raise PlanInputError(str(problem)) from None
    settings = _settings(given)
    kind = Kind(given.kind)
    running = [Running(Kind(compaction.kind), compaction.files) for compaction in given.running]
    selected = None if given.selected is None else list(given.selected)
    if given.candidates is None:
        candidates = default_candidates(kind, given.files, running, selected)
    else:
        candidates = list(given.candidates)
    return kind, settings, given.files, candidates, running


def render_jobs(jobs: list[PlannedJob]) -> str:
    """The §8 output line (without the newline): keys kind, group, priority, files, in that order."""
    return json.dumps(
        {
            "jobs": [
                {"kind": job.kind.value, "group": job.group, "priority": job.priority, "files": list(job.files)}
                for job in jobs
            ]
        }
    )


def _reject_constant(name: str) -> NoReturn:
    raise PlanInputError(f"input is not valid JSON: {name} is not allowed")


def run_plan(text: str) -> str:
    """Decode, validate and plan one §8 document; the output line. Raises ValueError if invalid."""
    try:
        doc = json.loads(text, parse_constant=_reject_constant)
    except PlanInputError:
        raise
    except RecursionError:
        raise PlanInputError("input is not valid JSON: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, or an integer with too many digits
        raise PlanInputError(f"input is not valid JSON: {exc}") from None
    kind, settings, files, candidates, running = parse_plan_input(doc)
    return render_jobs(make_plan(kind, settings, files, candidates, running))


def _read(file: str) -> str:
    if file == "-":
        data = sys.stdin.buffer.read()  # click.get_binary_stream is deprecated (Click 8.5)
        source = "stdin"
    else:
        source = file
        with open(file, "rb") as handle:
            data = handle.read()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise PlanInputError(f"cannot read {source}: not UTF-8 ({exc.reason})") from None


def _one_line(message: str) -> str:
    return " ".join(message.split())


@click.command("plan")
@click.argument("file", metavar="FILE")
def plan(file: str) -> None:
    """Dry-run the planner on one tablet described in JSON FILE (or - for stdin).

    Prints {"jobs": [...]} on one line. Invalid input prints one line on stderr and exits with 2.
    Touches no Redis, queues or data files.
    """
    try:
        text = _read(file)
    except OSError as exc:
        click.echo(_one_line(f"kompaktor plan: cannot read {file}: {exc.strerror or exc}"), err=True)
        sys.exit(EXIT_INVALID)
    except PlanInputError as exc:
        click.echo(_one_line(f"kompaktor plan: {exc}"), err=True)
        sys.exit(EXIT_INVALID)
    try:
        line = run_plan(text)
    except (PlanInputError, PlannerConfigError) as exc:
        click.echo(_one_line(f"kompaktor plan: {exc}"), err=True)
        sys.exit(EXIT_INVALID)
    click.echo(line)
