"""Backups of the metadata, and restores into an empty Redis (docs/backup.md).

A backup is a copy of all of Kompaktor's metadata — tables and their properties, tablets and
their files, user compactions, services and groups, the name counters — written once to object
storage beside the data (``backups/<id>/``): the metadata as gzipped JSON, the list of the data
files it references, and last a manifest with both files' SHA-256. A backup without a manifest
(one that died half-way) is never listed, and is deleted by the next ``backup delete`` of it.

The copy is read in chunks (no call holds Redis longer than one ``MGET`` of
:data:`~kompaktor.metadata.store.SCAN_CHUNK` tablets), so taking one never stalls commits.
Each table's tablets are read until they form an exact partition of the row space (a split or
merge between two chunks is read again); each tablet is then a state it really had at some
moment of the backup, which holds everything acknowledged before the backup began.

While a backup is being taken, the garbage collector deletes nothing (it would not know which
files the backup is about to reference); afterwards it spares every file a retained backup
references (:func:`referenced_by_backups`), so every retained backup restores completely.
"""

from __future__ import annotations

import bisect
import dataclasses
import gzip
import hashlib
import itertools
import json
import posixpath
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import NotRequired, TypedDict, cast

import pyarrow.parquet as pq
from redis.typing import EncodableT

from kompaktor import __version__, keyspace
from kompaktor.connection import text
from kompaktor.files.sortedfile import read_info, ts_bounds
from kompaktor.files.storage import Storage
from kompaktor.metadata import format as metaformat
from kompaktor.metadata.store import MetadataStore
from kompaktor.metadata.superseded import adding
from kompaktor.model.errors import KompaktorError
from kompaktor.model.keys import span_overlaps
from kompaktor.model.names import TABLES_DIR, file_order_key, tmp_tag
from kompaktor.model.tablet import TableInfo, Tablet
from kompaktor.policy.deletes import DeleteHorizonError
from kompaktor.policy.tableprops import keeps_deletes, max_versions

BACKUPS_DIR = "backups"
FORMAT = 1
#: how long a backup in progress keeps the garbage collector from deleting (refreshed per table)
MARK_TTL_S = 600.0
_PARTITION_ATTEMPTS = 20
_ID = re.compile(r"^B\d{13}-[0-9a-f]{8}$")


class BackupError(KompaktorError):
    """A backup cannot be taken, read, verified or restored; nothing was changed."""


@dataclass(frozen=True)
class Manifest:
    id: str
    created_ms: int
    format: int
    version: str
    tables: int
    tablets: int
    files: int
    bytes: int  # of the metadata file
    sha256: str  # of the metadata file
    files_sha256: str  # of the list of referenced files
    took_s: float

    # not ".gz": pyarrow's output streams would gzip the gzipped bytes a second time
    @property
    def metadata_path(self) -> str:
        return f"{BACKUPS_DIR}/{self.id}/metadata.json.gzip"

    @property
    def files_path(self) -> str:
        return f"{BACKUPS_DIR}/{self.id}/files.txt.gzip"


class TableSnapshot(TypedDict):
    """One table in a backup: its hash, its tablets' documents (JSON text, by tablet id) and the
    write ids it imported."""

    hash: dict[str, str]
    tablets: dict[str, str]
    #: absent from backups taken before writes were recorded
    writes: NotRequired[dict[str, str]]


class UserCompactionSnapshot(TypedDict):
    hash: dict[str, str]
    done: list[str]


class Snapshot(TypedDict):
    """A backup's metadata (``metadata.json.gzip``, JSON with sorted keys): every piece of
    Kompaktor's metadata that outlives a restore."""

    format: int
    names: dict[str, str]
    tables: dict[str, TableSnapshot]
    ucomps: dict[str, UserCompactionSnapshot]
    services: dict[str, str]
    groups: dict[str, str]
    seq: dict[str, str]


def manifest_path(bid: str) -> str:
    return f"{BACKUPS_DIR}/{bid}/MANIFEST.json"


def resolve(storage: Storage, bid: str) -> str:
    """``bid``, or the newest complete backup's id for ``latest``."""
    if bid == "latest":
        done = list_backups(storage)
        if not done:
            raise BackupError(f"no backups in {storage.uri} to restore ('latest')")
        return done[-1].id
    return check_id(bid)


