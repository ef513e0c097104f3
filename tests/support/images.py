"""The project's images as `make images` builds them (scripts/build-images.sh), as OCI archives;
and a previous release's, built from that release's own tree (:func:`release_images`).

The build is cached by its inputs, so calling this when nothing changed costs about a second.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Rebuilt:
    """An image rebuilt under the same reference: its OCI archive, its manifest digest (what a
    registry serves it by, and what the chart's ``*.image.digest`` values pin) and its image ID
    (the digest of its config)."""

    ref: str
    archive: Path
    digest: str
    image_id: str


def rebuilt(archive: Path, dest: Path, stamp: str) -> Rebuilt:
    """``archive``'s image with one more layer (a file ``/etc/kompaktor-rebuild`` holding
    ``stamp``), under the same reference — a rebuild of the same version whose content differs,
    as a user's rebuild of the same tag is. Written as an OCI archive at ``dest`` holding only what
    the rebuild added (the layer, the config, the manifest): it imports into a containerd that
    holds the original's layers, as a registry pull fetches only the layers a node lacks. The
    original is only read, so the shared image cache is never touched."""
    with tarfile.open(archive) as tar:
        index = json.loads(_member(tar, "index.json"))
        desc = index["manifests"][0]
        manifest = json.loads(_member(tar, _blob_path(desc["digest"])))
        config = json.loads(_member(tar, _blob_path(manifest["config"]["digest"])))
        layer = _one_file_layer("etc/kompaktor-rebuild", stamp.encode())
        config["rootfs"]["diff_ids"].append(_digest(layer))
        config.setdefault("history", []).append({"created_by": f"kompaktor test rebuild {stamp}"})
        config_bytes = json.dumps(config).encode()
        manifest["config"] = {**manifest["config"], "digest": _digest(config_bytes), "size": len(config_bytes)}
        layer_type = "application/vnd.oci.image.layer.v1.tar"
        manifest["layers"].append({"mediaType": layer_type, "digest": _digest(layer), "size": len(layer)})
        manifest_bytes = json.dumps(manifest).encode()
        index["manifests"][0] = {**desc, "digest": _digest(manifest_bytes), "size": len(manifest_bytes)}
        with tarfile.open(dest, "w") as out:
            _add(out, "oci-layout", _member(tar, "oci-layout"))
            for data in (layer, config_bytes, manifest_bytes):
                _add(out, _blob_path(_digest(data)), data)
            _add(out, "index.json", json.dumps(index).encode())
    ref = desc["annotations"]["org.opencontainers.image.ref.name"]
    return Rebuilt(ref, dest, _digest(manifest_bytes), _digest(config_bytes))


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _blob_path(digest: str) -> str:
    return "blobs/" + digest.replace(":", "/", 1)


def _member(tar: tarfile.TarFile, name: str) -> bytes:
    f = tar.extractfile(name)
    assert f is not None, name
    return f.read()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _one_file_layer(name: str, data: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as layer:
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), 0o644
        layer.addfile(info, io.BytesIO(data))
    return buf.getvalue()
