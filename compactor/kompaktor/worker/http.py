"""The compactor's HTTP endpoints. GET never changes state: ``/healthz``, ``/readyz`` (200 only
while the compactor takes jobs), ``/metrics`` (Prometheus), ``/state``. ``POST /drain`` asks the
compactor to drain, and is accepted only

- over loopback: the request arrived at 127.0.0.1 (or ::1) from a loopback address — the pod's
  own preStop hook, ``kompaktor drain``, which sends it to 127.0.0.1; a peer on the pod network
  reaches the pod's own address, never 127.0.0.1 (other 127.0.0.0/8 addresses count as the pod's
  address: nothing in a pod sends to them, and tests on one host stand for peers with them), or
- with ``Authorization: Bearer <token>`` matching the drain token (env KOMPAKTOR_DRAIN_TOKEN or a
  token file, re-read at each request so a rotated Secret applies): what the operator holds.

Anything else gets 403 and changes nothing."""

from __future__ import annotations

import hmac
import ipaddress
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kompaktor.worker.metrics import CompactorMetrics

DEFAULT_PORT = 8080
TOKEN_ENV = "KOMPAKTOR_DRAIN_TOKEN"
#: the addresses a drain request may arrive at without a token (where ``kompaktor drain`` sends it)
LOOPBACK = (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))


def token_source(token: str | None = None, token_file: str | None = None) -> Callable[[], str | None]:
    """The drain token, read when asked: from ``token_file`` (re-read each time) else ``token``.
    An empty token is no token."""

    def current() -> str | None:
        value = Path(token_file).read_text().strip() if token_file else (token or "").strip()
        return value or None

    if token_file:
        current()  # a missing or unreadable file is an error at start, not at the first drain
    return current


class Served(Protocol):
    """What the endpoints read and ask of the compactor (:class:`kompaktor.worker.compactor.Compactor`,
    which imports this module, not the other way round)."""

    ready: bool
    state: str
    drain: threading.Event
    metrics: CompactorMetrics

    def request_drain(self, why: str = ..., finish: bool = ...) -> None: ...


def _ip(addr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(addr.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def over_loopback(local_addr: str, peer_addr: str) -> bool:
    """A request that arrived at 127.0.0.1 / ::1 from a loopback address: from inside the pod."""
    local, peer = _ip(local_addr), _ip(peer_addr)
    return local in LOOPBACK and peer is not None and peer.is_loopback


def bearer_ok(header: str | None, token: str | None) -> bool:
    if not token or not header:
        return False
    scheme, _, given = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


def _current(drain_token: Callable[[], str | None] | None) -> str | None:
    try:
        return drain_token() if drain_token is not None else None
    except OSError:  # the token file went away: no token, so no drain from outside the pod
        return None


def serve(
    worker: Served, port: int, host: str = "0.0.0.0", drain_token: Callable[[], str | None] | None = None
) -> ThreadingHTTPServer:
    """Start serving in a daemon thread; the caller shuts the server down. ``drain_token`` gives
    the token that authorizes ``POST /drain`` from elsewhere than loopback (None: loopback only)."""

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
            if self.path != "/drain":
                self._send(404, b"not found\n")
                return
            peer = self.client_address[0]
            if over_loopback(self.connection.getsockname()[0], peer):
                why = "HTTP POST /drain over loopback"
            elif bearer_ok(self.headers.get("Authorization"), _current(drain_token)):
                why = f"HTTP POST /drain with the drain token from {peer}"
            else:
                self._send(403, b"forbidden: drain is accepted over loopback or with the drain token\n")
                return
            worker.request_drain(why)
            self._send(200, b"draining\n")

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server


def request_drain(
    port: int = DEFAULT_PORT, host: str = "127.0.0.1", timeout: float = 5.0, token: str | None = None
) -> str:
    """Ask the compactor listening on ``host:port`` to drain (what the preStop hook runs); with
    ``token``, as a bearer token (needed unless ``host`` is 127.0.0.1 or ::1)."""
    import urllib.request

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url_host = f"[{host}]" if ":" in host else host
    req = urllib.request.Request(f"http://{url_host}:{port}/drain", method="POST", data=b"", headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        answer: bytes = resp.read()
        return answer.decode().strip()
