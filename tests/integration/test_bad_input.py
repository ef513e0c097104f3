"""Issue 16 §5: every bad input is answered by one line on stderr and a non-zero exit, and changes
nothing: each case below compares every Redis key (the file-name counter included) and every file
under the storage and the output directory before and after. Plus the CLI's top-level rule: an
unexpected internal error is one line pointing at ``--debug``, which shows the traceback.

The tests run as root, which may write anywhere a mode bit forbids, so "read-only" here means a
sysfs directory (``/sys/kernel``: no process may create files there) and "a storage URI that is a
file" a regular file in the way."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import redis
from click.testing import CliRunner

from kompaktor.cli import main
from kompaktor.files.sortedfile import entries_to_table
from kompaktor.model.keys import Entry
from tests.support.snapshot import snapshot

pytestmark = pytest.mark.redis

READ_ONLY_DIR = "/sys/kernel"  # sysfs: even root cannot create a file here


def E(row: bytes, ts: int = 1) -> Entry:
    return Entry(row, b"f", b"q", b"", ts, False, b"v")


def files_under(*dirs: Path) -> list[str]:
    return sorted(str(p) for d in dirs if d.is_dir() for p in d.rglob("*"))


@pytest.fixture
def world(redis_url: str, tmp_path: Path):
    """A table `t` (tablets up to m, after m) with imported data, its storage, an output
    directory holding a directory `outdir`, a regular file `afile`, an empty Parquet file."""
    storage = tmp_path / "files"
    out = tmp_path / "out"
    (out / "outdir").mkdir(parents=True)
    (out / "afile").write_text("not a directory")
    pq.write_table(entries_to_table([E(b"a"), E(b"z")]), tmp_path / "a.parquet")
    pq.write_table(entries_to_table([]), tmp_path / "empty.parquet")
    runner = CliRunner()

    def run(*args: str, storage_uri: str | None = None):
        return runner.invoke(
            main,
            [*args, "--storage", storage_uri or str(storage)] + ([] if "--redis" in args else ["--redis", redis_url]),
            catch_exceptions=False,
        )

    assert run("table", "create", "t", "--splits", "m").exit_code == 0
    assert run("import", "t", str(tmp_path / "a.parquet")).exit_code == 0
    r = redis.Redis.from_url(redis_url)

    def state():
        return snapshot(r), files_under(storage, out)

    yield run, state, tmp_path
    r.close()


def group_file(tmp: Path, name: str, spec: dict) -> str:
    """A YAML file holding one CompactorGroup, for `kompaktor service apply`."""
    import yaml

    path = tmp / "groups" / f"{name}.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(
        yaml.safe_dump(
            {"apiVersion": "kompaktor.io/v1alpha1", "kind": "CompactorGroup", "metadata": {"name": name}, "spec": spec}
        )
    )
    return str(path)


#: issue 25 §1 and §3: what a group may not choose, refused by `kompaktor service apply` as by the
#: operator (same rule, same words), and nothing stored
HOSTILE_GROUPS = [
    (
        "jars",
        {"spark": {"conf": {"spark.jars": "http://evil.example/x.jar"}}},
        "error: CompactorGroup jars: spec.spark.conf key 'spark.jars' is not allowed",
    ),
    (
        "javaopts",
        {"spark": {"conf": {"spark.driver.extraJavaOptions": "-javaagent:/tmp/a.jar"}}},
        "error: CompactorGroup javaopts: spec.spark.conf key 'spark.driver.extraJavaOptions' is not allowed",
    ),
    (
        "master",
        {"spark": {"master": "spark://evil.example:7077"}},
        "error: CompactorGroup master: spec.spark.master 'spark://evil.example:7077' is not allowed",
    ),
    (
        "storage",
        {"storage": {"uri": "s3://someone-elses-bucket/x"}},
        "error: CompactorGroup storage: spec.storage.uri 's3://someone-elses-bucket/x' is not allowed",
    ),
    ("many", {"maxReplicas": 100000}, "error: CompactorGroup many: spec.maxReplicas 100000 is more than 1000"),
    (
        "labels",
        {"podLabels": {"app.kubernetes.io/component": "operator"}},
        "error: CompactorGroup labels: spec.podLabels key 'app.kubernetes.io/component' is not allowed",
    ),
]


def bad_inputs(tmp: Path, redis_port: int) -> list[tuple[list[str], str | None, int, str]]:
    """(arguments, storage URI or None for the table's, exit status, the error line's text)."""
    out = tmp / "out"
    afile = str(out / "afile")
    return [
        *[
            (["service", "apply", group_file(tmp, name, spec)], None, 1, message)
            for name, spec, message in HOSTILE_GROUPS
        ],
        (
            ["import", "t", str(tmp / "empty.parquet")],
            None,
            1,
            f"error: {tmp / 'empty.parquet'}: the file has no entries; nothing to import",
        ),
        (
            ["compact", "t", "--start", "z", "--end", "a"],
            None,
            1,
            "error: empty row range to compact: --start 'z' is after --end 'a'",
        ),
        (
            ["scan", "t", "--start", "b", "--end", "a"],
            None,
            1,
            "error: empty row range to scan: --start 'b' is after --end 'a'",
        ),
        # issue 25 §3: hostile values in what a user controls are refused, never interpreted
        (
            ["compact", "t", "--delete-rows-from", "z", "--delete-rows-to", "a"],
            None,
            1,
            "error: empty row range to delete: 'z' is not before 'a' (rows in [FROM, TO) are deleted)",
        ),
        (
            ["compact", "t", "--row-regex", "("],
            None,
            1,
            "error: row filter regex '(' is invalid: missing ), unterminated subpattern at position 0",
        ),
        (["compact", "t", "--ageoff-ttl", "-5"], None, 1, "error: ageoff ttl must be >= 0 ms, got -5"),
        (
            ["compact", "--status", "UC-1'; FLUSHALL; '"],
            None,
            1,
            "error: unknown user compaction \"UC-1'; FLUSHALL; '\"",
        ),
        (["compact", "--cancel", "../../kz:tables"], None, 1, "error: unknown user compaction '../../kz:tables'"),
        (
            ["table", "config", "t", "kz:tables=x"],
            None,
            1,
            "error: unknown table property 'kz:tables' (custom properties go under table.custom.)",
        ),
        (
            ["import", "t", str(tmp / "a.parquet")],
            READ_ONLY_DIR,
            1,
            f"error: cannot write to storage {READ_ONLY_DIR}: [Errno 1] Cannot create directory "
            f"'{READ_ONLY_DIR}/tables'",
        ),
        (
            ["import", "t", str(tmp / "a.parquet")],
            afile,
            1,
            f"error: storage {afile}: not a directory (a file is in the way)",
        ),
        (["scan", "t"], afile + "/sub", 1, f"error: storage {afile}/sub: cannot create the directory: Not a directory"),
        (
            ["scan", "t", "-o", f"{READ_ONLY_DIR}/out.parquet"],
            None,
            1,
            f"error: -o {READ_ONLY_DIR}/out.parquet: cannot write: Failed to open local file",
        ),
        (
            ["scan", "t", "-o", str(out / "outdir")],
            None,
            1,
            f"error: -o {out / 'outdir'}: is a directory; give the name of a Parquet file to write",
        ),
        (
            ["scan", "t", "-o", afile + "/x.parquet"],
            None,
            1,
            f"error: -o {afile}/x.parquet: {afile} is not an existing directory",
        ),
        (
            ["table", "list", "--redis", f"redis://127.0.0.1:{redis_port}/99"],
            None,
            1,
            f"error: Redis at redis://127.0.0.1:{redis_port}/99 has no such database (DB index out of range)",
        ),
        (
            ["table", "list", "--redis", f"redis://127.0.0.1:{redis_port}/0?ssl_ca_certs=/etc/ca.crt"],
            None,
            1,
            f"error: invalid Redis URL 'redis://127.0.0.1:{redis_port}/0?ssl_ca_certs=/etc/ca.crt': ssl_ca_certs "
            "needs TLS: use rediss://",
        ),
        (
            ["table", "list", "--redis", f"redis://127.0.0.1:{redis_port}/0?timeout=5"],
            None,
            1,
            f"error: invalid Redis URL 'redis://127.0.0.1:{redis_port}/0?timeout=5': unknown parameter(s) timeout",
        ),
        *[
            (
                ["table", "create", name],
                None,
                1,
                f"error: invalid table name {name!r}: use 1 to 128 ASCII letters, digits, '-', '_' or '.', "
                "not '.' or '..'",
            )
            for name in (".", "..", "é", "tab\u00e9le", "a\x01b", "a\x1b[31mb", "a b", "a/b", "x" * 129)
        ],
        (
            ["table", "config", "t", "table.iterator.versions=1e23"],
            None,
            1,
            "error: table.iterator.versions='1e23': not an integer",
        ),
        (
            ["table", "config", "t", "table.iterator.versions=100000000000000000000000"],
            None,
            1,
            "error: table.iterator.versions='100000000000000000000000': must be <= 2147483647",
        ),
        (
            ["table", "config", "t", "table.compaction.major.ratio=nan"],
            None,
            1,
            "error: table.compaction.major.ratio='nan': must be a finite number in [1.0, ∞)",
        ),
        *[
            (
                ["table", "config", "t", f"table.compaction.quota={v}"],
                None,
                1,
                f"error: table.compaction.quota={v!r}: must be a finite number in [0.001, 1.0]",
            )
            for v in ("0", "1.5", "0.0001", "inf", "-1")
        ],
        (
            ["table", "config", "t", "table.compaction.quota=x"],
            None,
            1,
            "error: table.compaction.quota='x': not a number",
        ),
        (
            ["table", "config", "t", "table.compaction.selector.threshold=x"],
            None,
            1,
            "error: table.compaction.selector.threshold='x': not a number",
        ),
        (
            ["table", "config", "t", "table.compaction.dispatcher.opts.service=nope"],
            None,
            1,
            "error: table.compaction.dispatcher.opts.service='nope': no compaction service 'nope' (services: default)",
        ),
        (
            ["table", "config", "t", "table.compaction.dispatcher.opts.service.user=nope"],
            None,
            1,
            "error: table.compaction.dispatcher.opts.service.user='nope': no compaction service 'nope'",
        ),
    ]


def test_every_bad_input_is_one_line_and_changes_nothing(world, redis_server) -> None:
    run, state, tmp = world
    before = state()
    for args, storage_uri, code, message in bad_inputs(tmp, redis_server.port):
        result = run(*args, storage_uri=storage_uri)
        assert result.exit_code == code, (args, result.output)
        assert result.stdout == "", (args, result.stdout)
        assert result.stderr.count("\n") == 1, (args, result.stderr)
        assert result.stderr.startswith(message), (args, result.stderr)
        assert state() == before, args


def test_the_good_neighbours_still_work(world) -> None:
    """What the refusals above must not refuse: a one-row range, a name with every allowed
    character, a service that exists, a new file name in an existing directory."""
    run, _state, tmp = world
    assert run("scan", "t", "--start", "a", "--end", "a").stdout.splitlines() == ["a f:q [] 1\tv"]
    assert run("table", "create", "Ab-9_x.y").exit_code == 0
    r = run(
        "table", "config", "t", "table.compaction.dispatcher.opts.service=default", "table.iterator.versions=2147483647"
    )
    assert r.exit_code == 0, r.output
    r = run("scan", "t", "-o", str(tmp / "out" / "new.parquet"))
    assert r.exit_code == 0 and r.stdout == f"wrote 2 entries to {tmp / 'out' / 'new.parquet'}\n"


def test_internal_error_is_one_line_pointing_at_debug(world, monkeypatch: pytest.MonkeyPatch) -> None:
    run, state, _tmp = world
    import kompaktor.cli.table as table_cli

    def broken(*_args, **_kwargs):
        raise RuntimeError("planted bug near redis://:PLANTED-pw@10.0.0.1:6379/0\nsecond line")

    monkeypatch.setattr(table_cli, "open_client", broken)
    before = state()
    result = run("table", "list")
    assert result.exit_code == 70
    assert result.stderr == (
        "error: internal error (RuntimeError: planted bug near redis://***@10.0.0.1:6379/0); "
        "run `kompaktor --debug …` for the traceback\n"
    )
    result = CliRunner().invoke(main, ["--debug", "table", "list"])
    assert isinstance(result.exception, RuntimeError)  # --debug lets the traceback through
    assert state() == before


def test_no_traceback_reaches_the_real_console(world, redis_url: str) -> None:
    """The installed command, as a person runs it: stderr is exactly one line."""
    _run, state, tmp = world
    exe = Path(sys.executable).parent / "kompaktor"
    env = {**os.environ, "KOMPAKTOR_REDIS_URL": redis_url, "KOMPAKTOR_STORAGE": str(tmp / "files")}
    before = state()
    for args in (
        ["import", "t", str(tmp / "empty.parquet")],
        ["scan", "t", "-o", str(tmp / "out" / "outdir")],
        ["import", "t", str(tmp / "a.parquet"), "--storage", READ_ONLY_DIR],
    ):
        p = subprocess.run([str(exe), *args], env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 1 and p.stdout == "" and p.stderr.count("\n") == 1, p.stderr
        assert p.stderr.startswith("error: ") and "Traceback" not in p.stderr
    assert state() == before
