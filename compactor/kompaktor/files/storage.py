"""Where data files live: one ``pyarrow.fs`` filesystem and a root, from a URI.

A plain path (or ``file://``) is a local directory; ``s3://bucket/prefix`` and
``hdfs://namenode/prefix`` go through the same code. Files are named by paths relative to the
root, which is what the metadata store records.

How a finished file gets its name depends on the store. Where a rename is atomic (a local disk,
HDFS) a writer writes under a temporary name and renames. On object stores (S3, GCS, ABFS
without a hierarchical namespace) a rename is a server-side copy of the whole object and a
delete: there a writer writes once, directly at the final name (:meth:`Storage.staging_name`).
That is safe because every final name is unique (a compaction output carries its ECID, a flush
or import file a random part) and nothing reads a file the metadata store does not reference: an
object whose writer died is either invisible (a multipart upload never completed) or
unreferenced, and the garbage collector removes it after its grace period.
"""

from __future__ import annotations

import errno
import os
import posixpath
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs
from prometheus_client.core import CounterMetricFamily

from kompaktor.model.errors import StorageError
from kompaktor.model.names import new_nonce, tmp_name

DEFAULT_STORAGE = os.path.join(os.path.expanduser("~"), ".local", "share", "kompaktor", "files")
#: the name of :meth:`Storage.check_writable`'s probe (outside ``tables/``: never a data file)
PROBE_PREFIX = "_kompaktor_write_probe_"
#: objects per LIST response on S3-compatible stores (ListObjectsV2's page)
LIST_PAGE = 1000


class RequestCounts:
    """Requests this process made to its storage, by kind (``put``: an object written, one per
    file however many parts its upload took; ``get``: an object opened for reading, whose row
    groups are then fetched by range GETs the filesystem layer issues and this count does not see;
    ``head``, ``list``, ``copy``, ``delete``). Process-wide: every :class:`Storage` adds to it,
    and the coordinator's and compactors' ``/metrics`` export it as
    ``kompaktor_storage_requests_total{op}``."""

    OPS = ("put", "get", "head", "list", "copy", "delete")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def add(self, op: str, n: int = 1) -> None:
        with self._lock:
            self._counts[op] += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {op: self._counts[op] for op in self.OPS}


REQUESTS = RequestCounts()


class RequestsCollector:
    """Exports :data:`REQUESTS` as ``kompaktor_storage_requests_total{op}`` into a registry."""

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "kompaktor_storage_requests",
            "Requests to the file storage by kind (get: objects opened for reading; their range GETs are not counted)",
            labels=["op"],
        )
        for op, n in REQUESTS.snapshot().items():
            family.add_metric([op], n)
        yield family


#: how an unreachable store, or one that takes no writes for now, words it (pyarrow's S3 and HDFS
#: clients, the JVM's under Spark, the OS): a fault of the place, not of the job
_UNAVAILABLE_TEXT = (
    "network_connection",
    "couldn't connect to server",
    "connection refused",
    "connection reset",
    "service_unavailable",
    "slow_down",
    "read-only file system",
    "no space left on device",
    "timed out",
    "broken pipe",
)
_UNAVAILABLE_ERRNO = {
    errno.ECONNREFUSED,
    errno.ECONNRESET,
    errno.ETIMEDOUT,
    errno.EHOSTUNREACH,
    errno.ENETUNREACH,
    errno.EROFS,
    errno.ENOSPC,
    errno.EPIPE,
}