def check_id(bid: str) -> str:
    if not _ID.match(bid):
        raise BackupError(f"{bid!r} is not a backup id (B<13 digits>-<8 hex>; `kompaktor backup list` shows them)")
    return bid


# -- reading the metadata ----------------------------------------------------------------------------
def _text(d: dict[bytes | str, bytes | str]) -> dict[str, str]:
    return {text(k): text(v) for k, v in d.items()}


def partition_gap(tablets: list[Tablet]) -> str | None:
    """Why ``tablets`` (in row order) do not cover the row space exactly once, or None."""
    if not tablets:
        return "no tablets"
    if tablets[0].prev is not None or tablets[-1].end is not None:
        return "the first or last tablet is bounded"
    for a, b in itertools.pairwise(tablets):
        if a.end != b.prev:
            return f"tablet {a.id} ends where {b.id} does not start"
    return None


def _read_tablets(store: MetadataStore, tid: str) -> dict[str, str]:
    for _ in range(_PARTITION_ATTEMPTS):
        docs = store.tables.tablet_docs(store.tables.tablet_ids(tid))
        tablets = [Tablet.from_json(t, json.loads(raw)) for t, raw in docs]
        if partition_gap(tablets) is None:
            return {t: raw.decode() for t, raw in docs}
    raise BackupError(f"table {tid}: its tablets kept changing while they were read (splits or merges); retry")


def snapshot(store: MetadataStore, bid: str) -> Snapshot:
    """Every piece of Kompaktor's metadata, read in chunks; the backup's content."""
    r = store._r
    names = _text(store.call(r.hgetall, keyspace.TABLES))
    tables: dict[str, TableSnapshot] = {}
    for tid in sorted(names.values()):
        store.files.begin_backup(bid, MARK_TTL_S)  # refreshed: a big table takes a while
        tables[tid] = {
            "hash": _text(store.call(r.hgetall, keyspace.table_key(tid))),
            "tablets": _read_tablets(store, tid),
            # the writes imported (a Spark job's, a micro-batch's): a replay after a restore imports once
            "writes": _text(store.call(r.hgetall, keyspace.writes_key(tid))),
        }
    ucomps: dict[str, UserCompactionSnapshot] = {}
    for cid in sorted(text(m) for m in store.call(r.smembers, keyspace.UCOMPS)):
        ucomps[cid] = {
            "hash": _text(store.call(r.hgetall, keyspace.ucomp_key(cid))),
            "done": sorted(text(m) for m in store.call(r.smembers, keyspace.ucomp_done_key(cid))),
        }
    return {
        "format": FORMAT,
        "names": names,
        "tables": tables,
        "ucomps": ucomps,
        "services": _text(store.call(r.hgetall, keyspace.SERVICES)),
        "groups": _text(store.call(r.hgetall, keyspace.GROUPS)),
        "seq": _text(store.call(r.hgetall, keyspace.SEQ)),
    }


def referenced(data: Snapshot) -> set[str]:
    """The data files a backup's tablets reference."""
    out: set[str] = set()
    for t in data["tables"].values():
        for raw in t["tablets"].values():
            out.update(json.loads(raw).get("files") or {})
    return out


# -- writing and reading backups ---------------------------------------------------------------------
def _put(storage: Storage, rel: str, data: bytes) -> None:
    staged = storage.staging_name(rel)
    storage.ensure_dir(posixpath.dirname(rel))
    out = storage.open_output(staged)
    try:
        out.write(data)
    finally:
        out.close()
    storage.publish(staged, rel)


def _get(storage: Storage, rel: str) -> bytes:
    with storage.open_input(rel) as f:
        return bytes(f.read())


def create(store: MetadataStore, storage: Storage) -> Manifest:
    """Take a backup; returns its manifest (written last)."""
    started = time.monotonic()
    now = int(time.time() * 1000)
    bid = f"B{now:013d}-{uuid.uuid4().hex[:8]}"
    store.files.begin_backup(bid, MARK_TTL_S)
    try:
        data = snapshot(store, bid)
        files = sorted(referenced(data))
        blob = gzip.compress(json.dumps(data, sort_keys=True).encode(), 6)
        listing = gzip.compress("".join(f + "\n" for f in files).encode(), 6)
        tablets = sum(len(t["tablets"]) for t in data["tables"].values())
        m = Manifest(
            bid,
            now,
            FORMAT,
            __version__,
            len(data["tables"]),
            tablets,
            len(files),
            len(blob),
            hashlib.sha256(blob).hexdigest(),
            hashlib.sha256(listing).hexdigest(),
            round(time.monotonic() - started, 3),
        )
        _put(storage, m.metadata_path, blob)
        _put(storage, m.files_path, listing)
        _put(storage, manifest_path(bid), json.dumps(asdict(m), indent=1).encode())
        return m
    finally:
        store.files.end_backup(bid)


