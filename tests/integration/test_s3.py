"""Object storage as users deploy it: `s3://` through a real S3 API server (moto in server mode,
tests/support/s3server.py), the endpoint given as users give one for MinIO, Ceph RGW or R2
(``AWS_ENDPOINT_URL``), credentials only in the environment.

- The whole demo — flushes, bulk imports, compactions by both engines (Arrow in-process, Spark
  executors reading and writing the store), splits, GC, verification — on `--storage s3://…`.
- Writing on an object store is once, at the final name: a compaction makes no server-side COPY
  and no DELETE of its output (a rename on S3 is both), counted from the server's own request log.
- Bad storage is one line, exit non-zero, nothing changed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from kompaktor import keyspace as C
from kompaktor.files.sortedfile import SortedFileWriter
from kompaktor.files.storage import REQUESTS, Storage
from kompaktor.model.keys import Entry
from tests.support.entries import entries
from tests.support.rawredis import raw_redis
from tests.support.s3server import S3Server

BIN = Path(sys.executable).parent
BUCKET = "kompaktor-s3"


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = S3Server(tmp_path_factory.mktemp("s3"), record=True).start()
    server.create_bucket(BUCKET)
    yield server
    server.stop()


@pytest.fixture
def s3_env(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    return {**os.environ, **s3.env()}


def _entries(n: int, prefix: str = "r") -> list[Entry]:
    return entries(n, prefix=prefix, width=6, cf=b"cf", cq=b"cq", ts=1, value=lambda r: b"v" * 16)


def _write_inputs(storage: Storage, entries: int, prefix: Callable[[int], str]) -> list[str]:
    """Four sorted input files of ``entries`` entries each (rows prefixed by ``prefix(i)``)."""
    inputs = []
    for i in range(4):
        rel = f"tables/t/a/F{i:04d}.parquet"
        with SortedFileWriter(storage, rel) as w:
            w.write_entries(_entries(entries, prefix=prefix(i)))
            w.commit()
        inputs.append(rel)
    return inputs


def test_a_file_is_written_once_at_its_final_name(s3: S3Server, s3_env: dict[str, str]) -> None:
    storage = Storage.from_uri(f"s3://{BUCKET}/once")
    assert not storage.renames_atomically
    s3.reset_requests()
    with SortedFileWriter(storage, "tables/t/a/F0001.parquet") as w:
        w.write_entries(_entries(1000))
        info = w.commit()
    assert info.entries == 1000 and storage.exists("tables/t/a/F0001.parquet")
    kinds = s3.requests(BUCKET)
    assert kinds["COPY"] == 0 and kinds["DELETE"] == 0, kinds
    assert kinds["PUT"] >= 1, kinds
    assert [rel for rel, _ in storage.list_files("tables")] == ["tables/t/a/F0001.parquet"]  # no temp name
    # never replaces a file: a second writer of the same name is refused before writing a byte
    s3.reset_requests()
    with pytest.raises(FileExistsError, match="not replacing"):
        SortedFileWriter(storage, "tables/t/a/F0001.parquet")
    assert s3.requests(BUCKET)["PUT"] == 0


def test_a_local_store_still_renames_into_place(tmp_path: Path) -> None:
    storage = Storage.from_uri(str(tmp_path))
    assert storage.renames_atomically
    w = SortedFileWriter(storage, "tables/t/a/F0001.parquet")
    assert w.tmp_rel != w.rel_path and "_tmp_" in w.tmp_rel
    w.write_entries(_entries(10))
    w.commit()
    assert [rel for rel, _ in storage.list_files("tables")] == ["tables/t/a/F0001.parquet"]


def test_a_writer_that_fails_leaves_nothing_under_the_name(s3: S3Server, s3_env: dict[str, str]) -> None:
    storage = Storage.from_uri(f"s3://{BUCKET}/failing")
    with pytest.raises(RuntimeError), SortedFileWriter(storage, "tables/t/a/F0002.parquet") as w:
        w.write_entries(_entries(100))
        raise RuntimeError("the writer dies")
    assert not storage.exists("tables/t/a/F0002.parquet")


def _demo(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "kompaktor"), "demo", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.spark
@pytest.mark.quiet  # a loaded machine's slow start lets the user compaction take every file first
def test_the_demo_runs_on_s3_with_both_engines(s3: S3Server, s3_env: dict[str, str], tmp_path: Path) -> None:
    from kompaktor.local.config import DEMO_CONFIG

    uri = f"s3://{BUCKET}/demo"
    # the demo's groups with a lower bound between them, so both take part with this little data
    assert "maxSize: 512Ki" in DEMO_CONFIG
    config = tmp_path / "demo.yaml"
    config.write_text(DEMO_CONFIG.replace("maxSize: 512Ki", "maxSize: 48Ki"))
    s3.reset_requests()
    out = _demo(
        s3_env,
        "--storage",
        uri,
        "--config",
        str(config),
        "--entries",
        "12000",
        "--duration",
        "8",
        "--tablets",
        "3",
        "--batch",
        "1000",
        "--burst-entries",
        "6000",
        "--burst-files",
        "6",
        "--json",
        "--data-dir",
        str(tmp_path / "demo"),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["verified"] == "yes", summary
    assert summary["undefined references"] == 0 and summary["entries scanned"] > 0, summary
    # both engines: small is the Arrow group, large runs Spark (local[1]) executors on the store
    assert summary["compactions run (small)"] > 0 and summary["compactions run (large)"] > 0, summary
    # the files are in the bucket, not under the data directory
    assert not (tmp_path / "demo" / "files").exists() or not any((tmp_path / "demo" / "files").rglob("*.parquet"))
    fs = s3.filesystem()
    objects = [
        i.path
        for i in fs.get_file_info(pafs.FileSelector(f"{BUCKET}/demo/tables", recursive=True))
        if i.type == pafs.FileType.File
    ]
    assert objects and not [o for o in objects if "/_tmp_" in o], objects[:5]
    kinds = s3.requests(BUCKET)
    # no rename anywhere: every output, flush and import written once at its name
    assert kinds["COPY"] == 0, kinds
    # the credentials went through the environment only: in no output and no process' log
    assert s3.secret_key not in out.stdout + out.stderr
    logs = list((tmp_path / "demo" / "logs").rglob("*.log"))
    assert logs and not [f for f in logs if s3.secret_key in f.read_text(errors="replace")]


def test_bad_storage_is_one_line_and_starts_nothing(s3: S3Server, s3_env: dict[str, str], tmp_path: Path) -> None:
    cases = {
        f"s3://no-such-bucket-{os.getpid()}/x": "no-such-bucket",
        "gopher://somewhere/x": "gopher",
    }
    for uri, named in cases.items():
        out = _demo(
            s3_env,
            "--storage",
            uri,
            "--entries",
            "10",
            "--duration",
            "1",
            "--data-dir",
            str(tmp_path / "d"),
            timeout=120,
        )
        assert out.returncode != 0
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and named in lines[0], out.stderr
        assert "Traceback" not in out.stderr
    # an endpoint that does not answer
    out = _demo(
        {**s3_env, "AWS_ENDPOINT_URL": "http://127.0.0.1:9"},
        "--storage",
        f"s3://{BUCKET}/x",
        "--entries",
        "10",
        "--duration",
        "1",
        timeout=120,
    )
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    assert out.returncode != 0 and len(lines) == 1 and "Could not connect" in lines[0], out.stderr
    # (wrong and read-only credentials: test_credentials_..., on a server that checks them)
    # a prefix that already holds tables is refused (the demo verifies every file under it)
    storage = Storage.from_uri(f"s3://{BUCKET}/taken")
    with SortedFileWriter(storage, "tables/t/a/F0009.parquet") as w:
        w.write_entries(_entries(5))
        w.commit()
    out = _demo(s3_env, "--storage", f"s3://{BUCKET}/taken", "--entries", "10", "--duration", "1", timeout=120)
    assert out.returncode != 0 and "already holds 1 file" in out.stderr, out.stderr


@pytest.fixture(scope="module")
def s3_iam(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, str]]]:
    """A second S3 server that checks signatures and rights, as S3 does: a user allowed
    everything on S3 and one allowed only to read; each user's client environment."""
    server = S3Server(tmp_path_factory.mktemp("s3-iam")).start()
    try:
        server.create_bucket(BUCKET)
        yield server.enforce_auth({"writer": ["s3:*"], "reader": ["s3:GetObject", "s3:ListBucket"]})
    finally:
        server.stop()


