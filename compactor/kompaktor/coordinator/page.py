"""The status page as HTML (docs/ui.md "The status page"): pure, from
:func:`kompaktor.coordinator.statuspage.collect`'s data.

Plain HTML with inline CSS and inline SVG charts: no script, no build step, nothing fetched from
elsewhere; the page reloads itself every :data:`REFRESH_S` seconds (a ``<meta>`` refresh). Every
text that comes from the store is escaped and passed through the log's redaction
(:func:`kompaktor.model.redact.redact_text`), so a credential in a failure's reason never shows.
Each figure is in an element with a ``data-k`` attribute (its key in the data) inside a row with
``data-group``, ``data-table`` or ``data-ecid``: what the browser test reads.
"""

from __future__ import annotations

import html
import time
from collections.abc import Iterable, Sequence
from typing import Any

from kompaktor.model.redact import redact_text

REFRESH_S = 10

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}
h1{font-size:1.4em;margin:0 0 .2em}h2{font-size:1.1em;margin:1.6em 0 .4em}
table{border-collapse:collapse;background:#fff;box-shadow:0 1px 2px #0002}
th,td{padding:.3em .6em;border-bottom:1px solid #e4e4e4;text-align:right;vertical-align:middle;white-space:nowrap}
th{background:#f0f0f0;font-weight:600}td.l,th.l{text-align:left}
tr.failed td{background:#fff1f0}tr.failed td.outcome{color:#b00020;font-weight:600}
.muted{color:#777}.empty{font-size:1.1em;padding:1em;background:#fff;border:1px dashed #bbb}
.bar{display:inline-block;width:120px;height:10px;background:#eee;vertical-align:middle}
.bar span{display:block;height:10px;background:#3b7dd8}
.legend span{margin-right:1em}
td.reason{min-width:20em;max-width:38em;text-align:left;white-space:normal;word-break:break-word}
"""


def _t(value: Any) -> str:
    """A value from the store as page text: redacted, escaped."""
    return html.escape(redact_text(str(value)))


def human_bytes(n: int | None) -> str:
    if n is None:
        return "–"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _count(n: int | None) -> str:
    return "–" if n is None else f"{n:,}"


def _secs(s: float | None) -> str:
    if s is None:
        return "–"
    if s < 120:
        return f"{s:.1f}s"
    return f"{s / 60:.0f}m" if s < 7200 else f"{s / 3600:.1f}h"


#: the columns that hold text (left-aligned, as their headers); the others hold figures
_TEXT = frozenset({"table", "tablet", "group", "kind", "compactor", "engine", "outcome", "state", "reason"})
_TEXT_HEADS = frozenset(
    {"ECID", "table", "tablet", "group", "kind", "compactor", "engine", "outcome", "state", "reason"}
)


def _cell(key: str, value: Any, shown: str | None = None, cls: str = "") -> str:
    classes = " ".join(c for c in (cls, "l" if key in _TEXT else "") if c)
    c = f' class="{classes}"' if classes else ""
    return f'<td data-k="{key}" data-v="{_t(value)}"{c}>{_t(value) if shown is None else shown}</td>'


def _head(*cols: str) -> str:
    cells = (f'<th class="l">{c}</th>' if i == 0 or c in _TEXT_HEADS else f"<th>{c}</th>" for i, c in enumerate(cols))
    return "<tr>" + "".join(cells) + "</tr>"


def _polyline(values: Sequence[float], xs: Sequence[float], top: float, h: float, color: str, dash: str = "") -> str:
    pts = " ".join(f"{x:.1f},{h - 2 - (v / top) * (h - 4):.1f}" for x, v in zip(xs, values, strict=True))
    d = f' stroke-dasharray="{dash}"' if dash else ""
    return f'<polyline fill="none" stroke="{color}" stroke-width="1.5"{d} points="{pts}"/>'


def chart(samples: Sequence[Any], now: float, window_s: float = 3600.0, w: int = 240, h: int = 56) -> str:
    """Queue depth (blue), replicas wanted (orange, dashed) and ready (green) over the last hour
    (or since the first sample, when the coordinator has run for less)."""
    if len(samples) < 2:
        return '<span class="muted">collecting…</span>'
    span = max(1.0, min(window_s, now - samples[0].t))
    xs = [w * (1 - min(span, now - s.t) / span) for s in samples]
    top = max(1, *(max(s.depth, s.wanted, s.ready) for s in samples))
    lines = (
        _polyline([s.depth for s in samples], xs, top, h, "#3b7dd8")
        + _polyline([s.wanted for s in samples], xs, top, h, "#e07b00", "4 2")
        + _polyline([s.ready for s in samples], xs, top, h, "#2e9e44")
    )
    return (
        f'<svg class="chart" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" '
        f'aria-label="depth and replicas, last {span / 60:.0f} min (max {top})"><rect width="{w}" height="{h}" '
        f'fill="#fff" stroke="#ddd"/>{lines}<text x="3" y="11" font-size="10" fill="#777">{top}</text>'
        f'<text x="{w - 3}" y="{h - 3}" font-size="9" fill="#777" text-anchor="end">{_secs(span)} ago → now</text>'
        "</svg>"
    )


def histogram(hist: dict[str, int], limit: int, w: int = 160, h: int = 40) -> str:
    """Tablets per file count; bars over the file limit in red."""
    if not hist:
        return ""
    top = max(hist.values())
    bw = w / len(hist)
    bars = []
    for i, (files, n) in enumerate(hist.items()):
        bh = max(1.0, (h - 12) * n / top)
        color = "#d8453b" if int(files) > limit else "#3b7dd8"
        bars.append(
            f'<rect x="{i * bw + 1:.1f}" y="{h - 12 - bh:.1f}" width="{max(1.0, bw - 2):.1f}" height="{bh:.1f}" '
            f'fill="{color}"><title>{n} tablet(s) with {files} file(s)</title></rect>'
            f'<text x="{i * bw + bw / 2:.1f}" y="{h - 1}" font-size="9" text-anchor="middle">{files}</text>'
        )
    svg = f'<svg width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" aria-label="files per tablet">'
    return svg + "".join(bars) + "</svg>"


def _groups(data: dict[str, Any]) -> str:
    rows = []
    for name, g in data["groups"].items():
        rows.append(
            f'<tr data-group="{_t(name)}"><td class="l">{_t(name)}</td>'
            + _cell("wanted", g["wanted"])
            + _cell("ready", g["ready"])
            + _cell("busy", g["busy"])
            + _cell("idle", g["idle"])
            + _cell("draining", g["draining"])
            + _cell("queued", g["queued"])
            + _cell("running", g["running"])
            + _cell("depth", g["depth"])
            + _cell("queued_bytes", g["queued_bytes"], human_bytes(g["queued_bytes"]))
            + _cell("oldest_queued_age_s", g["oldest_queued_age_s"], _secs(g["oldest_queued_age_s"]))
            + _cell("hpa_target", g["hpa_target"], f"{g['hpa_target']} jobs/replica")
            + _cell("compactions_committed", g["compactions_committed"])
            + _cell("dead_lettered", g["dead_lettered"])
            + f"<td>{chart(data['charts'].get(name, ()), data['now'])}</td></tr>"
        )
    legend = (
        '<p class="legend muted"><span style="color:#3b7dd8">— queue depth</span>'
        '<span style="color:#e07b00">- - replicas wanted</span><span style="color:#2e9e44">— replicas ready</span>'
        "<span>replicas within each group's min–max; wanted = ceil(depth / target)</span></p>"
    )
    head = _head(
        "group",
        "wanted",
        "ready",
        "busy",
        "idle",
        "draining",
        "queued",
        "running",
        "depth",
        "queued bytes",
        "oldest queued",
        "HPA target",
        "committed",
        "dead-lettered",
        "last hour",
    )
    return f'<h2>Compactor groups</h2><table id="groups">{head}{"".join(rows)}</table>{legend}'


def _running(data: dict[str, Any]) -> str:
    if not data["running"]:
        return '<h2>Running compactions</h2><p class="muted" id="running-none">None running.</p>'
    rows = []
    for r in data["running"]:
        pct = round(100 * r["done"])
        bar = f'<span class="bar"><span style="width:{pct}%"></span></span> {pct}%'
        parts = f"{r['parts_done']}/{r['parts']}" if r["parts"] else "–"
        rows.append(
            f'<tr data-ecid="{_t(r["ecid"])}"><td class="l">{_t(r["ecid"])}</td>'
            + _cell("table", r["table"])
            + _cell("tablet", r["tablet"])
            + _cell("group", r["group"])
            + _cell("kind", r["kind"])
            + _cell("compactor", r["compactor"])
            + _cell("done", r["done"], bar)
            + _cell("bytes_read", r["bytes_read"], f"{human_bytes(r['bytes_read'])} / {human_bytes(r['input_bytes'])}")
            + _cell("parts", parts)
            + _cell("resumed_parts", r["resumed_parts"])
            + _cell("elapsed_s", r["elapsed_s"], _secs(r["elapsed_s"]))
            + _cell("left_s", r["left_s"], _secs(r["left_s"]))
            + "</tr>"
        )
    head = _head(
        "ECID",
        "table",
        "tablet",
        "group",
        "kind",
        "compactor",
        "progress",
        "read",
        "ranges",
        "resumed",
        "running",
        "left",
    )
    return f'<h2>Running compactions</h2><table id="running">{head}{"".join(rows)}</table>'


def _tables(data: dict[str, Any]) -> str:
    if not data["tables"]:
        return '<h2>Tables</h2><p class="muted">No tables.</p>'
    rows = []
    for name, t in data["tables"].items():
        f = t["files_per_tablet"]
        rows.append(
            f'<tr data-table="{_t(name)}"><td class="l">{_t(name)}</td>'
            + _cell("score", t["score"])
            + _cell("state", t["state"])
            + _cell("tablets", t["tablets"])
            + _cell("files", t["files"])
            + _cell("files_max", f["max"], f"{f['min']}·{f['median']}·{f['max']}")
            + f"<td>{histogram(f['histogram'], t['file_limit'])}</td>"
            + _cell("over_limit", t["over_limit"], f"{t['over_limit']} (limit {t['file_limit']})")
            + _cell("deletes_ratio", t["deletes_ratio"], f"{100 * t['deletes_ratio']:.1f}%")
            + _cell("running_compactions", t["running_compactions"])
            + "</tr>"
        )
    head = _head(
        "table",
        "score",
        "state",
        "tablets",
        "files",
        "files/tablet min·median·max",
        "files per tablet",
        "over the file limit",
        "deletes",
        "running",
    )
    note = (
        '<p class="muted">Most in need of compaction first. Score = extra files per tablet on average '
        "+ 10 × share of tablets over the file limit + 10 × share of delete markers.</p>"
    )
    return f'<h2>Tables</h2><table id="tables">{head}{"".join(rows)}</table>{note}'


def _history(data: dict[str, Any]) -> str:
    if not data["history"]:
        return '<h2>History</h2><p class="muted" id="history-none">No finished compactions recorded.</p>'
    rows = []
    for r in data["history"]:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r["finished"]))
        rows.append(
            f'<tr data-ecid="{_t(r["ecid"])}"{" class=failed" if r["failed"] else ""}>'
            f'<td class="l">{when}</td>'
            + _cell("outcome", r["outcome"], cls="outcome")
            + _cell("group", r["group"])
            + _cell("table", r["table"])
            + _cell("tablet", r["tablet"])
            + _cell("kind", r["kind"])
            + _cell("compactor", r["compactor"])
            + _cell("engine", r["engine"] or "–")
            + _cell("input", r["input_files"], f"{r['input_files']} · {human_bytes(r['input_bytes'])}")
            + _cell("output_bytes", r["output_bytes"], human_bytes(r["output_bytes"]))
            + _cell("deletes_dropped", r["deletes_dropped"], _count(r["deletes_dropped"]))
            + _cell("queued_s", r["queued_s"], _secs(r["queued_s"]))
            + _cell("merge_s", r["merge_s"], _secs(r["merge_s"]))
            + _cell("commit_s", r["commit_s"], _secs(r["commit_s"]))
            + _cell("resumed_parts", r["resumed_parts"])
            + _cell("reason", r["reason"], cls="reason")
            + "</tr>"
        )
    head = _head(
        "finished (UTC)",
        "outcome",
        "group",
        "table",
        "tablet",
        "kind",
        "compactor",
        "engine",
        "input files · bytes",
        "output",
        "deletes dropped",
        "queued",
        "merge",
        "commit",
        "resumed",
        "reason",
    )
    title = '<h2>History <span class="muted">(failures first)</span></h2>'
    return f'{title}<table id="history">{head}{"".join(rows)}</table>'


def is_empty(data: dict[str, Any]) -> bool:
    return not (data["groups"] or data["tables"] or data["running"] or data["history"])


def render(data: dict[str, Any]) -> str:
    """The whole page."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(data["now"]))
    parts: Iterable[str]
    if is_empty(data):
        parts = (
            '<p class="empty" id="empty">Nothing here yet: no compactor groups, no tables and no compactions. '
            "Create a table and write to it (or start <code>kompaktor demo</code>) and this page fills in.</p>",
        )
    else:
        extra = ""
        if data["dead_letters"] or data["retries_pending"]:
            extra = (
                f'<p id="failures">Dead-lettered jobs: <b data-k="dead_letters">{data["dead_letters"]}</b>; '
                f'failed jobs waiting out their backoff: <b data-k="retries_pending">{data["retries_pending"]}</b>.</p>'
            )
        parts = (extra, _groups(data), _running(data), _tables(data), _history(data))
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="refresh" content="{REFRESH_S}"><title>Kompaktor status</title>'
        f"<style>{_CSS}</style></head><body><h1>Kompaktor status</h1>"
        f'<p class="muted">{stamp} · read-only · reloads every {REFRESH_S}s · '
        '<a href="/metrics">/metrics</a></p>' + "".join(parts) + "</body></html>\n"
    )
