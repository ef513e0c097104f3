"""The coordinator's status page (issue 36 §2) on a real redis-server, served by a real coordinator's
HTTP server: an empty system says so; groups, running compactions with progress, tables' health
and the history (failures first) show what the store holds; no secret ever shows; the charts
fill from the coordinator's ring buffer. (The browser's view: test_status_page_browser.py.)"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from html.parser import HTMLParser

import pytest

from kompaktor.client import Client
from kompaktor.coordinator import Coordinator
from kompaktor.coordinator.http import serve
from kompaktor.coordinator.statuspage import Sample, Samples, collect, table_health, wanted_replicas
from kompaktor.files.storage import Storage
from kompaktor.metadata import compactions, history
from kompaktor.metadata.store import MetadataStore
from kompaktor.model.tablet import FileMeta, Tablet
from kompaktor.policy.services import GroupConfig
from tests.integration.test_worker import make_table
from tests.support.coordinator import settings
from tests.support.rawredis import raw_redis

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]


class Figures(HTMLParser):
    """The page's figures: (row key, data-k) -> data-v, where a row is data-group, -table or -ecid."""

    def __init__(self) -> None:
        super().__init__()
        self.row: str | None = None
        self.rows: list[str] = []
        self.values: dict[tuple[str, str], str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "tr":
            self.row = a.get("data-group") or a.get("data-table") or a.get("data-ecid")
            if self.row:
                self.rows.append(self.row)
        elif tag == "td" and self.row and a.get("data-k"):
            self.values[(self.row, a["data-k"] or "")] = a.get("data-v") or ""


def figures(html: str) -> Figures:
    f = Figures()
    f.feed(html)
    return f


@pytest.fixture
def coord(store: MetadataStore, storage: Storage) -> Iterator[tuple[Coordinator, str]]:
    c = Coordinator(store, storage, settings())
    server = serve(c, 0, "127.0.0.1")
    yield c, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    c.resign()


def get(url: str) -> tuple[int, str, str]:
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *_args, **_kw):  # type: ignore[no-untyped-def]
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(url, timeout=10) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Location", ""), exc.read().decode()


def test_an_empty_system_shows_an_empty_page_that_says_so(coord: tuple[Coordinator, str]) -> None:
    _c, base = coord
    code, ctype, body = get(base + "/status")
    assert code == 200 and ctype.startswith("text/html")
    assert 'id="empty"' in body and "Nothing here yet" in body
    assert "<script" not in body.lower()
    assert get(base + "/")[:2] == (302, "/status")
    assert get(base + "/nope")[0] == 404