@pytest.mark.redis
def test_credentials_that_cannot_write_are_one_line_before_anything_starts(
    s3_iam: dict[str, dict[str, str]], redis_url: str, tmp_path: Path
) -> None:
    writer, reader = s3_iam["writer"], s3_iam["reader"]
    wrong = {**writer, "AWS_SECRET_ACCESS_KEY": writer["AWS_SECRET_ACCESS_KEY"][::-1]}
    unknown = {**writer, "AWS_ACCESS_KEY_ID": "AKIA" + "0" * 16}
    uri = f"s3://{BUCKET}/iam"
    cases = {
        "read-only": (reader, "Access Denied"),
        "wrong secret": (wrong, "signature"),
        "unknown key": (unknown, "Access Key Id"),
    }
    for case, (env, named) in cases.items():
        for cmd in (
            ["demo", "--storage", uri, "--entries", "10", "--duration", "1", "--data-dir", str(tmp_path / case)],
            ["coordinator", "--redis", redis_url, "--storage", uri],
            ["compactor", "--group", "g", "--http-port", "-1", "--redis", redis_url, "--storage", uri],
        ):
            out = subprocess.run(
                [str(BIN / "kompaktor"), *cmd], env={**os.environ, **env}, capture_output=True, text=True, timeout=120
            )
            lines = [line for line in out.stderr.splitlines() if line.strip()]
            assert out.returncode != 0 and "Traceback" not in out.stderr, (case, cmd[0], out.stderr)
            assert len(lines) == 1 and uri in lines[0] and named.lower() in lines[0].lower(), (case, cmd, out.stderr)
            assert env["AWS_SECRET_ACCESS_KEY"] not in out.stdout + out.stderr
    # nothing was written by any of them; the writer's probe was removed
    probe = subprocess.run(
        [sys.executable, "-c", _PROBE, uri], env={**os.environ, **writer}, capture_output=True, text=True, timeout=120
    )
    assert probe.returncode == 0 and probe.stdout.split() == ["writable", "0"], probe.stderr


