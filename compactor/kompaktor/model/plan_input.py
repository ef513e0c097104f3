"""The input of ``kompaktor plan`` (docs/planner.md §8): one tablet described in JSON, as pydantic models.

Pure: imports pydantic only. Every rule of §8 that needs nothing but the document is checked here,
with the message ``kompaktor plan`` prints: users' scripts match these messages, so each is
written out instead of pydantic's default. Two things come from the planner's policy, above this
layer, so the caller brings them: the grammar of a size string (``parse_size``, passed to
:meth:`PlanInput.from_document`), and the planner's own rules on its settings
(:class:`kompaktor.policy.planner.PlannerSettings`), which §8 applies after the groups and before
the files (:attr:`PlanProblem.in_tablet`).

A document can break several rules at once. Validation collects them all, and
:func:`first_problem` picks the one a walk of the document meets first: at each object its unknown
keys (in document order), then its missing keys, then its values in field order (kind, ratio,
maxOpen, maxFilesPerTablet, lowestRatio, groups, files, running, selected, candidates); lists and
objects item by item, in order; within a list of file names, each name is checked in turn.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, NamedTuple

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    PlainValidator,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from kompaktor.model.job import Kind

__all__ = [
    "MAX_BYTES",
    "PlanGroup",
    "PlanInput",
    "PlanProblem",
    "PlanRunning",
    "PlanSettingsInput",
    "first_problem",
    "type_name",
]

#: The largest size accepted for a file or a group's maxSize (a Java long, as in Accumulo).
MAX_BYTES = 2**63 - 1


def type_name(value: object) -> str:
    """How a message names the JSON type of ``value``."""
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


class _Problem(ValueError):
    """An error with its exact message; ``at`` continues its location below the validated value
    (an item of a list of names). Pydantic keeps it in the error's ``ctx["error"]``."""

    def __init__(self, message: str, *at: int | str) -> None:
        super().__init__(message)
        self.message = message
        self.at = at


@dataclass(frozen=True)
class _Context:
    """What validation needs besides the document: the size grammar, and the document's files when
    they are valid (None: they are not, and that error comes first)."""

    parse_size: Callable[[str], int]
    files: Mapping[str, int] | None


def _context(info: ValidationInfo) -> _Context:
    context = info.context
    if not isinstance(context, _Context):
        raise TypeError("validate a plan input with PlanInput.from_document")
    return context


# --------------------------------------------------------------------------- values


def _kind(value: object) -> str:
    if not isinstance(value, str) or value not in tuple(Kind):
        raise _Problem(f"must be one of {', '.join(json.dumps(k.value) for k in Kind)}, got {json.dumps(value)}")
    return value


