"""The status page as a person sees it (issue 36 §3): headless Chromium (Debian's ``chromium``) loads
the page a local cluster's coordinator serves — the processes `kompaktor up` runs: embedded Redis
with the chart's users, a coordinator process, real compactor processes — with work in flight (jobs
queued, a compaction running, one committed, one whose compactor died), and the figures in the
rendered page are those `kompaktor status --json` gives. Screenshots go to the test's directory,
and to $KOMPAKTOR_SCREENSHOTS when set (docs/img/ holds the ones docs/ui.md shows).

Skipped only when chromium is missing and cannot be installed (apt-get, as root)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kompaktor import keyspace as C
from kompaktor.client import Client
from kompaktor.files.storage import Storage
from kompaktor.local.cluster import LocalCluster
from kompaktor.local.config import load_config
from kompaktor.metadata import compactions, history
from kompaktor.metadata.store import MetadataStore
from kompaktor.model import grouptoken
from tests.integration.test_status_page import figures
from tests.support.entries import entries
from tests.support.procs import python_env
from tests.support.rawredis import raw_redis
from tests.support.wait import poll

pytestmark = [pytest.mark.redis, pytest.mark.timeout(600)]

GROUP = "pages"
CONFIG = f"""\
apiVersion: kompaktor.io/v1alpha1
kind: CompactionService
metadata: {{name: default}}
spec:
  ratio: 2
  maxOpen: 12
  maxFilesPerTablet: 8
  tables: ["*"]
  tiers:
    - {{name: all, compactorGroup: {GROUP}}}
---
apiVersion: kompaktor.io/v1alpha1
kind: CompactorGroup
metadata: {{name: {GROUP}}}
spec:
  minReplicas: 0
  maxReplicas: 3
  jobsPerReplica: 2
  spark: {{engine: arrow}}
"""
#: the flags the brief of issue 36 gives: nothing reaches out, nothing is kept between runs
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: the figures of a group, and of a table, that the page shows as `kompaktor status --json` has them
GROUP_KEYS = (
    "queued",
    "running",
    "depth",
    "busy",
    "draining",
    "queued_bytes",
    "compactions_committed",
    "dead_lettered",
)
TABLE_KEYS = ("tablets", "files", "running_compactions")


def _find_chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def chromium() -> str:
    """Chromium's path; installed with apt-get when missing (as `make install` does)."""
    found = _find_chromium()
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "-qq", "chromium"]
        for cmds in ([install], [["apt-get", "update", "-qq"], install]):  # the package lists may be stale
            for cmd in cmds:
                subprocess.run(cmd, env=env, capture_output=True, timeout=900, check=False)
            if (found := _find_chromium()) is not None:
                break
    if found is None:
        pytest.skip("chromium is not installed and apt-get could not install it (Debian package `chromium`)")
    return found


