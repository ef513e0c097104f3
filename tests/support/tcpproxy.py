"""A TCP proxy in front of a server, to give its clients an outage without stopping it (moto keeps
its objects in memory; a stopped server would lose them).

:meth:`TcpProxy.cut` closes every open connection and stops listening, so new connections are
refused, as when a store's endpoint goes away; :meth:`TcpProxy.restore` listens again on the same
port. :meth:`TcpProxy.cut_when` arms a trigger: the first request whose bytes contain a marker
(for S3, ``partNumber=`` — a writer uploading a part of its output) cuts the proxy before that
request reaches the server, so a test can place the outage in the middle of a merge without
racing it. :meth:`TcpProxy.hold_when` arms a pause instead: the first request containing its
marker waits in the proxy (``held`` is set) until :meth:`TcpProxy.release`, so a test can keep a
merge's upload in flight across whatever it does meanwhile (an upgrade). A client's own request
timeout ends a held request (the S3 SDK under pyarrow gives up on a silent connection within
seconds and sends it again): ``hold_when(marker, every=True)`` holds every request containing the
marker, retries included, so that no upload can complete until :meth:`release`; a marker may be
a compiled bytes pattern (for S3, the PUTs of one kind of object only).
"""

from __future__ import annotations

import re
import socket
import threading


class TcpProxy:
    def __init__(self, target: tuple[str, int], host: str = "127.0.0.1") -> None:
        self.target = target
        self.host = host
        self.port = 0
        self.cut_event = threading.Event()
        self._marker: bytes | None = None
        self._hold: bytes | re.Pattern[bytes] | None = None
        self._hold_every = False
        self.held = threading.Event()
        self._released = threading.Event()
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> TcpProxy:
        self._listen()
        return self

    def _listen(self) -> None:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((self.host, self.port))
        s.listen(64)
        self.port = s.getsockname()[1]
        self._listener = s
        t = threading.Thread(target=self._accept, args=(s,), name="proxy-accept", daemon=True)
        t.start()
        self._threads.append(t)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed by cut() or stop()
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                if self.cut_event.is_set():
                    client.close()
                    upstream.close()
                    continue
                self._conns.update((client, upstream))
            for src, dst, watch in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(target=self._pump, args=(src, dst, watch), name="proxy-pump", daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, watch: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if watch and self._marker is not None and self._marker in data:
                    self._marker = None
                    self.cut()
                    return
                if watch and self._holds(data):
                    if not self._hold_every:
                        self._hold = None
                    self.held.set()
                    self._released.wait()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
            with self._lock:
                self._conns.discard(src)
                self._conns.discard(dst)

    def _holds(self, data: bytes) -> bool:
        hold = self._hold
        if hold is None:
            return False
        return hold.search(data) is not None if isinstance(hold, re.Pattern) else hold in data

    def cut_when(self, marker: bytes) -> None:
        """Cut the proxy at the first client request containing ``marker`` (it is not forwarded)."""
        self._marker = marker

    def hold_when(self, marker: bytes | re.Pattern[bytes], *, every: bool = False) -> None:
        """Hold the first client request containing ``marker`` until :meth:`release` (once); with
        ``every``, each one until then (``held`` is set at the first)."""
        self.held.clear()
        self._released.clear()
        self._hold_every = every
        self._hold = marker

    def release(self) -> None:
        """Let a held request through (and disarm a hold not yet met)."""
        self._hold = None
        self._released.set()

    def cut(self) -> None:
        """Every connection closed, new ones refused, until :meth:`restore`."""
        with self._lock:
            self.cut_event.set()
            if self._listener is not None:
                self._listener.close()
                self._listener = None
            conns, self._conns = list(self._conns), set()
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def restore(self) -> None:
        with self._lock:
            self.cut_event.clear()
        self._listen()

    def stop(self) -> None:
        self._marker = None
        self.release()
        self.cut()