def list_backups(storage: Storage) -> list[Manifest]:
    """The complete backups (those with a manifest), oldest first."""
    out = []
    for d in storage.list_dirs(BACKUPS_DIR):
        if _ID.match(d) and storage.exists(manifest_path(d)):
            out.append(read_manifest(storage, d))
    return sorted(out, key=lambda m: m.created_ms)


def read_manifest(storage: Storage, bid: str) -> Manifest:
    check_id(bid)
    try:
        return Manifest(**json.loads(_get(storage, manifest_path(bid))))
    except FileNotFoundError:
        raise BackupError(f"no backup {bid} in {storage.uri} (`kompaktor backup list` shows them)") from None
    except (ValueError, TypeError) as exc:
        raise BackupError(f"backup {bid}: its manifest is unreadable: {exc}") from exc


def load(storage: Storage, m: Manifest) -> Snapshot:
    """A backup's metadata, its checksum checked."""
    blob = _get(storage, m.metadata_path)
    if hashlib.sha256(blob).hexdigest() != m.sha256:
        raise BackupError(f"backup {m.id}: metadata.json.gzip does not match its manifest's checksum")
    data = json.loads(gzip.decompress(blob))
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else None
        raise BackupError(f"backup {m.id}: format {found} (this Kompaktor reads {FORMAT})")
    return cast(Snapshot, data)


def files_of(storage: Storage, m: Manifest) -> list[str]:
    blob = _get(storage, m.files_path)
    if hashlib.sha256(blob).hexdigest() != m.files_sha256:
        raise BackupError(f"backup {m.id}: files.txt.gzip does not match its manifest's checksum")
    return gzip.decompress(blob).decode().split()


@dataclass
class Verified:
    manifest: Manifest
    missing: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.missing


def verify(storage: Storage, bid: str) -> Verified:
    """Both checksums, and every referenced file present."""
    m = read_manifest(storage, bid)
    load(storage, m)
    present = data_files(storage)
    return Verified(m, [f for f in files_of(storage, m) if f not in present])


def delete(storage: Storage, bid: str) -> None:
    """Delete a backup: its manifest first (it is no longer listed, nor spared by the collector)."""
    check_id(bid)
    storage.delete(manifest_path(bid))
    for rel, _ in storage.list_files(f"{BACKUPS_DIR}/{bid}"):
        storage.delete(rel)


def prune(storage: Storage, keep: int, max_age_s: float | None = None) -> list[str]:
    """Delete the oldest backups beyond the newest ``keep`` (and those older than ``max_age_s``,
    the newest always kept). Returns the ids deleted."""
    backups = list_backups(storage)
    now = time.time() * 1000
    doomed = backups[: max(0, len(backups) - keep)]
    if max_age_s is not None:
        doomed += [m for m in backups[:-1] if now - m.created_ms > max_age_s * 1000 and m not in doomed]
    for m in doomed:
        delete(storage, m.id)
    return [m.id for m in doomed]


_referenced_cache: dict[str, frozenset[str]] = {}


def referenced_by_backups(storage: Storage, backups: list[Manifest] | None = None) -> set[str]:
    """Every data file some retained backup references (what the collector spares)."""
    out: set[str] = set()
    for m in list_backups(storage) if backups is None else backups:
        if m.id not in _referenced_cache:
            _referenced_cache[m.id] = frozenset(files_of(storage, m))
        out |= _referenced_cache[m.id]
    return out


#: a flush or import registers its file this long after writing it at most (an import in progress
#: announces itself for 120 s at a time): files written this long before a backup began may still
#: have been registered after it read their tablet
WRITE_SLACK_S = 900.0


def is_write(rel: str) -> bool:
    """Whether ``rel`` is a flush's or an import's file (not a compaction's output, not temporary)."""
    name = posixpath.basename(rel)
    return name[:1] in ("F", "I") and tmp_tag(rel) is None