_PROBE = """
import sys
from kompaktor.files.storage import Storage
s = Storage.from_uri(sys.argv[1])
s.check_writable()
import pyarrow.fs as pafs
print("writable", len(s.fs.get_file_info(pafs.FileSelector(s.root, recursive=True, allow_not_found=True))))
"""


def test_an_arrow_compaction_on_s3_reads_each_input_once_and_never_copies_or_deletes(
    s3: S3Server, s3_env: dict[str, str]
) -> None:
    from prometheus_client import generate_latest

    from kompaktor.engines import make_engine
    from kompaktor.engines.api import MergeRequest
    from kompaktor.files.sortedfile import read_table
    from kompaktor.model.iterators import IteratorSettings
    from kompaktor.worker.metrics import CompactorMetrics

    storage = Storage.from_uri(f"s3://{BUCKET}/merge")
    inputs = _write_inputs(storage, 5000, lambda i: f"r{i}-")
    s3.reset_requests()
    before = REQUESTS.snapshot()
    req = MergeRequest(
        inputs=tuple(inputs),
        output="tables/t/a/A0001.parquet",
        prev=None,
        end=None,
        settings=IteratorSettings(),
        tmp_tag="ECID-s3",
    )
    result = make_engine("arrow").merge(storage, req)
    kinds = s3.requests(BUCKET)
    counted = {op: n - before[op] for op, n in REQUESTS.snapshot().items()}
    assert result.entries_written == 20000
    assert kinds["COPY"] == 0 and kinds["DELETE"] == 0, kinds
    print("requests of one arrow compaction on S3:", dict(kinds))
    # the output, once: one PUT, or the parts of one multipart upload (and no directory markers)
    assert kinds["PUT"] == 1 or (kinds["MULTIPART"] == 2 and kinds["PUT"] >= 1), kinds
    # every input: its footer and its data, fetched by range, no more than a few requests each
    assert kinds["GET"] + kinds["RANGE_GET"] <= 4 * len(inputs), kinds
    assert read_table(storage, req.output).num_rows == 20000
    # what a compactor's /metrics says of the same merge: one object written, each input opened,
    # nothing copied or deleted
    assert counted["put"] == 1 and counted["copy"] == counted["delete"] == 0, counted
    assert len(inputs) <= counted["get"] <= kinds["GET"] + kinds["RANGE_GET"], (counted, kinds)
    exposition = generate_latest(CompactorMetrics.create().registry).decode()
    assert f'kompaktor_storage_requests_total{{op="put"}} {float(REQUESTS.snapshot()["put"])}' in exposition


