"""An embedded ``redis-server`` for local mode and tests: own port, own data directory, AOF on
with ``appendfsync always`` (a single node acknowledges only what it fsynced: docs/architecture.md
"Durability: what an acknowledgment means"); and a local HA Redis (:class:`RedisHA`): a primary, a
replica and three ``redis-sentinel`` processes that promote the replica when the primary dies
(docs/architecture.md "Redis HA and failover")."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote

import redis

from kompaktor.local.procs import kill_group, spawn
from kompaktor.metadata import acl
from kompaktor.model.errors import KompaktorError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisProcess:
    """A redis-server child process; can be stopped (or killed) and restarted on the same port
    and data directory, which is how fault tests restart Redis."""

    def __init__(
        self,
        data_dir: str | Path,
        port: int | None = None,
        *,
        password: str | None = None,
        replica_of: int | None = None,
        appendfsync: str = "always",
        users: dict[str, str] | None = None,
    ) -> None:
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
        #: the port of the primary this server replicates (on 127.0.0.1), or None: a primary
        self.replica_of = replica_of
        self.appendfsync = appendfsync
        #: a Redis user per role (:mod:`kompaktor.metadata.acl`) with these passwords (role ->
        #: password, :func:`acl.new_passwords`); :meth:`role_url` gives each component its own URL.
        #: The default user stays (with ``password`` if given): what sets the server up uses it.
        self.role_passwords = dict(users or {})
        self.proc: subprocess.Popen[Any] | None = None

    @property
    def url(self) -> str:
        """The server's URL, with the password when it has one (redact before showing it:
        :func:`kompaktor.model.redact.redact_url`)."""
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def role_url(self, role: str) -> str:
        """The URL ``role``'s user connects with (the default user's :attr:`url` without users)."""
        if not self.role_passwords:
            return self.url
        return acl.role_url(self.url, role, self.role_passwords[role])

    def _config_args(self) -> list[str]:
        if not self.password and not self.role_passwords:
            return []
        conf = self.data_dir / "redis.conf"
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            if self.password:
                f.write(f'requirepass "{self.password}"\n')
                f.write(f'masterauth "{self.password}"\n')  # a replica (or a demoted primary) syncs with it
            for role, password in self.role_passwords.items():
                f.write(acl.rule(role, password) + "\n")
        return [str(conf)]

    def start(self, timeout: float = 30.0) -> RedisProcess:
        # own process group, and killed by the kernel if this process dies (local.procs)
        self.proc = spawn(
            [
                self.exe,
                *self._config_args(),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.data_dir),
                "--appendonly",
                "yes",
                "--appendfsync",
                self.appendfsync,
                "--save",
                "",
                "--daemonize",
                "no",
                *(["--replicaof", "127.0.0.1", str(self.replica_of)] if self.replica_of else []),
                "--loglevel",
                "warning",
                "--logfile",
                str(self.data_dir / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
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

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, password=self.password, socket_connect_timeout=1, socket_timeout=5)


def _poll(what: str, ok: Callable[[], object], timeout: float) -> None:
    """Wait until ``ok()`` is true (polled, with a deadline), else fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if ok():
                return
        except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError, redis.ResponseError):
            pass
        if time.monotonic() > deadline:
            raise KompaktorError(f"local Redis HA: {what} did not happen within {timeout:.0f}s")
        time.sleep(0.05)


