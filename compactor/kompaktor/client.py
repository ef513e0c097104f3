"""Client operations over the metadata store and storage: write (flush) entries, bulk import
sorted files, and scan the merged view of a table or row range."""

from __future__ import annotations

import posixpath
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import cast

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from kompaktor.engines.ranges.inputs import RANGE_BYTES, inspect_inputs
from kompaktor.engines.ranges.planning import plan_ranges
from kompaktor.files.arrowstack import merge_tables_once
from kompaktor.files.settime import TimeSetter
from kompaktor.files.sortedfile import SCHEMA, SortedFileWriter, iter_entries, read_info, read_table, table_to_entries
from kompaktor.files.storage import Storage
from kompaktor.metadata.store import MetadataStore
from kompaktor.model.errors import BadFileError, KompaktorError, StorageError, StoreUnavailable
from kompaktor.model.iterators import IteratorSettings
from kompaktor.model.keys import Entry, sort_key
from kompaktor.model.names import TABLES_DIR, data_file
from kompaktor.model.tablet import FileInfo, Tablet, now_ms
from kompaktor.policy.deletes import set_time_for
from kompaktor.policy.tableprops import max_versions as table_max_versions

#: a bulk import in progress keeps its staged files from the garbage collector for this long after
#: its last sign of life (refreshed every third of it while the import runs)
IMPORT_TTL_S = 120.0
#: a read's pin on its files lasts this long after its last sign of life (refreshed every third)
READ_TTL_S = 120.0
#: a read merges about this many of its inputs' entries at a time (by their row-group statistics):
#: a bigger tablet is read in row ranges of that size, one after another (in Spark, one task each:
#: a Spark task costs about 0.1 CPU s of its own, a merge of 4M entries 2.5, its memory 0.6 GB)
READ_PIECE_ENTRIES = 4_000_000
#: ... and about this many bytes of their row groups (uncompressed; big values make big pieces)
READ_PIECE_BYTES = RANGE_BYTES
#: re-reads of the tablets while pinning a read's files (each one after compactions replaced some)
_PIN_ATTEMPTS = 10


def file_order_key(path: str) -> str:
    """Files of a tablet oldest first: names are a prefix letter then a global sequence number."""
    return posixpath.basename(path)[1:]