def test_the_page_shows_groups_running_work_tables_and_failures_first(
    coord: tuple[Coordinator, str], store: MetadataStore, storage: Storage, client: Client
) -> None:
    c, base = coord
    make_table(client, "t", files=5, splits=(b"m",))
    make_table(client, "quiet", files=1, splits=())
    assert c.tick()
    res = compactions.reserve(store, store.queues, "default", "c-busy")
    assert res is not None
    store.fleet.register_compactor("default", "c-busy", "busy", res.ecid)
    store.fleet.register_compactor("default", "c-idle", "idle")
    input_bytes = sum(res.job.files.values())
    compactions.heartbeat(store, res, {"bytes_read": input_bytes // 4, "parts_done": 1, "parts": 4})
    secret = "redis://:hunter2-SECRET@redis:6379/0"
    now = time.time()
    for i, (outcome, reason) in enumerate(
        ((history.COMMITTED, ""), (history.FAILED, f"merge failed reading {secret}"), (history.COMMITTED, ""))
    ):
        rec = history.Record(f"ECID-{i:016x}", outcome, "default", res.table, res.tablet, "SYSTEM", "c", now + i)
        assert history.append(store, history.Record(**{**rec.to_json(), "reason": reason}))
    # a reason recorded before redaction existed (or by another writer) is redacted on the page too
    raw_redis(store).xadd("kz:history:default", {"r": history.Record("ECID-raw", history.KILLED, "default", res.table,
        res.tablet, "SYSTEM", "c", now + 5, reason=f"died at {secret}").to_json().__repr__().replace("'", '"')
        .replace("None", "null").replace("False", "false").replace("True", "true")})  # fmt: skip

    code, _ctype, body = get(base + "/status")
    assert code == 200
    assert "hunter2" not in body and "SECRET" not in body and "redis://***@redis:6379/0" in body
    f = figures(body)
    st = collect(store)
    g = st["groups"]["default"]
    assert f.values[("default", "depth")] == str(g["depth"]) and g["depth"] == g["queued"] + 1
    assert (f.values[("default", "busy")], f.values[("default", "idle")], f.values[("default", "ready")]) == (
        "1",
        "1",
        "2",
    )
    assert f.values[("default", "wanted")] == str(wanted_replicas(g["depth"], GroupConfig("default")))
    assert f.values[("default", "hpa_target")] == str(GroupConfig("default").jobs_per_replica)
    # the running compaction and its progress
    assert f.values[(res.ecid, "done")] == "0.25" and f.values[(res.ecid, "compactor")] == "c-busy"
    assert f.values[(res.ecid, "table")] == "t"
    # tables: the one that most needs compaction first
    tables = [r for r in f.rows if r in ("t", "quiet")]
    assert tables == ["t", "quiet"]
    assert f.values[("t", "files")] == str(st["tables"]["t"]["files"]) == "10"
    # the history: failures first (newest first among them), then the rest, newest first
    hist = [r for r in f.rows if r.startswith("ECID-") and r != res.ecid]
    assert hist == ["ECID-raw", "ECID-0000000000000001", "ECID-0000000000000002", "ECID-0000000000000000"]
    assert f.values[("ECID-raw", "outcome")] == "killed"
    assert 'class="failed"' in body or "class=failed" in body


def test_the_charts_fill_from_the_coordinator_samples(
    coord: tuple[Coordinator, str], store: MetadataStore, client: Client
) -> None:
    c, base = coord
    make_table(client, "t", files=5, splits=(b"m",))
    c.samples = Samples(every_s=0.0)
    for _ in range(3):
        assert c.tick()
    (ring,) = c.samples.groups.values()
    assert len(ring) == 3 and ring[-1].depth == store.queues.stats("default").depth > 0
    body = get(base + "/status")[2]
    assert "<polyline" in body and "collecting" not in body
    # the ring holds one hour: older samples fall out
    s = Samples(every_s=10, window_s=60)
    for i in range(20):
        s.add("g", Sample(1000.0 + 10 * i, i, 1, 1))
    assert len(s.groups["g"]) == 7 and [x.depth for x in s.of("g", now=1190.0)] == [13, 14, 15, 16, 17, 18, 19]


def test_the_table_score_ranks_more_files_deletes_and_tablets_over_the_limit_higher() -> None:
    def tablet(files: int, deletes: int = 0) -> Tablet:
        metas = {f"f{i}": FileMeta(100, 10, deletes, None, None) for i in range(files)}
        return Tablet("1;", "1", None, None, metas, {}, None, None, None, 0)

    calm = table_health([tablet(1), tablet(1)], limit=15)
    busy = table_health([tablet(6), tablet(2)], limit=15)
    over = table_health([tablet(16), tablet(2)], limit=15)
    deleting = table_health([tablet(1, deletes=5), tablet(1, deletes=5)], limit=15)
    assert calm["score"] == 0 and calm["over_limit"] == 0
    assert busy["score"] == 3.0
    assert over["over_limit"] == 1 and over["score"] == 8.0 + 5.0
    assert deleting["deletes_ratio"] == 0.5 and deleting["score"] == 5.0


def test_redis_away_is_a_503_that_says_so(storage: Storage) -> None:
    from tests.support.ports import free_port

    away = MetadataStore.from_url(f"redis://:pw-SECRET@127.0.0.1:{free_port()}/0")
    c = Coordinator(away, storage, settings())
    server = serve(c, 0, "127.0.0.1")
    try:
        code, _ctype, body = get(f"http://127.0.0.1:{server.server_address[1]}/status")
        assert code == 503 and body.startswith("status unavailable:") and "SECRET" not in body, body
        assert get(f"http://127.0.0.1:{server.server_address[1]}/metrics")[0] == 200  # metrics still answer
    finally:
        server.shutdown()
        server.server_close()