def _integer(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Problem(f"must be an integer, got {type_name(value)}")
    return value


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Problem(f"must be a number, got {type_name(value)}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise _Problem("must be a finite number")
    return number


def _at_most_max_bytes(value: int) -> int:
    if value > MAX_BYTES:
        raise _Problem(f"must be at most {MAX_BYTES} bytes, got {value}")
    return value


def _group_name(value: object) -> str:
    if not isinstance(value, str):
        raise _Problem(f"must be a string, got {type_name(value)}")
    return value


def _max_size(value: object, info: ValidationInfo) -> int | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            size = _context(info).parse_size(value)
        except ValueError as exc:
            raise _Problem(str(exc)) from None
    elif isinstance(value, bool) or not isinstance(value, int):
        raise _Problem(f"must be integer bytes or a size string, got {type_name(value)}")
    else:
        size = value
    return _at_most_max_bytes(size)


def _file_size(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Problem(f"must be integer bytes, got {type_name(value)}")
    if value < 0:
        raise _Problem(f"must be >= 0, got {value}")
    return _at_most_max_bytes(value)


def _names(value: object, files: Mapping[str, int] | None, *, non_empty: bool = False) -> tuple[str, ...]:
    """A list of file names, each in ``files`` (when known) and given once."""
    if not isinstance(value, list):
        raise _Problem(f"must be a list of file names, got {type_name(value)}")
    if non_empty and not value:
        raise _Problem("must not be empty")
    seen: set[str] = set()
    for i, name in enumerate(value):
        if not isinstance(name, str):
            raise _Problem(f"must be a file name (string), got {type_name(name)}", i)
        if files is not None and name not in files:
            raise _Problem(f"{json.dumps(name)} is not in files", i)
        if name in seen:
            raise _Problem(f"{json.dumps(name)} is repeated", i)
        seen.add(name)
    return tuple(value)


def _file_names(value: object, info: ValidationInfo) -> tuple[str, ...] | None:
    return None if value is None else _names(value, _context(info).files)


def _running_files(value: object, info: ValidationInfo) -> tuple[str, ...]:
    return _names(value, _context(info).files, non_empty=True)


def _a_list(what: str) -> Callable[[object], object]:
    def check(value: object) -> object:
        if not isinstance(value, list):
            raise _Problem(f"must be a list of {what}, got {type_name(value)}")
        return value

    return check


def _files_object(value: object) -> object:
    if not isinstance(value, dict):
        raise _Problem(f"must be an object mapping file names to sizes, got {type_name(value)}")
    return value


KindName = Annotated[str, PlainValidator(_kind)]
Number = Annotated[float, PlainValidator(_number)]
Integer = Annotated[int, PlainValidator(_integer)]
Files = Annotated[dict[str, Annotated[int, PlainValidator(_file_size)]], BeforeValidator(_files_object)]
FileNames = Annotated[tuple[str, ...] | None, PlainValidator(_file_names)]

_FILES: TypeAdapter[dict[str, int]] = TypeAdapter(Files)


# --------------------------------------------------------------------------- objects


class _PlanObject(BaseModel):
    """A JSON object of the document: camelCase keys, no others."""

    model_config = ConfigDict(alias_generator=to_camel, extra="forbid", frozen=True)

    #: the message for a value that is not an object (before ", got <type>")
    NOT_AN_OBJECT: ClassVar[str]
    #: the keys an unknown-key message lists, in its order
    KEYS: ClassVar[tuple[str, ...]]

    @model_validator(mode="before")
    @classmethod
    def _an_object(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            raise _Problem(f"{cls.NOT_AN_OBJECT}, got {type_name(value)}")
        return value


class PlanGroup(_PlanObject):
    """A size tier: ``maxSize`` in bytes (a size string is parsed), None for the unbounded group."""

    NOT_AN_OBJECT = "must be an object with name and maxSize"
    KEYS = ("name", "maxSize")

    name: Annotated[str, PlainValidator(_group_name)]
    max_size: Annotated[int | None, PlainValidator(_max_size)] = None


class PlanRunning(_PlanObject):
    """A compaction running on the tablet: its kind and input files (a non-empty list)."""

    NOT_AN_OBJECT = "must be an object with kind and files"
    KEYS = ("kind", "files")

    kind: KindName
    files: Annotated[tuple[str, ...], PlainValidator(_running_files)]


class PlanSettingsInput(_PlanObject):
    """The planner settings of a §8 document. The planner's own rules on them (ratio >= 1,
    maxOpen >= 2, the group rules of §7) are checked by ``PlannerSettings``."""

    NOT_AN_OBJECT = "input must be a JSON object"
    #: the required keys, then the optional ones (PlanInput's)
    KEYS = (
        "kind",
        "ratio",
        "maxOpen",
        "maxFilesPerTablet",
        "groups",
        "files",
        "lowestRatio",
        "candidates",
        "running",
        "selected",
    )

    kind: KindName
    ratio: Number
    max_open: Integer
    max_files_per_tablet: Integer
    #: None: not given (the planner's default)
    lowest_ratio: Annotated[float | None, PlainValidator(_number)] = None
    groups: Annotated[tuple[PlanGroup, ...], BeforeValidator(_a_list("groups"))]

    @classmethod
    def settings_of(cls, doc: Mapping[str, Any], parse_size: Callable[[str], int]) -> PlanSettingsInput:
        """The settings of a document, alone (its other keys left out)."""
        keys = {field.alias for field in cls.model_fields.values()}
        return cls.model_validate(
            {key: value for key, value in doc.items() if key in keys}, context=_Context(parse_size, None)
        )


class PlanInput(PlanSettingsInput):
    """A §8 document: the settings, then the tablet (its files, running compactions, selection and
    candidates; None: not given)."""

    files: Files
    running: Annotated[tuple[PlanRunning, ...], BeforeValidator(_a_list("running compactions"))] = ()
    selected: FileNames = None
    candidates: FileNames = None

    @classmethod
    def from_document(cls, doc: object, parse_size: Callable[[str], int]) -> PlanInput:
        """Validate a decoded document; :class:`ValidationError` when it is invalid
        (:func:`first_problem` says why)."""
        files = None
        if isinstance(doc, dict) and "files" in doc:
            try:
                files = _FILES.validate_python(doc["files"])
            except ValidationError:
                pass  # reported below, before any name is checked against the files
        return cls.model_validate(doc, context=_Context(parse_size, files))

    @field_validator("running", mode="wrap")
    @classmethod
    def _one_running_compaction_per_file(
        cls, value: Any, handler: ValidatorFunctionWrapHandler
    ) -> tuple[PlanRunning, ...]:
        try:
            running: tuple[PlanRunning, ...] = handler(value)
        except ValidationError as exc:
            # the entries before the first invalid one are checked first
            first_bad = min((e["loc"][0] for e in exc.errors() if e["loc"] and isinstance(e["loc"][0], int)), default=0)
            _check_owners(handler(value[:first_bad]) if first_bad else ())
            raise
        return _check_owners(running)


def _check_owners(running: tuple[PlanRunning, ...]) -> tuple[PlanRunning, ...]:
    owner: dict[str, int] = {}
    for i, compaction in enumerate(running):
        for j, name in enumerate(compaction.files):
            if name in owner:
                raise _Problem(
                    f"{json.dumps(name)} is already in running[{owner[name]}]: a file is in at most "
                    "one running compaction",
                    i,
                    "files",
                    j,
                )
            owner[name] = i
    return running


# --------------------------------------------------------------------------- the first problem


class PlanProblem(NamedTuple):
    """Why a document is invalid: the offending key (``groups[0].maxSize``; "" for the whole
    document) and the problem. ``in_tablet``: the key is among the tablet's (files, running,
    selected, candidates), which §8 checks after the planner settings."""

    key: str
    problem: str
    in_tablet: bool

    def __str__(self) -> str:
        return f"{self.key}: {self.problem}" if self.key else self.problem


_TABLET_KEYS = ("files", "running", "selected", "candidates")
#: the objects below a key: (object, key) -> the object its items are (lists) or None (keyed by name)
_BELOW: dict[tuple[type[_PlanObject], str], type[_PlanObject] | None] = {
    (PlanInput, "groups"): PlanGroup,
    (PlanInput, "running"): PlanRunning,
    (PlanInput, "files"): None,
}


def _cause(error: Mapping[str, Any]) -> _Problem | None:
    cause = (error.get("ctx") or {}).get("error")
    return cause if isinstance(cause, _Problem) else None


def _walk(error: Mapping[str, Any]) -> tuple[tuple[tuple[int, int], ...], str, type[_PlanObject]]:
    """Where the walk of a document meets ``error``, the key it names, and the object it is in."""
    cause = _cause(error)
    loc = (*error["loc"], *(cause.at if cause is not None else ()))
    kind = error["type"]
    position: list[tuple[int, int]] = []
    key = ""
    level: type[_PlanObject] | None = PlanInput
    parent: type[_PlanObject] = PlanInput
    for n, part in enumerate(loc):
        last = n == len(loc) - 1
        if isinstance(part, int):
            position.append((2, part))
            key += f"[{part}]"
        elif level is None:  # a file's name
            position.append((2, 0))  # pydantic reports them in document order
            key += f"[{json.dumps(part)}]"
        else:
            fields = [field.alias for field in level.model_fields.values()]
            rank = fields.index(part) if part in fields else len(fields)
            if last and kind == "extra_forbidden":
                position.append((0, 0))  # in document order, as pydantic reports them
            elif last and kind == "missing":
                position.append((1, rank))
            else:
                position.append((2, rank))
            key += f".{part}" if key else part
            parent = level
            below = (level, part)
            level = _BELOW.get(below, level)
    return tuple(position), key, parent


def first_problem(exc: ValidationError) -> PlanProblem:
    """The problem of an invalid document that a walk of it meets first (see the module's doc)."""
    best: tuple[tuple[tuple[int, int], ...], PlanProblem] | None = None
    for error in exc.errors():
        position, key, parent = _walk(error)
        if error["type"] == "missing":
            problem = "required key is missing"
        elif error["type"] == "extra_forbidden":
            problem = f"unknown key (expected one of {', '.join(parent.KEYS)})"
        elif (cause := _cause(error)) is not None:
            problem = cause.message
        else:
            problem = error["msg"]
        loc = error["loc"]
        top_key = len(loc) == 1 and error["type"] in ("missing", "extra_forbidden")
        in_tablet = bool(loc) and loc[0] in _TABLET_KEYS and not top_key
        if best is None or position < best[0]:
            best = (position, PlanProblem(key, problem, in_tablet))
    if best is None:
        raise ValueError("a validation error without errors")
    return best[1]
