"""The metadata's format version and the installation it belongs to (docs/upgrading.md).

Redis holds one hash, :data:`~kompaktor.keyspace.FORMAT` (``kz:format``):

``version``        the format of every record in the store (:data:`FORMAT_VERSION` when written
                   by this code); absent in a store written by 0.2.0 or older (format
                   :data:`UNRECORDED`)
``installation``   the installation's id, also written to the data storage
                   (:data:`INSTALLATION_FILE`): a Redis and a storage of two installations are
                   refused together, in one line, before anything writes
``step:<name>``    when each migration step finished (epoch ms)

Every role reads the format at start (:func:`check_readable`): a store newer than the code knows
is refused in one line, nothing written. The leader migrates an older one (:func:`migrate`), step
by step: each step is idempotent and recorded once done, so a migration killed at any point is
resumed by the next leader from the first step not recorded. Code reads every format from
:data:`MIN_READABLE` up to :data:`FORMAT_VERSION`, so compactors and clients of this release run
beside a store the leader has not migrated yet (a rolling upgrade), and the previous release's
compactors run against a migrated one (nothing they read changed shape).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kompaktor import __version__
from kompaktor import keyspace as C
from kompaktor.connection import text
from kompaktor.files.storage import Storage
from kompaktor.metadata.store import MetadataStore
from kompaktor.model.errors import KompaktorError
from kompaktor.model.names import TABLES_DIR
from kompaktor.model.redact import redact_url

#: the format this code writes
FORMAT_VERSION = 2
#: the format of a store with tables and no ``version`` (written by 0.2.0 or older)
UNRECORDED = 1
#: the oldest format this code reads (and migrates, as the leader)
MIN_READABLE = 1
#: the installation's id in the data storage, beside ``tables/`` and ``backups/``
INSTALLATION_FILE = "kompaktor-installation.json"


class FormatError(KompaktorError):
    """The metadata's format, or the installation, is not one this code may use; nothing written."""


@dataclass(frozen=True)
class StoreFormat:
    """What ``kz:format`` says: ``version`` None when the store records none (empty, or written
    by 0.2.0 or older: :attr:`has_tables` tells which)."""

    version: int | None
    installation: str | None
    steps: frozenset[str]
    has_tables: bool

    @property
    def effective(self) -> int | None:
        """The store's format: the recorded one, :data:`UNRECORDED` for an old store with tables,
        None for an empty store (any code may claim it)."""
        if self.version is not None:
            return self.version
        return UNRECORDED if self.has_tables else None


@dataclass(frozen=True)
class Step:
    """One migration step to ``version``: ``run`` must be idempotent (it runs again when a leader
    died before the step was recorded)."""

    version: int
    name: str
    run: Callable[[MetadataStore], None]


def read_format(store: MetadataStore) -> StoreFormat:
    """The store's format record (one HGETALL and one EXISTS; every role may read both)."""
    raw = {text(k): text(v) for k, v in store.call(store._r.hgetall, C.FORMAT).items()}
    has_tables = bool(store.call(store._r.exists, C.TABLES))
    version = raw.get("version")
    if version is not None and not version.isdigit():
        raise FormatError(f"metadata format record {C.FORMAT}: version {version!r} is not a number")
    steps = frozenset(k.removeprefix("step:") for k in raw if k.startswith("step:"))
    return StoreFormat(None if version is None else int(version), raw.get("installation"), steps, has_tables)


def check_readable(fmt: StoreFormat, url: str, role: str) -> None:
    """Refuse, in one line, a store this code cannot read: newer than :data:`FORMAT_VERSION`
    (``role`` of an older release than the store's), or older than :data:`MIN_READABLE`."""
    v = fmt.effective
    if v is None or MIN_READABLE <= v <= FORMAT_VERSION:
        return
    where = redact_url(url or "the given URL")
    if v > FORMAT_VERSION:
        raise FormatError(
            f"refused: the metadata at {where} is format {v}, newer than this {role} "
            f"(kompaktor {__version__}) reads (up to {FORMAT_VERSION}): run the release that wrote it"
        )
    raise FormatError(
        f"refused: the metadata at {where} is format {v}, older than this {role} (kompaktor {__version__}) "
        f"reads (from {MIN_READABLE}): upgrade through the releases in between (docs/upgrading.md)"
    )


def open_checked(store: MetadataStore, role: str) -> StoreFormat:
    """:func:`read_format` then :func:`check_readable`: what every role does at start."""
    fmt = read_format(store)
    check_readable(fmt, store.url, role)
    return fmt


#: this code's migration steps, oldest first. 1 -> 2: the format and the installation are recorded
#: (the installation step is :func:`claim_installation`'s, run with the storage at hand)
STEPS: tuple[Step, ...] = ()


