"""A real Kubernetes control plane on loopback: etcd + kube-apiserver + kube-controller-manager.

The two Kubernetes binaries are built once per machine from Debian's source package by
``build-control-plane.sh`` (cached outside the repository); etcd, kubectl and openssl come from
Debian. Every address is in 127.0.0.0/8 — the Service range too (127.100.0.0/16), so a process
bound to a Service's ClusterIP is reachable by the apiserver's aggregator. Every process is
stopped by its PID.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.support.ports import free_port
from tests.support.tls import make_ca, openssl, sign
from tests.support.wait import poll

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build-control-plane.sh"
SERVICE_RANGE = "127.100.0.0/16"


def wait_until(check: Callable[[], Any], what: str, timeout: float = 30.0, every: float = 0.1) -> Any:
    """:func:`tests.support.wait.poll` for the API server: any exception (a 404 until the object
    exists, a refused connection while a server starts) counts as "not yet"."""
    return poll(check, what, timeout, every, ignore=Exception)


def spawn_logged(root: Path, name: str, argv: list[str], env: dict[str, str] | None = None) -> Process:
    """``argv`` in its own session, in ``root``, its output in ``root/<name>.log``."""
    log = root / f"{name}.log"
    with open(log, "wb") as out:
        popen = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=root,
            start_new_session=True,
            env=env,
        )
    return Process(name, popen, log)


def binaries() -> Path:
    """The directory holding kube-apiserver and kube-controller-manager (built on first use)."""
    out = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT} failed (exit {out.returncode}):\n{out.stderr[-4000:]}")
    return Path(out.stdout.strip().splitlines()[-1])


def make_pki(d: Path, extra_ips: tuple[str, ...] = ()) -> None:
    """A CA, the apiserver's serving certificate (SAN 127.0.0.1, ``extra_ips`` and the in-cluster
    names), the service-account key pair, and a front-proxy CA + client certificate for aggregated
    APIs."""
    for ca in ("ca", "front-proxy-ca"):
        make_ca(d, ca, ca, days=2)
    (d / "san.cnf").write_text(
        "[req]\ndistinguished_name=dn\n[dn]\n[ext]\nsubjectAltName=IP:127.0.0.1,IP:127.100.0.1,"
        + "".join(f"IP:{ip}," for ip in extra_ips if ip != "127.0.0.1")
        + "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:localhost\n"
        "extendedKeyUsage=serverAuth\n"
    )
    sign(d, "apiserver", "kube-apiserver", "ca", days=2, extfile="san.cnf", extensions="ext")
    sign(d, "front-proxy-client", "front-proxy-client", "front-proxy-ca", days=2)
    openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
    openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)


@dataclass
class Process:
    name: str
    popen: subprocess.Popen
    log: Path

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen.poll() is not None:
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout)

    def tail(self, n: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""


@dataclass
class ControlPlane:
    root: Path
    bin_dir: Path | None = None
    hpa_sync_s: int = 5
    #: kube-controller-manager's client rate (Kubernetes' default is 20/s, burst 30); large
    #: clusters raise it, and so does the 660-pod benchmark
    kcm_qps: int = 20
    #: where the apiserver listens and what it advertises (the real-node tier: the node's bridge
    #: address, so pods reach it through the `kubernetes` Service)
    bind_address: str = "127.0.0.1"
    service_range: str = SERVICE_RANGE
    #: extra IP SANs of the serving certificate (the `kubernetes` Service's ClusterIP)
    extra_sans: tuple[str, ...] = ()
    processes: list[Process] = field(default_factory=list)
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    server: str = ""
    version: str = ""
    started_in_s: float = 0.0

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def ca(self) -> Path:
        return self.pki / "ca.crt"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "admin.kubeconfig"

    def _spawn(self, name: str, argv: list[str]) -> Process:
        proc = spawn_logged(self.root, name, argv)
        self.processes.append(proc)
        return proc

    def start(self) -> ControlPlane:
        t0 = time.monotonic()
        bin_dir = self.bin_dir or binaries()
        self.root.mkdir(parents=True, exist_ok=True)
        make_pki(self.pki, (self.bind_address, *self.extra_sans))
        (self.pki / "tokens.csv").write_text(f"{self.token},admin,admin,system:masters\n")
        etcd_client, etcd_peer, api_port, kcm_port = free_port(), free_port(), free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{etcd_client}"
        self._spawn(
            "etcd",
            [
                shutil.which("etcd") or "etcd",
                "--name",
                "kompaktor-test",
                "--data-dir",
                str(self.root / "etcd"),
                "--listen-client-urls",
                etcd_url,
                "--advertise-client-urls",
                etcd_url,
                "--listen-peer-urls",
                f"http://127.0.0.1:{etcd_peer}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{etcd_peer}",
                "--initial-cluster",
                f"kompaktor-test=http://127.0.0.1:{etcd_peer}",
                "--unsafe-no-fsync",
                "--listen-metrics-urls",
                f"http://127.0.0.1:{free_port()}",
            ],
        )
        p = self.pki
        self._spawn(
            "kube-apiserver",
            [
                str(bin_dir / "kube-apiserver"),
                "--etcd-servers",
                etcd_url,
                f"--bind-address={self.bind_address}",
                f"--advertise-address={self.bind_address}",
                f"--secure-port={api_port}",
                "--kubelet-preferred-address-types=InternalIP",
                "--insecure-port=0",
                f"--cert-dir={self.root / 'apiserver-certs'}",
                f"--tls-cert-file={p / 'apiserver.crt'}",
                f"--tls-private-key-file={p / 'apiserver.key'}",
                f"--client-ca-file={p / 'ca.crt'}",
                f"--token-auth-file={p / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                f"--service-account-key-file={p / 'sa.pub'}",
                f"--service-account-signing-key-file={p / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-cluster-ip-range={self.service_range}",
                f"--requestheader-client-ca-file={p / 'front-proxy-ca.crt'}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-username-headers=X-Remote-User",
                f"--proxy-client-cert-file={p / 'front-proxy-client.crt'}",
                f"--proxy-client-key-file={p / 'front-proxy-client.key'}",
                "--enable-priority-and-fairness=false",
            ],
        )
        self.server = f"https://{self.bind_address}:{api_port}"
        self._write_kubeconfig(self.kubeconfig, self.token)
        try:
            wait_until(lambda: self._get("/readyz") == "ok", "kube-apiserver /readyz", timeout=60)
        except TimeoutError as exc:
            raise RuntimeError(
                f"{exc}\n--- etcd ---\n{self.processes[0].tail()}\n--- kube-apiserver ---\n{self.processes[1].tail()}"
            ) from None
        self._spawn(
            "kube-controller-manager",
            [
                str(bin_dir / "kube-controller-manager"),
                f"--kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                f"--service-account-private-key-file={p / 'sa.key'}",
                f"--root-ca-file={p / 'ca.crt'}",
                "--bind-address=127.0.0.1",
                f"--secure-port={kcm_port}",
                "--port=0",
                f"--cert-dir={self.root / 'kcm-certs'}",
                f"--horizontal-pod-autoscaler-sync-period={self.hpa_sync_s}s",
                "--horizontal-pod-autoscaler-downscale-stabilization=15s",
                f"--kube-api-qps={self.kcm_qps}",
                f"--kube-api-burst={self.kcm_qps * 3 // 2}",
                "--controllers=*",
            ],
        )
        # the controller-manager is up when it has created the default namespace's ServiceAccount
        wait_until(
            lambda: json.loads(self._get("/api/v1/namespaces/default/serviceaccounts/default"))["metadata"],
            "the controller-manager to create the default ServiceAccount",
            timeout=60,
        )
        self.version = json.loads(self._get("/version"))["gitVersion"]
        self.started_in_s = time.monotonic() - t0
        return self

    def stop(self) -> None:
        for proc in reversed(self.processes):
            proc.stop()
        self.processes.clear()

    # -- API access ------------------------------------------------------------------------------
    def _ssl(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))

    def _get(self, path: str, token: str | None = None) -> str:
        req = urllib.request.Request(self.server + path, headers={"Authorization": f"Bearer {token or self.token}"})
        with urllib.request.urlopen(req, context=self._ssl(), timeout=5) as resp:
            return resp.read().decode()

    def _write_kubeconfig(self, path: Path, token: str, namespace: str = "default", user: str = "admin") -> Path:
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": self.server, "certificate-authority": str(self.ca)}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": user, "namespace": namespace}}],
        }
        path.write_text(yaml.safe_dump(cfg))
        return path

    def api(self, token: str | None = None) -> Any:
        """A `kubernetes` ApiClient as admin (or with ``token``)."""
        import kubernetes

        conf = kubernetes.client.Configuration()
        conf.host = self.server
        conf.ssl_ca_cert = str(self.ca)
        conf.api_key = {"authorization": f"Bearer {token or self.token}"}
        return kubernetes.client.ApiClient(conf)

    def service_account_token(self, namespace: str, name: str, timeout: float = 30.0) -> str:
        """The token the controller-manager minted for a ServiceAccount (1.20: a Secret)."""
        import base64

        import kubernetes

        core = kubernetes.client.CoreV1Api(self.api())

        def token() -> str | None:
            sa = core.read_namespaced_service_account(name, namespace)
            for ref in sa.secrets or []:
                secret = core.read_namespaced_secret(ref.name, namespace)
                if secret.type == "kubernetes.io/service-account-token" and secret.data and "token" in secret.data:
                    return base64.b64decode(secret.data["token"]).decode()
            return None

        return wait_until(token, f"a token for ServiceAccount {namespace}/{name}", timeout=timeout)

    def service_account_kubeconfig(self, namespace: str, name: str) -> Path:
        path = self.root / f"sa-{namespace}-{name}.kubeconfig"
        return self._write_kubeconfig(
            path,
            self.service_account_token(namespace, name),
            namespace,
            user=f"system:serviceaccount:{namespace}:{name}",
        )

    def kubectl(
        self, *args: str, kubeconfig: Path | None = None, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess:
        out = subprocess.run(
            ["kubectl", f"--kubeconfig={kubeconfig or self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            input=input,
            timeout=60,
        )
        if check and out.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({out.returncode}): {out.stderr}")
        return out

    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
