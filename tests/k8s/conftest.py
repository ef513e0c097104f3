"""The real control-plane tier: a session-scoped etcd + kube-apiserver + kube-controller-manager
(tests/k8s/controlplane.py) and a node agent standing in for the kubelet (nodeagent.py).

Skipped only when KOMPAKTOR_SKIP_K8S=1 is set (refused under CI=true), never silently: without
the binaries the fixture builds them (tests/k8s/build-control-plane.sh) and fails with the
build's error if that fails.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.k8s.controlplane import ControlPlane

_versions: list[str] = []


def skip_k8s(env: Mapping[str, str]) -> bool:
    """Whether KOMPAKTOR_SKIP_K8S=1 skips the tier; under CI it may not (a CI run that skipped the
    whole Kubernetes tier would pass while testing none of it)."""
    if env.get("KOMPAKTOR_SKIP_K8S") != "1":
        return False
    if env.get("CI", "").lower() in ("true", "1", "yes"):
        raise pytest.UsageError("KOMPAKTOR_SKIP_K8S=1 is refused under CI=true: CI runs the Kubernetes tier")
    return True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    mine = [item for item in items if Path(str(item.fspath)).is_relative_to(here)]
    skip = bool(mine) and skip_k8s(os.environ)
    for item in mine:
        item.add_marker(pytest.mark.k8s)
        if skip:
            item.add_marker(pytest.mark.skip(reason="KOMPAKTOR_SKIP_K8S=1: the control-plane tier is skipped"))


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    cp = ControlPlane(tmp_path_factory.mktemp("k8s"))
    try:
        cp.start()
        _versions.append(f"{cp.version} (started in {cp.started_in_s:.1f} s)")
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ControlPlane, Any]]:
    """A control plane on the node bridge and a real node (kubelet + containerd) running the
    project's own images (built by `make images`, imported into the node's containerd)."""
    from tests.k8s.node import start_cluster
    from tests.support.images import ensure_images

    images = ensure_images()
    cp, node = start_cluster(tmp_path_factory.mktemp("real-node"), images)
    _versions.append(f"real node {node.started_in_s:.1f} s (images imported in {node.image_import_s:.1f} s)")
    try:
        yield cp, node
    finally:
        try:
            node.remove_pods(timeout=90)
        finally:
            node.stop()
            cp.stop()


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if _versions:
        terminalreporter.write_line(f"Kubernetes: {'; '.join(_versions)}")
    support = sys.modules.get("tests.support.k8s")  # imported by a test that ran, if any
    for line in getattr(support, "FIGURES", []):
        terminalreporter.write_line(line)
