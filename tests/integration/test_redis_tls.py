"""Issue 16 §4: Redis over TLS, ``rediss://`` end to end, against a real TLS-only redis-server.

The test makes its own CA and server certificate with openssl and starts redis-server 7 with
``--port 0 --tls-port`` (TLS only, a password in a 0600 config file) — what the chart's
``redis.tls.enabled`` runs. The CLI, the coordinator, a compactor and the operator's Redis
backend connect with ``rediss://:PASSWORD@host:port/0?ssl_ca_certs=<ca.crt>`` (the URL the chart
puts in its Secret); without the CA, or in plain text, they are refused in one line that never
shows the password. Every process is stopped by its PID.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.support.ports import free_port
from tests.support.tls import make_ca, sign
from tests.support.wait import poll

pytestmark = pytest.mark.redis

PASSWORD = "PLANTED-tls-5e1c"
EXE = Path(sys.executable).parent / "kompaktor"


def make_certs(d: Path) -> Path:
    """A CA and a server certificate for localhost / 127.0.0.1 signed by it; returns the CA file."""
    make_ca(d, "ca", "kompaktor-test-ca", days=1)
    (d / "san.cnf").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    sign(d, "tls", "localhost", "ca", days=1, extfile="san.cnf")
    return d / "ca.crt"


@dataclass
class TlsRedis:
    port: int
    ca: Path
    proc: subprocess.Popen

    def url(self, ca: bool = True, host: str = "127.0.0.1") -> str:
        query = f"?ssl_ca_certs={self.ca}" if ca else ""
        return f"rediss://:{PASSWORD}@{host}:{self.port}/0{query}"


def _stop(p: subprocess.Popen, timeout: float = 30) -> None:
    if p.poll() is None:
        os.kill(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGKILL)
            p.wait(timeout=10)


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[TlsRedis]:
    if shutil.which("redis-server") is None or shutil.which("openssl") is None:
        pytest.fail("redis-server and openssl are needed (make install)")
    d = tmp_path / "tls"
    ca = make_certs(d)
    conf = d / "redis.conf"
    fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f'requirepass "{PASSWORD}"\n')
    port = free_port()
    proc = subprocess.Popen(
        [
            "redis-server",
            str(conf),
            "--port",
            "0",
            "--tls-port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--tls-cert-file",
            str(d / "tls.crt"),
            "--tls-key-file",
            str(d / "tls.key"),
            "--tls-ca-cert-file",
            str(ca),
            "--tls-auth-clients",
            "no",
            "--dir",
            str(d),
            "--save",
            "",
            "--appendonly",
            "no",
            "--logfile",
            str(d / "redis.log"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = TlsRedis(port, ca, proc)
    try:
        poll(lambda: redis.Redis.from_url(server.url()).ping(), "the TLS redis-server", 30, ignore=Exception)
        yield server
    finally:
        _stop(proc)


def run_cli(*args: str, url: str, storage: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(EXE), *args, "--redis", url, "--storage", str(storage)], capture_output=True, text=True, timeout=120
    )


def test_the_server_speaks_tls_only(tls_redis: TlsRedis) -> None:
    plain = redis.Redis(port=tls_redis.port, password=PASSWORD, socket_connect_timeout=2, socket_timeout=2)
    with pytest.raises(redis.ConnectionError):
        plain.ping()
    plain.close()
    probe = subprocess.run(
        ["redis-cli", "--tls", "--cacert", str(tls_redis.ca), "-p", str(tls_redis.port), "ping"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "REDISCLI_AUTH": PASSWORD},
    )
    assert probe.stdout.strip() == "PONG", probe  # the chart's probe: password from the environment


def test_cli_over_rediss_with_the_ca(tls_redis: TlsRedis, tmp_path: Path) -> None:
    files = tmp_path / "files"
    for host in ("127.0.0.1", "localhost"):  # the certificate's IP and DNS names, both verified
        out = run_cli("table", "create", f"t-{host.replace('.', '-')}", url=tls_redis.url(host=host), storage=files)
        assert out.returncode == 0, out.stderr
    out = run_cli("status", url=tls_redis.url(), storage=files)
    assert out.returncode == 0 and "t-localhost" in out.stdout, out.stderr
    # without the CA the server's certificate is not trusted; in plain text the server hangs up
    # (the wording of that line is the store's; here: one line, exit 1, no password)
    for url, message in (
        (tls_redis.url(ca=False), "certificate"),
        (tls_redis.url(ca=False).replace("rediss://", "redis://"), ""),
    ):
        out = run_cli("status", url=url, storage=files)
        assert out.returncode == 1, out
        assert out.stderr.count("\n") == 1 and out.stderr.startswith("error: "), out.stderr
        assert message in out.stderr.lower() and "://***@127.0.0.1:" in out.stderr, out.stderr
        assert PASSWORD not in out.stderr + out.stdout


def test_coordinator_compactor_and_operator_backend_over_rediss(tls_redis: TlsRedis, tmp_path: Path) -> None:
    from kompaktor.metadata.store import MetadataStore
    from kompaktor_operator.backend import RedisBackend

    url = tls_redis.url()
    env = {**os.environ, "KOMPAKTOR_REDIS_URL": url, "KOMPAKTOR_LOG": "DEBUG", "PYTHONUNBUFFERED": "1"}
    http_port = free_port()
    args = {
        "coordinator": ["coordinator", "--metrics-port", "-1", "--full-scan-interval", "1"],
        "compactor": [
            "compactor",
            "--group",
            "small",
            "--engine",
            "arrow",
            "--http-host",
            "127.0.0.1",
            "--http-port",
            str(http_port),
            "--id",
            "tls-c1",
        ],
    }
    logs = {name: tmp_path / f"{name}.log" for name in args}
    procs: dict[str, subprocess.Popen] = {}
    store = MetadataStore.from_url(url)
    try:
        for name, argv in args.items():
            with open(logs[name], "wb") as out:
                procs[name] = subprocess.Popen(
                    [str(EXE), *argv, "--storage", str(tmp_path / "files")],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
        poll(
            lambda: "leads (fencing token" in logs["coordinator"].read_text(),
            "the coordinator's lease",
            ignore=Exception,
        )
        # the compactor registered itself in Redis (a heartbeat over TLS) and says it is ready
        poll(
            lambda: any(c.id == "tls-c1" for c in store.fleet.compactors("small")),
            "the compactor's heartbeat",
            ignore=Exception,
        )
        poll(
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{http_port}/readyz", timeout=2).status == 200,
            "the compactor ready",
            ignore=Exception,
        )
        backend = RedisBackend(url)  # the operator's Redis path
        assert "tls-c1" in backend.compactors("small")
        assert backend.queue_figures("small").queued == 0
        backend.store.close()
        for name, p in procs.items():
            assert p.poll() is None, logs[name].read_text()
    finally:
        for p in procs.values():
            _stop(p)
        store.close()
    for name in args:
        text = logs[name].read_text()
        assert PASSWORD not in text and "Traceback" not in text, text


def _chart_redis(tls: bool) -> dict[str, Any]:
    import helm_python as helm
    import yaml

    chart_dir = Path(__file__).resolve().parents[2] / "helm" / "kompaktor"
    with helm.Chart.load(str(chart_dir)) as chart:
        out = chart.render(
            {"redis": {"tls": {"enabled": tls}}, "storage": {"uri": "s3://compactions/kompaktor"}},
            name="kompaktor",
            namespace="ns",
            is_install=True,
        )
    sts = next(d for d in yaml.safe_load_all(out["kompaktor/templates/redis.yaml"]) if d and d["kind"] == "StatefulSet")
    return sts["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_the_charts_redis_runs_with_the_password_off_argv(tls: bool, tmp_path: Path) -> None:
    """The chart's own redis-server command and readiness probe, run here as rendered (only the
    data directory, the certificate directory and the port moved): the server requires the
    password, which is on no process' command line, and the probe passes reading it from
    REDISCLI_AUTH."""
    c = _chart_redis(tls)
    port = free_port()
    script = c["args"][0].replace("/data", str(tmp_path))
    probe = c["readinessProbe"]["exec"]["command"]
    if tls:
        certs = tmp_path / "tls"
        make_certs(certs)
        script = script.replace("/etc/redis-tls", str(certs)).replace("--tls-port 6379", f"--tls-port {port}")
        probe = [p.replace("/etc/redis-tls", str(certs)) for p in probe]
    else:
        script = script.replace("exec redis-server ", f"exec redis-server --port {port} ")
    script = script.replace("exec redis-server ", "exec redis-server --bind 127.0.0.1 --save '' ")
    probe = [p.replace("redis-cli ", f"redis-cli -p {port} ") for p in probe]
    assert "PASSWORD" not in " ".join(probe) and " -a " not in " ".join(probe)
    env = {**os.environ, "REDIS_PASSWORD": PASSWORD, "REDISCLI_AUTH": PASSWORD}
    proc = subprocess.Popen([*c["command"], script], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = (
            f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={tmp_path / 'tls' / 'ca.crt'}"
            if tls
            else f"redis://127.0.0.1:{port}/0"
        )
        poll(
            lambda: subprocess.run(probe, env=env, timeout=10).returncode == 0,
            "the chart's readiness probe",
            30,
            ignore=Exception,
        )
        with pytest.raises(redis.AuthenticationError):
            redis.Redis.from_url(url).ping()  # no password: refused
        assert redis.Redis.from_url(url, password=PASSWORD).ping()
        # `exec`: the shell became redis-server; neither its arguments nor any other carry the password
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        assert "redis-server" in cmdline and PASSWORD not in cmdline
        failing = subprocess.run(probe, env={**env, "REDISCLI_AUTH": "wrong"}, timeout=10)
        assert failing.returncode != 0  # the probe really checks the password
    finally:
        _stop(proc)
    assert proc.returncode == 0  # SIGTERM reaches redis-server itself, which shuts down cleanly
