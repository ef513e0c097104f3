"""The foundation's CLI contract (issue 3 §5): `kompaktor table create|config|offline|online|delete`,
`kompaktor import`, `kompaktor scan`, with --redis/--storage or their environment variables.
Through click's CliRunner, and once as the real console command in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from kompaktor import keyspace as C
from kompaktor.cli import main
from kompaktor.connection import connect
from kompaktor.files.sortedfile import SCHEMA, entries_to_table
from kompaktor.metadata.store import MetadataStore
from kompaktor.model.keys import Entry, sort_key
from tests.support.snapshot import snapshot as redis_contents

pytestmark = pytest.mark.redis


def E(row: bytes, ts: int = 1, deleted: bool = False, value: bytes = b"v") -> Entry:
    return Entry(row, b"f", b"q", b"", ts, deleted, b"" if deleted else value)


@pytest.fixture
def cli(redis_url: str, tmp_path: Path):
    """Run `kompaktor ARGS…` in-process with --redis and --storage given explicitly."""
    runner = CliRunner()
    storage = str(tmp_path / "files")

    def run(*args: str, ok: bool = True):
        result = runner.invoke(main, [*args, "--redis", redis_url, "--storage", storage], catch_exceptions=False)
        if ok:
            assert result.exit_code == 0, result.output
        return result

    run.storage = storage
    return run


def parquet(path: Path, entries: list[Entry]) -> str:
    pq.write_table(entries_to_table(entries), path)
    return str(path)


def snapshot(url: str, storage: str) -> tuple:
    """The metadata (the ID sequence aside) and the files under ``storage``."""
    client = connect(url)
    try:
        meta = redis_contents(client, skip=(C.SEQ.encode(),))
    finally:
        client.close()
    files = (
        sorted(str(p.relative_to(storage)) for p in Path(storage).rglob("*") if p.is_file())
        if os.path.isdir(storage)
        else []
    )
    return meta, files


def test_table_lifecycle(cli, redis_url: str, tmp_path: Path) -> None:
    out = cli("table", "create", "t", "--splits", "g,p").output
    assert "created table t" in out and "3 tablets" in out
    splits_file = tmp_path / "splits.txt"
    splits_file.write_text("80\n\nff00\n61\n")
    assert "4 tablets" in cli("table", "create", "u", "--splits-file", str(splits_file)).output
    store = MetadataStore.from_url(redis_url)
    assert [t.end for t in store.tables.tablets(store.tables.table_id("u"))] == [b"a", b"\x80", b"\xff\x00", None]

    assert cli("table", "config", "t").output == ""
    out = cli("table", "config", "t", "table.iterator.versions=3", "table.custom.owner=me").output
    assert out.splitlines() == ["table.custom.owner=me", "table.iterator.versions=3"]
    assert cli("table", "config", "t", "table.custom.owner=").output.splitlines() == ["table.iterator.versions=3"]

    assert "OFFLINE" in cli("table", "offline", "t").output
    assert store.tables.table("t").state == "OFFLINE"
    assert "ONLINE" in cli("table", "online", "t").output
    assert store.tables.table("t").state == "ONLINE"
    assert "deleted table t" in cli("table", "delete", "t").output
    assert [t.name for t in store.tables.tables()] == ["u"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["table", "create", "t"], "table 't' already exists"),
        (["table", "create", "bad name"], "invalid table name"),
        (["table", "config", "nope"], "unknown table 'nope'"),
        (["table", "config", "t", "table.iterator.versions=0"], "table.iterator.versions='0': must be >= 1"),
        (["table", "config", "t", "no.such.prop=1"], "unknown table property 'no.such.prop'"),
        (["table", "config", "t", "novalue"], "expected KEY=VALUE"),
        (["table", "offline", "nope"], "unknown table 'nope'"),
        (["table", "delete", "nope"], "unknown table 'nope'"),
        (["scan", "nope"], "unknown table 'nope'"),
        (["import", "nope", "whatever.parquet"], "unknown table 'nope'"),
    ],
)
def test_errors_are_one_line_and_exit_1(cli, redis_url: str, args: list[str], message: str) -> None:
    cli("table", "create", "t")
    before = snapshot(redis_url, cli.storage)
    result = cli(*args, ok=False)
    assert result.exit_code == 1
    assert f"error: {message}" in result.output and "Traceback" not in result.output
    assert snapshot(redis_url, cli.storage) == before


def test_splits_file_must_be_hex(cli, tmp_path: Path) -> None:
    (tmp_path / "s.txt").write_text("61\nnot-hex\n")
    result = cli("table", "create", "t", "--splits-file", str(tmp_path / "s.txt"), ok=False)
    assert result.exit_code == 1 and "--splits-file line 2: not hex" in result.output


def test_import_and_scan(cli, tmp_path: Path) -> None:
    cli("table", "create", "t", "--splits", "m")
    a = parquet(tmp_path / "a.parquet", [E(b"a", 1), E(b"z", 1)])
    b = parquet(tmp_path / "b.parquet", [E(b"a", 2, value=b"new"), E(b"n", 1, deleted=True), E(b"\xff", 1)])
    assert "imported 2 files into t" in cli("import", "t", a, b).output
    lines = cli("scan", "t").output.splitlines()
    assert lines == ["a f:q [] 2\tnew", "z f:q [] 1\tv", "\\xff f:q [] 1\tv"]
    assert cli("scan", "t", "--start", "b", "--end", "z").output.splitlines() == ["z f:q [] 1\tv"]


def test_import_refusal_exits_nonzero_and_changes_nothing(cli, redis_url: str, tmp_path: Path) -> None:
    cli("table", "create", "t", "--splits", "m")
    cli("import", "t", parquet(tmp_path / "first.parquet", [E(b"a")]))
    before = snapshot(redis_url, cli.storage)
    good = parquet(tmp_path / "good.parquet", [E(b"b"), E(b"y")])
    unsorted = parquet(tmp_path / "unsorted.parquet", [E(b"y"), E(b"b")])
    pq.write_table(entries_to_table([E(b"c")]).drop_columns(["vis"]), tmp_path / "noviz.parquet")
    for files, message in (
        ([good, unsorted], "unsorted.parquet: entries are not in key order"),
        ([str(tmp_path / "noviz.parquet"), good], "noviz.parquet: wrong schema"),
        ([good, str(tmp_path / "missing.parquet")], "missing.parquet: cannot open"),
    ):
        result = cli("import", "t", *files, ok=False)
        assert result.exit_code == 1 and message in result.output, result.output
        assert snapshot(redis_url, cli.storage) == before
    assert cli("scan", "t").output.splitlines() == ["a f:q [] 1\tv"]


def test_scan_output_file_has_the_file_schema(cli, tmp_path: Path) -> None:
    cli("table", "create", "t", "--splits", "m")
    cli("table", "config", "t", "table.iterator.versions=2")
    entries = [E(b"a", 3), E(b"a", 2), E(b"a", 1), E(b"q", 1), E(b"\x80", 5, deleted=True), E(b"\x80", 4)]
    cli("import", "t", parquet(tmp_path / "in.parquet", sorted(entries, key=sort_key)))
    out = tmp_path / "out" / "merged.parquet"
    os.makedirs(out.parent)
    assert "wrote 3 entries" in cli("scan", "t", "--start", "a", "--end", "\x80", "-o", str(out)).output
    table = pq.read_table(out)
    assert table.schema.remove_metadata() == SCHEMA
    assert table.to_pylist() == [e._asdict() for e in (E(b"a", 3), E(b"a", 2), E(b"q", 1))]
    assert os.listdir(out.parent) == ["merged.parquet"]  # no temp file left beside it
    # the output is itself importable
    cli("table", "create", "copy")
    cli("table", "config", "copy", "table.iterator.versions=2")
    cli("import", "copy", str(out))
    assert cli("scan", "copy").output == cli("scan", "t", "--end", "q").output


def test_environment_variables_select_redis_and_storage(redis_url: str, tmp_path: Path) -> None:
    runner = CliRunner()
    env = {"KOMPAKTOR_REDIS_URL": redis_url, "KOMPAKTOR_STORAGE": str(tmp_path / "envfiles")}
    result = runner.invoke(main, ["table", "create", "t"], env=env)
    assert result.exit_code == 0, result.output
    src = parquet(tmp_path / "a.parquet", [E(b"a")])
    assert runner.invoke(main, ["import", "t", src], env=env).exit_code == 0
    assert list((tmp_path / "envfiles").rglob("I*.parquet"))
    assert MetadataStore.from_url(redis_url).tables.table("t").name == "t"


def test_redis_unreachable(tmp_path: Path) -> None:
    from tests.support.ports import free_port

    url = f"redis://127.0.0.1:{free_port()}/0"
    result = CliRunner().invoke(main, ["table", "create", "t", "--redis", url, "--storage", str(tmp_path)])
    assert result.exit_code == 1
    assert f"error: Redis at {url} is unreachable" in result.output


def test_real_console_command(redis_url: str, tmp_path: Path) -> None:
    """The installed `kompaktor` entry point, as scripts run it."""
    exe = Path(sys.executable).parent / "kompaktor"
    assert exe.exists(), "the kompaktor console script is not installed in the venv"
    env = {**os.environ, "KOMPAKTOR_REDIS_URL": redis_url, "KOMPAKTOR_STORAGE": str(tmp_path / "files")}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(exe), *args], env=env, capture_output=True, text=True, timeout=120)

    assert run("table", "create", "t", "--splits", "m").returncode == 0
    src = parquet(tmp_path / "a.parquet", [E(b"a"), E(b"z")])
    bad = parquet(tmp_path / "bad.parquet", [E(b"z"), E(b"a")])
    p = run("import", "t", src, bad)
    assert p.returncode == 1 and "bad.parquet: entries are not in key order" in p.stderr
    assert "Traceback" not in p.stderr
    assert run("import", "t", src).returncode == 0
    p = run("scan", "t")
    assert p.returncode == 0 and p.stdout.splitlines() == ["a f:q [] 1\tv", "z f:q [] 1\tv"]
    p = run("scan", "t", "-o", str(tmp_path / "out.parquet"))
    assert p.returncode == 0 and pq.read_schema(tmp_path / "out.parquet").remove_metadata() == SCHEMA


def test_the_documented_example_imports(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/file-format.md's pyarrow example produces a file `kompaktor import` accepts."""
    doc = (Path(__file__).parents[2] / "docs" / "file-format.md").read_text()
    example = doc.split("```python\n")[2].split("```")[0]
    monkeypatch.chdir(tmp_path)
    exec(compile(example, "file-format.md", "exec"), {})
    cli("table", "create", "users", "--splits", "user1,user5")
    cli("import", "users", "users.parquet")
    assert cli("scan", "users").output.splitlines() == [
        "user1 info:name [] 1700000000000\tAnn",
        "user2 info:email [admin] 1700000000000\tbo@example.com",
        "user\\x80 info:name [] 1700000000000\tZoë",
    ]
