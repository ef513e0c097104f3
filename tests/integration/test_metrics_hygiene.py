"""Every /metrics endpoint passes ``promtool check metrics`` (Prometheus' own linter), scraped over
HTTP from real processes that have done real work: a coordinator that planned a job and a
compactor that committed it (the operator's, which needs a Kubernetes API, is checked the same
way in tests/k8s/test_user_path.py). promtool comes from Debian's prometheus package (``make
promtool`` unpacks it into ~/.cache/kompaktor/promtool; no Prometheus server is installed or started)."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.integration.test_coordinator import write_files
from tests.promcheck import check, promtool
from tests.support.ports import free_port
from tests.support.wait import poll

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.redis


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def test_promtool_catches_a_bad_exposition() -> None:
    """The check can fail: a counter without the _total suffix is what promtool reports."""
    res = subprocess.run(
        [promtool(), "check", "metrics"],
        capture_output=True,
        text=True,
        input="# HELP jobs_done Jobs.\n# TYPE jobs_done counter\njobs_done 1\n",
    )
    assert "_total" in res.stdout + res.stderr


def test_coordinator_and_compactor_metrics_pass_promtool(tmp_path: Path, redis_url: str, client) -> None:
    client.store.tables.create_table("t", [])
    write_files(client, "t", 4)
    env = {
        **os.environ,
        "KOMPAKTOR_REDIS_URL": redis_url,
        "KOMPAKTOR_STORAGE": client.storage.uri,
        "PYTHONUNBUFFERED": "1",
    }
    cport, wport = free_port(), free_port()
    cli = [sys.executable, "-m", "kompaktor"]
    logs = [open(tmp_path / n, "wb") for n in ("coordinator.log", "compactor.log")]  # noqa: SIM115
    procs = [
        subprocess.Popen(
            [
                *cli,
                "coordinator",
                "--metrics-port",
                str(cport),
                "--metrics-host",
                "127.0.0.1",
                "--full-scan-interval",
                "1",
            ],
            env=env,
            stdout=logs[0],
            stderr=subprocess.STDOUT,
        ),
        subprocess.Popen(
            [
                *cli,
                "compactor",
                "--group",
                "default",
                "--engine",
                "arrow",
                "--http-host",
                "127.0.0.1",
                "--http-port",
                str(wport),
            ],
            env=env,
            stdout=logs[1],
            stderr=subprocess.STDOUT,
        ),
    ]
    try:
        # the compactor committed the job the coordinator planned; the coordinator's gauges show the group
        worker = poll(
            lambda: 'kompaktor_compactions_completed_total{group="default"} 1.0' in (t := scrape(wport)) and t,
            "the compactor to commit a compaction",
            ignore=OSError,
        )
        coord = poll(
            lambda: 'kompaktor_queue_depth{group="default"}' in (t := scrape(cport)) and t,
            "the coordinator to export the group's queue",
            ignore=OSError,
        )
        check(worker)
        check(coord)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for f in logs:
            f.close()
