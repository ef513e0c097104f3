"""Issue 15 §3: the chaos run with the real failure — `kompaktor demo --chaos` on a local HA Redis
(a primary, a replica, three redis-sentinel processes): besides the compactor and coordinator
faults, the Redis primary is SIGKILLed once mid-ingest (a write awaiting its acknowledgment) and
once mid-commit (a compaction's commit applied on the primary, not yet acknowledged), Sentinel
promotes the replica, every client reconnects; then nothing acknowledged is lost or applied twice.
Real processes throughout; the moments are observed in Redis, not timed."""

from __future__ import annotations

from pathlib import Path

import pytest

from kompaktor.local.demo import DemoOptions, run_demo

from .test_local import ARROW_ONLY

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def test_failover_chaos_loses_nothing_acknowledged(tmp_path: Path) -> None:
    res = run_demo(
        DemoOptions(
            entries=30_000,
            duration_s=20,
            tablets=3,
            batch=1000,
            live=False,
            chaos=True,
            ha=True,
            chaos_interval_s=1.0,
            config_text=ARROW_ONLY,
            data_dir=str(tmp_path / "chaos"),
        )
    )
    s = res.summary
    text = "\n".join(f"{k}: {v}" for k, v in s.items())
    assert res.verified, text
    assert s["chaos: Redis primary SIGKILLed, replica promoted (failovers)"] == 2, text
    assert "mid-ingest" in s["chaos: failovers"] and "mid-commit" in s["chaos: failovers"]
    assert s["entries scanned"] == s["entries written"], text  # every acknowledged flush and import
    assert s["undefined references"] == 0 and s["deleted entries resurrected"] == 0
    assert s["chaos: acknowledged commits lost"] == 0 and s["chaos: commits applied twice"] == 0
    assert s["chaos: referenced files missing"] == 0 and s["chaos: unreferenced or temp files after GC"] == 0
    # both kinds of acknowledged write were checked (how many depends on how long the failovers
    # stalled the 20 s of ingest: a count floor made this test depend on timing)
    assert s["chaos: acknowledged commits checked"] >= 1, text
    assert s["chaos: acknowledged writes checked (flushes + commits)"] > s["chaos: acknowledged commits checked"], text
