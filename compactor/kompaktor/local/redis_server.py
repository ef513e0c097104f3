"""An embedded ``redis-server`` for local mode and tests: own port, own data directory, AOF on."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import quote

import redis

from kompaktor.local.procs import spawn
from kompaktor.model.errors import KompaktorError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisProcess:
    """A redis-server child process; can be stopped (or killed) and restarted on the same port
    and data directory, which is how fault tests restart Redis."""

    def __init__(self, data_dir: str | Path, port: int | None = None, *, password: str | None = None) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise KompaktorError("redis-server is not installed (run `make install`, or apt-get install redis-server)")
        self.exe = exe
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        #: with a password the server requires AUTH; it is written to a config file (mode 0600),
        #: never put on redis-server's command line (visible to every process on the host)
        self.password = password
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """The server's URL, with the password when it has one (redact before showing it:
        :func:`kompaktor.model.redact.redact_url`)."""
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def _config_args(self) -> list[str]:
        if not self.password:
            return []
        conf = self.data_dir / "redis.conf"
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f'requirepass "{self.password}"\n')
        return [str(conf)]

    def start(self, timeout: float = 30.0) -> RedisProcess:
        # own process group, and killed by the kernel if this process dies (local.procs)
        self.proc = spawn(
            [self.exe, *self._config_args(), "--port", str(self.port), "--bind", "127.0.0.1",
             "--dir", str(self.data_dir),
             "--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--daemonize", "no",
             "--loglevel", "warning", "--logfile", str(self.data_dir / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        client = redis.Redis(port=self.port, password=self.password, socket_connect_timeout=1)
        try:
            while True:
                try:
                    if client.ping():
                        return self
                except (redis.ConnectionError, redis.BusyLoadingError, redis.TimeoutError):
                    if self.proc.poll() is not None:
                        raise KompaktorError(f"redis-server exited; see {self.data_dir / 'redis.log'}") from None
                    if time.monotonic() > deadline:
                        raise KompaktorError("redis-server did not start in time") from None
                    time.sleep(0.02)
        finally:
            client.close()

    def stop(self, kill: bool = False) -> None:
        if self.proc is not None and self.proc.poll() is None:
            if kill:
                self.proc.kill()
            else:
                self.proc.terminate()
            self.proc.wait(timeout=30)
        self.proc = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None
