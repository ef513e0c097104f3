"""The metadata store's Redis connection is private to ``kompaktor.metadata`` (issue 38 §2): no
code outside that package, the tests and benchmarks included, reads another object's ``_r``
(a class's own ``self._r`` is its own business). Tests reach Redis through
``tests.support.rawredis``. The sources are read with ``ast``: nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
METADATA = ROOT / "compactor" / "kompaktor" / "metadata"


def foreign_private_client_uses(source: str) -> list[int]:
    """The lines of ``source`` that read ``<something>._r`` where the something is not ``self``."""
    return sorted(
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute)
        and node.attr == "_r"
        and not (isinstance(node.value, ast.Name) and node.value.id == "self")
    )


def test_the_reader_finds_a_foreign_client_but_not_a_class_s_own() -> None:
    source = "x = store._r.get('k')\nself._r.set('k', 1)\ny = self.store._r\nz = s._rest\nw = q._r\n"
    assert foreign_private_client_uses(source) == [1, 3, 5]


def test_nothing_outside_the_metadata_package_reaches_the_store_s_connection() -> None:
    found = {
        str(path.relative_to(ROOT)): lines
        for top in ("compactor", "operator", "tests", "bench")
        for path in sorted((ROOT / top).rglob("*.py"))
        if METADATA not in path.parents and (lines := foreign_private_client_uses(path.read_text()))
    }
    assert found == {}
