"""The project's images as `make images` builds them (scripts/build-images.sh), as OCI archives;
and a previous release's, built from that release's own tree (:func:`release_images`).

The build is cached by its inputs, so calling this when nothing changed costs about a second.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.releases import Release, checkout

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build-images.sh"


def _cache() -> Path:
    return Path(os.environ.get("KOMPAKTOR_IMAGE_CACHE", Path.home() / ".cache" / "kompaktor" / "images"))


def _build(script: Path, cwd: Path, env: dict[str, str] | None = None) -> dict[str, Path]:
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, cwd=cwd, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{script} failed ({out.returncode}):\n{out.stderr[-4000:]}")
    lines = out.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(
            f"{script} wrote no images.json (docker keeps images in its engine; the test tier "
            "needs buildah or podman: CONTAINER_TOOL=buildah)"
        )
    manifest = json.loads(Path(lines[-1]).read_text())
    return {ref: Path(path) for ref, path in manifest.items()}


def ensure_images() -> dict[str, Path]:
    """Image reference -> OCI archive, for the operator, compactor and Redis images and the test
    node's pause image (built with buildah or podman: docker keeps images in its own store)."""
    return _build(SCRIPT, ROOT)


def release_images(rel: Release, work: Path) -> dict[str, Path]:
    """Image reference -> OCI archive for ``rel``'s operator, compactor and Redis images, built by
    ``rel``'s own scripts/build-images.sh from ``rel``'s tree (extracted under ``work``), so they
    carry its version and code.

    They are cached by their inputs as this checkout's are, in a cache of their own
    (``images-<version>`` beside it): the script keeps one archive per image name in its cache and
    removes the others, so sharing this checkout's would rebuild both every run. The Debian base
    is the same for both (same suite, mirror and packages): its tarball is linked in rather than
    made again with mmdebstrap."""
    cache = _cache().with_name(f"images-{rel.version}")
    cache.mkdir(parents=True, exist_ok=True)
    _share_bases(_cache(), cache)
    tree = checkout(rel, work)
    env = {**os.environ, "KOMPAKTOR_IMAGE_CACHE": str(cache), "PYTHON": sys.executable}
    images = _build(tree / "scripts" / "build-images.sh", tree, env)
    _share_bases(cache, _cache())
    return {ref: path for ref, path in images.items() if rel.version in ref}


def _share_bases(src: Path, dest: Path) -> None:
    """Hard-link ``src``'s Debian base tarballs into ``dest`` (named by the hash of their inputs:
    the same name is the same base), whichever cache made one first."""
    dest.mkdir(parents=True, exist_ok=True)
    for base in src.glob("debian-base-*.tar"):
        if not (dest / base.name).exists():
            os.link(base, dest / base.name)
