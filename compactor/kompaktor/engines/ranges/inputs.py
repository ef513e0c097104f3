"""The inputs of a merge as its planner sees them: footers, row-group statistics, and the one place
where a failed read of an input becomes a :class:`BadFileError` naming the file (:func:`reading`).

Part of :mod:`kompaktor.engines.ranges`; imports no other part of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from kompaktor.files.sortedfile import conform
from kompaktor.files.storage import Storage
from kompaktor.model.errors import BadFileError, UnsortedError
from kompaktor.model.keys import span_overlaps

Bound = bytes | None
#: uncompressed bytes per key range at most (about; from row-group sizes)
RANGE_BYTES = 256 << 20


@dataclass(frozen=True)
class InputMeta:
    path: str
    size: int
    entries: int
    #: (min row, max row, entries, uncompressed bytes) of each row group with row statistics, in
    #: file order — or of each segment of a row group that was sampled (:func:`refine_inputs`)
    groups: tuple[tuple[bytes, bytes, int, int], ...]
    has_stats: bool
    data_bytes: int = 0  # uncompressed size of all row groups
    #: index of the row group each entry of ``groups`` belongs to (empty: one entry per group)
    group_index: tuple[int, ...] = ()


def as_bytes(v: Any) -> bytes:
    """A row statistic (``str`` or ``bytes``, as pyarrow gives it) as bytes."""
    return v.encode() if isinstance(v, str) else bytes(v)


def _read_error(path: str, exc: BaseException, row_group: int | None) -> BadFileError:
    if row_group is not None:
        return BadFileError(f"{path}: not a readable Parquet file (row group {row_group}): {exc}")
    if isinstance(exc, FileNotFoundError):
        return BadFileError(f"{path}: input file not found")
    return BadFileError(f"{path}: not a readable Parquet file: {exc}")


@contextmanager
def reading(path: str, *, row_group: int | None = None, on_error: Callable[[], None] | None = None) -> Iterator[None]:
    """Read ``path`` (or its row group ``row_group``) inside: a :class:`BadFileError` raised there
    passes through, an ``OSError`` or Arrow error becomes a :class:`BadFileError` naming the file
    (a missing file, or an unreadable one, with the row group when given). ``on_error`` runs
    first, whatever the error (to release what the read had opened)."""
    try:
        yield
    except BadFileError:
        if on_error is not None:
            on_error()
        raise
    except (OSError, pa.ArrowException) as exc:
        if on_error is not None:
            on_error()
        raise _read_error(path, exc, row_group) from exc


def row_stats(md: pq.FileMetaData, row_col: int | None, g: int) -> tuple[bytes, bytes] | None:
    st = md.row_group(g).column(row_col).statistics if row_col is not None else None
    if st is None or not st.has_min_max:
        return None
    return as_bytes(st.min), as_bytes(st.max)


def row_column(md: pq.FileMetaData) -> int | None:
    return next((i for i in range(md.num_columns) if md.schema.column(i).path == "row"), None)


def inspect_inputs(storage: Storage, inputs: tuple[str, ...] | list[str]) -> list[InputMeta]:
    """Open every input's footer: a clear :class:`BadFileError` for a missing, non-Parquet or
    wrongly-shaped file before any work starts; row-group statistics for planning."""
    metas = []
    for path in inputs:
        with reading(path):
            size = storage.size(path)
            with storage.open_input(path) as f:
                pf = pq.ParquetFile(f)
                conform(pf.schema_arrow.empty_table(), path)
                md = pf.metadata
        row_col = row_column(md)
        groups: list[tuple[bytes, bytes, int, int]] = []
        index: list[int] = []
        has_stats = row_col is not None
        for g in range(md.num_row_groups):
            rg = md.row_group(g)
            stats = row_stats(md, row_col, g)
            if stats is None:
                has_stats = False
                continue
            if stats[0] > stats[1]:
                raise BadFileError(
                    f"{path}: the footer statistics of row group {g} are invalid "
                    f"(min row {stats[0]!r} > max row {stats[1]!r})"
                )
            if groups and stats[0] < groups[-1][1]:
                raise UnsortedError(
                    f"{path}: entries are not in key order: row group {g} starts before the end "
                    f"of row group {index[-1]} (footer statistics)"
                )
            groups.append((*stats, rg.num_rows, rg.total_byte_size))
            index.append(g)
        data_bytes = sum(md.row_group(g).total_byte_size for g in range(md.num_row_groups))
        metas.append(InputMeta(path, size, md.num_rows, tuple(groups), has_stats, data_bytes, tuple(index)))
    return metas


def estimate_entries(metas: list[InputMeta], prev: Bound, end: Bound) -> int:
    """Entries of the inputs in rows (prev, end], counted by whole row groups or sampled
    segments (an upper bound)."""
    total = 0
    for m in metas:
        if not m.has_stats:
            total += m.entries
        else:
            total += sum(n for lo, hi, n, _b in m.groups if span_overlaps(lo, hi, prev, end))
    return total
