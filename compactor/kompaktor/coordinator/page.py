"""The status page as HTML (docs/ui.md "The status page"): pure, from
:func:`kompaktor.coordinator.statuspage.collect`'s data.

Plain HTML with inline CSS and inline SVG charts: no script, no build step, nothing fetched from
elsewhere; the page reloads itself every :data:`REFRESH_S` seconds (a ``<meta>`` refresh). The
HTML comes from Jinja2 templates shipped in the package (``templates/``: the page, and one per
section — failures, groups, running compactions, tables, history — with the cells' macros), with
autoescaping on: every value from the store is escaped, and the ``text`` filter passes it through
the log's redaction (:func:`kompaktor.model.redact.redact_text`) first, so a credential in a
failure's reason never shows. The two small SVG charts are built here from figures alone.
Each figure is in an element with a ``data-k`` attribute (its key in the data) inside a row with
``data-group``, ``data-table`` or ``data-ecid``: what the browser test reads.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import jinja2
from markupsafe import Markup

from kompaktor.model.redact import redact_text

if TYPE_CHECKING:
    from kompaktor.coordinator.statuspage import PageData, Sample

REFRESH_S = 10


def _text(value: object) -> str:
    """A value from the store as page text, redacted (the template escapes it)."""
    return redact_text(str(value))


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


def _polyline(values: Sequence[float], xs: Sequence[float], top: float, h: float, color: str, dash: str = "") -> str:
    pts = " ".join(f"{x:.1f},{h - 2 - (v / top) * (h - 4):.1f}" for x, v in zip(xs, values, strict=True))
    d = f' stroke-dasharray="{dash}"' if dash else ""
    return f'<polyline fill="none" stroke="{color}" stroke-width="1.5"{d} points="{pts}"/>'


def chart(samples: Sequence[Sample], now: float, window_s: float = 3600.0, w: int = 240, h: int = 56) -> str:
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
    for i, (label, n) in enumerate(hist.items()):
        files = int(label)  # a figure: nothing to escape
        bh = max(1.0, (h - 12) * n / top)
        color = "#d8453b" if files > limit else "#3b7dd8"
        bars.append(
            f'<rect x="{i * bw + 1:.1f}" y="{h - 12 - bh:.1f}" width="{max(1.0, bw - 2):.1f}" height="{bh:.1f}" '
            f'fill="{color}"><title>{n} tablet(s) with {files} file(s)</title></rect>'
            f'<text x="{i * bw + bw / 2:.1f}" y="{h - 1}" font-size="9" text-anchor="middle">{files}</text>'
        )
    svg = f'<svg width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" aria-label="files per tablet">'
    return svg + "".join(bars) + "</svg>"


def _utc(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(epoch))


def _percent(done: float) -> int:
    return round(100 * done)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("kompaktor.coordinator", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(text=_text, human_bytes=human_bytes, secs=_secs, figure=_count, utc=_utc, percent=_percent)
    # the charts are built from figures only (no text from the store): markup as they are
    env.globals.update(
        TEXT=_TEXT,
        TEXT_HEADS=_TEXT_HEADS,
        chart=lambda samples, now: Markup(chart(samples, now)),
        histogram=lambda hist, limit: Markup(histogram(hist, limit)),
    )
    return env


_ENV = _environment()


def is_empty(data: PageData) -> bool:
    return not (data["groups"] or data["tables"] or data["running"] or data["history"])


def render(data: PageData) -> str:
    """The whole page."""
    return _ENV.get_template("page.html.j2").render(
        **data,
        stamp=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(data["now"])),
        refresh_s=REFRESH_S,
        empty=is_empty(data),
    )
