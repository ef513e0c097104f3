"""Every function of the product reads in one screen: under 60 lines, its decorators included
(a click command's options count), or one comment line inside it beginning ``# long`` says why."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (ROOT / "compactor" / "kompaktor", ROOT / "operator" / "kompaktor_operator")
LIMIT = 60


def long_functions() -> list[str]:
    """``path:line name (n lines)`` of each function of ``PACKAGES`` over the limit without a reason."""
    found = []
    for package in PACKAGES:
        for path in sorted(package.rglob("*.py")):
            lines = path.read_text().splitlines()
            for node in ast.walk(ast.parse("\n".join(lines))):
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                span = lines[first - 1 : node.end_lineno]
                said = any(line.strip().startswith("# long") or "# long:" in line for line in span)
                if len(span) >= LIMIT and not said:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({len(span)} lines)")
    return found


def test_every_function_is_short_or_says_why() -> None:
    assert long_functions() == []