_DIES_MID_UPLOAD = """
import os, signal, sys
from kompaktor.files.storage import Storage
storage = Storage.from_uri(sys.argv[1])
rel = storage.staging_name(sys.argv[2])
sink = storage.open_output(rel)
for _ in range(12):  # 12 MiB: pyarrow uploads 5 MiB parts as it goes
    sink.write(os.urandom(1 << 20))
sink.flush()
os.kill(os.getpid(), signal.SIGKILL)  # the writer dies before completing the upload
"""


def test_a_writer_killed_mid_upload_leaves_no_visible_object(s3: S3Server, s3_env: dict[str, str]) -> None:

    uri, rel = f"s3://{BUCKET}/killed", "tables/t/a/C0001.parquet"
    s3.reset_requests()
    proc = subprocess.run([sys.executable, "-c", _DIES_MID_UPLOAD, uri, rel], env=s3_env, timeout=120)
    assert proc.returncode == -9
    assert s3.requests(BUCKET)["PUT"] >= 1  # parts went up ...
    storage = Storage.from_uri(uri)
    assert not storage.exists(rel) and storage.list_files("tables") == []  # ... and nothing is visible
    s3api = s3.client()
    uploads = s3api.list_multipart_uploads(Bucket=BUCKET, Prefix="killed/").get("Uploads", [])
    assert [u["Key"] for u in uploads] == [f"killed/{rel}"]
    # what a bucket's AbortIncompleteMultipartUpload rule does (docs/storage.md)
    s3api.abort_multipart_upload(Bucket=BUCKET, Key=uploads[0]["Key"], UploadId=uploads[0]["UploadId"])
    assert not s3api.list_multipart_uploads(Bucket=BUCKET, Prefix="killed/").get("Uploads")
    assert not storage.exists(rel)


def _table_with_an_orphan(client, storage: Storage, name: str, n: int) -> tuple[list[str], str]:
    """A table of one tablet with ``n`` entries flushed, and beside its file a complete object
    nobody references (a writer that finished its upload and died before its commit, at a final
    name in the table's directory): (the tablet's files, the orphan)."""
    client.store.tables.create_table(name, [])
    client.flush(name, _entries(n))
    (tablet,) = client.store.tables.tablets(client.store.tables.table_id(name))
    files = sorted(tablet.files)
    orphan = files[0].rsplit("/", 1)[0] + "/A-orphan.parquet"
    with SortedFileWriter(storage, orphan) as w:
        w.write_entries(_entries(3))
        w.commit()
    return files, orphan


@pytest.mark.redis
def test_gc_on_s3_removes_what_no_tablet_references_and_keeps_the_rest(
    s3: S3Server, s3_env: dict[str, str], redis_url: str
) -> None:
    from kompaktor.client import Client
    from kompaktor.coordinator.gc import collect_garbage
    from kompaktor.metadata.store import MetadataStore

    storage = Storage.from_uri(f"s3://{BUCKET}/gc")
    store = MetadataStore.from_url(redis_url)
    client = Client(store, storage)
    (referenced,), orphan = _table_with_an_orphan(client, storage, "t", 100)
    assert collect_garbage(store, storage, grace_s=3600) == []  # younger than the grace period: kept
    assert collect_garbage(store, storage, grace_s=0) == [orphan]
    assert [rel for rel, _ in storage.list_files("tables")] == [referenced]
    assert [e.row for e in client.scan("t")] == [e.row for e in _entries(100)]