def newer_than_backups(backups: list[Manifest]) -> float | None:
    """From when (epoch s) flushes and imports are spared for ``restore --adopt-newer``: shortly
    before the newest of ``backups`` began; None when there is none."""
    return None if not backups else backups[-1].created_ms / 1000 - WRITE_SLACK_S


# -- restore -----------------------------------------------------------------------------------------
@dataclass
class Restored:
    manifest: Manifest
    tables: int
    tablets: int
    files: int
    #: data files in storage that the restored metadata does not reference: inputs of compactions
    #: committed before the backup (not yet collected), and what was written after it
    unreferenced: list[str]
    #: with ``adopt_newer``: flushes and imports the restored view lacked, registered again
    adopted: list[str] = field(default_factory=list)
    #: what it could not bring back, each with the reason in one line: files whose content the
    #: restored view lacks (with ``adopt_newer``: those it could not register again)
    not_adopted: dict[str, str] = field(default_factory=dict)
    #: unreferenced files whose every entry is present in, or hidden by, the restored view
    #: (:mod:`kompaktor.metadata.superseded`): nothing of them is lost
    superseded: list[str] = field(default_factory=list)


def _metadata_keys(store: MetadataStore) -> list[str]:
    """Whether this Redis holds tables (a restore writes them all in one transaction, so there is
    no half-restored state; a coordinator's lease, groups or queues do not count)."""
    return [keyspace.TABLES] if store.call(store._r.exists, keyspace.TABLES) else []


def data_files(storage: Storage) -> set[str]:
    """Every file under tables/, listed (one LIST per 1,000 objects on an object store, instead
    of a HEAD per referenced file)."""
    return {rel for d in storage.list_dirs(TABLES_DIR) for rel, _ in storage.list_files(f"{TABLES_DIR}/{d}")}


def _max_name_numbers(present: set[str]) -> tuple[int, int]:
    """The highest table id and file sequence number in storage (files written after a backup
    have higher ones than its counters: the restored counters must not hand them out again)."""
    top_table = top_file = 0
    for rel in present:
        d = rel.split("/")[1]
        if re.fullmatch(r"[0-9a-f]+", d):
            top_table = max(top_table, int(d, 16))
        m = re.match(r"^[A-Z]([0-9a-f]{10})", posixpath.basename(rel))
        if m:
            top_file = max(top_file, int(m.group(1), 16))
    return top_table, top_file


def restore(store: MetadataStore, storage: Storage, bid: str, *, adopt_newer: bool = False) -> Restored:
    """Restore backup ``bid`` into an empty Redis. Refuses a Redis that holds Kompaktor's keys, a
    backup whose checksums fail or whose files are missing — in one line, nothing written.
    Compactions running when the backup was taken are gone (their outputs become garbage); the
    coordinator rebuilds the queues from the restored tablets (all marked dirty)."""
    bid = resolve(storage, bid)
    present = _metadata_keys(store)
    if present:
        raise BackupError(
            f"refused: this Redis already holds Kompaktor metadata ({present[0]} and more); restore needs an empty one"
        )
    m = read_manifest(storage, bid)
    data = load(storage, m)
    files = files_of(storage, m)
    stored = data_files(storage)
    missing = [f for f in files if f not in stored]
    if missing:
        raise BackupError(
            f"refused: backup {bid} references {len(missing)} files that are not in storage (first: {missing[0]})"
        )
    claim = metaformat.check_restore(store, storage)  # another installation's Redis: refused, nothing written
    _write_back(store, data, _max_name_numbers(stored), bid)
    metaformat.record_installation(store, storage, claim)  # the restored Redis is this storage's
    wanted = set(files)
    unreferenced = sorted(rel for rel in stored if rel not in wanted and tmp_tag(rel) is None)
    tablets = sum(len(t["tablets"]) for t in data["tables"].values())
    out = Restored(m, len(data["tables"]), tablets, len(files), unreferenced)
    settle(store, storage, {tid: name for name, tid in data["names"].items()}, out, adopt=adopt_newer)
    return out


