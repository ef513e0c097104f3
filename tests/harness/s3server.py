"""An S3 API server for tests: moto in server mode (it speaks the S3 REST protocol), on a free port
of a given address (loopback by default; the real-node tier binds it to the node's bridge so pods
reach it), with its own credentials, stopped by its PID.

Clients get the endpoint the way users give one for MinIO, Ceph RGW or R2: ``AWS_ENDPOINT_URL``
in the environment (pyarrow's S3 filesystem reads it), with ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` / ``AWS_REGION`` beside it — :meth:`S3Server.env`.
"""

from __future__ import annotations

import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class S3Server:
    def __init__(self, root: Path, host: str = "127.0.0.1") -> None:
        self.root = Path(root)
        self.host = host
        self.port = 0
        self.access_key = "AKIA" + secrets.token_hex(8).upper()
        self.secret_key = secrets.token_urlsafe(30)
        self.popen: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def env(self) -> dict[str, str]:
        """What a client needs, as environment variables (never arguments)."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": self.endpoint}

    def start(self, timeout: float = 60) -> S3Server:
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = _free_port(self.host)
        server = Path(sys.executable).parent / "moto_server"
        log = open(self.root / "moto.log", "wb")  # noqa: SIM115 - the server's for its life
        self.popen = subprocess.Popen([str(server), "-H", self.host, "-p", str(self.port)], stdout=log,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                      cwd=self.root)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"moto_server exited ({self.popen.returncode}): "
                                   f"{(self.root / 'moto.log').read_text()[-2000:]}")
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=2).close()
                return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"moto_server did not answer on {self.endpoint}")

    def create_bucket(self, name: str) -> None:
        import pyarrow.fs as pafs

        fs = pafs.S3FileSystem(access_key=self.access_key, secret_key=self.secret_key, region="us-east-1",
                               endpoint_override=self.endpoint, scheme="http", allow_bucket_creation=True)
        fs.create_dir(name)

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