def unavailable(exc: BaseException) -> bool:
    """Whether an error (or one it was raised from) says the storage cannot be reached or
    written for now: a job that met it is retried later without counting against it."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, OSError) and seen.errno in _UNAVAILABLE_ERRNO:
            return True
        text = str(seen).lower()
        if any(marker in text for marker in _UNAVAILABLE_TEXT):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def default_storage_uri() -> str:
    return os.environ.get("KOMPAKTOR_STORAGE") or DEFAULT_STORAGE


def _local_dir(uri: str, root: str) -> None:
    """Create a local storage directory, or say in one line why it cannot be one."""
    if os.path.exists(root) and not os.path.isdir(root):
        raise StorageError(f"storage {uri}: not a directory (a file is in the way)")
    try:
        os.makedirs(root, exist_ok=True)
    except OSError as exc:
        raise StorageError(f"storage {uri}: cannot create the directory: {exc.strerror or exc}") from exc


@dataclass(frozen=True)
class Storage:
    uri: str
    fs: pafs.FileSystem
    root: str

    @classmethod
    def from_uri(cls, uri: str | None = None) -> Storage:
        uri = uri or default_storage_uri()
        if "://" not in uri:
            root = os.path.abspath(uri)
            _local_dir(uri, root)
            return cls(uri=root, fs=pafs.LocalFileSystem(), root=root)
        fs, root = pafs.FileSystem.from_uri(uri)
        if isinstance(fs, pafs.LocalFileSystem):
            _local_dir(uri, root)
        return cls(uri=uri, fs=fs, root=root.rstrip("/"))

    def path(self, rel: str) -> str:
        """Absolute path inside the filesystem for a path relative to the root."""
        return posixpath.join(self.root, rel)

    def ensure_dir(self, rel_dir: str) -> None:
        """Directories exist on disks and HDFS; an object store has none (pyarrow would PUT an
        empty marker object per level, a request per file written for nothing)."""
        if self.renames_atomically:
            self.fs.create_dir(self.path(rel_dir), recursive=True)

    def check_writable(self) -> None:
        """Write, then delete, a small probe object at the root: a store this process cannot
        write to (read-only or wrong credentials, a missing bucket, an endpoint that does not
        answer) is one line before anything starts, not a failure of every job later."""
        rel = f"{PROBE_PREFIX}{new_nonce()}"
        try:
            with self.open_output(rel) as f:
                f.write(b"kompaktor write probe\n")
            self.delete(rel)
        except (OSError, ValueError) as exc:
            raise StorageError(f"storage {self.uri}: cannot write: {' '.join(str(exc).split())}") from None

    def open_input(self, rel: str) -> pa.NativeFile:
        """A finished file, for reading (random access: row groups are fetched by range)."""
        REQUESTS.add("get")
        return self.fs.open_input_file(self.path(rel))

    def open_output(self, rel: str) -> pa.NativeFile:
        """A new file, written as a stream (on object stores: one object, uploaded in parts)."""
        REQUESTS.add("put")
        return self.fs.open_output_stream(self.path(rel))

    def exists(self, rel: str) -> bool:
        REQUESTS.add("head")
        return self.fs.get_file_info(self.path(rel)).type != pafs.FileType.NotFound

    def size(self, rel: str) -> int:
        REQUESTS.add("head")
        info = self.fs.get_file_info(self.path(rel))
        if info.type == pafs.FileType.NotFound:
            raise FileNotFoundError(self.path(rel))
        return int(info.size)

    @property
    def renames_atomically(self) -> bool:
        """A local disk or HDFS: finished files are renamed into place. Object stores: not."""
        return isinstance(self.fs, pafs.LocalFileSystem) or self.fs.type_name == "hdfs"

    def staging_name(self, rel: str, tag: str | None = None) -> str:
        """Where a writer of ``rel`` writes: a temporary name renamed by :meth:`publish` where a
        rename is atomic; on object stores ``rel`` itself, written once (refused, before any
        byte is written, if an object already has that name)."""
        if self.renames_atomically:
            return tmp_name(rel, tag)
        if self.exists(rel):
            raise FileExistsError(f"{rel}: a file with this name exists; not replacing it")
        return rel

    def publish(self, staged: str, rel: str) -> None:
        """Make a finished file visible under ``rel`` (nothing to do when it was written there)."""
        if staged != rel:
            self.move(staged, rel)

    def move(self, src_rel: str, dst_rel: str) -> None:
        """Give a finished file its name; never replaces a file already there (that is
        :class:`FileExistsError`, and the source stays). Locally a hard link then an unlink: the
        link fails atomically if the name is taken, and a crash in between leaves the source,
        a temporary name the garbage collector removes. Elsewhere the name is checked first, then
        renamed (HDFS: atomic) or copied and deleted (object stores, where visibility is decided
        by the metadata store anyway); names carry a random or ECID part, so a second writer of
        the same name does not exist in practice, and this check makes it an error, not a loss."""
        src, dst = self.path(src_rel), self.path(dst_rel)
        if isinstance(self.fs, pafs.LocalFileSystem):
            try:
                os.link(src, dst)
            except FileExistsError:
                raise FileExistsError(f"{dst_rel}: a file with this name exists; not replacing it") from None
            except OSError as exc:
                if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
                    raise
                # no hard links here: renameat2(RENAME_NOREPLACE) would be the atomic way; check
                # and rename is the next best (the names are unique anyway, see above)
            else:
                os.unlink(src)
                return
        if self.exists(dst_rel):
            raise FileExistsError(f"{dst_rel}: a file with this name exists; not replacing it")
        if not self.renames_atomically:
            REQUESTS.add("copy")
            REQUESTS.add("delete")
        self.fs.move(src, dst)

    def delete(self, rel: str) -> bool:
        REQUESTS.add("delete")
        try:
            self.fs.delete_file(self.path(rel))
        except FileNotFoundError:
            return False
        return True

    def _listing(self, rel_dir: str, recursive: bool) -> list[pafs.FileInfo]:
        """What is under ``rel_dir``, counted as the LIST requests an object store answers it with."""
        sel = pafs.FileSelector(self.path(rel_dir), recursive=recursive, allow_not_found=True)
        infos = self.fs.get_file_info(sel)
        REQUESTS.add("list", max(1, -(-len(infos) // LIST_PAGE)))
        return infos

    def list_dirs(self, rel_dir: str) -> list[str]:
        """Names of the directories right under ``rel_dir`` (on object stores: the common
        prefixes of one delimited listing), sorted."""
        infos = self._listing(rel_dir, recursive=False)
        return sorted(posixpath.basename(i.path.rstrip("/")) for i in infos if i.type == pafs.FileType.Directory)

    def list_files(self, rel_dir: str) -> list[tuple[str, float]]:
        """(relative path, modification time in seconds) of every file under a directory."""
        out = []
        for info in self._listing(rel_dir, recursive=True):
            if info.type == pafs.FileType.File:
                rel = posixpath.relpath(info.path, self.root)
                mtime = info.mtime.timestamp() if info.mtime is not None else 0.0
                out.append((rel, mtime))
        return sorted(out)