class SentinelProcess:
    """A ``redis-sentinel`` child process watching the primary ``service`` on 127.0.0.1: its own
    port and directory, its config file (which Sentinel rewrites) written there, mode 0600."""

    def __init__(
        self,
        data_dir: str | Path,
        primary_port: int,
        *,
        service: str,
        quorum: int = 2,
        password: str | None = None,
        port: int | None = None,
        down_after_ms: int = 1000,
    ) -> None:
        exe = shutil.which("redis-sentinel")
        if exe is None:
            raise KompaktorError(
                "redis-sentinel is not installed (run `make install`, or apt-get install redis-sentinel)"
            )
        self.exe = exe
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.primary_port = primary_port
        self.service = service
        self.quorum = quorum
        self.password = password
        self.down_after_ms = down_after_ms
        self.proc: subprocess.Popen[Any] | None = None

    def start(self, timeout: float = 30.0) -> SentinelProcess:
        conf = self.data_dir / "sentinel.conf"
        lines = [
            f"port {self.port}",
            "bind 127.0.0.1",
            f'dir "{self.data_dir}"',
            f'logfile "{self.data_dir / "sentinel.log"}"',
            "loglevel warning",
            f"sentinel monitor {self.service} 127.0.0.1 {self.primary_port} {self.quorum}",
            f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}",
            f"sentinel failover-timeout {self.service} 10000",
            f"sentinel parallel-syncs {self.service} 1",
        ]
        if self.password:
            lines.append(f'sentinel auth-pass {self.service} "{self.password}"')
        if not conf.exists():  # a restart keeps what Sentinel rewrote (the current primary, its peers)
            fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write("\n".join(lines) + "\n")
        self.proc = spawn([self.exe, str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = self.client()
        try:
            _poll(f"sentinel on port {self.port} answering", client.ping, timeout)
        finally:
            client.close()
        return self

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_connect_timeout=1, socket_timeout=5)

    def primary(self) -> tuple[str, int] | None:
        """The primary this sentinel names now (None: it cannot be asked)."""
        c = self.client()
        try:
            addr = cast("tuple[bytes | str, int] | None", c.sentinel_get_master_addr_by_name(self.service))
        except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
            return None
        finally:
            c.close()
        return None if not addr else (str(addr[0]), int(addr[1]))

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


class RedisHA:
    """A primary, ``replicas`` replicas and three sentinels on 127.0.0.1, each in its own directory
    under ``data_dir``: the local form of the chart's Sentinel option. :attr:`url` is the
    ``redis+sentinel://`` URL clients use; :meth:`kill_primary` and :meth:`restart` are what the
    failover chaos does."""

    SERVICE = "kompaktor"

    def __init__(
        self,
        data_dir: str | Path,
        *,
        replicas: int = 1,
        sentinels: int = 3,
        password: str | None = None,
        down_after_ms: int = 1000,
        users: dict[str, str] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.password = password
        self.role_passwords = dict(users or {})  # the same users on every server
        primary = RedisProcess(self.data_dir / "redis-0", password=password, users=users)
        self.servers = [primary] + [
            RedisProcess(self.data_dir / f"redis-{i + 1}", password=password, replica_of=primary.port, users=users)
            for i in range(replicas)
        ]
        self.sentinels = [
            SentinelProcess(
                self.data_dir / f"sentinel-{i}",
                primary.port,
                service=self.SERVICE,
                quorum=sentinels // 2 + 1,
                password=password,
                down_after_ms=down_after_ms,
            )
            for i in range(sentinels)
        ]
        self.failovers = 0

    @property
    def url(self) -> str:
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{auth}{hosts}/{self.SERVICE}/0"

    def role_url(self, role: str) -> str:
        """The Sentinel URL ``role``'s user connects with (:attr:`url` without users)."""
        if not self.role_passwords:
            return self.url
        return acl.role_url(self.url, role, self.role_passwords[role])

    def start(self, timeout: float = 60.0) -> RedisHA:
        for srv in self.servers:
            srv.start()
        for srv in self.servers[1:]:
            self._wait_synced(srv, timeout)
        for s in self.sentinels:
            s.start()
        self.wait_stable(timeout)
        return self

    def _wait_synced(self, srv: RedisProcess, timeout: float) -> None:
        c = srv.client()
        try:
            _poll(
                f"replica on port {srv.port} in sync",
                lambda: c.info("replication").get("master_link_status") == "up",
                timeout,
            )
        finally:
            c.close()

    def primary_port(self) -> int | None:
        """The port of the primary the sentinels agree on (a majority), or None."""
        votes: dict[int, int] = {}
        for s in self.sentinels:
            addr = s.primary() if s.running else None
            if addr is not None:
                votes[addr[1]] = votes.get(addr[1], 0) + 1
        best = max(votes.items(), key=lambda kv: kv[1], default=None)
        return best[0] if best is not None and best[1] > len(self.sentinels) // 2 else None

    def primary(self) -> RedisProcess:
        port = self.primary_port()
        srv = next((s for s in self.servers if s.port == port), None)
        if srv is None:
            raise KompaktorError("local Redis HA: the sentinels agree on no primary")
        return srv

    def wait_stable(self, timeout: float = 60.0) -> None:
        """Until the sentinels agree on a primary that runs and says it is one, every other server
        runs and is its replica in sync, and each sentinel sees all the replicas and sentinels."""

        def stable() -> bool:
            port = self.primary_port()
            if port is None:
                return False
            for srv in self.servers:
                if not srv.running:
                    return False
                c = srv.client()
                try:
                    info = c.info("replication")
                finally:
                    c.close()
                if srv.port == port:
                    if info.get("role") != "master" or int(info.get("connected_slaves", 0)) < len(self.servers) - 1:
                        return False
                elif info.get("master_port") != port or info.get("master_link_status") != "up":
                    return False
            for s in self.sentinels:
                c = s.client()
                try:
                    m = cast("dict[str, Any]", c.sentinel_master(self.SERVICE))
                finally:
                    c.close()
                if (
                    int(m.get("num-slaves", 0)) < len(self.servers) - 1
                    or int(m.get("num-other-sentinels", 0)) < len(self.sentinels) - 1
                    or m.get("is_master_down")
                    or "s_down" in str(m.get("flags", ""))
                ):
                    return False
            return True

        _poll("a stable primary with its replicas and sentinels", stable, timeout)

    def kill_primary(self) -> RedisProcess:
        """SIGKILL the primary the sentinels name; returns it (stopped)."""
        srv = self.primary()
        srv.stop(kill=True)
        return srv

    def wait_failover(self, old_port: int, timeout: float = 60.0) -> int:
        """Until the sentinels agree on a new primary (not ``old_port``) that says it is one; its port."""
        new: list[int] = []

        def promoted() -> bool:
            port = self.primary_port()
            if port is None or port == old_port:
                return False
            srv = next(s for s in self.servers if s.port == port)
            c = srv.client()
            try:
                ok = c.info("replication").get("role") == "master"
            finally:
                c.close()
            if ok:
                new.append(port)
            return ok

        _poll("a failover (Sentinel promoting a replica)", promoted, timeout)
        self.failovers += 1
        return new[-1]

    def restart(self, srv: RedisProcess, timeout: float = 60.0) -> None:
        """Start a stopped server again as a replica of the current primary (Sentinel would turn a
        returning ex-primary into one anyway), then wait until everything is stable."""
        port = self.primary_port()
        srv.replica_of = port if port != srv.port else None
        srv.start()
        self.wait_stable(timeout)

    def stop(self) -> None:
        for s in self.sentinels:
            s.stop()
        for srv in self.servers:
            srv.stop()

    def kill(self) -> None:
        procs: list[RedisProcess | SentinelProcess] = [*self.sentinels, *self.servers]
        for p in procs:
            if p.proc is not None:
                kill_group(p.proc.pid)