@dataclass
class Client:
    store: MetadataStore
    storage: Storage

    def new_file_path(self, tid: str, origin: str) -> str:
        """A fresh, unique relative path for a file of table ``tid``; origin is flush, import,
        partial or full (the F/I/C/A prefix)."""
        return data_file(tid, origin, self.store.next_seq("file"))

    # -- writing -----------------------------------------------------------------------------
    def flush(self, table: str, entries: Iterable[Entry]) -> list[str]:
        """Write entries as one new sorted file per tablet they fall in (like a minor
        compaction) and register each with its tablet. Returns the new files."""
        tid = self.store.tables.table_id(table)
        tablets = self.store.tables.tablets(tid)
        ordered = sorted(entries, key=sort_key)
        per_tablet: dict[str, list[Entry]] = {}
        i = 0
        for t in tablets:
            chunk = []
            while i < len(ordered) and (t.end is None or ordered[i].row <= t.end):
                chunk.append(ordered[i])
                i += 1
            if chunk:
                per_tablet[t.id] = chunk
        written: dict[str, FileInfo] = {}
        try:
            for _tablet_id, chunk in per_tablet.items():
                w = SortedFileWriter(self.storage, self.new_file_path(tid, "flush"))
                try:
                    w.write_entries(chunk)
                    info = w.commit()
                except BaseException:
                    w.abort()
                    raise
                written[info.path] = info
            self.store.files.add_files(table, {p: i.meta for p, i in written.items()}, allow_offline=False)
        except StoreUnavailable:
            # the outcome is unknown (a lost reply, a write not confirmed durable): the files may
            # be referenced now, so they stay; if not, the garbage collector removes them
            raise
        except BaseException:
            for p in written:
                self.storage.delete(p)
            raise
        return sorted(written)

    def import_files(self, table: str, sources: list[str], *, set_time: bool = False) -> list[str]:
        """Bulk import: validate every source (schema, key order), copy it into storage under an
        ``I`` name, then register all of them in one mutation. Any refusal changes nothing.
        ``set_time``: every entry gets the import's time (:mod:`kompaktor.files.settime`), so
        none is refused for being older than a tablet's delete horizon."""
        tid = self.store.tables.table_id(table)
        stamp = set_time_for(self.store.tables.tablets(tid), now_ms()) if set_time else None
        if not sources:
            raise KompaktorError("no files to import")
        for src in sources:  # refused before anything is written: a file with no entries
            if _foreign_rows(src) == 0:
                raise BadFileError(f"{src}: the file has no entries; nothing to import")
        staged: list[SortedFileWriter] = []
        done: dict[str, FileInfo] = {}
        guard = _ImportGuard(self.store, tid, staged)  # staged files are not garbage while it runs
        try:
            try:
                self.storage.ensure_dir(f"{TABLES_DIR}/{tid}")  # storage unusable: no name taken yet
                for src in sources:
                    w = SortedFileWriter(self.storage, self.new_file_path(tid, "import"), source=src, tmp_tag=guard.id)
                    staged.append(w)
                    guard.refresh()
                    _copy(src, w, stamp)
                for w in staged:
                    info = w.commit()
                    done[info.path] = info
            except OSError as exc:  # pyarrow's I/O errors included
                raise StorageError(f"cannot write to storage {self.storage.uri}: {exc}") from exc
            self.store.files.add_files(table, {p: i.meta for p, i in done.items()})
        except StoreUnavailable:
            if not done:
                for w in staged:
                    _quietly(w.abort)
            raise  # registering: the outcome is unknown, the files stay (see flush)
        except BaseException:
            for w in staged:
                _quietly(w.abort)
            for p in done:
                _quietly(self.storage.delete, p)
            guard.forget()  # nothing of it is left to protect
            raise
        finally:
            guard.close()
        return sorted(done)

    # -- reading -----------------------------------------------------------------------------
    def tablet_sources(self, t: Tablet, start: bytes | None = None, end: bytes | None = None) -> list[Iterator[Entry]]:
        lo = t.prev
        hi = t.end if end is None or (t.end is not None and t.end <= end) else end
        srcs = []
        for path in sorted(t.files, key=file_order_key):
            it = iter_entries(self.storage, path, lo, hi)
            if start is not None and (lo is None or lo < start):
                it = (e for e in it if e.row >= start)
            srcs.append(it)
        return srcs

    def scan(self, table: str, start: bytes | None = None, end: bytes | None = None) -> Iterator[Entry]:
        """The merged view of rows in [start, end] (inclusive; None = unbounded), in key order:
        :meth:`read_arrow`'s batches as entries. An unknown table raises here, not at the first
        ``next()``."""
        reader = self.read_arrow(table, start, end)

        def entries() -> Iterator[Entry]:
            for batch in reader:
                yield from table_to_entries(pa.Table.from_batches([batch]))

        return entries()

    def read_arrow(
        self,
        table: str,
        start: bytes | None = None,
        end: bytes | None = None,
        *,
        max_versions: int | None = None,
        batch_rows: int = 65536,
        piece_entries: int = READ_PIECE_ENTRIES,
    ) -> pa.RecordBatchReader:
        """The merged view of rows in [start, end] (inclusive; None = unbounded) as Arrow batches
        in key order and the file schema, for Polars, DuckDB or pyarrow to read directly.
        ``max_versions`` overrides the table's ``table.iterator.versions``.

        The read's files are pinned (:func:`pin_read`) before the first batch: compactions may
        replace them meanwhile, but the garbage collector spares them until the read ends, so a
        long read sees the table as it was when it began. Each tablet is merged with the
        vectorized iterator stack (:mod:`kompaktor.files.arrowstack`), a piece of about
        ``piece_entries`` input entries in memory at a time (:func:`cut_part`). An unknown table
        raises here, not at the first batch; a range with ``start`` after ``end`` is empty."""
        if piece_entries < 1:
            raise KompaktorError(f"piece_entries must be at least 1, not {piece_entries}")
        info = self.store.tables.table(table)
        settings = IteratorSettings(max_versions=max_versions or table_max_versions(info.props))
        lease = ReadLease(self.store, info.id)
        parts = lease.pin(start, end)

        def batches() -> Iterator[pa.RecordBatch | None]:
            try:
                yield None  # started below: a generator closes (and ends the pin) only once started
                for part in parts:
                    for piece in cut_part(self.storage, part, piece_entries):
                        yield from read_part(self.storage, piece, settings, batch_rows)
            finally:
                lease.close()

        started = batches()
        next(started)  # a reader dropped unread closes it now, ending the pin and its thread
        return pa.RecordBatchReader.from_batches(SCHEMA, cast(Iterator[pa.RecordBatch], started))


