"""The status page's HTML and the history's records, pure (issue 36): what is escaped and
redacted, what an empty system shows, how --since is read."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from html.parser import HTMLParser

import pytest

from kompaktor.coordinator import page
from kompaktor.coordinator.statuspage import Sample
from kompaktor.metadata import history

NOW = 1_790_000_000.0


def data(**kw) -> dict:
    base = {"now": NOW, "groups": {}, "charts": {}, "running": [], "tables": {}, "history": [], "dead_letters": 0}
    return {**base, "retries_pending": 0, **kw}


def test_an_empty_system_says_so_and_nothing_else() -> None:
    html = page.render(data())
    assert 'id="empty"' in html and "Nothing here yet" in html
    assert 'id="groups"' not in html and "<script" not in html.lower()


def test_text_from_the_store_is_escaped_and_redacted() -> None:
    rec = history.Record(
        "ECID-1",
        history.FAILED,
        "g<b>",
        "1",
        "1;",
        "SYSTEM",
        "<script>alert(1)</script>",
        NOW,
        reason="read s3://AKIA:topSECRET@bucket/x failed",
    )
    html = page.render(data(history=[{**rec.to_json(), "table": "t", "failed": True}]))
    assert "<script>alert" not in html and "&lt;script&gt;" in html and "g&lt;b&gt;" in html
    assert "topSECRET" not in html and "s3://***@bucket/x" in html


def test_the_history_shows_the_queued_time_and_the_deletes_dropped() -> None:
    rec = history.Record(
        "ECID-2", history.COMMITTED, "g", "1", "1;", "SYSTEM", "c", NOW, queued_s=12.5, deletes_dropped=1234
    )
    killed = history.Record("ECID-3", history.KILLED, "g", "1", "1;", "SYSTEM", "c", NOW)
    rows = [{**r.to_json(), "table": "t", "failed": r.failed} for r in (killed, rec)]
    html = page.render(data(history=rows))
    assert '<td data-k="queued_s" data-v="12.5">12.5s</td>' in html
    assert '<td data-k="deletes_dropped" data-v="1234">1,234</td>' in html
    assert '<td data-k="queued_s" data-v="None">–</td>' in html  # not known for a killed job
    assert "<th>deletes dropped</th><th>queued</th>" in html


def test_the_chart_spans_the_samples_it_has() -> None:
    assert "collecting" in page.chart([Sample(NOW, 1, 1, 1)], NOW)
    svg = page.chart([Sample(NOW - 60, 0, 0, 0), Sample(NOW, 4, 2, 1)], NOW)
    assert svg.count("<polyline") == 3 and "1.0m ago" not in svg and "60.0s ago → now" in svg


def test_since_reads_durations_and_iso_times() -> None:
    assert history.parse_since("90s", now=1000.0) == 910.0
    assert history.parse_since("2h", now=10_000.0) == 10_000.0 - 7200
    assert history.parse_since("1.5d", now=200_000.0) == 200_000.0 - 129_600
    assert history.parse_since("2026-11-27T05:00:00") == datetime(2026, 11, 27, 5, tzinfo=UTC).timestamp()
    assert history.parse_since("2026-11-27T06:00:00+01:00") == datetime(2026, 11, 27, 5, tzinfo=UTC).timestamp()
    for bad in ("yesterday", "5 minutes", "-3h", ""):
        with pytest.raises(ValueError, match="give a duration"):
            history.parse_since(bad)


def test_a_record_round_trips_and_refuses_an_unknown_outcome() -> None:
    rec = history.Record("E", history.KILLED, "g", "1", "1;", "USER", "c", time.time(), merge_s=1.5)
    assert history.Record.from_json({**rec.to_json(), "added_later": 1}) == rec and rec.failed
    with pytest.raises(ValueError, match="unknown outcome 'lost'"):
        history.Record("E", "lost", "g", "1", "1;", "USER", "c", 0.0)
    assert history.clean_reason("a\n  b " + "x" * 900) == ("a b " + "x" * 900)[: history.REASON_MAX]


class _Tags(HTMLParser):
    """Every start tag with its attributes, and every text node, as a browser's parser sees them."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.texts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.texts.append(data)


def test_a_hostile_group_and_table_name_stay_text() -> None:
    hostile = '<img src=x onerror=alert(1)>"\' data-x="y'
    group = dict.fromkeys(
        ("wanted", "ready", "busy", "idle", "draining", "queued", "running", "depth", "queued_bytes"), 1
    ) | {"oldest_queued_age_s": 1.0, "hpa_target": 1, "compactions_committed": 0, "dead_lettered": 0}
    table = {
        "state": "ONLINE",
        "tablets": 1,
        "files": 1,
        "files_per_tablet": {"min": 1, "median": 1, "max": 1, "histogram": {"1": 1}},
        "running_compactions": 0,
        "file_limit": 4,
        "over_limit": 0,
        "deletes_ratio": 0.0,
        "score": 0.0,
    }
    parsed = _Tags()
    parsed.feed(page.render(data(groups={hostile: group}, tables={hostile: table})))
    assert "img" not in {tag for tag, _ in parsed.tags}
    assert all("data-x" not in attrs and "onerror" not in attrs for _, attrs in parsed.tags)
    assert [a["data-group"] for t, a in parsed.tags if t == "tr" and "data-group" in a] == [hostile]
    assert [a["data-table"] for t, a in parsed.tags if t == "tr" and "data-table" in a] == [hostile]
    assert parsed.texts.count(hostile) == 2  # the group's first cell and the table's
