"""The project's releases as docs/upgrading.md lists them: version and commit, newest first.

The upgrade tests find "the previous release" here rather than by tag, so that a clone without
tags (a branch pushed alone) still has it."""

from __future__ import annotations

import re
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_ROW = re.compile(r"^\|\s*(\d+\.\d+\.\d+)\s*\|\s*([0-9a-f]{40})\s*\|")


@dataclass(frozen=True)
class Release:
    version: str
    commit: str


def releases(doc: Path = ROOT / "docs" / "upgrading.md") -> list[Release]:
    """Every release in the table of ``doc``, newest first."""
    out = [Release(m[1], m[2]) for line in doc.read_text().splitlines() if (m := _ROW.match(line))]
    if not out:
        raise ValueError(f"{doc}: no release rows (| X.Y.Z | <40-hex commit> |)")
    return out


def current_version() -> str:
    text = (ROOT / "compactor" / "kompaktor" / "__init__.py").read_text()
    m = re.search(r'^__version__ = "([^"]+)"', text, re.M)
    assert m, "no __version__"
    return m[1]


def previous() -> Release:
    """The newest release that is not this checkout's version."""
    cur = current_version()
    return next(r for r in releases() if r.version != cur)


def checkout(rel: Release, dest: Path) -> Path:
    """The tree of ``rel`` extracted into ``dest`` (``git archive``: no work tree of ours touched)."""
    dest.mkdir(parents=True, exist_ok=True)
    tar = dest / "tree.tar"
    with tar.open("wb") as f:
        subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rel.commit], stdout=f, check=True)
    with tarfile.open(tar) as t:
        t.extractall(dest / "tree", filter="data")
    tar.unlink()
    return dest / "tree"
