"""`kompaktor plan FILE.json`: dry-run the planner on one tablet described in JSON (docs/planner.md §8).

Reads a file (or stdin with ``-``), validates it strictly, runs :func:`kompaktor.policy.planner.plan`
and prints one JSON line ``{"jobs": [...]}``. Invalid input prints one line on stderr naming the
offending key, nothing on stdout, and exits with 2. Touches no Redis, queues or data files.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from typing import Any, NoReturn

import click

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

__all__ = ["PlanInputError", "parse_plan_input", "plan", "render_jobs", "run_plan"]

EXIT_INVALID = 2
#: The largest size accepted for a file or a group's maxSize (a Java long, as in Accumulo).
MAX_BYTES = 2**63 - 1

_REQUIRED = ("kind", "ratio", "maxOpen", "maxFilesPerTablet", "groups", "files")
_OPTIONAL = ("lowestRatio", "candidates", "running", "selected")
_GROUP_KEYS = ("name", "maxSize")
_RUNNING_KEYS = ("kind", "files")
_KINDS = tuple(kind.value for kind in Kind)


class PlanInputError(ValueError):
    """Invalid `kompaktor plan` input; the message names the offending key where there is one."""


def _fail(key: str, problem: str) -> NoReturn:
    raise PlanInputError(f"{key}: {problem}" if key else problem)


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _check_keys(obj: Mapping[str, Any], where: str, allowed: tuple[str, ...], required: tuple[str, ...]) -> None:
    for key in obj:
        if key not in allowed:
            _fail(f"{where}{key}", f"unknown key (expected one of {', '.join(allowed)})")
    for key in required:
        if key not in obj:
            _fail(f"{where}{key}", "required key is missing")


def _integer(key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(key, f"must be an integer, got {_type_name(value)}")
    return value


def _number(key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        _fail(key, f"must be a number, got {_type_name(value)}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        _fail(key, "must be a finite number")
    return number


def _bytes(key: str, value: int) -> int:
    if value > MAX_BYTES:
        _fail(key, f"must be at most {MAX_BYTES} bytes, got {value}")
    return value


def _kind(key: str, value: object) -> Kind:
    if not isinstance(value, str) or value not in _KINDS:
        _fail(key, f"must be one of {', '.join(map(json.dumps, _KINDS))}, got {json.dumps(value)}")
    return Kind(value)


def _names(key: str, value: object, files: Mapping[str, int], *, non_empty: bool = False) -> list[str]:
    if not isinstance(value, list):
        _fail(key, f"must be a list of file names, got {_type_name(value)}")
    if non_empty and not value:
        _fail(key, "must not be empty")
    seen: set[str] = set()
    for i, name in enumerate(value):
        if not isinstance(name, str):
            _fail(f"{key}[{i}]", f"must be a file name (string), got {_type_name(name)}")
        if name not in files:
            _fail(f"{key}[{i}]", f"{json.dumps(name)} is not in files")
        if name in seen:
            _fail(f"{key}[{i}]", f"{json.dumps(name)} is repeated")
        seen.add(name)
    return value


def _group(i: int, value: object) -> SizeTier:
    where = f"groups[{i}]"
    if not isinstance(value, dict):
        _fail(where, f"must be an object with name and maxSize, got {_type_name(value)}")
    _check_keys(value, f"{where}.", _GROUP_KEYS, ("name",))
    name = value["name"]
    if not isinstance(name, str):
        _fail(f"{where}.name", f"must be a string, got {_type_name(name)}")
    size = value.get("maxSize")
    max_size: int | None
    if size is None:
        max_size = None
    elif isinstance(size, str):
        try:
            max_size = parse_accumulo_size(size)
        except ValueError as exc:
            _fail(f"{where}.maxSize", str(exc))
    elif isinstance(size, bool) or not isinstance(size, int):
        _fail(f"{where}.maxSize", f"must be integer bytes or a size string, got {_type_name(size)}")
    else:
        max_size = size
    if max_size is not None:
        _bytes(f"{where}.maxSize", max_size)
    return SizeTier(name, max_size)


def parse_plan_input(doc: object) -> tuple[Kind, PlannerSettings, dict[str, int], list[str], list[Running]]:
    """Validate a decoded §8 document: (kind, settings, files, candidates, running).

    Raises :class:`PlanInputError` (naming the key) or :class:`PlannerConfigError` (naming the
    setting), both :class:`ValueError`.
    """
    if not isinstance(doc, dict):
        _fail("", f"input must be a JSON object, got {_type_name(doc)}")
    _check_keys(doc, "", _REQUIRED + _OPTIONAL, _REQUIRED)

    kind = _kind("kind", doc["kind"])
    ratio = _number("ratio", doc["ratio"])
    max_open = _integer("maxOpen", doc["maxOpen"])
    max_files = _integer("maxFilesPerTablet", doc["maxFilesPerTablet"])
    lowest_ratio = _number("lowestRatio", doc["lowestRatio"]) if "lowestRatio" in doc else DEFAULTS.lowest_ratio
    raw_groups = doc["groups"]
    if not isinstance(raw_groups, list):
        _fail("groups", f"must be a list of groups, got {_type_name(raw_groups)}")
    groups = tuple(_group(i, group) for i, group in enumerate(raw_groups))
    settings = PlannerSettings(
        ratio=ratio,
        max_open=max_open,
        max_files_per_tablet=max_files,
        lowest_ratio=lowest_ratio,
        groups=groups,
    )

    files = doc["files"]
    if not isinstance(files, dict):
        _fail("files", f"must be an object mapping file names to sizes, got {_type_name(files)}")
    for name, size in files.items():
        key = f"files[{json.dumps(name)}]"
        if isinstance(size, bool) or not isinstance(size, int):
            _fail(key, f"must be integer bytes, got {_type_name(size)}")
        if size < 0:
            _fail(key, f"must be >= 0, got {size}")
        _bytes(key, size)

    raw_running = doc.get("running", [])
    if not isinstance(raw_running, list):
        _fail("running", f"must be a list of running compactions, got {_type_name(raw_running)}")
    running: list[Running] = []
    owner: dict[str, int] = {}
    for i, entry in enumerate(raw_running):
        where = f"running[{i}]"
        if not isinstance(entry, dict):
            _fail(where, f"must be an object with kind and files, got {_type_name(entry)}")
        _check_keys(entry, f"{where}.", _RUNNING_KEYS, _RUNNING_KEYS)
        entry_kind = _kind(f"{where}.kind", entry["kind"])
        names = _names(f"{where}.files", entry["files"], files, non_empty=True)
        for j, name in enumerate(names):
            if name in owner:
                _fail(
                    f"{where}.files[{j}]",
                    f"{json.dumps(name)} is already in running[{owner[name]}]: a file is in at most "
                    "one running compaction",
                )
            owner[name] = i
        running.append(Running(entry_kind, tuple(names)))

    selected = doc.get("selected")
    if selected is not None:
        selected = _names("selected", selected, files)

    raw_candidates = doc.get("candidates")
    if raw_candidates is None:
        candidates = default_candidates(kind, files, running, selected)
    else:
        candidates = _names("candidates", raw_candidates, files)
    return kind, settings, files, candidates, running


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
        data = click.get_binary_stream("stdin").read()
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