@dataclass(frozen=True)
class ReadPart:
    """One tablet's share of a read: rows in (prev, end], at or after ``start``, from ``files``
    (oldest first), pinned when the read began. Picklable: a Spark task reads one."""

    tablet_id: str
    prev: bytes | None
    end: bytes | None
    start: bytes | None
    files: tuple[str, ...]
    #: the files' entries and bytes, whole files counted (at least the part's); 0 for a piece of
    #: a part (:func:`cut_part`), which is not cut again
    entries: int = 0
    size: int = 0


def plan_read(tablets: Iterable[Tablet], start: bytes | None, end: bytes | None) -> list[ReadPart]:
    """The parts of a read of [start, end] over ``tablets`` (those overlapping it, in row order)."""
    parts = []
    for t in tablets:
        hi = t.end if end is None or (t.end is not None and t.end <= end) else end
        lo_start = start if start is not None and (t.prev is None or t.prev < start) else None
        files = tuple(sorted(t.files, key=file_order_key))
        metas = t.files.values()
        parts.append(
            ReadPart(t.id, t.prev, hi, lo_start, files, sum(m.entries for m in metas), sum(m.size for m in metas))
        )
    return parts


def cut_part(storage: Storage, part: ReadPart, piece_entries: int = READ_PIECE_ENTRIES) -> list[ReadPart]:
    """``part`` as consecutive row ranges of about ``piece_entries`` input entries (and at most
    about :data:`READ_PIECE_BYTES`) each, cut at the max rows of its files' row groups (their
    footers are read only when the files hold more than that). Any cut is correct: the statistics
    only decide the balance. A piece wholly before ``start`` is left out; the others keep
    ``start`` where they begin before it."""
    if part.entries <= piece_entries and part.size <= READ_PIECE_BYTES:
        return [part]
    metas = inspect_inputs(storage, part.files)
    ranges = plan_ranges(metas, part.prev, part.end, piece_entries, READ_PIECE_BYTES)
    s = part.start
    return [
        ReadPart(part.tablet_id, lo, hi, s if s is not None and (lo is None or lo < s) else None, part.files)
        for lo, hi in ranges
        if s is None or hi is None or hi >= s
    ]


def read_part(
    storage: Storage, part: ReadPart, settings: IteratorSettings, batch_rows: int = 65536
) -> Iterator[pa.RecordBatch]:
    """The merged view of one part, in batches of at most ``batch_rows`` entries."""
    tables = [read_table(storage, p, part.prev, part.end) for p in part.files]
    if part.start is not None:
        tables = [t.filter(pc.field("row") >= pa.scalar(part.start, pa.binary())) for t in tables]
    merged = merge_tables_once([t for t in tables if t.num_rows], settings)
    yield from merged.to_batches(max_chunksize=batch_rows)


class ReadLease:
    """A read's pin on its files: while it lasts, the garbage collector deletes none of them,
    whatever compactions replace them meanwhile. It is a record among the bulk imports in
    progress (``kz:imports``, :meth:`register_import
    <kompaktor.metadata.store.files.FileStore.register_import>`), which the collector already
    spares, refreshed by a thread of its own while the read runs; a reader that dies stops
    refreshing it and it ends ``ttl_s`` later (docs/spark.md, "Reading")."""

    def __init__(self, store: MetadataStore, table_id: str, lease_id: str | None = None) -> None:
        self.store, self.table_id = store, table_id
        self.id = lease_id or f"READ{uuid.uuid4().hex[:16]}"
        self.files: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def pin(self, start: bytes | None, end: bytes | None, ttl_s: float = READ_TTL_S) -> list[ReadPart]:
        """Pin the files of the tablets overlapping [start, end] and return the read's parts.
        The files are recorded first, then the tablets read again: a file still referenced then
        is one no collector pass has taken as garbage before the record existed (references only
        ever disappear), and every later pass sees the record."""
        parts = plan_read(self.store.tables.tablets_in_range(self.table_id, start, end), start, end)
        for _ in range(_PIN_ATTEMPTS):
            self.files.update(f for p in parts for f in p.files)
            self.refresh(ttl_s)
            again = plan_read(self.store.tables.tablets_in_range(self.table_id, start, end), start, end)
            if all(f in self.files for p in again for f in p.files):
                self.keep_alive(ttl_s)
                return again
            parts = again
        self.close()
        raise KompaktorError(f"cannot pin the files of table {self.table_id}: compactions keep replacing them")

    def refresh(self, ttl_s: float = READ_TTL_S) -> None:
        self.store.files.register_import(self.id, self.table_id, sorted(self.files), ttl_s)

    def keep_alive(self, ttl_s: float = READ_TTL_S) -> None:
        """Refresh the pin every third of ``ttl_s`` until :meth:`close`."""

        def run() -> None:
            while not self._stop.wait(ttl_s / 3):
                try:
                    self.refresh(ttl_s)
                except KompaktorError:  # Redis unreachable: the collector cannot run either
                    pass

        self._thread = threading.Thread(target=run, name=f"read-{self.id}", daemon=True)
        self._thread.start()

    def close(self, tail_s: float = 0.0) -> None:
        """End the pin ``tail_s`` from now (a collector pass that began before still spares the
        files)."""
        if self._stop.is_set():
            return
        self._stop.set()
        try:
            self.refresh(ttl_s=tail_s)
        except KompaktorError:
            pass