def settle(store: MetadataStore, storage: Storage, names: dict[str, str], out: Restored, *, adopt: bool) -> None:
    """Sort the unreferenced files into superseded, adopted and not brought back, by content
    (:mod:`kompaktor.metadata.superseded`; their names and times tell nothing, docs/backup.md
    "What a restore reports"). Flushes and imports first, each checked against the backup's view:
    those it lacks are registered again with ``adopt``, oldest first (:func:`adopt_file`). Then
    compaction outputs, against the
    view that results: they are never registered (a full compaction's output lacks the delete
    markers it dropped, which its inputs still carry), so one whose content the view lacks is
    reported — an input of it written after the backup is gone, or was not adopted."""
    writes = sorted((r for r in out.unreferenced if is_write(r)), key=file_order_key)
    outputs = sorted((r for r in out.unreferenced if not is_write(r)), key=file_order_key)
    view = RestoredView(store, storage)
    for batch in (writes, outputs):
        by_table: dict[str, list[str]] = {}
        for rel in batch:
            table = names.get(rel.split("/")[1])
            if table is None:
                out.not_adopted[rel] = "its table was created after the backup"
            else:
                by_table.setdefault(table, []).append(rel)
        adds = view.adding(by_table, out.not_adopted)
        for table, rels in by_table.items():
            for rel in rels:
                if rel not in out.not_adopted:
                    _place(store, storage, view, out, table, rel, adds=rel in adds, adopt=adopt)


def _place(
    store: MetadataStore,
    storage: Storage,
    view: RestoredView,
    out: Restored,
    table: str,
    rel: str,
    *,
    adds: bool,
    adopt: bool,
) -> None:
    """Superseded, adopted or not brought back (with the reason, in one line)."""
    if not adds:
        out.superseded.append(rel)
    elif not is_write(rel):
        out.not_adopted[rel] = "a compaction's output holding entries the restored view lacks"
    elif not adopt:
        out.not_adopted[rel] = "written after the backup (--adopt-newer registers it again)"
    else:
        try:
            view.refresh(table, adopt_file(store, storage, table, rel))
            out.adopted.append(rel)
        except DeleteHorizonError:
            out.not_adopted[rel] = "refused: it holds a put at or before a tablet's delete horizon"
        except (KompaktorError, OSError) as exc:
            out.not_adopted[rel] = " ".join(str(exc).split())


#: unreferenced files checked against a tablet in one pass over its files, at most (each pass holds
#: a batch of entries of every one of them)
CHECK_BATCH = 64


class RestoredView:
    """The restored tablets of each table, read once and kept up to date as files are adopted:
    what :func:`settle` checks the unreferenced files against — a table's tablets read once, a
    file's tablets found by bisection (a restore may hold a million), and each tablet's files read
    once per :data:`CHECK_BATCH` files overlapping it, not once per file."""

    def __init__(self, store: MetadataStore, storage: Storage) -> None:
        self.store, self.storage = store, storage
        self._tables: dict[str, tuple[TableInfo, list[Tablet]]] = {}

    def _table(self, name: str) -> tuple[TableInfo, list[Tablet]]:
        if name not in self._tables:
            info = self.store.tables.table(name)
            tablets = sorted(self.store.tables.tablets(info.id), key=_end_order)
            self._tables[name] = (info, tablets)
        return self._tables[name]

    def overlapping(self, name: str, first: bytes | None, last: bytes | None) -> list[Tablet]:
        """The tablets of table ``name`` that rows in [first, last] fall in."""
        tablets = self._table(name)[1]
        lo = 0 if first is None else bisect.bisect_left(tablets, (False, first), key=_end_order)
        out = []
        for t in tablets[lo:]:
            if not span_overlaps(first, last, t.prev, t.end):
                break
            out.append(t)
        return out

    def refresh(self, name: str, tablet_ids: list[str]) -> None:
        """Read again the tablets ``tablet_ids`` of table ``name`` (files were added to them)."""
        info, tablets = self._table(name)
        fresh = {t.id: t for t in self.store.tables.get_tablets(tablet_ids)}
        self._tables[name] = (info, [fresh.get(t.id, t) for t in tablets])

    def adding(self, by_table: dict[str, list[str]], errors: dict[str, str]) -> set[str]:
        """The files (per table) holding an entry the view of their tablets lacks; a file that
        cannot be read goes into ``errors`` with the reason."""
        found: set[str] = set()
        for name, rels in by_table.items():
            per_tablet: dict[str, tuple[Tablet, list[str]]] = {}
            for rel in rels:
                try:
                    info = read_info(self.storage, rel)
                except (KompaktorError, OSError) as exc:
                    errors[rel] = " ".join(str(exc).split())
                    continue
                for t in self.overlapping(name, info.first_row, info.last_row) if info.entries else []:
                    per_tablet.setdefault(t.id, (t, []))[1].append(rel)
            props = self._table(name)[0].props
            for t, cands in per_tablet.values():
                for i in range(0, len(cands), CHECK_BATCH):
                    found |= self._adding(t, cands[i : i + CHECK_BATCH], props, errors)
        return found

    def _adding(self, t: Tablet, cands: list[str], props: dict[str, str], errors: dict[str, str]) -> set[str]:
        try:
            return adding(self.storage, t, cands, max_versions=max_versions(props), keeps_deletes=keeps_deletes(props))
        except (KompaktorError, OSError) as exc:
            if len(cands) == 1:
                errors[cands[0]] = " ".join(str(exc).split())
                return set()
        out: set[str] = set()  # a file unreadable past its footer: one at a time, to name it
        for rel in cands:
            out |= self._adding(t, [rel], props, errors)
        return out


