"""The images as built by `make images`, run in a real container runtime (containerd + runc).

As the pods run them: as the images' own numeric USER, 10001 (Redis 999), a read-only root
filesystem, only /tmp (and the mounted data) writable. The compactor image starts, imports every
engine, and merges real files mounted into it to exactly the bytes the host's engine writes; the
operator image has no PySpark; the Redis image serves as uid 999 from a read-only root
with its data on a mounted volume.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kompaktor import __version__
from kompaktor.files.sortedfile import write_sorted
from kompaktor.files.storage import Storage
from kompaktor.model.keys import Entry
from tests.support.entries import entries

BIN = Path(sys.executable).parent
COMPACTOR = f"ghcr.io/kompaktor/kompaktor-compactor:{__version__}"
OPERATOR = f"ghcr.io/kompaktor/kompaktor-operator:{__version__}"
REDIS = f"ghcr.io/kompaktor/kompaktor-redis:{__version__}"


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from tests.support.containerd import Containerd
    from tests.support.images import ensure_images

    images = ensure_images()
    ctd = Containerd(tmp_path_factory.mktemp("containerd"))
    ctd.start()
    try:
        for ref in (COMPACTOR, OPERATOR, REDIS):
            ctd.import_image(images[ref])
        yield ctd
    finally:
        ctd.stop()


def _ok(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 0, f"exit {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    return out.stdout


def test_compactor_image_starts_as_10001_on_a_read_only_root(runtime) -> None:
    assert __version__ in _ok(runtime.run(COMPACTOR, ["kompaktor", "--version"]))
    out = _ok(runtime.run(COMPACTOR, ["sh", "-c", "id -u; touch /opt/x 2>&1; touch /scratch/x 2>&1; true"]))
    assert out.splitlines()[0] == "10001"
    assert "Read-only file system" in out  # the root and /scratch (a volume in pods) are not writable here


def test_every_engine_imports_in_the_compactor_image(runtime) -> None:
    code = (
        "import importlib; from kompaktor.engines import ENGINES; "
        "[importlib.import_module(f'kompaktor.engines.{e}') for e in ENGINES]; "
        "import numpy, pyarrow, pyspark; print('engines', *ENGINES)"
    )
    assert _ok(runtime.run(COMPACTOR, ["python3", "-c", code])).strip() == "engines spark arrow"


def _entries(version: int, rows: range) -> list[Entry]:
    """Rows ``r%06d`` over seven qualifiers, one row in 97 a delete marker."""
    return entries(
        rows,
        version,
        prefix="r",
        width=6,
        cf=b"cf",
        cq=lambda r: f"q{r % 7}".encode(),
        deleted=lambda r: r % 97 == version,
        value=lambda r: f"value-{version}-{r}".encode(),
    )


@pytest.mark.parametrize("engine", ["arrow", "spark"])
def test_a_merge_in_the_image_gives_the_hosts_bytes(runtime, tmp_path: Path, engine: str) -> None:
    data = tmp_path / "data"
    storage = Storage.from_uri(str(data))
    inputs = []
    for version in range(3):
        write_sorted(storage, f"in-{version}.parquet", _entries(version, range(version * 500, 20_000, 3)))
        inputs.append(f"in-{version}.parquet")
    os.chmod(data, 0o777)
    args = ["merge", *inputs, "--engine", engine, "--spark-master", "local[1]"]
    host = subprocess.run(
        [str(BIN / "kompaktor"), *args, "-o", str(data / "host.parquet")],
        cwd=data,
        capture_output=True,
        text=True,
        timeout=300,
    )
    _ok(host)
    scratch = tmp_path / "scratch"  # an emptyDir in pods
    scratch.mkdir(mode=0o777)
    os.chmod(scratch, 0o777)
    _ok(
        runtime.run(
            COMPACTOR,
            ["sh", "-c", f"cd /data && kompaktor {' '.join(args)} -o image.parquet"],
            mounts=[(data, "/data", False), (scratch, "/scratch", False)],
        )
    )
    assert (data / "image.parquet").read_bytes() == (data / "host.parquet").read_bytes()


def test_operator_image_has_no_pyspark(runtime, tmp_path: Path) -> None:
    _ok(runtime.run(OPERATOR, ["kompaktor", "operator", "--help"]))
    out = runtime.run(OPERATOR, ["python3", "-c", "import pyspark"])
    assert out.returncode != 0 and "No module named 'pyspark'" in out.stderr
    # and asking its CLI for the spark engine says what is missing in one line
    write_sorted(Storage.from_uri(str(tmp_path)), "in.parquet", _entries(0, range(10)))
    os.chmod(tmp_path, 0o755)  # readable by the image's uid 10001
    os.chmod(tmp_path / "in.parquet", 0o644)
    out = runtime.run(
        OPERATOR, ["kompaktor", "merge", "/in/in.parquet", "-o", "/tmp/o.parquet"], mounts=[(tmp_path, "/in", True)]
    )
    assert out.returncode == 1 and "kompaktor[spark]" in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_redis_image_serves_as_999_from_a_read_only_root(runtime, tmp_path: Path) -> None:
    data = tmp_path / "redis"
    data.mkdir()
    os.chown(data, 999, 999)
    script = (
        "redis-server --port 0 --unixsocket /tmp/r.sock --dir /data --appendonly yes --daemonize yes "
        "--pidfile /tmp/r.pid --logfile /tmp/r.log && "
        "for i in $(seq 50); do redis-cli -s /tmp/r.sock ping 2>/dev/null && break; sleep 0.1; done; "
        "redis-cli -s /tmp/r.sock set k v >/dev/null; redis-cli -s /tmp/r.sock info server | grep redis_version; "
        "id -u; redis-cli -s /tmp/r.sock shutdown"
    )
    out = _ok(runtime.run(REDIS, ["sh", "-c", script], mounts=[(data, "/data", False)]))
    assert out.startswith("PONG") and "redis_version:7." in out and out.splitlines()[-1] == "999", out
    assert (data / "appendonlydir").is_dir()  # the data went to the volume


def test_a_rebuilt_image_leaves_no_untagged_copy_in_the_tool_storage(tmp_path: Path) -> None:
    """`make images` rebuilds an image when its inputs change (the pause image when the node's
    pause binary does): the copy it replaced must not stay in buildah's storage untagged (each
    compactor rebuild left 1.4 GB there). Real buildah, the build script's own publish step."""
    lib = Path(__file__).resolve().parents[2] / "scripts" / "build-images-lib.sh"
    image = "localhost/kompaktor/publish-check:1"
    (tmp_path / "cache").mkdir()

    def build_and_publish(content: str, n: int) -> str:
        ctx = tmp_path / f"ctx{n}"
        ctx.mkdir()
        (ctx / "file").write_text(content)
        (ctx / "Dockerfile").write_text("FROM scratch\nCOPY file /file\n")
        script = (
            f"set -euo pipefail; source {lib}; TOOL=buildah; CACHE={tmp_path}/cache; "
            f"buildah bud -q --isolation chroot -t {image} {ctx} >/dev/null; "
            f'publish check {image} "$CACHE/check-{n}.tar"; buildah images -q --no-trunc {image}'
        )
        return _ok(subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120)).strip()

    try:
        first = build_and_publish("one", 1)
        second = build_and_publish("two", 2)
        assert first != second
        left = _ok(subprocess.run(["buildah", "images", "-q", "--no-trunc"], capture_output=True, text=True))
        assert first not in left.split(), "the replaced image is still in buildah's storage"
        assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["check-2.tar"]
    finally:
        subprocess.run(["buildah", "rmi", "-f", image], capture_output=True, timeout=60)