class _ImportGuard:
    """Announces a bulk import in progress to the garbage collector
    (:meth:`store.files.register_import <kompaktor.metadata.store.files.FileStore.register_import>`):
    files tagged with :attr:`id` (the writers' temporary names) and the final names of the staged
    files are left alone for as long as the import runs, however long that is, refreshed by a
    thread of its own. At the end the record's expiry becomes the end time: a collector pass that
    began before then (and so may have read the tablets before the files were registered) still
    leaves them alone; a later pass reads the registration. A failed import that removed its
    files drops the record."""

    def __init__(self, store: MetadataStore, table_id: str, staged: list[SortedFileWriter]) -> None:
        self.store, self.table_id, self.staged = store, table_id, staged
        self.id = f"IMP{uuid.uuid4().hex[:16]}"
        self._stop = threading.Event()
        self.refresh()
        self._thread = threading.Thread(target=self._run, name=f"import-{self.id}", daemon=True)
        self._thread.start()

    def refresh(self, ttl_s: float = IMPORT_TTL_S) -> None:
        self.store.files.register_import(self.id, self.table_id, [w.rel_path for w in list(self.staged)], ttl_s)

    def _run(self) -> None:
        while not self._stop.wait(IMPORT_TTL_S / 3):
            try:
                self.refresh()
            except KompaktorError:  # Redis unreachable: the collector cannot run either; next time
                pass

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        try:
            self.refresh(ttl_s=0.0)
        except KompaktorError:
            pass

    def forget(self) -> None:
        """The import failed and removed its files: drop the record."""
        self._stop.set()
        try:
            self.store.files.forget_import(self.id)
        except KompaktorError:
            pass  # it expires on its own


def _copy(src: str, w: SortedFileWriter, stamp: int | None) -> None:
    """Write the user's file ``src`` into ``w``, as it is or with every entry at time ``stamp``."""
    if stamp is None:
        for batch in _read_foreign(src):
            w.write_table(pa.Table.from_batches([batch]))
        return
    setter = TimeSetter(stamp, src)
    for batch in _read_foreign(src):
        w.write_table(setter.feed(pa.Table.from_batches([batch])), checked=True)
    if (rest := setter.finish()) is not None:
        w.write_table(rest, checked=True)


def _quietly(fn: Callable[..., object], *args: object) -> None:
    """Clean-up after a failure: a second error (the storage that failed) must not hide the first."""
    try:
        fn(*args)
    except (OSError, pa.ArrowException):
        pass


def _open_foreign(src: str) -> pa.NativeFile:
    try:
        if "://" in src:
            fs, path = pafs.FileSystem.from_uri(src)
        else:
            fs, path = pafs.LocalFileSystem(), posixpath.abspath(src)
        return fs.open_input_file(path)
    except (OSError, pa.ArrowException) as exc:
        raise BadFileError(f"{src}: cannot open: {exc}") from exc


def _foreign_rows(src: str) -> int:
    """The number of rows a user's Parquet file declares (its footer only)."""
    with _open_foreign(src) as f:
        try:
            return pq.ParquetFile(f).metadata.num_rows
        except (OSError, pa.ArrowException) as exc:
            raise BadFileError(f"{src}: not a readable Parquet file: {exc}") from exc


def _read_foreign(src: str) -> Iterator[pa.RecordBatch]:
    """Batches of a user's Parquet file (local path or filesystem URI)."""
    f = _open_foreign(src)
    with f:
        try:
            pf = pq.ParquetFile(f)
            yield from pf.iter_batches(batch_size=65536)
        except (OSError, pa.ArrowException) as exc:
            raise BadFileError(f"{src}: not a readable Parquet file: {exc}") from exc


__all__ = ["Client", "ReadLease", "ReadPart", "file_order_key", "plan_read", "read_info", "read_part"]