def browse(chromium: str, profile: Path, *args: str) -> str:
    out = subprocess.run(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(
        load_config(CONFIG),
        tmp_path / "cluster",
        coordinator_args=["--full-scan-interval", "1", "--dead-after", "600"],
        status_port=0,
    )
    try:
        c.start()
        yield c
    finally:
        c.stop()


def status_json(cluster: LocalCluster) -> dict[str, Any]:
    env = python_env(KOMPAKTOR_REDIS_URL=cluster.role_urls["admin"], KOMPAKTOR_STORAGE=cluster.storage_uri)
    out = subprocess.run(
        [sys.executable, "-m", "kompaktor", "status", "--json"], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def figures_of(st: dict[str, Any]) -> dict[str, Any]:
    """What the test compares: the groups' and tables' figures (ages move on by themselves)."""
    return {
        "groups": {g: {k: v[k] for k in GROUP_KEYS} for g, v in st["groups"].items()},
        "tables": {t: {k: v[k] for k in TABLE_KEYS} for t, v in st["tables"].items()},
    }


def run_one_compactor(cluster: LocalCluster) -> None:
    """A real compactor process that takes one job and ends."""
    env = python_env(
        KOMPAKTOR_REDIS_URL=cluster.role_urls["compactor"],
        KOMPAKTOR_STORAGE=cluster.storage_uri,
        KOMPAKTOR_GROUP_TOKEN=grouptoken.group_token(cluster.group_key, GROUP),  # one of the group's
    )
    args = ["compactor", "--group", GROUP, "--id", "compactor-once", "--max-jobs", "1", "--http-port", "-1", "--broker"]
    out = subprocess.run([sys.executable, "-m", "kompaktor", *args], env=env, capture_output=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]


def work_in_flight(cluster: LocalCluster, store: MetadataStore) -> compactions.Reservation:
    """Jobs queued on four tablets of 10 files each; one committed by a compactor process; one
    whose compactor went silent (the coordinator finds it dead: killed); one running now."""
    client = Client(store, Storage.from_uri(cluster.storage_uri))
    store.tables.create_table("events", [b"g", b"n", b"t"])
    for k in range(10):  # every file spans the four tablets; every third deletes a fifth of the rows
        deleted = (lambda r: r % 5 == 0) if k % 3 == 0 else None
        client.flush("events", [e for p in "cipw" for e in entries(30, k, prefix=p, deleted=deleted)])
    store.tables.create_table("quiet", [])
    client.flush("quiet", entries(20))
    poll(lambda: store.queues.stats(GROUP).queued >= 4, "the coordinator to queue the tablets' jobs")
    run_one_compactor(cluster)
    ghost = compactions.reserve(store, store.queues, GROUP, "compactor-gone")
    assert ghost is not None
    raw_redis(store).hset(C.heartbeat_key(ghost.ecid), "updated", time.time() - 3600)  # silent for an hour
    poll(
        lambda: [r.outcome for r in history.read(store, [GROUP])] == [history.KILLED, history.COMMITTED],
        "the coordinator to find the silent compaction dead",
    )
    res = compactions.reserve(store, store.queues, GROUP, "compactor-page-1")
    assert res is not None
    size = sum(res.job.files.values())
    compactions.heartbeat(store, res, {"bytes_read": size * 3 // 5, "parts_done": 3, "parts": 5, "parts_reused": 1})
    return res


def test_the_page_in_a_browser_shows_what_status_json_says(
    chromium: str, cluster: LocalCluster, tmp_path: Path
) -> None:
    store = MetadataStore.from_url(cluster.role_urls["admin"])
    url = cluster.status_url
    assert url is not None
    res = work_in_flight(cluster, store)
    profile = tmp_path / "chromium-profile"
    # the charts need two of the coordinator's samples (one every 10 s)
    poll(lambda: "<polyline" in browse(chromium, profile, "--dump-dom", url), "the page's charts", 90, 1.0)

    def alive() -> None:  # the running compactor is alive: it says so before every read, as a real
        # one's heartbeat does every few seconds (a look can take longer than ALIVE_S when busy)
        store.fleet.register_compactor(GROUP, res.compactor, "busy", res.ecid)

    def look() -> tuple[dict[str, Any], str, dict[str, Any]]:
        alive()
        before = status_json(cluster)
        alive()
        dom = browse(chromium, profile, "--dump-dom", url)
        alive()
        return before, dom, status_json(cluster)

    def agree(got: tuple[dict[str, Any], str, dict[str, Any]]) -> bool:
        page, g = figures(got[1]), got[0]["groups"][GROUP]
        return figures_of(got[0]) == figures_of(got[2]) and all(
            page.values.get((GROUP, k)) == str(g[k]) for k in GROUP_KEYS
        )

    before, dom, _after = poll(
        lambda: (got := look()) and agree(got) and got,
        "two looks at `kompaktor status --json` around the page's to agree (the killed job is queued "
        "again once its backoff has passed)",
        180,  # a look is two CLI processes and a browser: tens of seconds on a loaded machine
        every=1.0,
    )
    page = figures(dom)
    g = before["groups"][GROUP]
    for k in GROUP_KEYS:
        assert page.values[(GROUP, k)] == str(g[k]), k
    assert page.values[(GROUP, "ready")] == str(g["compactors"] - g["draining"])
    assert g["running"] == 1 and g["queued"] >= 1 and g["busy"] == 1
    for name, t in before["tables"].items():
        for k in TABLE_KEYS:
            assert page.values[(name, k)] == str(t[k]), (name, k)
        assert page.values[(name, "files_max")] == str(t["files_per_tablet"]["max"])
    assert [r for r in page.rows if r in before["tables"]] == ["events", "quiet"]  # most in need first
    # tablets of 10 files over the limit of 8: all but the one compacted
    assert page.values[("events", "over_limit")] == "3" and float(page.values[("events", "deletes_ratio")]) > 0
    # the running compaction, with its progress; the history, its failure first and why
    assert page.values[(res.ecid, "done")] == "0.6" and page.values[(res.ecid, "resumed_parts")] == "1"
    (killed,) = before["last_failures"][GROUP]
    hist = [r for r in page.rows if r.startswith("ECID-") and r != res.ecid]
    assert hist[0] == killed["ecid"] and page.values[(killed["ecid"], "outcome")] == "killed"
    assert "compactor died: no heartbeat for" in page.values[(killed["ecid"], "reason")]
    assert len(hist) == 2 and page.values[(hist[1], "outcome")] == "committed"
    assert "<script" not in dom.lower()

    shots = [tmp_path / "status-page.png"]
    browse(chromium, profile, f"--screenshot={shots[0]}", "--window-size=1760,1400", "--hide-scrollbars", url)
    assert shots[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shots[0].stat().st_size > 20_000
    if os.environ.get("KOMPAKTOR_SCREENSHOTS"):
        dest = Path(os.environ["KOMPAKTOR_SCREENSHOTS"])
        dest.mkdir(parents=True, exist_ok=True)
        for s in shots:
            shutil.copy(s, dest / s.name)
