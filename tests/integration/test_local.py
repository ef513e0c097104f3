"""Local mode end to end: `kompaktor demo` (small), the chaos run, `kompaktor up` + `status`,
and the local autoscaler. Real redis-server, real compactor processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from kompaktor.local.cluster import LocalCluster, desired_replicas
from kompaktor.local.config import DEMO_CONFIG, load_config
from kompaktor.local.demo import DemoOptions, run_demo
from tests.support.wait import poll

pytestmark = [pytest.mark.redis, pytest.mark.slow]

ARROW_ONLY = DEMO_CONFIG.replace(
    'spark: {master: "local[1]", conf: {spark.sql.shuffle.partitions: "2"}}', "spark: {engine: arrow}"
)


def test_hpa_formula_clamps_to_bounds() -> None:
    assert desired_replicas(0, 2, 1, 4) == 1
    assert desired_replicas(5, 2, 1, 4) == 3  # ceil(5/2)
    assert desired_replicas(100, 2, 1, 4) == 4
    assert desired_replicas(0, 1, 0, 3) == 0


def test_demo_small_verifies_with_spark_and_arrow_groups(tmp_path: Path) -> None:
    pages: list[tuple[str, str]] = []

    def look(url: str) -> None:  # the status page, served while the demo runs (issue 36 §2)
        pages.append(
            (url, poll(lambda: urllib.request.urlopen(url, timeout=5).read().decode(), "the page", ignore=OSError))
        )

    opts = DemoOptions(
        entries=12_000,
        duration_s=8,
        tablets=3,
        batch=1000,
        live=False,
        data_dir=str(tmp_path / "demo"),
        on_status_page=look,
    )
    res = run_demo(opts)
    ((url, page),) = pages
    assert url.startswith("http://127.0.0.1:") and url.endswith("/status") and "Kompaktor status" in page
    s = res.summary
    assert res.verified, "\n".join(f"{k}: {v}" for k, v in s.items())
    assert s["entries scanned"] == s["entries written"] == 12_000 + opts.burst_entries
    assert s["undefined references"] == 0 and s["deleted entries resurrected"] == 0
    assert s["files after"] < s["files flushed"]
    assert s["files per tablet after (max)"] <= 15
    assert sum(v for k, v in s.items() if k.startswith("compactions run")) > 0
    assert res.samples, "progress was sampled"


def test_chaos_run_loses_nothing(tmp_path: Path) -> None:
    res = run_demo(
        DemoOptions(
            entries=40_000,
            duration_s=20,
            tablets=3,
            batch=1000,
            live=False,
            chaos=True,
            chaos_interval_s=1.0,
            config_text=ARROW_ONLY,
            data_dir=str(tmp_path / "chaos"),
        )
    )
    s = res.summary
    assert res.verified, "\n".join(f"{k}: {v}" for k, v in s.items())
    assert s["chaos: compactors SIGKILLed mid-merge"] >= 1
    assert s["chaos: dead compactions detected (of the killed)"] == s["chaos: compactors SIGKILLed mid-merge"]
    assert s["chaos: killed jobs re-run"] == s["chaos: compactors SIGKILLed mid-merge"]
    assert s["chaos: busy compactors SIGTERMed"] >= 1
    assert s["chaos: dead compactions from SIGTERM"] == 0
    assert s["chaos: Redis restarts"] == 1 and s["chaos: coordinator restarts"] >= 1
    assert s["chaos: running compactions left"] == 0
    assert s["chaos: unreferenced or temp files after GC"] == 0
    assert s["jobs dead-lettered"] == 0 and s["queues drained"]
    assert s["entries scanned"] == s["entries written"]


def test_up_autoscales_and_status_reports(tmp_path: Path) -> None:
    from kompaktor.client import Client
    from kompaktor.files.storage import Storage
    from kompaktor.local.ingest import ContinuousIngest, split_points

    cfg = load_config(ARROW_ONLY)
    cluster = LocalCluster(cfg, tmp_path / "up", coordinator_args=["--full-scan-interval", "5"]).start()
    try:
        store = cluster.store
        assert store is not None
        client = Client(store, Storage.from_uri(cluster.storage_uri))
        store.tables.create_table("t", split_points(2))
        ing = ContinuousIngest(client, "t", batch=500)
        for _ in range(12):
            ing.flush_once()
        # compactions bring the 12 files per tablet down
        poll(
            lambda: (
                cluster.autoscale() is not None
                and max(len(t.files) for t in store.tables.tablets(store.tables.table_id("t"))) < 6
            ),
            what="compactions to reduce files per tablet",
        )
        # scale up beyond min when the queue is deep, then drain back down to min with SIGTERM
        for g in cfg.groups:
            cluster.add_compactor(g)
        poll(
            lambda: all(len([c for c in store.fleet.compactors(g) if c.state == "idle"]) >= 2 for g in cfg.groups),
            what="extra compactors to register idle",
        )
        drained = [p for g in cfg.groups for p in cluster.live(g)]
        cluster.autoscale()
        poll(
            lambda: all(len(cluster.live(g)) == cfg.groups[g].min_replicas for g in cfg.groups),
            what="scale-down to min replicas",
        )
        victims = [p for p in drained if p.draining]
        assert victims, "the autoscaler drained the extra compactors"
        for p in victims:
            assert p.popen.wait(timeout=60) == 0, "a drained compactor exits 0"
        assert store.bookkeeping.counters().get("dead_compactions", 0) == 0
        env = {**os.environ, "KOMPAKTOR_REDIS_URL": cluster.url, "KOMPAKTOR_STORAGE": cluster.storage_uri}
        out = subprocess.run(
            [sys.executable, "-m", "kompaktor", "status", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        st = json.loads(out.stdout)
        assert set(st["groups"]) == {"small", "large"}
        for g in st["groups"].values():
            assert {"queued", "running", "compactors", "dead_compactions_recovered", "oldest_queued_age_s"} <= set(g)
        assert st["groups"]["small"]["compactions_committed"] > 0
        t = st["tables"]["t"]
        assert t["tablets"] == 2 and t["files_per_tablet"]["max"] < 6
        human = subprocess.run(
            [sys.executable, "-m", "kompaktor", "status"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        assert "compactor groups" in human.stdout and "small" in human.stdout
    finally:
        cluster.stop()


def test_up_command_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    cfg = tmp_path / "local.yaml"
    cfg.write_text(ARROW_ONLY)
    p = subprocess.Popen(
        [sys.executable, "-m", "kompaktor", "up", "--config", str(cfg), "--data-dir", str(tmp_path / "data")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = poll(lambda: p.stdout.readline(), timeout=120, what="kompaktor up to start")
        assert "kompaktor is up" in line
        # the status page's address, served by the coordinator while `up` runs (issue 36 §2)
        line = p.stdout.readline()
        assert line.startswith("status page: http://127.0.0.1:"), line
        url = line.split(": ", 1)[1].strip()
        page = poll(lambda: urllib.request.urlopen(url, timeout=5).read().decode(), "the page", ignore=OSError)
        assert "Kompaktor status" in page and 'data-group="small"' in page
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=120) == 0
    finally:
        if p.poll() is None:
            p.kill()
    assert (tmp_path / "data" / "redis" / "appendonlydir").exists(), "embedded Redis ran with AOF on"
