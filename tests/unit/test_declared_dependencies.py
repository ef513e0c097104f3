"""Every third-party module the shipped packages import is declared (issue 26 §5): a module
imported but not in ``[project.dependencies]`` (or, for the Spark engine, the ``spark`` extra)
works on a developer's machine, where the dev extras bring it, and fails in the image (numpy
was one). Read from the source with ``ast``: nothing is imported."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"compactor/kompaktor": "kompaktor", "operator/kompaktor_operator": "kompaktor_operator"}
#: where an optional extra may be imported (and must be imported lazily, or only there)
EXTRAS = {"pyspark": "spark"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_imported_third_party_module_is_declared() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {_normal(re.split(r"[\[<>=!~;\s]", d, maxsplit=1)[0]) for d in project["dependencies"]}
    extras = {
        extra: {_normal(re.split(r"[\[<>=!~;\s]", d, maxsplit=1)[0]) for d in deps}
        for extra, deps in project["optional-dependencies"].items()
    }
    dists = packages_distributions()
    ours = set(PACKAGES.values())
    missing: dict[str, set[str]] = {}
    for folder in PACKAGES:
        for path in (ROOT / folder).rglob("*.py"):
            for mod in _imports(path) - ours - set(sys.stdlib_module_names) - {"__future__"}:
                names = {_normal(d) for d in dists.get(mod, [mod])}
                extra = EXTRAS.get(mod)
                if names & declared or (extra and names & extras[extra]):
                    continue
                missing.setdefault(mod, set()).add(str(path.relative_to(ROOT)))
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"
