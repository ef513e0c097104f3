"""The status page renders what it rendered before its HTML came from templates.

``golden/status_page.html`` and ``golden/status_page_empty.html`` were written by the page's
string-built renderer (before the Jinja2 templates) for the data below: a hostile group and
table name, a failed and a committed compaction, a running merge with resumed parts, dead
letters and charts. The templates must render the same page: the same elements, attributes and
text in the same order. Two differences are allowed, neither visible: whitespace between tags
(the templates are laid out on lines) and the entity an escaped quote becomes (``&#39;`` from
Jinja2, ``&#x27;`` from ``html.escape``)."""

from __future__ import annotations

import dataclasses
import pathlib
import re

from kompaktor.coordinator import page
from kompaktor.coordinator.statuspage import Sample
from kompaktor.metadata import history, status

GOLDEN = pathlib.Path(__file__).parent / "golden"
NOW = 1_790_000_000.0
HOSTILE = "<img src=x onerror=alert('g')>\"&"


def _history_row(rec: history.Record, table: str) -> dict:
    return {**rec.to_json(), "table": table, "failed": rec.failed}


def full() -> dict:
    group = {
        "queued": 3,
        "running": 2,
        "depth": 5,
        "compactors": 4,
        "busy": 2,
        "draining": 1,
        "oldest_queued_age_s": 312.5,
        "queued_bytes": 5_500_000,
        "rejected": 0,
        "dead_compactions_recovered": 1,
        "compactions_committed": 1234,
        "dead_lettered": 1,
        "idle": 1,
        "ready": 3,
        "wanted": 3,
        "min_replicas": 0,
        "max_replicas": 10,
        "hpa_target": 2,
    }
    table = {
        "id": "7",
        "state": "ONLINE",
        "tablets": 4,
        "files": 14,
        "files_per_tablet": {"min": 1, "median": 3.5, "max": 6, "histogram": {"1": 1, "3": 1, "4": 1, "6": 1}},
        "running_compactions": 1,
        "entries": 10_000,
        "delete_horizon": None,
        "file_limit": 4,
        "over_limit": 1,
        "deletes": 120,
        "deletes_ratio": 0.012,
        "score": 2.87,
    }
    running = {
        "table": HOSTILE,
        "ecid": "ECID-run",
        "tablet": "7;m",
        "group": HOSTILE,
        "kind": "SYSTEM",
        "compactor": "c-1",
        "input_files": 3,
        "input_bytes": 3 << 20,
        "bytes_read": 1 << 20,
        "parts_done": 3,
        "parts": 5,
        "resumed_parts": 1,
        "done": 0.6,
        "elapsed_s": 95.2,
        "left_s": 63.5,
    }
    failed = history.Record(
        "ECID-f", history.FAILED, HOSTILE, "7", "7;a", "SYSTEM", "c-2", NOW - 30, reason="disk <full> & 'gone'"
    )
    done = history.Record(
        "ECID-d", history.COMMITTED, "g", "7", "7;b", "USER", "c-1", NOW - 90, engine="arrow", input_files=2,
        input_bytes=4096, output_bytes=2048, deletes_dropped=12_345, queued_s=4.5, merge_s=7200.0, commit_s=0.2,
    )  # fmt: skip
    samples = [Sample(NOW - 600, 2, 1, 1), Sample(NOW - 300, 6, 3, 2), Sample(NOW, 5, 3, 3)]
    return {
        "now": NOW,
        "groups": {HOSTILE: group, "quiet": {**group, "queued": 0, "depth": 0}},
        "charts": {HOSTILE: samples, "quiet": samples[:1]},
        "running": [running],
        "tables": {
            HOSTILE: table,
            "empty": {**table, "files_per_tablet": {**table["files_per_tablet"], "histogram": {}}},
        },
        "history": [_history_row(failed, HOSTILE), _history_row(done, "t")],
        "dead_letters": 2,
        "retries_pending": 1,
    }


def empty() -> dict:
    base = {"now": NOW, "groups": {}, "charts": {}, "running": [], "tables": {}, "history": [], "dead_letters": 0}
    return {**base, "retries_pending": 0}


def quiet() -> dict:
    """Groups and tables, nothing running, no history, no failures."""
    data = full()
    return {**data, "running": [], "history": [], "dead_letters": 0, "retries_pending": 0}


CASES = {"status_page.html": full, "status_page_empty.html": empty, "status_page_quiet.html": quiet}


def normalised(html: str) -> str:
    return re.sub(r">\s+<", "><", html).replace("&#x27;", "&#39;").replace("&quot;", "&#34;").strip()


def test_the_page_is_what_it_was() -> None:
    for name, data in CASES.items():
        assert normalised(page.render(data())) == normalised((GOLDEN / name).read_text()), name


if __name__ == "__main__":  # writes the golden pages (only ever from the string-built renderer)
    for name, data in CASES.items():
        (GOLDEN / name).write_text(page.render(data()))


def test_the_history_row_type_names_every_field_of_a_record() -> None:
    """``status.HistoryRow`` is the record's JSON form: a field added to the record and not to the
    type would reach the page and ``--json`` untyped."""
    assert list(status.HistoryRow.__annotations__) == [f.name for f in dataclasses.fields(history.Record)]


def test_the_templates_ship_in_the_package() -> None:
    """The wheel (and so the compactor image) carries the package directory's files: the templates
    must be there, beside the module that loads them."""
    templates = pathlib.Path(page.__file__).parent / "templates"
    for name in ("page", "macros", "empty", "failures", "groups", "running", "tables", "history"):
        assert (templates / f"{name}.html.j2").is_file(), name
