"""Certificates made with the openssl command for tests that run a TLS server (Redis with TLS,
the control plane's apiserver): a self-signed CA and certificates it signs, short-lived."""

from __future__ import annotations

import subprocess
from pathlib import Path


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(d: Path, name: str, cn: str, days: int) -> None:
    """A self-signed CA: ``d/<name>.crt`` and its key ``d/<name>.key``."""
    d.mkdir(parents=True, exist_ok=True)
    key = ["-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key"]
    openssl("req", "-x509", *key, "-out", f"{name}.crt", "-days", str(days), "-subj", f"/CN={cn}", cwd=d)


def sign(
    d: Path, name: str, cn: str, ca: str, days: int, extfile: str | None = None, extensions: str | None = None
) -> None:
    """A key ``d/<name>.key`` and a certificate ``d/<name>.crt`` for ``cn`` signed by the CA
    ``d/<ca>.crt``; ``extfile`` (and its section ``extensions``) add e.g. subjectAltName."""
    key = ["-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key"]
    openssl("req", *key, "-out", f"{name}.csr", "-subj", f"/CN={cn}", cwd=d)
    ext = [*(["-extfile", extfile] if extfile else []), *(["-extensions", extensions] if extensions else [])]
    by_ca = ["-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial"]
    openssl("x509", "-req", "-in", f"{name}.csr", *by_ca, "-out", f"{name}.crt", "-days", str(days), *ext, cwd=d)
