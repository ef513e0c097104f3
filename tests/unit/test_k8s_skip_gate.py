"""KOMPAKTOR_SKIP_K8S=1 turns the Kubernetes tier into skips on a developer's machine, and is
refused under CI=true: a CI run must not pass by skipping the whole tier."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _k8s_tier(**env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("CI", "KOMPAKTOR_SKIP_K8S")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/k8s/test_controlplane.py"],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_skip_is_refused_under_ci_in_one_line() -> None:
    out = _k8s_tier(KOMPAKTOR_SKIP_K8S="1", CI="true")
    assert out.returncode == 4, out  # pytest's usage error: the session fails, no test ran
    assert out.stderr.strip() == "ERROR: KOMPAKTOR_SKIP_K8S=1 is refused under CI=true: CI runs the Kubernetes tier"


def test_skip_outside_ci_skips_the_tier_saying_so() -> None:
    out = _k8s_tier(KOMPAKTOR_SKIP_K8S="1")
    assert out.returncode == 0, out
    assert "skipped" in out.stdout and "passed" not in out.stdout, out.stdout
