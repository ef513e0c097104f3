"""Client operations over the metadata store and storage: write (flush) entries, bulk import
sorted files, and scan the merged view of a table or row range."""

from __future__ import annotations

import posixpath
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from kompaktor.files.settime import TimeSetter
from kompaktor.files.sortedfile import SortedFileWriter, iter_entries, read_info
from kompaktor.files.storage import Storage
from kompaktor.metadata.store import MetadataStore
from kompaktor.model.errors import BadFileError, KompaktorError, StorageError, StoreUnavailable
from kompaktor.model.iterators import IteratorSettings, merged_view
from kompaktor.model.keys import Entry, sort_key
from kompaktor.model.names import TABLES_DIR, data_file
from kompaktor.model.tablet import FileInfo, Tablet, now_ms
from kompaktor.policy.deletes import set_time_for
from kompaktor.policy.tableprops import max_versions

#: a bulk import in progress keeps its staged files from the garbage collector for this long after
#: its last sign of life (refreshed every third of it while the import runs)
IMPORT_TTL_S = 120.0


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
        """The merged view of rows in [start, end] (inclusive; None = unbounded), in key order.
        An unknown table raises here, not at the first ``next()``."""
        info = self.store.tables.table(table)
        settings = IteratorSettings(max_versions=max_versions(info.props))
        tablets = self.store.tables.tablets_in_range(info.id, start, end)

        def entries() -> Iterator[Entry]:
            for t in tablets:
                yield from merged_view(self.tablet_sources(t, start, end), settings)

        return entries()


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


__all__ = ["Client", "file_order_key", "read_info"]