@pytest.mark.redis
def test_gc_passes_on_s3_are_bounded_and_resume_where_the_last_stopped(
    s3: S3Server, s3_env: dict[str, str], redis_url: str
) -> None:
    from kompaktor.client import Client
    from kompaktor.coordinator.gc import GcCursor, collect_garbage
    from kompaktor.metadata.store import MetadataStore

    storage = Storage.from_uri(f"s3://{BUCKET}/gc-bounded")
    store = MetadataStore.from_url(redis_url)
    client = Client(store, storage)
    orphans, kept = {}, set()
    for name in ("ta", "tb", "tc"):
        files, orphans[store.tables.table_id(name)] = _table_with_an_orphan(client, storage, name, 50)
        kept.update(files)
    cursor = GcCursor()
    passes = []
    for _ in range(3):  # two objects per table: each pass lists one table's directory, no more
        s3.reset_requests()
        passes.append(collect_garbage(store, storage, grace_s=0, cursor=cursor, max_objects=2))
        # the tables, then one directory, then backups/ (files retained backups reference are spared)
        assert s3.requests(BUCKET)["LIST"] == 3, s3.requests(BUCKET)
    assert passes == [[orphans[tid]] for tid in sorted(orphans)]
    assert {rel for rel, _ in storage.list_files("tables")} == kept
    # the next pass starts over from the first table and finds nothing more
    assert collect_garbage(store, storage, grace_s=0, cursor=cursor, max_objects=2) == []
    for name in ("ta", "tb", "tc"):
        assert [e.row for e in client.scan(name)] == [e.row for e in _entries(50)]


@pytest.mark.redis
def test_split_and_merge_on_s3_keep_the_scan_exact(s3: S3Server, s3_env: dict[str, str], redis_url: str) -> None:
    from kompaktor.client import Client
    from kompaktor.metadata import tablet_ops
    from kompaktor.metadata.store import MetadataStore

    storage = Storage.from_uri(f"s3://{BUCKET}/splits")
    store = MetadataStore.from_url(redis_url)
    client = Client(store, storage)
    store.tables.create_table("t", [])
    expected = []
    for k in range(3):
        batch = _entries(200, prefix=f"{k}-")
        client.flush("t", batch)
        expected += batch
    rows = sorted(e.row for e in expected)

    def scanned() -> list[bytes]:
        return [e.row for e in client.scan("t")]

    assert scanned() == rows
    tablet_ops.split(store, "t", [b"1-", b"2-"])
    assert len(store.tables.tablets(store.tables.table_id("t"))) == 3 and scanned() == rows
    assert tablet_ops.merge(store, "t", None, None) is not None
    assert len(store.tables.tablets(store.tables.table_id("t"))) == 1 and scanned() == rows


