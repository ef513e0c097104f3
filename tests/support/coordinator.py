"""Coordinator settings for tests that drive the coordinator by hand (``tick()``): a fast tick,
and no full scan, dead-compaction sweep or garbage collection unless the test asks."""

from __future__ import annotations

from typing import Any

from kompaktor.coordinator import CoordinatorSettings

QUIET = dict(tick_s=0.01, lease_ms=10_000, full_scan_s=1e9, dead_after_s=5.0, gc_interval_s=1e9, gc_grace_s=1e9)


def settings(**kw: Any) -> CoordinatorSettings:
    """:data:`QUIET`, with ``kw`` overriding."""
    return CoordinatorSettings(**{**QUIET, **kw})
