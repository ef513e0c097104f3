"""The benchmarks use the test harness, never the other way round (issue 38 §3): no file under
tests/ imports ``bench``, at its top or inside a function. The import contract in pyproject.toml
covers tests/ and tests/support (packages) with their indirect imports; the test files in
tests/unit, integration, ... are no package (pytest's importlib mode), so they are read here
with ``ast``: nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _bench_imports(source: str) -> list[int]:
    """The lines of ``source`` that import ``bench`` or a module of it."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        if any(n == "bench" or n.startswith("bench.") for n in names):
            lines.append(node.lineno)
    return lines


def test_the_reader_finds_every_form_of_import_of_bench() -> None:
    source = (
        "import bench\nimport os, bench.soak as s\nfrom bench import soak\nfrom bench.merge_bench import generate\n"
        "def f():\n    from bench.common import descendants\n"
        "import benchmark\nfrom tests.support.growth import growth\nfrom . import bench\n"
    )
    assert _bench_imports(source) == [1, 2, 3, 4, 6]


def test_no_test_imports_the_benchmarks() -> None:
    found = {
        f"{path.relative_to(TESTS.parent)}:{line}"
        for path in TESTS.rglob("*.py")
        for line in _bench_imports(path.read_text())
    }
    assert not found, f"tests import bench (move what they need into tests/support): {sorted(found)}"
