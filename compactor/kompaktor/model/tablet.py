"""Tablets and their files, as every part of Kompaktor sees them. Pure data: no I/O.

A table is split by row ranges into tablets; a tablet owns immutable sorted files
(:class:`FileMeta`), the compactions running on it (:class:`RunningCompaction`), at most one
selection of files for a USER or SELECTOR compaction (:class:`Selection`), a user-compaction
hold and an operation in progress (split or merge). The metadata store persists these documents;
it does not define them.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import orjson

from kompaktor.model.keys import SortKey, decode_row, encode_row, row_in_range

ONLINE, OFFLINE, DELETED = "ONLINE", "OFFLINE", "DELETED"
STATES = (ONLINE, OFFLINE, DELETED)
# Tablet ids: "<table id>;<end token>", where the end token is the end row in lowercase hex,
# or "~" for the last tablet (unbounded end): hex sorts like the bytes, and "~" after any hex.
LAST = "~"


def end_token(end: bytes | None) -> str:
    return LAST if end is None else end.hex()


def tablet_id(tid: str, end: bytes | None) -> str:
    return f"{tid};{end_token(end)}"


_new_tuple = tuple.__new__  # builds a named tuple without its argument-checking __new__


def now_ms() -> int:
    return int(time.time() * 1000)


# -- timestamps as tokens --------------------------------------------------------------------
# Timestamps are any int64; the metadata's Lua compares them, and Lua's numbers are doubles (a
# nanosecond timestamp loses its last digits, and cjson prints 14). So the delete horizon and the
# files' timestamp bounds travel as tokens: the timestamp offset by 2**63, as 20 decimal digits,
# which compare as strings exactly as the timestamps compare as integers.
TS_MIN, TS_MAX = -(2**63), 2**63 - 1


def ts_token(ts: int) -> str:
    """``ts`` (an int64) as a fixed-width token that sorts like the number."""
    if not TS_MIN <= ts <= TS_MAX:
        raise ValueError(f"timestamp {ts} is outside int64")
    return f"{ts - TS_MIN:020d}"


def ts_from_token(token: str) -> int:
    return int(token) + TS_MIN


def _ts_or_none(token: str | None) -> int | None:
    return None if token is None else ts_from_token(token)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for a bulk decode or plan (nesting is fine).

    Decoding 100,000 tablets makes millions of small acyclic objects (freed by reference counting
    alone); with the collector on, each young-generation pass re-traverses the survivors, which
    made decoding them 3-4x slower (5.2 s instead of 1.3 s, measured)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@dataclass(frozen=True)
class TableInfo:
    id: str
    name: str
    state: str
    props: dict[str, str]


class FileMeta(NamedTuple):
    """A file of a tablet. A named tuple, not a dataclass: a full scan decodes 20 of them per
    tablet, and a tuple is built several times faster than a frozen dataclass.

    ``put_min`` is the oldest timestamp of a put in the file (:data:`TS_MAX` when it has none),
    ``del_max`` the newest timestamp of a delete marker (None when it has none); either is None
    when unknown (a file registered before they were recorded). They are whole-file bounds, kept
    as they are when a split shares the file: the delete horizon only needs bounds."""

    size: int
    entries: int
    deletes: int = 0
    first_row: bytes | None = None
    last_row: bytes | None = None
    put_min: int | None = None
    del_max: int | None = None

    def to_json(self) -> dict[str, Any]:
        d = {
            "size": self.size,
            "entries": self.entries,
            "deletes": self.deletes,
            "first": encode_row(self.first_row),
            "last": encode_row(self.last_row),
        }
        if self.put_min is not None:
            d["pmin"] = ts_token(self.put_min)
        if self.del_max is not None:
            d["dmax"] = ts_token(self.del_max)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> FileMeta:
        first, last = d.get("first"), d.get("last")
        return _new_tuple(
            cls,
            (
                d["size"],
                d["entries"],
                d.get("deletes", 0),
                None if first is None else bytes.fromhex(first),
                None if last is None else bytes.fromhex(last),
                _ts_or_none(d.get("pmin")),
                _ts_or_none(d.get("dmax")),
            ),
        )


@dataclass(frozen=True)
class FileInfo:
    """A sorted file as its writer (or a read of its footer) describes it; :attr:`meta` is what a
    tablet records about it."""

    path: str  # relative to the storage root
    size: int
    entries: int
    deletes: int
    first: SortKey | None  # first key as sort_key tuple, None when empty
    last: SortKey | None
    # FileMeta.put_min / del_max, measured by the writers of flushes and imports (None: not
    # measured; a compaction's output gets them from its inputs when it commits). Not part of a
    # file's identity: two writers of the same bytes describe the same file.
    put_min: int | None = field(default=None, compare=False)
    del_max: int | None = field(default=None, compare=False)

    @property
    def first_row(self) -> bytes | None:
        return None if self.first is None else self.first[0]

    @property
    def last_row(self) -> bytes | None:
        return None if self.last is None else self.last[0]

    @property
    def meta(self) -> FileMeta:
        return FileMeta(
            self.size, self.entries, self.deletes, self.first_row, self.last_row, self.put_min, self.del_max
        )


@dataclass(frozen=True)
class RunningCompaction:
    ecid: str
    kind: str
    files: tuple[str, ...]
    group: str
    priority: int
    compactor: str
    selection: str | None
    started_ms: int
    output: str  # relative path of the (temporary, then final) output

    def to_json(self) -> dict[str, Any]:
        d = {
            "kind": self.kind,
            "files": list(self.files),
            "group": self.group,
            "priority": self.priority,
            "compactor": self.compactor,
            "started": self.started_ms,
            "output": self.output,
        }
        if self.selection is not None:
            d["selection"] = self.selection
        return d


@dataclass(frozen=True)
class Selection:
    id: str
    kind: str  # USER or SELECTOR
    files: tuple[str, ...]
    done: int = 0
    created_ms: int = 0

    def stale(self, expiry_ms: int, now: int) -> bool:
        """docs/planner.md §5: no job of the selection has completed and it is older than the table's
        selection expiry (``table.compaction.selection.expiration.ms``, default 2 minutes);
        SYSTEM compactions may then take its files."""
        return self.done == 0 and now - self.created_ms > expiry_ms


@dataclass(frozen=True)
class Tablet:
    id: str
    table: str
    prev: bytes | None
    end: bytes | None
    files: dict[str, FileMeta]
    running: dict[str, RunningCompaction]
    selection: Selection | None
    hold: str | None
    op: str | None
    version: int
    #: the delete horizon: the newest timestamp of a delete marker that a full compaction of this
    #: tablet dropped (None: none dropped). A put at or before it could be one those markers hid,
    #: so a flush or import bringing one is refused (docs/file-format.md, "Deletes stay deleted").
    horizon: int | None = None

    @classmethod
    def from_json(cls, tablet_id: str, d: dict[str, Any]) -> Tablet:
        file_meta = FileMeta.from_json
        running = {}
        for ecid, r in (d.get("running") or {}).items():
            running[ecid] = RunningCompaction(
                ecid,
                r["kind"],
                tuple(r["files"]),
                r["group"],
                r["priority"],
                r["compactor"],
                r.get("selection"),
                r["started"],
                r["output"],
            )
        sel = d.get("sel")
        selection = None
        if sel:
            selection = Selection(
                sel["id"], sel["kind"], tuple(sel["files"] or ()), sel.get("done", 0), sel.get("created", 0)
            )
        return cls(
            tablet_id,
            d["table"],
            decode_row(d.get("prev")),
            decode_row(d.get("end")),
            {f: file_meta(m) for f, m in (d.get("files") or {}).items()},
            running,
            selection,
            d.get("hold"),
            d.get("op"),
            d.get("v", 0),
            _ts_or_none(d.get("dh")),
        )

    def running_files(self) -> set[str]:
        return {f for r in self.running.values() for f in r.files}

    def contains_row(self, row: bytes) -> bool:
        return row_in_range(row, self.prev, self.end)


def decode_tablets(docs: Iterable[tuple[str, bytes]]) -> list[Tablet]:
    """Tablets from their stored documents (:meth:`TableStore.tablet_docs
    <kompaktor.metadata.store.tables.TableStore.tablet_docs>`)."""
    decode, loads = Tablet.from_json, orjson.loads
    with gc_paused():
        return [decode(t, loads(raw)) for t, raw in docs]


#: what a compactor is doing, as its heartbeat says
CompactorState = Literal["idle", "busy", "draining"]


@dataclass(frozen=True)
class CompactorInfo:
    id: str
    group: str
    state: CompactorState
    ecid: str | None
    last_seen: float
