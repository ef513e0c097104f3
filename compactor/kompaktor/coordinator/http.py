"""The coordinator's HTTP endpoints: ``/metrics`` (Prometheus: the queues, the autoscaling
signal) and ``/status``, the read-only status page (:mod:`.page`; ``/`` redirects to it).
GET only; nothing here changes state."""

from __future__ import annotations

import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kompaktor.coordinator import page, statuspage
from kompaktor.model.errors import KompaktorError
from kompaktor.model.redact import redact_text

if TYPE_CHECKING:
    from kompaktor.coordinator.core import Coordinator

log = logging.getLogger("kompaktor.coordinator")

STATUS_PATH = "/status"
#: a page rendered this recently is served again: viewers reloading it (every 10 s each) read the
#: store once a second at most, and one render runs at a time
CACHE_S = 1.0


def status_html(coord: Coordinator) -> str:
    """The status page now (reads the store)."""
    return page.render(statuspage.collect(coord.store, coord.samples))


def serve(coord: Coordinator, port: int, host: str = "0.0.0.0") -> ThreadingHTTPServer:
    """Serve ``/metrics`` and ``/status`` from a daemon thread; the caller shuts the server down."""
    lock = threading.Lock()
    cached: list[tuple[float, bytes]] = []

    def page_body() -> bytes:
        with lock:
            if cached and time.monotonic() - cached[0][0] < CACHE_S:
                return cached[0][1]
            body = status_html(coord).encode()
            cached[:] = [(time.monotonic(), body)]
            return body

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_args: Any) -> None:
            pass

        def _send(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8", **headers: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for k, v in headers.items():
                self.send_header(k.replace("_", "-"), v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(coord.metrics.registry), CONTENT_TYPE_LATEST)
            elif path == STATUS_PATH:
                try:
                    body = page_body()
                except KompaktorError as exc:  # Redis away: say so, and the page comes back by itself
                    self._send(503, f"status unavailable: {redact_text(str(exc))}\n".encode(), Retry_After="5")
                    return
                self._send(200, body, "text/html; charset=utf-8", Cache_Control="no-store")
            elif path == "/":
                self._send(302, b"", Location=STATUS_PATH)
            else:
                self._send(404, b"not found\n")

        do_HEAD = do_GET

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server
