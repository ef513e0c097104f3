"""Every third-party module the shipped packages import is declared (issue 26 §5): a module
imported but not in ``[project.dependencies]`` (or in its extra: ``spark`` for PySpark,
``operator`` for kopf and the asyncio Kubernetes client; each image installs only its own)
works on a developer's machine, where the dev extras bring it, and fails in the image (numpy
was one). The test suite and the benchmarks may import any extra's modules (dev, bench), and
nothing else. Read from the source with ``ast``: nothing is imported."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections.abc import Callable
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"compactor/kompaktor": "kompaktor", "operator/kompaktor_operator": "kompaktor_operator"}
#: the test suite and the benchmarks: any extra
DEV = {"tests": "tests", "bench": "bench"}
#: where an optional extra may be imported (and must be imported lazily, or only there)
EXTRAS = {"pyspark": "spark", "kopf": "operator", "kubernetes_asyncio": "operator", "aiohttp": "operator"}


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


def _declared() -> tuple[set[str], dict[str, set[str]]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {_normal(re.split(r"[\[<>=!~;\s]", d, maxsplit=1)[0]) for d in project["dependencies"]}
    extras = {
        extra: {_normal(re.split(r"[\[<>=!~;\s]", d, maxsplit=1)[0]) for d in deps}
        for extra, deps in project["optional-dependencies"].items()
    }
    return declared, extras


def _undeclared(folders: dict[str, str], allowed: Callable[[str, set[str]], bool]) -> dict[str, set[str]]:
    """Third-party modules imported under ``folders`` whose distributions ``allowed`` refuses."""
    dists = packages_distributions()
    ours = {"kompaktor", "kompaktor_operator", *folders.values()}
    missing: dict[str, set[str]] = {}
    for folder in folders:
        for path in (ROOT / folder).rglob("*.py"):
            for mod in _imports(path) - ours - set(sys.stdlib_module_names) - {"__future__"}:
                if not allowed(mod, {_normal(d) for d in dists.get(mod, [mod])}):
                    missing.setdefault(mod, set()).add(str(path.relative_to(ROOT)))
    return missing


def test_every_imported_third_party_module_is_declared() -> None:
    declared, extras = _declared()

    def allowed(mod: str, names: set[str]) -> bool:
        extra = EXTRAS.get(mod)
        return bool(names & declared or (extra and names & extras[extra]))

    missing = _undeclared(PACKAGES, allowed)
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


def test_tests_and_benchmarks_import_only_declared_modules() -> None:
    declared, extras = _declared()
    everything = declared.union(*extras.values())
    missing = _undeclared(DEV, lambda mod, names: bool(names & everything))
    assert not missing, f"imported by tests/ or bench/ but in no extra of pyproject.toml: {missing}"
