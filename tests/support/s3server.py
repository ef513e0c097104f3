"""An S3 API server for tests: moto in server mode (it speaks the S3 REST protocol), on a free port
of a given address (loopback by default; the real-node tier binds it to the node's bridge so pods
reach it), with its own credentials, stopped by its PID.

Clients get the endpoint the way users give one for MinIO, Ceph RGW or R2: ``AWS_ENDPOINT_URL``
in the environment (pyarrow's S3 filesystem reads it), with ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` / ``AWS_REGION`` beside it — :meth:`S3Server.env`.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import urllib.request
from collections import Counter
from pathlib import Path

from tests.support.ports import free_port
from tests.support.wait import poll


class S3Server:
    def __init__(self, root: Path, host: str = "127.0.0.1", *, record: bool = False) -> None:
        self.root = Path(root)
        self.host = host
        #: every request the server answers, as moto's recorder writes it (method, URL, headers)
        self.record = record
        self.recording = self.root / "requests.jsonl"
        self.port = 0
        self.access_key = "AKIA" + secrets.token_hex(8).upper()
        self.secret_key = secrets.token_urlsafe(30)
        self.popen: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def env(self) -> dict[str, str]:
        """What a client needs, as environment variables (never arguments)."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.endpoint,
        }

    def start(self, timeout: float = 60) -> S3Server:
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port(self.host)
        server = Path(sys.executable).parent / "moto_server"
        log = open(self.root / "moto.log", "wb")  # noqa: SIM115 - the server's for its life
        env = dict(os.environ)
        if self.record:
            env.update(MOTO_ENABLE_RECORDING="true", MOTO_RECORDER_FILEPATH=str(self.recording))
        self.popen = subprocess.Popen(
            [str(server), "-H", self.host, "-p", str(self.port)],
            stdout=log,
            env=env,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=self.root,
        )
        log.close()

        def answers() -> bool:
            if self.popen is not None and self.popen.poll() is not None:
                raise RuntimeError(
                    f"moto_server exited ({self.popen.returncode}): {(self.root / 'moto.log').read_text()[-2000:]}"
                )
            urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=2).close()
            return True

        poll(answers, f"moto_server on {self.endpoint}", timeout, every=0.1, ignore=OSError)
        return self

    def requests(self, bucket: str | None = None) -> Counter[str]:
        """Requests by S3 operation kind since the last :meth:`reset_requests` (needs ``record``):
        PUT (an object or a part of a multipart upload), COPY (server-side copy: a PUT with
        x-amz-copy-source), GET, RANGE_GET, HEAD, LIST, DELETE, MULTIPART (create / complete /
        abort an upload)."""
        kinds: Counter[str] = Counter()
        if not self.recording.exists():
            return kinds
        for line in self.recording.read_text().splitlines():
            req = json.loads(line)
            method, url = req["method"], req["url"]
            path, _, query = url.partition("?")
            parts = path.split("/", 4)  # http: '' host bucket key
            if bucket is not None and (len(parts) < 4 or parts[3] != bucket):
                continue
            headers = {k.lower(): v for k, v in req["headers"].items()}
            has_key = len(parts) > 4 and parts[4] != ""
            if method == "PUT" and "x-amz-copy-source" in headers:
                kinds["COPY"] += 1
            elif method == "PUT":
                kinds["PUT"] += 1
            elif (method == "POST" and ("uploads" in query or "uploadId" in query)) or (
                method == "DELETE" and "uploadId" in query
            ):
                kinds["MULTIPART"] += 1
            elif method == "DELETE" or (method == "POST" and "delete" in query):
                kinds["DELETE"] += 1
            elif method == "HEAD":
                kinds["HEAD"] += 1
            elif method == "GET" and not has_key:
                kinds["LIST"] += 1
            elif method == "GET":
                kinds["RANGE_GET" if "range" in headers else "GET"] += 1
            else:
                kinds[method] += 1
        return kinds

    def reset_requests(self) -> None:
        self.recording.write_text("")

    def filesystem(self, allow_bucket_creation: bool = False):
        """A pyarrow S3 filesystem on this server, with its credentials."""
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(
            access_key=self.access_key,
            secret_key=self.secret_key,
            region="us-east-1",
            endpoint_override=self.endpoint,
            scheme="http",
            allow_bucket_creation=allow_bucket_creation,
        )

    def create_bucket(self, name: str) -> None:
        self.filesystem(allow_bucket_creation=True).create_dir(name)

    def client(self, service: str = "s3"):
        """A boto3 client of this server with its own keys (``s3``, or ``iam`` for the users)."""
        import boto3

        return boto3.client(
            service,
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
        )

    def enforce_auth(self, users: dict[str, list[str]]) -> dict[str, dict[str, str]]:
        """Create an IAM user per entry, allowed the S3 actions listed (``["s3:*"]``,
        ``["s3:GetObject", "s3:ListBucket"]``), then make the server check every request's
        signature and those users' rights from now on, as S3 does (moto checks nothing until
        told to). Returns each user's client environment (:meth:`env` with its own keys). The
        server's own keys stop working: buckets are created before."""
        iam = self.client("iam")
        envs = {}
        for user, actions in users.items():
            iam.create_user(UserName=user)
            iam.put_user_policy(
                UserName=user,
                PolicyName=f"{user}-s3",
                PolicyDocument=json.dumps(
                    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}]}
                ),
            )
            key = iam.create_access_key(UserName=user)["AccessKey"]
            envs[user] = {
                **self.env(),
                "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
                "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
            }
        urllib.request.urlopen(
            urllib.request.Request(  # moto's switch: authenticate after 0 more requests
                f"{self.endpoint}/moto-api/reset-auth", data=b"0", method="POST", headers={"Content-Type": "text/plain"}
            ),
            timeout=10,
        ).close()
        return envs

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
