"""The compactor's composition root: a :class:`Compactor` built from what `kompaktor compactor`
is given — its group's settings from Redis (the operator stores them), the command line's
overrides, the store, the storage and the drain token — then run until drained.

Owns the order of the start-up checks: a bad ``--spark-conf`` before anything is connected,
Redis reachable, the group's settings admitted for this pod (:func:`refuse_unadmitted`), the
drain token readable, the storage writable. The click command (:mod:`kompaktor.cli.compactor`)
only parses options; nothing here reads them.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict

from kompaktor import keyspace as C
from kompaktor.files.storage import Storage
from kompaktor.metadata import format as metaformat
from kompaktor.metadata.brokered import BrokeredJobs
from kompaktor.metadata.history import HistoryLimits
from kompaktor.metadata.store import MetadataStore
from kompaktor.model import grouptoken
from kompaktor.model.errors import KompaktorError
from kompaktor.policy.services import GroupConfig
from kompaktor.resources.admission import check_spark
from kompaktor.resources.operator_config import OperatorConfig
from kompaktor.worker.compactor import DEFAULTS_SOURCE, REDIS_SOURCE, Compactor, WorkerSettings
from kompaktor.worker.http import TOKEN_ENV, token_source

log = logging.getLogger("kompaktor.compactor")


@dataclass(frozen=True)
class CompactorOptions:
    """What one compactor process is given (the options of `kompaktor compactor`). ``None``
    overrides leave the group's setting as it is."""

    group: str
    redis_url: str
    storage_uri: str | None = None
    compactor_id: str | None = None  # default: host name and pid
    engine: str | None = None
    spark_master: str | None = None
    spark_conf: tuple[str, ...] = ()  # KEY=VALUE, over the group's
    driver_memory: str | None = None
    drain_grace: float | None = None
    http_port: int = 8080  # 0: any free port, -1: no HTTP endpoints
    http_host: str = "0.0.0.0"
    drain_token_file: str | None = None
    settings_digest: str | None = None  # the operator's: refuse settings it did not admit
    stay_drained: bool = False
    #: the coordinator makes the compactor's writes (a compactor pod; :mod:`kompaktor.metadata.brokered`)
    broker: bool = False
    max_jobs: int | None = None
    #: the group's history bounds (its CompactorGroup's spec.history) overridden, when given
    history_records: int | None = None
    history_age: float | None = None


def parse_spark_conf(pairs: tuple[str, ...]) -> dict[str, str]:
    """``KEY=VALUE`` pairs as a dict; a pair without ``=`` is an error."""
    conf: dict[str, str] = {}
    for kv in pairs:
        if "=" not in kv:
            raise ValueError(f"--spark-conf expects KEY=VALUE, got {kv!r}")
        k, v = kv.split("=", 1)
        conf[k] = v
    return conf


def group_config(store: MetadataStore, group: str, digest: str | None) -> tuple[GroupConfig, str]:
    """The group's configuration in Redis and where it came from; in a pod the operator made
    (``digest``), only settings it admitted. A group nobody configured runs on the defaults."""
    cfg = store.fleet.groups().get(group)
    if digest:
        refuse_unadmitted(group, cfg, digest)
    if cfg is None:
        # a compactor run by hand for a group nobody configured: the defaults (those of a
        # CompactorGroup that leaves everything out), said at WARNING in its start-up line; the
        # operator stores a group's configuration before it creates the group's pods
        return GroupConfig(group), DEFAULTS_SOURCE
    return cfg, REDIS_SOURCE


class SettingsOverrides(TypedDict, total=False):
    """The :class:`WorkerSettings` fields the command line overrides (the options given)."""

    engine: str
    spark_master: str
    driver_memory: str
    drain_grace_s: float
    spark_conf: dict[str, str]
    history_limits: HistoryLimits


def settings_overrides(
    opts: CompactorOptions, spark_conf: dict[str, str] | None, limits: HistoryLimits | None = None
) -> SettingsOverrides:
    """The settings ``opts`` override; ``spark_conf``: the whole Spark conf, when it is overridden;
    ``limits``: the history's bounds, when ``--history-records`` or ``--history-age`` is given."""
    out = SettingsOverrides()
    if opts.engine is not None:
        out["engine"] = opts.engine
    if opts.spark_master is not None:
        out["spark_master"] = opts.spark_master
    if opts.driver_memory is not None:
        out["driver_memory"] = opts.driver_memory
    if opts.drain_grace is not None:
        out["drain_grace_s"] = opts.drain_grace
    if spark_conf is not None:
        out["spark_conf"] = spark_conf
    if limits is not None:
        out["history_limits"] = limits
    return out


