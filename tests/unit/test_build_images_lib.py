"""The steps of `make images` that can fail half-way (scripts/build-images-lib.sh), run in bash with
a stub in place of pip and of the container tool: a failed wheel build fails and caches nothing;
a rebuilt image replaces its archive and its old copy in the tool's storage."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIB = ROOT / "scripts" / "build-images-lib.sh"
SCRIPT = ROOT / "scripts" / "build-images.sh"

#: `python -m pip wheel ... --wheel-dir DIR ...`: writes the wheels pip would have made by the time
#: it stopped (pyspark and kopf among them), then exits with $STUB_STATUS
PIP_STUB = """#!/usr/bin/env bash
while [[ $# -gt 0 && $1 != --wheel-dir ]]; do shift; done
touch "$2/pyspark-3.5.0-py2.py3-none-any.whl" "$2/kopf-1.37.0-py3-none-any.whl" "$2/kompaktor-0.1.0-py3-none-any.whl"
[[ $STUB_STATUS == 0 ]] || echo "ERROR: Failed building wheel for pyarrow" >&2
echo "WARNING: Location 'x' is ignored: it is either a non-existing path or lacks a specific scheme." >&2
exit "$STUB_STATUS"
"""

#: the container tool: records each call, `push` writes the archive it was asked for
TOOL_STUB = """#!/usr/bin/env bash
echo "$*" >> "$CALLS"
if [[ $1 == push ]]; then dest="${4#oci-archive:}"; touch "${dest%:"$3"}"; fi
"""


def _stub(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def _bash(code: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", f"set -euo pipefail; source {LIB}; {code}"],
        cwd=tmp_path,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_a_failed_wheel_build_fails_and_caches_nothing(tmp_path: Path) -> None:
    py = _stub(tmp_path / "python", PIP_STUB)
    house = tmp_path / "deps-abc"
    out = _bash(f'PY={py}; wheelhouse "{house}"; echo cached', tmp_path, STUB_STATUS="1")
    assert out.returncode == 1, out
    assert "cached" not in out.stdout
    assert "Failed building wheel for pyarrow" in out.stderr, out.stderr
    assert "no wheelhouse cached" in out.stderr.splitlines()[-1], out.stderr
    assert "is ignored" not in out.stderr
    assert not house.exists() and not Path(f"{house}.partial").exists()


def test_a_whole_wheelhouse_is_cached_without_the_package_and_reused(tmp_path: Path) -> None:
    py = _stub(tmp_path / "python", PIP_STUB)
    house = tmp_path / "deps-abc"
    out = _bash(f'PY={py}; wheelhouse "{house}"', tmp_path, STUB_STATUS="0")
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in house.iterdir()) == [
        ".complete",
        "kopf-1.37.0-py3-none-any.whl",
        "pyspark-3.5.0-py2.py3-none-any.whl",
    ]
    # cached: pip is not asked again (it would fail now)
    again = _bash(f'PY={py}; wheelhouse "{house}"', tmp_path, STUB_STATUS="1")
    assert again.returncode == 0, again.stderr


def test_a_failed_package_wheel_fails_the_step(tmp_path: Path) -> None:
    py = _stub(tmp_path / "python", PIP_STUB)
    (tmp_path / "pkg").mkdir()
    out = _bash(f'PY={py}; pip_wheel --no-deps --wheel-dir "{tmp_path}/pkg" .; echo went-on', tmp_path, STUB_STATUS="1")
    assert out.returncode == 1 and "went-on" not in out.stdout, out


def test_the_build_script_uses_these_steps_for_every_wheel_and_image() -> None:
    script = SCRIPT.read_text()
    assert "pip wheel" not in script and "|| true" not in script.split("# --- the wheelhouse")[1]
    assert re.search(r'^wheelhouse "\$DEPS"$', script, re.M)
    assert re.search(r"^pip_wheel --no-deps --wheel-dir \S+ \.$", script, re.M)
    assert len(re.findall(r"^\s*publish ", script, re.M)) == 2  # the three images, the pause image
    assert " push " not in script


def test_a_rebuilt_image_replaces_its_archive_and_prunes_its_old_copy(tmp_path: Path) -> None:
    _stub(tmp_path / "buildah", TOOL_STUB)
    cache = tmp_path / "images"
    cache.mkdir()
    (cache / "pause-old.tar").touch()
    (cache / "compactor-keep.tar").touch()
    calls = tmp_path / "calls"
    out = _bash(
        f'PATH={tmp_path}:$PATH; TOOL=buildah; CACHE={cache}; publish pause img:3.2 "{cache}/pause-new.tar"',
        tmp_path,
        CALLS=str(calls),
    )
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in cache.iterdir()) == ["compactor-keep.tar", "pause-new.tar"]
    assert calls.read_text().splitlines() == [
        f"push -q img:3.2 oci-archive:{cache}/partial-pause.tar:img:3.2",
        "rmi --prune",
    ]
