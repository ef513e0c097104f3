"""The compactor's HTTP endpoints. GET never changes state: ``/healthz``, ``/readyz`` (200 only
while the compactor takes jobs), ``/metrics`` (Prometheus), ``/state``. ``POST /drain`` asks the
compactor to drain (the pod's preStop hook sends it with ``kompaktor drain``)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

if TYPE_CHECKING:
    from kompaktor.worker.compactor import Compactor

DEFAULT_PORT = 8080


def serve(worker: Compactor, port: int, host: str = "0.0.0.0") -> ThreadingHTTPServer:
    """Start serving in a daemon thread; the caller shuts the server down."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_args: Any) -> None:
            pass

        def _send(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/healthz":
                self._send(200, b"ok\n")
            elif self.path == "/readyz":
                ok = worker.ready and not worker.drain.is_set()
                self._send(200 if ok else 503, b"ready\n" if ok else b"not ready\n")
            elif self.path == "/metrics":
                self._send(200, generate_latest(worker.metrics.registry), CONTENT_TYPE_LATEST)
            elif self.path == "/state":
                self._send(200, f"{worker.state}\n".encode())
            elif self.path == "/drain":
                self.send_response(405)
                self.send_header("Allow", "POST")
                self.send_header("Content-Length", "0")
                self.end_headers()
            else:
                self._send(404, b"not found\n")

        def do_POST(self) -> None:
            if self.path == "/drain":
                worker.request_drain("HTTP POST /drain")
                self._send(200, b"draining\n")
            else:
                self._send(404, b"not found\n")

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server


def request_drain(port: int = DEFAULT_PORT, host: str = "127.0.0.1", timeout: float = 5.0) -> str:
    """Ask the compactor listening on ``host:port`` to drain (what the preStop hook runs)."""
    import urllib.request

    req = urllib.request.Request(f"http://{host}:{port}/drain", method="POST", data=b"")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.read().decode().strip()