def worker_settings(cfg: GroupConfig, source: str, opts: CompactorOptions, conf: dict[str, str]) -> WorkerSettings:
    """The group's settings with the command line's overrides (``conf``: the parsed
    ``--spark-conf``); the overriding flags are named in the settings' source."""
    compactor_id = opts.compactor_id or f"{socket.gethostname()}-{os.getpid()}"
    settings = WorkerSettings.for_group(cfg, compactor_id, max_jobs=opts.max_jobs)
    limits = history_limits(settings.history_limits, opts.history_records, opts.history_age)
    overrides = settings_overrides(opts, {**settings.spark_conf, **conf} if conf else None, limits)
    if overrides:
        flags = sorted(_FLAGS.get(k, "--" + k.removesuffix("_s").replace("_", "-")) for k in overrides)
        source += ", overridden by " + " ".join(flags)
    return dataclasses.replace(settings, source=source, stay_drained=opts.stay_drained, **overrides)


#: the options an override names, where its name is not the setting's
_FLAGS = {"history_limits": "--history-records/--history-age"}


def history_limits(group: HistoryLimits, records: int | None, age: float | None) -> HistoryLimits | None:
    """The group's history bounds with ``--history-records`` / ``--history-age`` over them, or None
    when neither option was given."""
    if records is None and age is None:
        return None
    return HistoryLimits(group.max_records if records is None else records, group.max_age_s if age is None else age)


def build_compactor(opts: CompactorOptions) -> tuple[Compactor, Callable[[], str | None]]:
    """The compactor, and the drain token its HTTP endpoints accept, after the start-up checks."""
    conf = parse_spark_conf(opts.spark_conf)
    store = MetadataStore.from_url(opts.redis_url)
    store.ping()
    metaformat.open_checked(store, "compactor")  # a store newer than this compactor: one line
    cfg, source = group_config(store, opts.group, opts.settings_digest)
    settings = worker_settings(cfg, source, opts, conf)
    drain_token = token_source(os.environ.get(TOKEN_ENV), opts.drain_token_file)
    storage = Storage.from_uri(opts.storage_uri)
    storage.check_writable()  # read-only or wrong credentials: one line, now
    jobs = BrokeredJobs(store, group_token=os.environ.get(grouptoken.TOKEN_ENV) or None) if opts.broker else None
    return Compactor(store, storage, settings, jobs=jobs), drain_token


def run_compactor(opts: CompactorOptions) -> int:
    """Build the compactor, serve its HTTP endpoints, run it until drained; the exit code."""
    worker, drain_token = build_compactor(opts)
    worker.install_signal_handlers()
    if opts.http_port >= 0:
        port = worker.serve_http(opts.http_port, opts.http_host, drain_token)
        log.info("compactor %s serving HTTP on :%d", worker.s.compactor_id, port)
    try:
        return worker.run()
    finally:
        # Done (drained): a SIGTERM now — the kubelet's, right after the preStop hook that asked
        # for the drain — has nothing left to ask for. Ignored, it cannot kill the process while it
        # closes or during interpreter shutdown (where Python puts back the default action).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        worker.close()


def refuse_unadmitted(group: str, cfg: GroupConfig | None, digest: str) -> None:
    """In a pod the operator made (it gave the digest of the settings it admitted), refuse in one
    line to run settings from Redis other than those (docs/kubernetes.md "How a group's settings
    reach its compactors"): none stored, settings the pod's allow-lists
    (``KOMPAKTOR_ALLOWED_SPARK_*`` in its spec) refuse, or another digest — Redis lost the group,
    someone else wrote ``kz:groups``, or the pod is an old one of a rollout."""
    if cfg is None:
        # the operator stored the group before the pod, so Redis lost it (or this is another
        # Redis); the defaults would silently differ from the CompactorGroup
        raise KompaktorError(
            f"group {group} has no configuration in Redis ({C.GROUPS}): the operator stores it when it "
            f"reconciles the CompactorGroup (edit or re-apply it, or restart the operator)"
        )
    refusal = check_spark(cfg.spark_conf, cfg.spark_master, OperatorConfig.from_env())
    if refusal is not None:
        raise KompaktorError(
            f"group {group}'s settings in Redis ({C.GROUPS}) are not allowed in this pod ({refusal.rule}): "
            f"{refusal.message}; not starting"
        )
    if cfg.settings_digest() != digest:
        raise KompaktorError(
            f"group {group}'s settings in Redis ({C.GROUPS}) have digest {cfg.settings_digest()}, not this "
            f"pod's {digest}: not starting with settings the operator did not admit for this pod (a rollout "
            f"of the CompactorGroup replaces it; otherwise {C.GROUPS} was written outside the operator)"
        )
