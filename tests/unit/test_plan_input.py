"""The `kompaktor plan` input models (kompaktor.model.plan_input): what they hold, and which of
several problems a document reports — the first one the walk of §8 meets, as before the models."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from kompaktor.cli.plan import PlanInputError, parse_plan_input
from kompaktor.model.plan_input import PlanInput, first_problem
from kompaktor.policy.planner import Kind, PlannerConfigError
from kompaktor.policy.sizes import parse_accumulo_size

BASE: dict[str, Any] = {
    "kind": "SYSTEM",
    "ratio": 3,
    "maxOpen": 10,
    "maxFilesPerTablet": 15,
    "groups": [{"name": "a"}],
    "files": {"f1": 1, "f2": 2, "f3": 3},
}


def doc(**changes: Any) -> dict[str, Any]:
    out = {**BASE, **changes}
    return {k: v for k, v in out.items() if v is not ...}


def test_kinds_have_one_definition() -> None:
    """The planner, the services' kinds, the dispatcher's properties and the CRD read one Kind."""
    from kompaktor.model import job
    from kompaktor.policy import services, tableprops
    from kompaktor.resources import models

    assert Kind is job.Kind and tuple(Kind) == ("SYSTEM", "USER", "SELECTOR")
    assert tuple(Kind) == services.KINDS
    assert models.CompactionServiceSpec().kinds == list(Kind)
    for kind in Kind:
        tableprops.validate_props({f"{tableprops.DISPATCH_PREFIX}.{kind.lower()}": "s"})
    for kind in Kind:
        given = PlanInput.from_document(doc(kind=kind.value), parse_accumulo_size)
        assert given.kind == kind


def test_a_valid_document() -> None:
    given = PlanInput.from_document(
        doc(groups=[{"name": "s", "maxSize": "1M"}, {"name": "l", "maxSize": None}], running=[], selected=["f1"]),
        parse_accumulo_size,
    )
    assert [(g.name, g.max_size) for g in given.groups] == [("s", 1 << 20), ("l", None)]
    assert (given.kind, given.ratio, given.max_open, given.lowest_ratio) == ("SYSTEM", 3.0, 10, None)
    assert given.files == {"f1": 1, "f2": 2, "f3": 3}
    assert (given.running, given.selected, given.candidates) == ((), ("f1",), None)


def test_snake_case_keys_are_unknown() -> None:
    with pytest.raises(ValidationError) as info:
        PlanInput.from_document(doc(maxOpen=..., max_open=10), parse_accumulo_size)
    assert str(first_problem(info.value)).startswith("max_open: unknown key")


#: documents breaking several rules, and the one problem reported (the first in §8's order)
SEVERAL: list[tuple[dict[str, Any], str]] = [
    (
        doc(running=[{"kind": "USER", "files": ["f1"]}, {"kind": "USER", "files": ["f1"]}, {"kind": "X", "files": []}]),
        'running[1].files[0]: "f1" is already in running[0]: a file is in at most one running compaction',
    ),
    (
        doc(running=[{"kind": "USER", "files": ["f1"]}, {"kind": "X", "files": ["f1"]}]),
        'running[1].kind: must be one of "SYSTEM", "USER", "SELECTOR", got "X"',
    ),
    (doc(groups=[{"name": "a", "maxSize": "bad"}, {"name": 5}]), "groups[0].maxSize: invalid size 'bad'"),
    (doc(maxOpen=1, files=[1]), "maxOpen: must be an integer >= 2, got 1"),
    (doc(ratio=0.5, files={"a": -1}), "ratio: must be >= 1, got 0.5"),
    (doc(ratio=0.5, running=[{"kind": "USER", "files": ["zz"]}]), "ratio: must be >= 1, got 0.5"),
    (doc(groups=[], selected=[1]), "groups: at least one group is required"),
    (doc(groups=[{"name": "a"}, {"name": "a"}], files={"x": "1"}), "groups[1].name: duplicate group name 'a'"),
    (doc(selected=["zz", 5]), 'selected[0]: "zz" is not in files'),
    (doc(files={"a": -1}, running=[{"kind": "USER", "files": ["zz"]}]), 'files["a"]: must be >= 0, got -1'),
    (doc(running=[{"kind": "USER", "files": ["zz", 5]}]), 'running[0].files[0]: "zz" is not in files'),
    (
        doc(running=[{"kind": "USER", "files": ["f1", "f1"]}, {"kind": "USER", "files": ["f1"]}]),
        'running[0].files[1]: "f1" is repeated',
    ),
    (doc(candidates=["f1", "zz"], selected=[3]), "selected[0]: must be a file name (string), got an integer"),
    (doc(extra=1, kind="X"), "extra: unknown key"),
    (doc(files=..., maxOpen=1, zz=1), "zz: unknown key"),
    (doc(files=..., maxOpen=1), "files: required key is missing"),
    (doc(lowestRatio=None, ratio="3"), "ratio: must be a number, got a string"),
    (doc(running=None, maxOpen=0), "maxOpen: must be an integer >= 2, got 0"),
    (doc(running=[5, {"kind": "USER", "files": ["f1"]}]), "running[0]: must be an object with kind and files"),
    (doc(groups=[{"name": "a", "q": 1, "maxSize": "x"}]), "groups[0].q: unknown key (expected one of name, maxSize)"),
    (doc(groups=[{"maxSize": "x", "q": 1}]), "groups[0].q: unknown key"),
    (doc(groups=[{"maxSize": "x"}]), "groups[0].name: required key is missing"),
    (doc(running=[{"files": 1, "q": 1}]), "running[0].q: unknown key (expected one of kind, files)"),
]


@pytest.mark.parametrize(("document", "message"), SEVERAL)
def test_the_first_problem_is_reported(document: dict[str, Any], message: str) -> None:
    with pytest.raises((PlanInputError, PlannerConfigError)) as info:
        parse_plan_input(json.loads(json.dumps(document)))
    assert str(info.value).startswith(message)
