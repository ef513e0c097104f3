"""Issue 16 §3: drain is a POST, accepted over loopback (the pod's own preStop hook sends it to
127.0.0.1) or with the drain token the operator holds; an anonymous request from anywhere else is
refused with 403 and changes nothing; GET endpoints stay read-only.

One host stands in for a pod and its network: the compactor's HTTP server bound to 127.0.0.2 (or
to 0.0.0.0 and reached at 127.0.0.2) plays the pod's own address, which is what a peer on the pod
network reaches; 127.0.0.1 plays the pod's loopback. Real sockets, real compactor HTTP server."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from kompaktor.cli import main
from kompaktor.worker import Compactor, WorkerSettings
from kompaktor.worker.http import over_loopback, request_drain, token_source

pytestmark = pytest.mark.redis

TOKEN = "drain-token-5b7e"


def call(host: str, port: int, path: str, method: str = "GET", token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(
        f"http://{host}:{port}{path}", method=method, headers=headers, data=b"" if method == "POST" else None
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def compactor(store, storage) -> Iterator:
    """serve(host, token=…, token_file=…) → (worker, port); every server is closed afterwards."""
    workers: list[Compactor] = []

    def serve(host: str, token: str | None = None, token_file: str | None = None) -> tuple[Compactor, int]:
        w = Compactor(store, storage, WorkerSettings("small", f"c{len(workers)}", engine="arrow"))
        workers.append(w)
        return w, w.serve_http(0, host, token_source(token, token_file))

    yield serve
    for w in workers:
        w.close()


def test_anonymous_drain_from_the_pod_network_is_refused(compactor) -> None:
    w, port = compactor("127.0.0.2", token=TOKEN)
    assert call("127.0.0.2", port, "/drain", "POST") == (
        403,
        "forbidden: drain is accepted over loopback or with the drain token\n",
    )
    assert call("127.0.0.2", port, "/drain", "POST", token="wrong")[0] == 403
    assert call("127.0.0.2", port, "/drain", "POST", token=TOKEN[:-1])[0] == 403
    assert not w.drain.is_set()
    # the read-only endpoints answer anyone, and a GET never drains
    assert call("127.0.0.2", port, "/healthz") == (200, "ok\n")
    assert call("127.0.0.2", port, "/state") == (200, "idle\n")
    assert call("127.0.0.2", port, "/metrics")[0] == 200
    assert call("127.0.0.2", port, "/drain")[0] == 405
    assert not w.drain.is_set()
    # the operator's token drains
    assert call("127.0.0.2", port, "/drain", "POST", token=TOKEN) == (200, "draining\n")
    assert w.drain.is_set()


def test_without_a_token_only_loopback_drains(compactor) -> None:
    w, port = compactor("127.0.0.2")
    assert call("127.0.0.2", port, "/drain", "POST", token="anything")[0] == 403
    assert not w.drain.is_set()
    w, port = compactor("127.0.0.1")
    assert request_drain(port) == "draining"  # `kompaktor drain` in the preStop hook
    assert w.drain.is_set()


def test_a_server_on_every_address_tells_loopback_from_the_pod_address(compactor) -> None:
    """Bound to 0.0.0.0 as in a pod: the same server refuses a request that arrives at the pod's
    address and takes one that arrives at 127.0.0.1."""
    w, port = compactor("0.0.0.0")
    assert call("127.0.0.2", port, "/drain", "POST")[0] == 403
    assert not w.drain.is_set()
    assert call("127.0.0.1", port, "/drain", "POST") == (200, "draining\n")
    assert w.drain.is_set()


def test_the_token_file_is_reread_so_a_rotated_secret_applies(compactor, tmp_path: Path) -> None:
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    w, port = compactor("127.0.0.2", token_file=str(f))
    f.write_text("rotated-token\n")
    assert call("127.0.0.2", port, "/drain", "POST", token=TOKEN)[0] == 403
    f.unlink()
    assert call("127.0.0.2", port, "/drain", "POST", token="rotated-token")[0] == 403
    assert not w.drain.is_set()
    f.write_text("rotated-token\n")
    assert call("127.0.0.2", port, "/drain", "POST", token="rotated-token")[0] == 200
    assert w.drain.is_set()
    with pytest.raises(FileNotFoundError):
        token_source(None, str(tmp_path / "missing"))


def test_kompaktor_drain_sends_the_token(compactor, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    w, port = compactor("127.0.0.2", token=TOKEN)
    args = ["drain", "--host", "127.0.0.2", "--port", str(port)]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 1
    assert r.stderr == (
        f"error: the compactor on 127.0.0.2:{port} refused to drain: HTTP 403 forbidden: "
        "drain is accepted over loopback or with the drain token\n"
    )
    assert not w.drain.is_set()
    (tmp_path / "token").write_text(TOKEN)
    r = CliRunner().invoke(main, [*args, "--token-file", str(tmp_path / "token")])
    assert (r.exit_code, r.stdout) == (0, "draining\n")
    w, port = compactor("127.0.0.2", token=TOKEN)
    monkeypatch.setenv("KOMPAKTOR_DRAIN_TOKEN", TOKEN)
    r = CliRunner().invoke(main, ["drain", "--host", "127.0.0.2", "--port", str(port)])
    assert (r.exit_code, r.stdout) == (0, "draining\n") and w.drain.is_set()


@pytest.mark.parametrize(
    ("local", "peer", "ok"),
    [
        ("127.0.0.1", "127.0.0.1", True),
        ("::1", "::1", True),
        ("::ffff:127.0.0.1", "::ffff:127.0.0.1", True),
        ("127.0.0.1", "10.1.2.3", False),  # cannot happen on a real network; refused anyway
        ("127.0.0.2", "127.0.0.1", False),  # arrived at the pod's address
        ("10.0.0.5", "10.0.0.9", False),
        ("0.0.0.0", "127.0.0.1", False),
        ("not-an-ip", "127.0.0.1", False),
    ],
)
def test_over_loopback(local: str, peer: str, ok: bool) -> None:
    assert over_loopback(local, peer) is ok
