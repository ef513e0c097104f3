"""The project's images as `make images` builds them (scripts/build-images.sh), as OCI archives.

The build is cached by its inputs, so calling this when nothing changed costs about a second.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build-images.sh"


def ensure_images() -> dict[str, Path]:
    """Image reference -> OCI archive, for the operator, compactor and Redis images and the test
    node's pause image (built with buildah or podman: docker keeps images in its own store)."""
    out = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"{SCRIPT} failed ({out.returncode}):\n{out.stderr[-4000:]}")
    lines = out.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(
            f"{SCRIPT} wrote no images.json (docker keeps images in its engine; the test tier "
            "needs buildah or podman: CONTAINER_TOOL=buildah)"
        )
    manifest = json.loads(Path(lines[-1]).read_text())
    return {ref: Path(path) for ref, path in manifest.items()}
