"""A real Kubernetes node on this machine: kubelet + containerd + runc, CNI bridge networking,
kube-proxy (iptables) for ClusterIP Services, kube-scheduler, and cluster DNS from dnsmasq.

Everything the node gets outside 127.0.0.0/8 lives on one bridge this fixture creates
(:data:`BRIDGE`, pods in :data:`POD_CIDR`, Services in :data:`SERVICE_RANGE`, routed to the bridge
only); a FORWARD rule rejects anything from the bridge that would leave it, so nothing is routed
off the machine. The apiserver of this tier listens on the bridge's address, so pods reach it
through the `kubernetes` Service like on any cluster.

What is real: the kubelet 1.20.2 (built from Debian's source with the control plane), containerd
1.6 and runc from Debian, the CNI bridge/host-local/loopback plugins, kube-proxy's iptables rules,
kube-scheduler. What is a stand-in: cluster DNS (no CoreDNS exists here) — dnsmasq on the bridge
answers `<service>.<namespace>.svc[.cluster.local]` from a hosts file this harness rewrites from a
watch on Services. The kubelet's own API accepts the apiserver anonymously (webhook authn/authz
off), as on a test cluster.

Stopped in reverse order, each process by its PID; then containers (containerd's shims), the
pods' network namespaces and mounts, the kubelet's cgroups, kube-proxy's iptables chains, the
guard rules, the route and the bridge are removed, and the sysctls put back.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.k8s.controlplane import ControlPlane, Process, binaries, free_port, spawn_logged, wait_until

BRIDGE = "kompaktor0"
POD_CIDR = "10.213.0.0/24"
GATEWAY = "10.213.0.1"
SERVICE_RANGE = "10.214.0.0/24"
KUBERNETES_SERVICE_IP = "10.214.0.1"
NODE_NAME = "kz-node"
CLUSTER_DOMAIN = "cluster.local"
PAUSE_IMAGE = "localhost/kompaktor/pause:3.2"
CGROUP_ROOT = "/kompaktor-node"
GUARD_COMMENT = "kompaktor-test-node"


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(list(argv), capture_output=True, text=True, timeout=60)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({out.returncode}): {out.stderr.strip()}")
    return out


def _unquote(rule: str) -> list[str]:
    import shlex

    return shlex.split(rule)


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


@dataclass
class Network:
    """The bridge, its route for the Service range, the guard rule and the sysctls a node needs."""

    saved_sysctls: dict[str, str] = field(default_factory=dict)

    def setup(self) -> None:
        self.teardown()  # a bridge left by a run that was killed
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")
        # Services resolve to the bridge, never to the default route
        _run("ip", "route", "add", SERVICE_RANGE, "dev", BRIDGE, "src", GATEWAY)
        for name, value in (
            ("net.ipv4.ip_forward", "1"),
            ("net.bridge.bridge-nf-call-iptables", "1"),
            ("net.ipv4.conf.all.route_localnet", None),
        ):  # kube-proxy sets the last
            path = _sysctl_path(name)
            self.saved_sysctls[name] = path.read_text().strip()
            if value is not None:
                path.write_text(value)
        # nothing from the pods leaves the machine: only the bridge itself and the host answer
        _run(
            "iptables",
            "-I",
            "FORWARD",
            "1",
            "-i",
            BRIDGE,
            "!",
            "-o",
            BRIDGE,
            "-m",
            "comment",
            "--comment",
            GUARD_COMMENT,
            "-j",
            "REJECT",
        )

    @staticmethod
    def remove_kube_chains() -> None:
        """Every KUBE-* chain the kubelet and kube-proxy made, and the jumps to them (kube-proxy
        --cleanup leaves the kubelet's and fails on ipset without the ipset tool)."""
        for table in ("filter", "nat", "mangle"):
            rules = _run("iptables", "-t", table, "-S", check=False).stdout.splitlines()
            for rule in rules:
                parts = rule.split()
                if parts[:1] == ["-A"] and not parts[1].startswith("KUBE-") and "KUBE-" in rule:
                    _run("iptables", "-t", table, "-D", *_unquote(rule)[1:], check=False)
            chains = [r.split()[1] for r in rules if r.startswith("-N KUBE-")]
            for chain in chains:
                _run("iptables", "-t", table, "-F", chain, check=False)
            for chain in chains:
                _run("iptables", "-t", table, "-X", chain, check=False)

    def teardown(self) -> None:
        self.remove_kube_chains()
        while (
            _run(
                "iptables",
                "-D",
                "FORWARD",
                "-i",
                BRIDGE,
                "!",
                "-o",
                BRIDGE,
                "-m",
                "comment",
                "--comment",
                GUARD_COMMENT,
                "-j",
                "REJECT",
                check=False,
            ).returncode
            == 0
        ):
            pass
        _run("ip", "route", "del", SERVICE_RANGE, "dev", BRIDGE, check=False)
        _run("ip", "link", "del", BRIDGE, check=False)
        for name, value in self.saved_sysctls.items():
            with contextlib.suppress(OSError):
                _sysctl_path(name).write_text(value)
        self.saved_sysctls.clear()


class ServiceDns:
    """dnsmasq on the bridge, answering Services' names from a hosts file kept current by a watch."""

    def __init__(self, root: Path, api: Any) -> None:
        self.root = root
        self.api = api
        self.hosts = root / "services.hosts"
        self.proc: Process | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._names: dict[str, str] = {}

    def start(self, spawn: Any) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.hosts.write_text("")
        self.proc = spawn(
            "dnsmasq",
            [
                shutil.which("dnsmasq") or "/usr/sbin/dnsmasq",
                "--keep-in-foreground",
                "--no-daemon",
                "--conf-file=/dev/null",
                "--no-resolv",
                "--no-hosts",
                f"--addn-hosts={self.hosts}",
                f"--listen-address={GATEWAY}",
                "--bind-interfaces",
                "--port=53",
                f"--local=/{CLUSTER_DOMAIN}/",
                "--local=/svc/",
                "--domain-needed",
                "--user=root",
                "--group=root",
                "--log-facility=-",
                f"--pid-file={self.root / 'dnsmasq.pid'}",
            ],
        )
        # Only once dnsmasq answers: the watch's first write sends SIGHUP, and a SIGHUP that
        # arrives before dnsmasq has installed its handler kills it — every pod then fails to
        # resolve its Services (seen once in CI: operator and coordinator in a crash loop).
        deadline = time.monotonic() + 15
        while True:
            if self.proc.popen.poll() is not None:
                raise RuntimeError(f"dnsmasq exited with {self.proc.popen.returncode}")
            try:
                socket.create_connection((GATEWAY, 53), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("dnsmasq does not listen on the bridge after 15 s") from None
                time.sleep(0.05)
        self._thread = threading.Thread(target=self._watch, name="service-dns", daemon=True)
        self._thread.start()

    def _write(self) -> None:
        lines = [f"{ip} {name}.{CLUSTER_DOMAIN} {name}\n" for name, ip in sorted(self._names.items())]
        tmp = self.hosts.with_suffix(".tmp")
        tmp.write_text("".join(lines))
        tmp.replace(self.hosts)
        if self.proc is not None:
            if self.proc.popen.poll() is not None:
                raise RuntimeError(f"cluster DNS (dnsmasq) died with {self.proc.popen.returncode}")
            self.proc.popen.send_signal(signal.SIGHUP)  # dnsmasq re-reads --addn-hosts

    def _watch(self) -> None:
        import kubernetes

        core = kubernetes.client.CoreV1Api(self.api)
        while not self._stop.is_set():
            try:
                listing = core.list_service_for_all_namespaces()
                self._names = {
                    f"{s.metadata.name}.{s.metadata.namespace}.svc": s.spec.cluster_ip
                    for s in listing.items
                    if s.spec.cluster_ip not in (None, "", "None")
                }
                self._write()
                w = kubernetes.watch.Watch()
                for ev in w.stream(
                    core.list_service_for_all_namespaces,
                    resource_version=listing.metadata.resource_version,
                    timeout_seconds=30,
                ):
                    if self._stop.is_set():
                        w.stop()
                        break
                    svc = ev["object"]
                    key = f"{svc.metadata.name}.{svc.metadata.namespace}.svc"
                    if ev["type"] == "DELETED" or svc.spec.cluster_ip in (None, "", "None"):
                        self._names.pop(key, None)
                    else:
                        self._names[key] = svc.spec.cluster_ip
                    self._write()
            except Exception:  # the apiserver going away at teardown, a watch expiring
                self._stop.wait(0.5)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=35)


@dataclass
class RealNode:
    """A real node (kubelet + containerd) and the cluster services around it, for one control plane.

    Use :func:`start_cluster` to get a control plane bound to the bridge together with this node.
    """

    root: Path
    cp: ControlPlane
    images: dict[str, Path] = field(default_factory=dict)  # image ref -> OCI archive to import
    network: Network = field(default_factory=Network)
    processes: list[Process] = field(default_factory=list)
    containerd: Any = None
    dns: ServiceDns | None = None
    kubelet_port: int = 0
    started_in_s: float = 0.0
    image_import_s: float = 0.0

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Process:
        proc = spawn_logged(self.root, name, argv, env)
        self.processes.append(proc)
        return proc

    # -- start -----------------------------------------------------------------------------------
    def start(self) -> RealNode:
        from tests.support.containerd import Containerd

        t0 = time.monotonic()
        bin_dir = self.cp.bin_dir or binaries()
        self.root.mkdir(parents=True, exist_ok=True)
        cni = self.root / "cni"
        cni.mkdir(exist_ok=True)
        (cni / "10-kompaktor.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "0.4.0",
                    "name": "kompaktor",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": BRIDGE,
                            "isGateway": True,
                            "ipMasq": False,
                            "hairpinMode": True,
                            "ipam": {
                                "type": "host-local",
                                "ranges": [[{"subnet": POD_CIDR, "gateway": GATEWAY}]],
                                "routes": [{"dst": "0.0.0.0/0"}],
                                "dataDir": str(self.root / "ipam"),
                            },
                        },
                        {"type": "portmap", "capabilities": {"portMappings": True}},
                    ],
                }
            )
        )
        self.containerd = Containerd(self.root / "containerd", cni_conf_dir=cni, sandbox_image=PAUSE_IMAGE)
        self.containerd.start()
        t_img = time.monotonic()
        for archive in self.images.values():
            self.containerd.import_image(archive)
        self.image_import_s = time.monotonic() - t_img

        kubeconfig = self.cp.kubeconfig
        # kube-scheduler
        self._spawn(
            "kube-scheduler",
            [
                str(bin_dir / "kube-scheduler"),
                f"--kubeconfig={kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                "--port=0",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                f"--cert-dir={self.root / 'scheduler-certs'}",
            ],
        )
        # kube-proxy (iptables); NodePorts only on the bridge address
        self._spawn(
            "kube-proxy",
            [
                str(bin_dir / "kube-proxy"),
                f"--kubeconfig={kubeconfig}",
                f"--hostname-override={NODE_NAME}",
                "--proxy-mode=iptables",
                f"--cluster-cidr={POD_CIDR}",
                f"--bind-address={GATEWAY}",
                f"--healthz-bind-address=127.0.0.1:{free_port()}",
                f"--metrics-bind-address=127.0.0.1:{free_port()}",
                f"--nodeport-addresses={GATEWAY}/32",
                "--conntrack-max-per-core=0",
                "--conntrack-tcp-timeout-established=0",
                "--conntrack-tcp-timeout-close-wait=0",
                "--iptables-sync-period=5s",
                "--iptables-min-sync-period=0s",
            ],
        )
        # cluster DNS (stand-in)
        self.dns = ServiceDns(self.root / "dns", self.cp.api())
        self.dns.start(self._spawn)
        # kubelet
        for ctrl in self._cgroup_controllers():
            (ctrl / CGROUP_ROOT.lstrip("/")).mkdir(exist_ok=True)
        self.kubelet_port = free_port()
        resolv = self.root / "resolv.conf"
        resolv.write_text(f"nameserver {GATEWAY}\n")
        config = {
            "kind": "KubeletConfiguration",
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "address": GATEWAY,
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}, "x509": {}},
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": CGROUP_ROOT,
            "cgroupsPerQOS": True,
            "enforceNodeAllocatable": ["pods"],
            "failSwapOn": False,
            "clusterDNS": [GATEWAY],
            "clusterDomain": CLUSTER_DOMAIN,
            "resolvConf": str(resolv),
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "syncFrequency": "10s",
            "nodeStatusUpdateFrequency": "5s",
            "fileCheckFrequency": "10s",
            "volumeStatsAggPeriod": "0s",
            "maxPods": 30,
            "containerLogMaxSize": "10Mi",
            "containerLogMaxFiles": 2,
        }
        (self.root / "kubelet.yaml").write_text(yaml.safe_dump(config))
        self._spawn(
            "kubelet",
            [
                str(bin_dir / "kubelet"),
                f"--config={self.root / 'kubelet.yaml'}",
                f"--kubeconfig={kubeconfig}",
                "--container-runtime=remote",
                f"--container-runtime-endpoint=unix://{self.containerd.socket}",
                f"--root-dir={self.root / 'kubelet'}",
                f"--cert-dir={self.root / 'kubelet-pki'}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={GATEWAY}",
                f"--pod-infra-container-image={PAUSE_IMAGE}",
                "--v=1",
            ],
        )
        try:
            wait_until(self._node_ready, f"node {NODE_NAME} Ready", timeout=90, every=0.5)
        except TimeoutError as exc:
            raise RuntimeError(f"{exc}\n--- kubelet ---\n{self.log('kubelet')}") from None
        self.started_in_s = time.monotonic() - t0
        return self

    def _node_ready(self) -> bool:
        out = self.cp.kubectl("get", "node", NODE_NAME, "-o", "json", check=False)
        if out.returncode != 0:
            return False
        conds = json.loads(out.stdout).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

    @staticmethod
    def _cgroup_controllers() -> list[Path]:
        base = Path("/sys/fs/cgroup")
        return [p for p in base.iterdir() if p.is_dir() and not p.is_symlink() and (p / "cgroup.procs").exists()]

    def log(self, name: str, n: int = 6000) -> str:
        proc = next((p for p in self.processes if p.name == name), None)
        return proc.tail(n) if proc else ""

    # -- stop ------------------------------------------------------------------------------------
    def remove_pods(self, timeout: float = 120) -> None:
        """Delete every pod outside kube-system and wait until the runtime ran their shutdown."""
        self.cp.kubectl("delete", "pods", "--all", "--all-namespaces", "--wait=false", check=False)
        with contextlib.suppress(TimeoutError):
            wait_until(
                lambda: (
                    not json.loads(self.cp.kubectl("get", "pods", "--all-namespaces", "-o", "json").stdout)["items"]
                ),
                "every pod gone",
                timeout=timeout,
                every=1,
            )

    def stop(self) -> None:
        for proc in reversed(self.processes):
            with contextlib.suppress(Exception):
                proc.stop()
        if self.dns is not None:
            self.dns.stop()
        if self.containerd is not None:
            with contextlib.suppress(Exception):
                self.containerd.stop()
        self._remove_cgroups()
        self._unmount_under(self.root)
        self._remove_netns()
        self.network.teardown()

    @staticmethod
    def _unmount_under(root: Path) -> None:
        prefix = str(root.resolve())
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        for mnt in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
            _run("umount", "-l", mnt, check=False)

    def _remove_netns(self) -> None:
        # containerd's CRI names the pods' network namespaces cni-<uuid>; only those under this
        # node's state directory (netns_mounts_under_state_dir) or, else, /var/run/netns
        for d in (self.root / "containerd", Path("/var/run/netns")):
            if not d.exists():
                continue
            for ns in d.rglob("cni-*"):
                _run("umount", "-l", str(ns), check=False)
                with contextlib.suppress(OSError):
                    ns.unlink()

    @staticmethod
    def _kill_pod_processes() -> list[int]:
        """SIGKILL every process left in the node's cgroups (containers whose shim is gone)."""
        killed: set[int] = set()
        for _ in range(50):
            pids = {
                int(p)
                for ctrl in RealNode._cgroup_controllers()
                for procs in (ctrl / CGROUP_ROOT.lstrip("/")).rglob("cgroup.procs")
                for p in procs.read_text().split()
            } - {os.getpid()}
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            killed |= pids
            time.sleep(0.1)
        return sorted(killed)

    @staticmethod
    def _remove_cgroups() -> None:
        RealNode._kill_pod_processes()
        for ctrl in RealNode._cgroup_controllers():
            top = ctrl / CGROUP_ROOT.lstrip("/")
            if not top.exists():
                continue
            for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                with contextlib.suppress(OSError):
                    d.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()


def start_cluster(root: Path, images: dict[str, Path]) -> tuple[ControlPlane, RealNode]:
    """The bridge, a control plane listening on it, and a real node joined to it."""
    network = Network()
    network.setup()
    cp = ControlPlane(
        root / "cp", bind_address=GATEWAY, service_range=SERVICE_RANGE, extra_sans=(KUBERNETES_SERVICE_IP,)
    )
    node = RealNode(root / "node", cp, images=images, network=network)
    try:
        cp.start()
        node.start()
    except BaseException:
        node.stop()
        cp.stop()
        raise
    return cp, node


def running_containers(node: RealNode) -> list[str]:
    """Containers containerd still runs for the kubelet (namespace k8s.io)."""
    out = _run("ctr", "--address", str(node.containerd.socket), "-n", "k8s.io", "tasks", "ls", check=False)
    return [line.split()[0] for line in out.stdout.splitlines()[1:] if line.strip() and "RUNNING" in line]
