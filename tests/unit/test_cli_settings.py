"""Each process's command only parses: a command line (and the environment variables it reads)
becomes the settings object its composition root takes, and nothing starts. The expected objects
are written out by hand from the documented options (docs/cli.md, `--help`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click
import pytest
from click.testing import CliRunner

from kompaktor.cli import main
from kompaktor.cli.compactor import compactor, compactor_options
from kompaktor.cli.coordinator import coordinator, coordinator_options
from kompaktor.cli.local import demo, demo_settings, up, up_settings
from kompaktor.coordinator.assemble import CoordinatorOptions
from kompaktor.coordinator.core import CoordinatorSettings
from kompaktor.local.assemble import DemoSettings, UpSettings
from kompaktor.local.config import DEMO_CONFIG
from kompaktor.metadata.history import HistoryLimits
from kompaktor.worker.assemble import CompactorOptions

T = TypeVar("T")

REDIS = "redis://127.0.0.1:7001/3"


@pytest.fixture(autouse=True)
def _no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only what a test sets: none of the variables the commands read comes from outside."""
    for name in list(os.environ):
        if name.startswith("KOMPAKTOR_") or name == "POD_NAME":
            monkeypatch.delenv(name)


def parsed(command: click.Command, to_settings: Callable[..., T], argv: list[str]) -> T:
    """The settings ``argv`` gives: click parses it (the environment included) into the
    parameters the command's function receives, which turns them into its settings with
    ``to_settings``; nothing runs."""
    with command.make_context(command.name or "", argv) as ctx:  # closes a --config file at the end
        return to_settings(**ctx.params)


def test_a_coordinator_command_line_is_its_settings() -> None:
    argv = [
        *("--metrics-port", "0", "--metrics-host", "127.0.0.1", "--full-scan-interval", "5"),
        *("--dead-after", "7", "--gc-grace", "11", "--gc-interval", "13", "--lease", "2.5"),
        *("--plan-workers", "2", "--backup-interval", "60", "--backup-keep", "3", "--backup-max-age", "86400"),
        *("--bootstrap-from", "latest", "--history-records", "50", "--history-age", "600"),
        *("--redis", REDIS, "--storage", "/data/kz"),
    ]
    settings = CoordinatorSettings(
        full_scan_s=5.0,
        dead_after_s=7.0,
        gc_grace_s=11.0,
        gc_interval_s=13.0,
        lease_ms=2500,
        plan_workers=2,
        backup_interval_s=60.0,
        backup_keep=3,
        backup_max_age_s=86400.0,
        history_limits=HistoryLimits(50, 600.0),
    )
    expected = CoordinatorOptions(REDIS, "/data/kz", settings, 0, "127.0.0.1", "latest")
    assert parsed(coordinator, coordinator_options, argv) == expected


def test_the_coordinators_defaults_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    opts = parsed(coordinator, coordinator_options, [])
    assert (opts.redis_url, opts.storage_uri, opts.metrics_port, opts.metrics_host) == (
        "redis://127.0.0.1:6379/0",
        None,
        9090,
        "0.0.0.0",
    )
    s = opts.settings
    assert (s.full_scan_s, s.dead_after_s, s.gc_grace_s, s.gc_interval_s) == (30.0, 30.0, 300.0, 60.0)
    assert s.lease_ms == 10_000
    assert (s.backup_interval_s, s.backup_keep, s.backup_max_age_s, opts.bootstrap_from) == (0.0, 7, None, None)
    assert s.history_limits == HistoryLimits(10_000, 7 * 86400.0)
    for name, value in {
        "KOMPAKTOR_REDIS_URL": REDIS,
        "KOMPAKTOR_STORAGE": "/data/env",
        "KOMPAKTOR_METRICS_HOST": "127.0.0.2",
        "KOMPAKTOR_BOOTSTRAP_FROM": "b-1",
        "KOMPAKTOR_HISTORY_RECORDS": "5",
        "KOMPAKTOR_HISTORY_AGE": "9",
    }.items():
        monkeypatch.setenv(name, value)
    opts = parsed(coordinator, coordinator_options, [])
    assert (opts.redis_url, opts.storage_uri, opts.metrics_host, opts.bootstrap_from) == (
        REDIS,
        "/data/env",
        "127.0.0.2",
        "b-1",
    )
    assert opts.settings.history_limits == HistoryLimits(5, 9.0)