@pytest.mark.redis
def test_a_storage_outage_mid_merge_fails_the_job_cleanly_and_it_is_retried(
    s3: S3Server, s3_env: dict[str, str], redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's endpoint goes away while a compactor uploads its output: the job fails and is
    released (no commit, no failure counted against it, the compactor keeps running), and once
    the store is back the job is planned again and commits; the scan is exact throughout."""
    from kompaktor.client import Client
    from kompaktor.coordinator import Coordinator
    from kompaktor.metadata import failures
    from kompaktor.metadata.store import MetadataStore
    from kompaktor.worker import Compactor, WorkerSettings
    from tests.support.tcpproxy import TcpProxy

    proxy = TcpProxy((s3.host, s3.port)).start()
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)  # the compactor reaches S3 through it
        storage = Storage.from_uri(f"s3://{BUCKET}/outage")
        store = MetadataStore.from_url(redis_url)
        client = Client(store, storage)
        store.tables.create_table("t", [])
        for k in range(4):  # ~2 MiB of incompressible values per file: the output is uploaded in parts
            client.flush(
                "t",
                [Entry(b"row%06d" % (i * 4 + k), b"cf", b"cq", b"", 1, False, os.urandom(128)) for i in range(15000)],
            )
        before = list(client.scan("t"))
        (tablet,) = store.tables.tablets(store.tables.table_id("t"))
        inputs = set(tablet.files)
        assert Coordinator(store, storage).full_scan() == 1
        worker = Compactor(store, storage, WorkerSettings("default", "c-outage", engine="arrow"))

        proxy.cut_when(b"partNumber=")  # the first part of the output cuts the store off
        outcome = worker.run_one()
        assert proxy.cut_event.is_set()
        assert outcome is not None and outcome.status == "failed" and outcome.storage_down, outcome
        (tablet,) = store.tables.tablets(store.tables.table_id("t"))
        assert set(tablet.files) == inputs and tablet.running == {}  # nothing committed, released
        assert raw_redis(store).hlen(C.FAILURES) == 0 and not failures.dead_letters(store)  # not the job's fault

        proxy.restore()
        assert Coordinator(store, storage).full_scan() == 1  # planned again at once
        outcome = worker.run_one()
        assert outcome is not None and outcome.status == "committed", outcome
        (tablet,) = store.tables.tablets(store.tables.table_id("t"))
        assert len(tablet.files) == 1 and not set(tablet.files) & inputs
        assert list(client.scan("t")) == before
        # the history: released without counting a failure (retried), then committed (issue 36 §1)
        from kompaktor.metadata import history

        recs = history.read(store, ["default"])
        assert [r.outcome for r in recs] == [history.COMMITTED, history.RETRIED]
        assert recs[1].reason.startswith("storage unavailable:") and recs[1].failed
    finally:
        proxy.stop()


def test_an_interrupted_arrow_merge_resumes_on_s3(s3: S3Server, s3_env: dict[str, str], store) -> None:
    """Resumable merges on an object store (issue 23 §2): parts are written once at their final
    names, verified by reading them back, reused by the retry; the resumed output is the
    uninterrupted one byte for byte, and after the commit nothing of the job is left."""
    import hashlib
    import threading

    from kompaktor.engines.api import MergeCancelled, MergeRequest
    from kompaktor.engines.arrow import ArrowMergeEngine
    from kompaktor.metadata import progress as records
    from kompaktor.model.iterators import IteratorSettings
    from kompaktor.model.resume import job_fingerprint

    storage = Storage.from_uri(f"s3://{BUCKET}/resume")
    inputs = _write_inputs(storage, 3000, lambda i: f"r{i % 2}-{i}-")
    settings = IteratorSettings()
    fp = job_fingerprint("t;", None, None, {p: storage.size(p) for p in inputs}, "SYSTEM", None, settings)
    engine = ArrowMergeEngine(range_entries=1500, resume_min_bytes=0)

    def request(out: str, tag: str, log) -> MergeRequest:
        return MergeRequest(tuple(inputs), f"tables/t/a/{out}", None, None, settings, tag, resume=log)

    def sha(rel: str) -> str:
        with storage.open_input(rel) as f:
            return hashlib.sha256(f.read()).hexdigest()

    def temp() -> list[str]:
        return [rel for rel, _ in storage.list_files("tables") if "/_tmp_" in rel]

    ref_log = records.RedisResumeLog(store, "f" * 64, "t;", tuple(inputs))
    ref = engine.merge(storage, request("A0000.parquet", "ECID-00000000000000a0", ref_log))
    records.finish(store, storage, ref_log.fingerprint, ref.parts)
    assert temp() == []
    cancel = threading.Event()
    with pytest.raises(MergeCancelled):
        engine.merge(
            storage,
            request("A0001.parquet", "ECID-00000000000000a1", records.RedisResumeLog(store, fp, "t;", tuple(inputs))),
            progress=lambda p: cancel.set() if p["parts_done"] >= 3 else None,
            cancel=cancel,
        )
    assert len(temp()) == 3  # the recorded parts, at their final names
    got = engine.merge(
        storage,
        request("A0002.parquet", "ECID-00000000000000a2", records.RedisResumeLog(store, fp, "t;", tuple(inputs))),
    )
    assert got.parts_reused == 3 and got.entries_read + got.entries_reused == ref.entries_read
    assert sha(got.info.path) == sha(ref.info.path)
    records.finish(store, storage, fp, got.parts)
    assert temp() == [] and records.records(store) == {}


def test_a_held_upload_reaches_the_store_only_once_released(
    s3: S3Server, s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The upgrade test's hold (tests/support/tcpproxy.py): a file's upload waits in the proxy, the
    object absent meanwhile, and lands whole once released."""
    import threading

    from tests.support.tcpproxy import TcpProxy

    proxy = TcpProxy((s3.host, s3.port)).start()
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        storage = Storage.from_uri(f"s3://{BUCKET}/held")
        proxy.hold_when(b"PUT ")
        done = threading.Event()

        def write() -> None:
            with SortedFileWriter(storage, "x.parquet") as w:
                w.write_entries(_entries(100))
                w.commit()
            done.set()

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        assert proxy.held.wait(60), "no PUT reached the proxy"
        assert not done.is_set() and not storage.exists("x.parquet")
        proxy.release()
        writer.join(60)
        assert done.is_set() and storage.exists("x.parquet")
    finally:
        proxy.stop()