def migrate(
    store: MetadataStore, steps: Sequence[Step] = STEPS, *, now_ms: Callable[[], int] | None = None
) -> list[str]:
    """Bring the store to :data:`FORMAT_VERSION` as the leader (``store`` fenced with its token):
    run every step above the store's format that is not recorded, record each once done, then
    the version. An empty store is claimed at :data:`FORMAT_VERSION` with no steps. Returns the
    names of the steps run. Refuses a store newer than this code, writing nothing."""
    clock = now_ms or (lambda: int(time.time() * 1000))
    fmt = open_checked(store, "coordinator")
    current = fmt.effective
    if current is None:
        store._core.write(("HSET", C.FORMAT, "version", str(FORMAT_VERSION)))
        return []
    ran: list[str] = []
    for step in steps:
        if step.version <= current or step.name in fmt.steps:
            continue
        step.run(store)
        store._core.write(("HSET", C.FORMAT, f"step:{step.name}", str(clock())))
        ran.append(step.name)
    if current < FORMAT_VERSION:
        store._core.write(("HSET", C.FORMAT, "version", str(FORMAT_VERSION), "migrated", str(clock())))
    return ran


# -- the installation --------------------------------------------------------------------------


def read_storage_installation(storage: Storage) -> str | None:
    """The installation id the storage holds, or None."""
    if not storage.exists(INSTALLATION_FILE):
        return None
    with storage.open_input(INSTALLATION_FILE) as f:
        raw = f.read()
    try:
        found = json.loads(raw)["installation"]
    except (ValueError, KeyError, TypeError):
        raise FormatError(f"storage {storage.uri}: {INSTALLATION_FILE} is not Kompaktor's; remove it") from None
    if not isinstance(found, str) or not found:
        raise FormatError(f"storage {storage.uri}: {INSTALLATION_FILE} names no installation; remove it")
    return found


def _write_storage_installation(storage: Storage, installation: str) -> None:
    body = json.dumps({"installation": installation, "created_by": __version__}).encode()
    with storage.open_output(INSTALLATION_FILE) as f:
        f.write(body)


def _holds_data(storage: Storage) -> bool:
    return any(storage.list_files(f"{TABLES_DIR}/{d}") for d in storage.list_dirs(TABLES_DIR))


@dataclass(frozen=True)
class Claim:
    """What :func:`decide_installation` found: the installation's id, and where it is missing."""

    installation: str
    write_redis: bool
    write_storage: bool


def decide_installation(
    ours: str | None, has_tables: bool, theirs: str | None, holds_data: bool, *, where: str, uri: str
) -> Claim:
    """Pure: whether a Redis (``ours``, ``has_tables``) and a storage (``theirs``, ``holds_data``)
    belong to one installation, and which ids are missing. Refused (:class:`FormatError`, one
    line): two different ids; a Redis without tables beside a storage that holds data files (another
    installation's, or this one's with its metadata lost, which needs a restore first)."""
    if ours and theirs and ours != theirs:
        raise FormatError(
            f"refused: Redis at {where} belongs to installation {ours}, storage {uri} to "
            f"installation {theirs}: give the Redis and the storage of one installation"
        )
    if not has_tables and ours is None and holds_data:
        whose = f"installation {theirs}" if theirs else "an installation this Redis does not know"
        raise FormatError(
            f"refused: storage {uri} holds data files of {whose} and Redis at {where} holds "
            f"no tables: restore its metadata first (kompaktor restore latest) or give an empty storage prefix"
        )
    return Claim(ours or theirs or uuid.uuid4().hex, ours is None, theirs is None)


def check_installation(store: MetadataStore, storage: Storage) -> Claim:
    """:func:`decide_installation` on what the store and the storage hold; writes nothing. Every
    role holding both runs it at start (a standby coordinator too)."""
    fmt = read_format(store)
    theirs = read_storage_installation(storage)
    holds = fmt.installation is None and not fmt.has_tables and _holds_data(storage)
    where = redact_url(store.url or "the given URL")
    return decide_installation(fmt.installation, fmt.has_tables, theirs, holds, where=where, uri=storage.uri)


def claim_installation(store: MetadataStore, storage: Storage) -> str:
    """:func:`check_installation`, then record the id where it is missing (a first start, an
    upgrade from 0.2.0, a restore). The leader's (``store`` fenced), or a single process's before
    any other starts (``kompaktor up``). Returns the installation id."""
    claim = check_installation(store, storage)
    record_installation(store, storage, claim)
    return claim.installation


def check_restore(store: MetadataStore, storage: Storage) -> Claim:
    """What a restore into ``store`` from ``storage`` records (before it writes anything): refused
    in one line when the Redis already belongs to another installation than the storage."""
    fmt = read_format(store)
    where = redact_url(store.url or "the given URL")
    theirs = read_storage_installation(storage)
    return decide_installation(fmt.installation, True, theirs, False, where=where, uri=storage.uri)


def record_installation(store: MetadataStore, storage: Storage, claim: Claim) -> None:
    """Write the installation's id where :func:`decide_installation` found it missing."""
    if claim.write_redis:
        store._core.write(("HSET", C.FORMAT, "installation", claim.installation))
    if claim.write_storage:
        _write_storage_installation(storage, claim.installation)