def test_a_compactor_command_line_is_its_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = [
        *("--group", "small", "--id", "c-1", "--engine", "arrow", "--spark-master", "local[2]"),
        *("--spark-conf", "spark.a=1", "--spark-conf", "spark.b=x=y", "--driver-memory", "2g"),
        *("--drain-grace", "30", "--http-port", "0", "--http-host", "127.0.0.1"),
        *("--drain-token-file", "/run/token", "--stay-drained", "--broker", "--max-jobs", "3"),
        *("--history-records", "9", "--history-age", "60", "--redis", REDIS, "--storage", "/data/kz"),
    ]
    expected = CompactorOptions(
        group="small",
        redis_url=REDIS,
        storage_uri="/data/kz",
        compactor_id="c-1",
        engine="arrow",
        spark_master="local[2]",
        spark_conf=("spark.a=1", "spark.b=x=y"),
        driver_memory="2g",
        drain_grace=30.0,
        http_port=0,
        http_host="127.0.0.1",
        drain_token_file="/run/token",
        stay_drained=True,
        broker=True,
        max_jobs=3,
        history_records=9,
        history_age=60.0,
    )
    assert parsed(compactor, compactor_options, argv) == expected
    # a pod's: the operator gives most of it in the environment
    for name, value in {
        "POD_NAME": "small-7f9c-abcde",
        "KOMPAKTOR_BROKER": "1",
        "KOMPAKTOR_STAY_DRAINED": "true",
        "KOMPAKTOR_SETTINGS_DIGEST": "d1",
        "KOMPAKTOR_DRAIN_TOKEN_FILE": "/run/t",
        "KOMPAKTOR_REDIS_URL": REDIS,
    }.items():
        monkeypatch.setenv(name, value)
    assert parsed(compactor, compactor_options, ["--group", "small"]) == CompactorOptions(
        group="small",
        redis_url=REDIS,
        compactor_id="small-7f9c-abcde",
        drain_token_file="/run/t",
        settings_digest="d1",
        stay_drained=True,
        broker=True,
    )


def test_the_compactor_needs_a_group() -> None:
    """A usage error, as before: click's message and exit status 2, nothing started."""
    result = CliRunner().invoke(main, ["compactor"])
    assert result.exit_code == 2 and "Missing option '--group'" in result.output


def test_an_up_command_line_is_its_settings(tmp_path: Path) -> None:
    config = tmp_path / "local.yaml"
    config.write_text("# a configuration\n")
    argv = ["--config", str(config), "--redis", REDIS, "--data-dir", "/d", "--storage", "s3://b/p", "--ha"]
    expected = UpSettings(
        config_text="# a configuration\n",
        redis_url=REDIS,
        data_dir="/d",
        storage="s3://b/p",
        ha=True,
        status_port=0,
    )
    assert parsed(up, up_settings, [*argv, "--status-port", "0"]) == expected
    assert parsed(up, up_settings, []) == UpSettings(
        config_text=DEMO_CONFIG, redis_url=None, data_dir=".kompaktor", storage=None, ha=False, status_port=None
    )


def test_a_demo_command_line_is_its_settings(tmp_path: Path) -> None:
    config = tmp_path / "local.yaml"
    config.write_text("# demo groups\n")
    argv = [
        *("--entries", "1000", "--tablets", "2", "--compactors", "3", "--duration", "5", "--batch", "100"),
        *("--burst-entries", "0", "--burst-files", "4", "--config", str(config), "--data-dir", "/d"),
        *("--storage", "s3://b/p", "--chaos", "--seed", "11", "--workload", "mix", "--json", "--status-port", "-1"),
    ]
    expected = DemoSettings(
        entries=1000,
        tablets=2,
        compactors=3,
        duration_s=5.0,
        batch=100,
        burst_entries=0,
        burst_files=4,
        config_text="# demo groups\n",
        data_dir="/d",
        storage="s3://b/p",
        chaos=True,
        chaos_seed=11,
        ha=True,  # --chaos without --single-redis: a primary, a replica and sentinels
        workload="mix",
        as_json=True,
        status_port=None,  # -1: no status page
    )
    assert parsed(demo, demo_settings, argv) == expected
    assert parsed(demo, demo_settings, ["--chaos", "--single-redis"]).ha is False
    assert parsed(demo, demo_settings, []) == DemoSettings(
        entries=150_000,
        tablets=4,
        compactors=None,
        duration_s=45.0,
        batch=1500,
        burst_entries=50_000,
        burst_files=40,
        config_text=DEMO_CONFIG,
        data_dir=None,
        storage=None,
        chaos=False,
        chaos_seed=7,
        ha=False,
        workload="plain",
        as_json=False,
        status_port=0,
    )
