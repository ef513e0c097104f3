"""`make mutation` removes one guard at a time by replacing its text (scripts/mutation.py). A
refactor that changes a guard's text would make that mutant fail to apply only when someone runs
the slow target; this test fails at once instead: every guard's text occurs exactly once, and
every test a mutant names exists (docs/verification.md, "Guards killed by mutation")."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _mutants() -> list[object]:
    spec = importlib.util.spec_from_file_location("kompaktor_mutation_script", ROOT / "scripts" / "mutation.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return [*module.MUTANTS, *module.CONDITIONS]


MUTANTS = _mutants()


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)  # type: ignore[attr-defined]
def test_each_guard_is_where_its_mutant_looks(mutant: object) -> None:
    text = (ROOT / "compactor" / "kompaktor" / mutant.path).read_text()  # type: ignore[attr-defined]
    assert text.count(mutant.original) == 1, f"{mutant.name}: update scripts/mutation.py"  # type: ignore[attr-defined]


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)  # type: ignore[attr-defined]
def test_each_mutants_tests_exist(mutant: object) -> None:
    for test in mutant.tests:  # type: ignore[attr-defined]
        path, _, name = test.partition("::")
        base = re.sub(r"\[.*\]$", "", name)
        assert re.search(rf"^def {re.escape(base)}\(", (ROOT / path).read_text(), re.M), test
