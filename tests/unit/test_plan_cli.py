"""`kompaktor plan` (docs/planner.md §8): output contract, defaults and every kind of invalid input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kompaktor.cli import main
from kompaktor.cli.plan import plan

M = 1 << 20

#: The §8 example, verbatim.
EXAMPLE_TEXT = """\
{"kind": "SYSTEM", "ratio": 3, "maxOpen": 10, "maxFilesPerTablet": 15,
 "groups": [{"name": "small", "maxSize": "100M"}, {"name": "medium", "maxSize": "500M"},
            {"name": "large"}],
 "files": {"f1": 104857600, "f2": 103809024, "f3": 34603008, "f4": 34603008,
           "f5": 34603008, "f6": 34603008}}
"""
EXAMPLE_OUTPUT = (
    '{"jobs": [{"kind": "SYSTEM", "group": "medium", "priority": -32756, '
    '"files": ["f3", "f4", "f5", "f6", "f2", "f1"]}]}\n'
)


def base(**changes: Any) -> dict[str, Any]:
    """A valid document (the §8 example) with keys replaced; a value of ... deletes the key."""
    doc: dict[str, Any] = json.loads(EXAMPLE_TEXT)
    for key, value in changes.items():
        if value is ...:
            doc.pop(key, None)
        else:
            doc[key] = value
    return doc


def invoke(text: str, *args: str) -> Any:
    return CliRunner().invoke(plan, [*args] if args else ["-"], input=text)


def run_doc(doc: object) -> Any:
    return invoke(json.dumps(doc))


def jobs_of(doc: dict[str, Any]) -> list[dict[str, Any]]:
    result = run_doc(doc)
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout.endswith("\n") and result.stdout.count("\n") == 1
    return json.loads(result.stdout)["jobs"]


# --------------------------------------------------------------------------- output


def test_section_8_example_stdin() -> None:
    result = invoke(EXAMPLE_TEXT)
    assert result.exit_code == 0
    assert result.stdout == EXAMPLE_OUTPUT
    assert result.stderr == ""


def test_section_8_example_file(tmp_path: Path) -> None:
    path = tmp_path / "tablet.json"
    path.write_text(EXAMPLE_TEXT)
    result = CliRunner().invoke(plan, [str(path)])
    assert (result.exit_code, result.stdout, result.stderr) == (0, EXAMPLE_OUTPUT, "")


def test_through_the_cli_group(tmp_path: Path) -> None:
    path = tmp_path / "tablet.json"
    path.write_text(EXAMPLE_TEXT)
    result = CliRunner().invoke(main, ["plan", str(path)])
    assert (result.exit_code, result.stdout) == (0, EXAMPLE_OUTPUT)


def kompaktor_script() -> Path:
    script = Path(sys.executable).parent / "kompaktor"
    if not script.exists():
        pytest.skip("the kompaktor console script is not installed next to this interpreter")
    return script


def test_subprocess_example(tmp_path: Path) -> None:
    path = tmp_path / "tablet.json"
    path.write_text(EXAMPLE_TEXT)
    done = subprocess.run(
        [str(kompaktor_script()), "plan", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, EXAMPLE_OUTPUT, "")


def test_subprocess_stdin_and_invalid_input() -> None:
    script = str(kompaktor_script())
    done = subprocess.run(
        [script, "plan", "-"], input=EXAMPLE_TEXT, capture_output=True, text=True, timeout=60, check=False
    )
    assert (done.returncode, done.stdout) == (0, EXAMPLE_OUTPUT)
    bad = json.dumps(base(maxOpen=1))
    done = subprocess.run([script, "plan", "-"], input=bad, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "maxOpen" in done.stderr


def test_nothing_planned() -> None:
    assert jobs_of(base(files={"a": 1})) == []
    assert jobs_of(base(files={})) == []
    result = run_doc(base(files={"a": 1}))
    assert result.stdout == '{"jobs": []}\n'


def test_key_order_and_multiple_jobs() -> None:
    doc = base(groups=[{"name": "default"}], files={f"f{i:02d}": M for i in range(25)})
    jobs = jobs_of(doc)
    assert [list(job) for job in jobs] == [["kind", "group", "priority", "files"]] * 3
    assert [len(job["files"]) for job in jobs] == [10, 10, 5]
    assert [job["priority"] for job in jobs] == [18788, 18788, 18783]


def test_files_sorted_by_size_then_name() -> None:
    doc = base(kind="USER", files={"z": 1, "b": 5, "a": 5, "c": 2}, selected=["z", "b", "a", "c"])
    assert jobs_of(doc) == [{"kind": "USER", "group": "small", "priority": 9, "files": ["z", "c", "a", "b"]}]


def test_integer_max_size_and_lowest_ratio() -> None:
    doc = base(groups=[{"name": "g", "maxSize": 1000}, {"name": "h", "maxSize": None}], lowestRatio=1.0)
    assert jobs_of(doc)[0]["group"] == "h"


# --------------------------------------------------------------------------- default candidates

RUNNING_DOC = {
    "files": {"a": 3, "b": 3, "c": 3, "d": 3, "x": 1, "y": 1},
    "groups": [{"name": "default"}],
}


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        # SYSTEM: files minus running inputs minus selected.
        ({"running": [{"kind": "USER", "files": ["x", "y"]}]}, [["a", "b", "c", "d"]]),
        ({"running": [{"kind": "SYSTEM", "files": ["x", "y"]}]}, []),  # waits for the projection
        ({"selected": ["x", "y"]}, [["a", "b", "c", "d"]]),
        ({"selected": ["a"]}, [["x", "y", "b", "c", "d"]]),
        ({}, [["x", "y", "a", "b", "c", "d"]]),
        # USER/SELECTOR: selected minus running; no selection, no candidates.
        ({"kind": "USER"}, []),
        ({"kind": "USER", "selected": None}, []),
        ({"kind": "SELECTOR", "selected": []}, []),
        ({"kind": "USER", "selected": ["a", "x"]}, [["x", "a"]]),
        ({"kind": "USER", "selected": ["a", "x"], "running": [{"kind": "SYSTEM", "files": ["x"]}]}, [["a"]]),
        # Given candidates are used as they are, even if they overlap selected or running files.
        ({"candidates": ["a", "b", "c", "d"], "selected": ["a"]}, [["a", "b", "c", "d"]]),
        ({"candidates": None, "selected": ["x"]}, [["y", "a", "b", "c", "d"]]),
        ({"candidates": []}, []),
    ],
)
def test_candidates(changes: dict[str, Any], expected: list[list[str]]) -> None:
    doc = base(**RUNNING_DOC)
    doc.update(changes)
    assert [job["files"] for job in jobs_of(doc)] == expected


# --------------------------------------------------------------------------- invalid input

INVALID: list[tuple[str, object, str]] = [
    # (id, document or raw text, text the message must contain)
    ("not-json", "{", "not valid JSON"),
    ("empty", "", "not valid JSON"),
    ("nan", EXAMPLE_TEXT.replace('"ratio": 3', '"ratio": NaN'), "NaN"),
    ("infinity", EXAMPLE_TEXT.replace('"ratio": 3', '"ratio": Infinity'), "Infinity"),
    ("neg-infinity", EXAMPLE_TEXT.replace('"ratio": 3', '"ratio": -Infinity'), "Infinity"),
    ("overflow-float", EXAMPLE_TEXT.replace('"ratio": 3', '"ratio": 1e999'), "ratio"),
    ("too-many-digits", EXAMPLE_TEXT.replace('"ratio": 3', '"ratio": ' + "9" * 5000), "not valid JSON"),
    ("array", [1, 2], "JSON object"),
    ("string", '"hello"', "JSON object"),
    ("null", "null", "JSON object"),
    ("missing-kind", base(kind=...), "kind"),
    ("missing-ratio", base(ratio=...), "ratio"),
    ("missing-maxOpen", base(maxOpen=...), "maxOpen"),
    ("missing-maxFilesPerTablet", base(maxFilesPerTablet=...), "maxFilesPerTablet"),
    ("missing-groups", base(groups=...), "groups"),
    ("missing-files", base(files=...), "files"),
    ("unknown-top", base(maxopen=10), "maxopen"),
    ("kind-bad", base(kind="MAJOR"), "kind"),
    ("kind-lower", base(kind="system"), "kind"),
    ("kind-null", base(kind=None), "kind"),
    ("ratio-bool", base(ratio=True), "ratio"),
    ("ratio-string", base(ratio="3"), "ratio"),
    ("ratio-low", base(ratio=0.99), "ratio"),
    ("ratio-null", base(ratio=None), "ratio"),
    ("maxOpen-1", base(maxOpen=1), "maxOpen"),
    ("maxOpen-float", base(maxOpen=10.0), "maxOpen"),
    ("maxOpen-bool", base(maxOpen=True), "maxOpen"),
    ("maxFiles-float", base(maxFilesPerTablet=15.5), "maxFilesPerTablet"),
    ("maxFiles-bool", base(maxFilesPerTablet=False), "maxFilesPerTablet"),
    ("maxFiles-string", base(maxFilesPerTablet="15"), "maxFilesPerTablet"),
    ("lowestRatio-low", base(lowestRatio=0.9), "lowestRatio"),
    ("lowestRatio-null", base(lowestRatio=None), "lowestRatio"),
    ("lowestRatio-bool", base(lowestRatio=True), "lowestRatio"),
    ("groups-empty", base(groups=[]), "groups"),
    ("groups-object", base(groups={"name": "a"}), "groups"),
    ("group-not-object", base(groups=["a"]), "groups[0]"),
    ("group-unknown-key", base(groups=[{"name": "a", "maxsize": "1M"}]), "groups[0].maxsize"),
    ("group-missing-name", base(groups=[{"maxSize": "1M"}]), "groups[0].name"),
    ("group-empty-name", base(groups=[{"name": ""}]), "groups[0].name"),
    ("group-name-number", base(groups=[{"name": 5}]), "groups[0].name"),
    ("group-dup-name", base(groups=[{"name": "a", "maxSize": 1}, {"name": "a"}]), "groups[1].name"),
    ("group-two-unbounded", base(groups=[{"name": "a"}, {"name": "b", "maxSize": None}]), "groups[1].maxSize"),
    (
        "group-dup-size",
        base(groups=[{"name": "a", "maxSize": "100M"}, {"name": "b", "maxSize": 104857600}, {"name": "c"}]),
        "groups[1].maxSize",
    ),
    ("group-size-zero", base(groups=[{"name": "a", "maxSize": 0}]), "groups[0].maxSize"),
    ("group-size-zero-string", base(groups=[{"name": "a", "maxSize": "0K"}]), "groups[0].maxSize"),
    ("group-size-negative", base(groups=[{"name": "a", "maxSize": -1}]), "groups[0].maxSize"),
    ("group-size-fraction", base(groups=[{"name": "a", "maxSize": "1.5M"}]), "groups[0].maxSize"),
    ("group-size-k8s-decimal", base(groups=[{"name": "a", "maxSize": "1T"}]), "groups[0].maxSize"),
    ("group-size-float", base(groups=[{"name": "a", "maxSize": 1.5}]), "groups[0].maxSize"),
    ("group-size-bool", base(groups=[{"name": "a", "maxSize": True}]), "groups[0].maxSize"),
    ("group-size-huge", base(groups=[{"name": "a", "maxSize": 2**63}]), "groups[0].maxSize"),
    ("files-list", base(files=["a"]), "files"),
    ("file-negative", base(files={"a": -1}), 'files["a"]'),
    ("file-float", base(files={"a": 1.0}), 'files["a"]'),
    ("file-bool", base(files={"a": True}), 'files["a"]'),
    ("file-string", base(files={"a": "1M"}), 'files["a"]'),
    ("file-null", base(files={"a": None}), 'files["a"]'),
    ("file-huge", base(files={"a": 2**63}), 'files["a"]'),
    ("candidates-string", base(candidates="f1"), "candidates"),
    ("candidates-unknown", base(candidates=["f1", "zz"]), "candidates[1]"),
    ("candidates-repeat", base(candidates=["f1", "f2", "f1"]), "candidates[2]"),
    ("candidates-number", base(candidates=[1]), "candidates[0]"),
    ("selected-unknown", base(selected=["zz"]), "selected[0]"),
    ("selected-repeat", base(selected=["f1", "f1"]), "selected[1]"),
    ("selected-object", base(selected={"f1": 1}), "selected"),
    ("running-null", base(running=None), "running"),
    ("running-object", base(running={"kind": "USER", "files": ["f1"]}), "running"),
    ("running-entry-list", base(running=[["f1"]]), "running[0]"),
    ("running-unknown-key", base(running=[{"kind": "USER", "files": ["f1"], "ecid": "x"}]), "running[0].ecid"),
    ("running-missing-files", base(running=[{"kind": "USER"}]), "running[0].files"),
    ("running-missing-kind", base(running=[{"files": ["f1"]}]), "running[0].kind"),
    ("running-bad-kind", base(running=[{"kind": "MAJC", "files": ["f1"]}]), "running[0].kind"),
    ("running-empty-files", base(running=[{"kind": "USER", "files": []}]), "running[0].files"),
    ("running-unknown-file", base(running=[{"kind": "USER", "files": ["zz"]}]), "running[0].files[0]"),
    ("running-repeat", base(running=[{"kind": "USER", "files": ["f1", "f1"]}]), "running[0].files[1]"),
    (
        "running-file-twice",
        base(running=[{"kind": "USER", "files": ["f1"]}, {"kind": "SYSTEM", "files": ["f2", "f1"]}]),
        "running[1].files[1]",
    ),
]


@pytest.mark.parametrize(
    ("doc", "needle"), [(doc, needle) for _, doc, needle in INVALID], ids=[i for i, _, _ in INVALID]
)
def test_invalid_input(doc: object, needle: str) -> None:
    text = doc if isinstance(doc, str) else json.dumps(doc)
    result = invoke(text)
    assert result.exit_code == 2, result.stdout
    assert result.stdout == ""
    assert result.stderr.endswith("\n") and result.stderr.count("\n") == 1
    assert needle in result.stderr


TOP_UNKNOWN = (
    "unknown key (expected one of kind, ratio, maxOpen, maxFilesPerTablet, groups, files, lowestRatio, candidates, "
    "running, selected)"
)
SIZE_GRAMMAR = (
    "expected integer bytes, or digits with a K, M, G (binary, any case), B, Ki, Mi, Gi or Ti suffix, e.g. '32M'"
)
#: The exact message of each invalid document above (users' scripts match them); the JSON decoder's
#: own messages (not-json, empty, too-many-digits) come from the Python version and are left out.
EXACT: dict[str, str] = dict(
    [
        ("nan", "input is not valid JSON: NaN is not allowed"),
        ("infinity", "input is not valid JSON: Infinity is not allowed"),
        ("neg-infinity", "input is not valid JSON: -Infinity is not allowed"),
        ("overflow-float", "ratio: must be a finite number"),
        ("array", "input must be a JSON object, got a list"),
        ("string", "input must be a JSON object, got a string"),
        ("null", "input must be a JSON object, got null"),
        ("missing-kind", "kind: required key is missing"),
        ("missing-ratio", "ratio: required key is missing"),
        ("missing-maxOpen", "maxOpen: required key is missing"),
        ("missing-maxFilesPerTablet", "maxFilesPerTablet: required key is missing"),
        ("missing-groups", "groups: required key is missing"),
        ("missing-files", "files: required key is missing"),
        (
            "unknown-top",
            "maxopen: " + TOP_UNKNOWN,
        ),
        ("kind-bad", 'kind: must be one of "SYSTEM", "USER", "SELECTOR", got "MAJOR"'),
        ("kind-lower", 'kind: must be one of "SYSTEM", "USER", "SELECTOR", got "system"'),
        ("kind-null", 'kind: must be one of "SYSTEM", "USER", "SELECTOR", got null'),
        ("ratio-bool", "ratio: must be a number, got a boolean"),
        ("ratio-string", "ratio: must be a number, got a string"),
        ("ratio-low", "ratio: must be >= 1, got 0.99"),
        ("ratio-null", "ratio: must be a number, got null"),
        ("maxOpen-1", "maxOpen: must be an integer >= 2, got 1"),
        ("maxOpen-float", "maxOpen: must be an integer, got a number"),
        ("maxOpen-bool", "maxOpen: must be an integer, got a boolean"),
        ("maxFiles-float", "maxFilesPerTablet: must be an integer, got a number"),
        ("maxFiles-bool", "maxFilesPerTablet: must be an integer, got a boolean"),
        ("maxFiles-string", "maxFilesPerTablet: must be an integer, got a string"),
        ("lowestRatio-low", "lowestRatio: must be >= 1, got 0.9"),
        ("lowestRatio-null", "lowestRatio: must be a number, got null"),
        ("lowestRatio-bool", "lowestRatio: must be a number, got a boolean"),
        ("groups-empty", "groups: at least one group is required"),
        ("groups-object", "groups: must be a list of groups, got an object"),
        ("group-not-object", "groups[0]: must be an object with name and maxSize, got a string"),
        ("group-unknown-key", "groups[0].maxsize: unknown key (expected one of name, maxSize)"),
        ("group-missing-name", "groups[0].name: required key is missing"),
        ("group-empty-name", "groups[0].name: a non-empty name is required"),
        ("group-name-number", "groups[0].name: must be a string, got an integer"),
        ("group-dup-name", "groups[1].name: duplicate group name 'a' (also groups[0])"),
        ("group-two-unbounded", "groups[1].maxSize: more than one unbounded group ('a' and 'b')"),
        ("group-dup-size", "groups[1].maxSize: duplicate maxSize 104857600 (also groups[0])"),
        ("group-size-zero", "groups[0].maxSize: must be > 0, got 0"),
        ("group-size-zero-string", "groups[0].maxSize: must be > 0, got 0"),
        ("group-size-negative", "groups[0].maxSize: must be > 0, got -1"),
        (
            "group-size-fraction",
            "groups[0].maxSize: invalid size '1.5M': " + SIZE_GRAMMAR,
        ),
        (
            "group-size-k8s-decimal",
            "groups[0].maxSize: invalid size '1T': " + SIZE_GRAMMAR,
        ),
        ("group-size-float", "groups[0].maxSize: must be integer bytes or a size string, got a number"),
        ("group-size-bool", "groups[0].maxSize: must be integer bytes or a size string, got a boolean"),
        ("group-size-huge", "groups[0].maxSize: must be at most 9223372036854775807 bytes, got 9223372036854775808"),
        ("files-list", "files: must be an object mapping file names to sizes, got a list"),
        ("file-negative", 'files["a"]: must be >= 0, got -1'),
        ("file-float", 'files["a"]: must be integer bytes, got a number'),
        ("file-bool", 'files["a"]: must be integer bytes, got a boolean'),
        ("file-string", 'files["a"]: must be integer bytes, got a string'),
        ("file-null", 'files["a"]: must be integer bytes, got null'),
        ("file-huge", 'files["a"]: must be at most 9223372036854775807 bytes, got 9223372036854775808'),
        ("candidates-string", "candidates: must be a list of file names, got a string"),
        ("candidates-unknown", 'candidates[1]: "zz" is not in files'),
        ("candidates-repeat", 'candidates[2]: "f1" is repeated'),
        ("candidates-number", "candidates[0]: must be a file name (string), got an integer"),
        ("selected-unknown", 'selected[0]: "zz" is not in files'),
        ("selected-repeat", 'selected[1]: "f1" is repeated'),
        ("selected-object", "selected: must be a list of file names, got an object"),
        ("running-null", "running: must be a list of running compactions, got null"),
        ("running-object", "running: must be a list of running compactions, got an object"),
        ("running-entry-list", "running[0]: must be an object with kind and files, got a list"),
        ("running-unknown-key", "running[0].ecid: unknown key (expected one of kind, files)"),
        ("running-missing-files", "running[0].files: required key is missing"),
        ("running-missing-kind", "running[0].kind: required key is missing"),
        ("running-bad-kind", 'running[0].kind: must be one of "SYSTEM", "USER", "SELECTOR", got "MAJC"'),
        ("running-empty-files", "running[0].files: must not be empty"),
        ("running-unknown-file", 'running[0].files[0]: "zz" is not in files'),
        ("running-repeat", 'running[0].files[1]: "f1" is repeated'),
        (
            "running-file-twice",
            'running[1].files[1]: "f1" is already in running[0]: a file is in at most one running compaction',
        ),
    ]
)


@pytest.mark.parametrize(("case_id", "message"), list(EXACT.items()), ids=list(EXACT))
def test_exact_messages(case_id: str, message: str) -> None:
    doc = next(doc for i, doc, _ in INVALID if i == case_id)
    result = invoke(doc if isinstance(doc, str) else json.dumps(doc))
    assert (result.exit_code, result.stdout, result.stderr) == (2, "", f"kompaktor plan: {message}\n")


def test_invalid_ids_unique() -> None:
    ids = [i for i, _, _ in INVALID]
    assert len(ids) == len(set(ids))


def test_messages_name_the_key() -> None:
    result = run_doc(base(groups=[{"name": "a", "maxSize": 0}]))
    assert result.stderr == "kompaktor plan: groups[0].maxSize: must be > 0, got 0\n"
    result = run_doc(base(extra=1))
    assert result.stderr.startswith("kompaktor plan: extra: unknown key")


@pytest.mark.parametrize(
    ("make_path", "needle"),
    [
        (lambda tmp: tmp / "missing.json", "cannot read"),
        (lambda tmp: tmp, "cannot read"),  # a directory
    ],
)
def test_unreadable_file(tmp_path: Path, make_path: Any, needle: str) -> None:
    result = CliRunner().invoke(plan, [str(make_path(tmp_path))])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and needle in result.stderr


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(b'{"kind": "\xff"}')
    result = CliRunner().invoke(plan, [str(path)])
    assert (result.exit_code, result.stdout) == (2, "")
    assert "UTF-8" in result.stderr and result.stderr.count("\n") == 1


def test_missing_argument_is_a_usage_error() -> None:
    result = CliRunner().invoke(plan, [])
    assert result.exit_code == 2
    assert result.stdout == ""