def _end_order(t: Tablet) -> tuple[bool, bytes]:
    return t.end is None, t.end or b""


def adopt_file(store: MetadataStore, storage: Storage, table: str, rel: str) -> list[str]:
    """Register a flush or import again with every tablet it overlaps, as the flush or import did
    (the delete horizon checked as it was then); the ids of those tablets."""
    info = read_info(storage, rel)
    with storage.open_input(rel) as f:
        put_min, del_max = ts_bounds(pq.read_table(f, columns=["ts", "deleted"]))
    return store.files.add_files(table, {rel: dataclasses.replace(info, put_min=put_min, del_max=del_max).meta})


def bootstrap(store: MetadataStore, storage: Storage, bid: str) -> Restored | None:
    """Restore ``bid`` (or ``latest``) when this Redis holds no tables and was never restored —
    what a new install does when told to start from a backup; None when there was nothing to do."""
    if _metadata_keys(store) or bool(store.call(store._r.exists, keyspace.RESTORED)):
        return None
    return restore(store, storage, bid)


def _fields(values: dict[str, str]) -> Mapping[EncodableT, EncodableT]:
    """A hash's fields as redis-py's ``hset`` takes them (its mapping's key type is a union, which
    a ``dict[str, str]`` does not match: dict keys are invariant)."""
    return cast("Mapping[EncodableT, EncodableT]", values)


def _write_back(store: MetadataStore, data: Snapshot, tops: tuple[int, int], bid: str) -> None:
    p = store._r.pipeline(transaction=True)
    p.set(keyspace.RESTORED, bid)  # what bootstrap() checks: this Redis was restored once
    if data["names"]:
        p.hset(keyspace.TABLES, mapping=_fields(data["names"]))
    for tid, t in data["tables"].items():
        p.hset(keyspace.table_key(tid), mapping=_fields(t["hash"]))
        for tablet, raw in t["tablets"].items():
            doc = json.loads(raw)
            doc["running"] = {}  # compactions running then are dead now: outputs are garbage
            p.set(keyspace.tablet_key(tablet), json.dumps(doc, separators=(",", ":")))
            p.zadd(keyspace.tablets_key(tid), {tablet.split(";", 1)[1]: 0})
            p.sadd(keyspace.DIRTY, tablet)
        if t.get("writes"):  # backups taken before writes were recorded have none
            p.hset(keyspace.writes_key(tid), mapping=_fields(t["writes"]))
    for cid, u in data["ucomps"].items():
        if u["hash"]:
            p.hset(keyspace.ucomp_key(cid), mapping=_fields(u["hash"]))
        p.sadd(keyspace.UCOMPS, cid)
        if u["done"]:
            p.sadd(keyspace.ucomp_done_key(cid), *u["done"])
    for key, values in ((keyspace.SERVICES, data["services"]), (keyspace.GROUPS, data["groups"])):
        if values:
            p.hset(key, mapping=_fields(values))
    seq = dict(data["seq"])
    seq["table"] = str(max(int(seq.get("table", 0)), tops[0]))
    seq["file"] = str(max(int(seq.get("file", 0)), tops[1]))
    p.hset(keyspace.SEQ, mapping=_fields(seq))
    store.call(p.execute)
