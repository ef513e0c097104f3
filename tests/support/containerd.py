"""A containerd of the test's own: config, socket, state and images under one directory.

Debian's containerd 1.6 with runc. Its CRI plugin is what a kubelet talks to (tests/k8s/node.py);
:meth:`Containerd.run` also runs one-off containers with `ctr` (the image tier). One setting is
required on these VMs: ``restrict_oom_score_adj`` — they forbid lowering ``oom_score_adj`` even
to root, the kubelet asks -998 for every pod sandbox, and without it every sandbox fails.

Nothing listens off loopback: the gRPC, ttrpc and debug sockets are files under the root, metrics
are off, the CRI streaming server (kubectl exec/logs/port-forward) binds 127.0.0.1. The pods'
network namespaces are mounted under the state directory. :meth:`Containerd.stop` stops the
daemon by its PID, kills the shims it started (and so their containers), and unmounts what is
left under its root.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

K8S_NAMESPACE = "k8s.io"


class Containerd:
    def __init__(
        self,
        root: Path,
        *,
        cni_conf_dir: Path | None = None,
        cni_bin_dir: Path = Path("/usr/lib/cni"),
        sandbox_image: str = "localhost/kompaktor/pause:3.2",
    ) -> None:
        self.root = Path(root).resolve()
        self.cni_conf_dir = cni_conf_dir or (self.root / "cni")
        self.cni_bin_dir = cni_bin_dir
        self.sandbox_image = sandbox_image
        self.socket = self.root / "containerd.sock"
        self.popen: subprocess.Popen | None = None
        self.log = self.root / "containerd.log"

    def config(self) -> str:
        r = self.root
        return f"""version = 2
root = "{r / "root"}"
state = "{r / "state"}"

[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{r / "ttrpc.sock"}"
[debug]
  address = "{r / "debug.sock"}"
[metrics]
  address = ""

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{self.sandbox_image}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  netns_mounts_under_state_dir = true
  enable_tls_streaming = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{self.cni_bin_dir}"
    conf_dir = "{self.cni_conf_dir}"
"""

    def ctr(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        out = subprocess.run(
            ["ctr", "--address", str(self.socket), "-n", K8S_NAMESPACE, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and out.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)} failed ({out.returncode}): {out.stderr.strip()}")
        return out

    def start(self, timeout: float = 30) -> None:
        if shutil.which("containerd") is None:
            raise RuntimeError("containerd is not installed (tests/k8s/build-control-plane.sh installs it)")
        self.root.mkdir(parents=True, exist_ok=True)
        self.cni_conf_dir.mkdir(parents=True, exist_ok=True)
        (self.root / "config.toml").write_text(self.config())
        with open(self.log, "wb") as out:
            self.popen = subprocess.Popen(
                ["containerd", "--config", str(self.root / "config.toml")],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"containerd exited ({self.popen.returncode}):\n{self.tail()}")
            if self.ctr("version", check=False, timeout=5).returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError(f"containerd did not answer on {self.socket} within {timeout:.0f}s:\n{self.tail()}")

    def tail(self, n: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def import_image(self, archive: Path) -> list[str]:
        """Import an OCI archive into the kubelet's namespace; the image references it held."""
        out = self.ctr("images", "import", str(archive))
        refs = [line.split()[1] for line in out.stdout.splitlines() if line.startswith("unpacking ")]
        listed = self.ctr("images", "ls", "-q").stdout.split()
        return refs or listed

    def run(
        self,
        image: str,
        argv: list[str],
        *,
        read_only: bool = True,
        mounts: list[tuple[Path, str, bool]] | tuple = (),
        env: dict[str, str] | None = None,
        timeout: float = 300,
    ) -> subprocess.CompletedProcess:
        """A one-off container as the image's own USER (ctr 1.6 cannot override it), with no network
        but its own loopback, removed afterwards."""
        args = ["run", "--rm"]
        if read_only:
            args.append("--read-only")
        args += ["--mount", "type=tmpfs,src=tmpfs,dst=/tmp,options=rw:nosuid:nodev:mode=1777"]
        # an /etc/hosts naming the container's host name, as the kubelet and docker write one
        hosts = self.root / "hosts"
        hosts.write_text(f"127.0.0.1\tlocalhost {socket.gethostname()}\n::1\tlocalhost\n")
        args += ["--mount", f"type=bind,src={hosts},dst=/etc/hosts,options=rbind:ro"]
        for src, dst, ro in mounts:
            args += ["--mount", f"type=bind,src={src},dst={dst},options=rbind:{'ro' if ro else 'rw'}"]
        for k, v in (env or {}).items():
            args += ["--env", f"{k}={v}"]
        name = f"kz-{uuid.uuid4().hex[:12]}"
        return subprocess.run(
            ["ctr", "--address", str(self.socket), "-n", K8S_NAMESPACE, *args, image, name, *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def _shims(self) -> list[int]:
        pids = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "containerd-shim" in cmd and (str(self.socket) in cmd or str(self.root) in cmd):
                pids.append(int(proc.name))
        return pids

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        # the shims outlive the daemon by design; a shim's death takes its containers' init along
        # only with a pid namespace, so the caller also kills what is left in its cgroups
        for pid in self._shims():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        prefix = str(self.root)
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        for mnt in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
            subprocess.run(["umount", "-l", mnt], capture_output=True)
