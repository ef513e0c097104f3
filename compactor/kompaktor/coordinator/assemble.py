"""The coordinator process, put together: its one composition root.

``kompaktor coordinator`` only parses its options into :class:`CoordinatorOptions` and calls
:func:`run_coordinator`; everything the process is made of — the store, the storage, the checks
at start, the optional bootstrap from a backup, the coordinator, its HTTP server, the broker, the
signal handlers — is assembled here, in the order the start-up needs (docs/architecture.md,
"The parts and their layers")."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass

from kompaktor.coordinator.broker import Broker
from kompaktor.coordinator.core import Coordinator, CoordinatorSettings
from kompaktor.coordinator.http import STATUS_PATH, serve
from kompaktor.files.storage import Storage
from kompaktor.metadata import backup
from kompaktor.metadata import format as metaformat
from kompaktor.metadata.store import MetadataStore
from kompaktor.model.grouptoken import KEY_ENV

log = logging.getLogger("kompaktor.coordinator")


@dataclass(frozen=True)
class CoordinatorOptions:
    """Everything ``kompaktor coordinator`` is told: where Redis and the storage are, how to serve
    HTTP, which backup to start from, and the coordinator's own settings."""

    redis_url: str
    storage_uri: str | None
    settings: CoordinatorSettings
    metrics_port: int = 9090
    metrics_host: str = "0.0.0.0"
    bootstrap_from: str | None = None


def open_store(opts: CoordinatorOptions, say: Callable[[str], None]) -> tuple[MetadataStore, Storage]:
    """The store and the storage, checked: Redis a primary of a version Kompaktor runs on, the
    storage writable, a backup restored if asked and Redis is new, the metadata's format one this
    release reads, and the two of one installation (each refused in one line, nothing written)."""
    store = MetadataStore.from_url(opts.redis_url)
    store.ping()
    storage = Storage.from_uri(opts.storage_uri)
    storage.check_writable()
    if opts.bootstrap_from:
        restored = backup.bootstrap(store, storage, opts.bootstrap_from)
        say(
            f"bootstrap: restored backup {restored.manifest.id} ({restored.tablets} tablets; "
            f"{len(restored.not_adopted)} files in storage not brought back)"
            if restored
            else "bootstrap: Redis already holds metadata (or was restored before): nothing restored"
        )
    metaformat.open_checked(store, "coordinator")
    metaformat.check_installation(store, storage)
    return store, storage


def serve_http(coord: Coordinator, opts: CoordinatorOptions) -> None:
    """/metrics and the status page, unless switched off (a negative port)."""
    if opts.metrics_port < 0:
        return
    server = serve(coord, opts.metrics_port, opts.metrics_host)
    log.info(
        "coordinator %s serving /metrics and %s on %s:%d",
        coord.holder,
        STATUS_PATH,
        opts.metrics_host,
        server.server_address[1],
    )


def run_coordinator(opts: CoordinatorOptions, say: Callable[[str], None]) -> None:
    """Assemble the process and run it until SIGTERM or SIGINT: the broker serves compactors'
    writes (leader or not), the coordinator competes for the lease and leads when it holds it."""
    store, storage = open_store(opts, say)
    coord = Coordinator(store, storage, opts.settings)
    serve_http(coord, opts)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    Broker(store, os.environ.get(KEY_ENV)).start(stop)
    coord.run(stop)
