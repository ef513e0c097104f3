"""``promtool check metrics`` for the tests that scrape a real /metrics (integration and k8s tiers).

promtool comes from Debian's prometheus package (``make promtool`` unpacks it into
~/.cache/kompaktor/promtool; no Prometheus server is installed or started)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families


def promtool() -> str:
    found = shutil.which("promtool") or str(Path.home() / ".cache/kompaktor/promtool/usr/bin/promtool")
    if not os.access(found, os.X_OK):
        pytest.fail("promtool is missing: run `make promtool` (make test does)")
    return found


def check(text: str) -> None:
    """promtool finds nothing to say about the exposition ``text``."""
    res = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True)
    assert res.returncode == 0 and not res.stdout.strip() and not res.stderr.strip(), (
        f"promtool check metrics:\n{res.stdout}{res.stderr}\n--- exposition ---\n{text}"
    )


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of an exposition: (series name, labels) -> value."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }
