"""One sorted file from sorted Parquet parts, without decoding them (docs/architecture.md "Long merges resume").

The Spark engine's tasks each write one ordered part as a Parquet file (encoded and compressed
on the executors, in parallel). The driver then builds the single output file by copying each
part's column-chunk bytes as they are and writing one footer that lists every part's row groups
with their file offsets shifted by where the part's bytes landed — a byte copy instead of
decoding and re-encoding every entry on the driver.

The footer (Parquet's ``FileMetaData``) is Thrift compact protocol. :func:`decode` reads any
struct into a generic tree (field id -> (type, value)) and :func:`encode` writes it back byte for
byte, so fields this module does not know (statistics, encodings, newer format additions) pass
through unchanged; only the offsets, row-group ordinals, row count and key/value metadata are
rewritten. Parts must share one schema (checked: their encoded schema elements are compared).
"""

from __future__ import annotations

import posixpath
from typing import Any

from kompaktor.files.sortedfile import SCHEMA, _decode_key, _metadata, encode_table
from kompaktor.files.storage import Storage
from kompaktor.model.errors import BadFileError, UnsortedError
from kompaktor.model.keys import SortKey
from kompaktor.model.tablet import FileInfo

MAGIC = b"PAR1"
COPY_CHUNK = 8 << 20

# Thrift compact protocol types
T_TRUE, T_FALSE, T_BYTE, T_I16, T_I32, T_I64, T_DOUBLE, T_BINARY, T_LIST, T_SET, T_MAP, T_STRUCT = range(1, 13)

Struct = list[list[Any]]  # [[field id, type, value], ...] in wire order


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def byte(self) -> int:
        b = self.data[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        shift = out = 0
        while True:
            b = self.byte()
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
            shift += 7

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def take(self, n: int) -> bytes:
        out = self.data[self.pos : self.pos + n]
        if len(out) != n:
            raise ValueError("truncated Thrift data")
        self.pos += n
        return out


def _read_value(r: _Reader, t: int) -> Any:
    if t in (T_TRUE, T_FALSE):
        return None  # the type carries the value (in a container: one byte, see _read_elem)
    if t == T_BYTE:
        return r.byte()
    if t in (T_I16, T_I32, T_I64):
        return r.zigzag()
    if t == T_DOUBLE:
        return r.take(8)
    if t == T_BINARY:
        return r.take(r.varint())
    if t in (T_LIST, T_SET):
        h = r.byte()
        size, et = h >> 4, h & 0x0F
        if size == 15:
            size = r.varint()
        return [et, [_read_elem(r, et) for _ in range(size)]]
    if t == T_MAP:
        size = r.varint()
        if not size:
            return [0, 0, []]
        kv = r.byte()
        kt, vt = kv >> 4, kv & 0x0F
        return [kt, vt, [(_read_elem(r, kt), _read_elem(r, vt)) for _ in range(size)]]
    if t == T_STRUCT:
        return _read_struct(r)
    raise ValueError(f"unknown Thrift compact type {t}")


def _read_elem(r: _Reader, t: int) -> Any:
    if t in (T_TRUE, T_FALSE):
        return r.byte()
    return _read_value(r, t)


def _read_struct(r: _Reader) -> Struct:
    fields: Struct = []
    last = 0
    while True:
        h = r.byte()
        if h == 0:
            return fields
        t, delta = h & 0x0F, h >> 4
        fid = last + delta if delta else r.zigzag()
        fields.append([fid, t, _read_value(r, t)])
        last = fid


def decode(data: bytes) -> Struct:
    r = _Reader(data)
    out = _read_struct(r)
    if r.pos != len(data):
        raise ValueError(f"{len(data) - r.pos} bytes after the Thrift struct")
    return out


def _varint(n: int, out: bytearray) -> None:
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return


def _zigzag(n: int, out: bytearray) -> None:
    _varint((n << 1) ^ (n >> 63), out)


def _write_value(t: int, v: Any, out: bytearray) -> None:
    if t in (T_TRUE, T_FALSE):
        return
    if t == T_BYTE:
        out.append(v)
    elif t in (T_I16, T_I32, T_I64):
        _zigzag(v, out)
    elif t == T_DOUBLE:
        out += v
    elif t == T_BINARY:
        _varint(len(v), out)
        out += v
    elif t in (T_LIST, T_SET):
        et, items = v
        if len(items) < 15:
            out.append((len(items) << 4) | et)
        else:
            out.append(0xF0 | et)
            _varint(len(items), out)
        for item in items:
            _write_elem(et, item, out)
    elif t == T_MAP:
        kt, vt, items = v
        _varint(len(items), out)
        if items:
            out.append((kt << 4) | vt)
            for k, val in items:
                _write_elem(kt, k, out)
                _write_elem(vt, val, out)
    elif t == T_STRUCT:
        _write_struct(v, out)
    else:
        raise ValueError(f"unknown Thrift compact type {t}")


def _write_elem(t: int, v: Any, out: bytearray) -> None:
    if t in (T_TRUE, T_FALSE):
        out.append(v)
    else:
        _write_value(t, v, out)


def _write_struct(fields: Struct, out: bytearray) -> None:
    last = 0
    for fid, t, v in fields:
        delta = fid - last
        if 0 < delta <= 15:
            out.append((delta << 4) | t)
        else:
            out.append(t)
            _zigzag(fid, out)
        _write_value(t, v, out)
        last = fid
    out.append(0)


def encode(fields: Struct) -> bytes:
    out = bytearray()
    _write_struct(fields, out)
    return bytes(out)


def field(s: Struct, fid: int) -> list[Any] | None:
    return next((f for f in s if f[0] == fid), None)


def required(s: Struct, fid: int) -> list[Any]:
    """Field ``fid`` of ``s``; a ValueError if the struct has none."""
    f = field(s, fid)
    if f is None:
        raise ValueError(f"Thrift struct without field {fid}")
    return f


def set_field(s: Struct, fid: int, t: int, v: Any) -> None:
    f = field(s, fid)
    if f is not None:
        f[1], f[2] = t, v
    else:
        s.append([fid, t, v])
        s.sort(key=lambda x: x[0])


# FileMetaData: 2 schema, 3 num_rows, 4 row_groups, 5 key_value_metadata
# RowGroup: 1 columns, 5 file_offset, 7 ordinal
# ColumnChunk: 2 file_offset, 3 meta_data, 4 offset_index_offset, 6 column_index_offset
# ColumnMetaData: 9 data_page_offset, 10 index_page_offset, 11 dictionary_page_offset, 14 bloom_filter_offset
_CHUNK_OFFSETS = (2, 4, 6)
_META_OFFSETS = (9, 10, 11, 14)


def _shift(s: Struct, fids: tuple[int, ...], by: int) -> None:
    for f in s:
        if f[0] in fids and f[1] == T_I64:
            f[2] += by


def shift_row_group(rg: Struct, by: int, ordinal: int) -> Struct:
    _shift(rg, (5,), by)
    cols = field(rg, 1)
    for chunk in cols[2][1] if cols else []:
        if field(chunk, 1) is not None:
            raise ValueError("a column chunk in another file (file_path) cannot be concatenated")
        _shift(chunk, _CHUNK_OFFSETS, by)
        meta = field(chunk, 3)
        if meta is not None:
            _shift(meta[2], _META_OFFSETS, by)
    if field(rg, 7) is not None:
        set_field(rg, 7, T_I16, ordinal)
    return rg


#: how much of a file's end :func:`read_footer_bytes` reads at once, the footer inside it mostly
#: (pyarrow's reader takes 64 KiB too): on an object store, one request instead of two
FOOTER_READ = 64 << 10


def read_footer_bytes(f: Any, size: int, name: str) -> bytes:
    """The footer's bytes (``FileMetaData``, encoded) of the Parquet file open as ``f`` (``size``
    bytes), in one read when it lies in the file's last :data:`FOOTER_READ` bytes;
    :class:`BadFileError` naming ``name`` when there is none."""
    if size < 12:
        raise BadFileError(f"{name}: not a Parquet file ({size} bytes)")
    n = min(size, FOOTER_READ)
    tail = f.read_at(n, size - n)
    flen = int.from_bytes(tail[-8:-4], "little")
    if tail[-4:] != MAGIC or flen > size - 12:
        raise BadFileError(f"{name}: not a Parquet file (no footer)")
    if flen + 8 <= n:
        return bytes(tail[n - 8 - flen : n - 8])
    return bytes(f.read_at(flen, size - 8 - flen))


def read_footer(f: Any, size: int, name: str) -> Struct:
    """The decoded footer (``FileMetaData``) of the Parquet file open as ``f`` (``size`` bytes);
    :class:`BadFileError` naming ``name`` when there is none or it cannot be read."""
    return decode_footer(read_footer_bytes(f, size, name), name)


def decode_footer(raw: bytes, name: str) -> Struct:
    """:func:`decode` of a footer's bytes; :class:`BadFileError` naming ``name`` if they are not one."""
    try:
        return decode(raw)
    except (ValueError, IndexError) as exc:
        raise BadFileError(f"{name}: unreadable Parquet footer: {exc}") from exc


def as_file(footer: bytes, body: bytes = b"") -> bytes:
    """A Parquet file of ``footer``'s bytes after ``body`` (the magic, ``body``, the footer, its
    length, the magic): what a reader needs to read a footer already fetched (``body`` empty) or a
    row group of :func:`row_group_file`."""
    return b"".join((MAGIC, body, footer, len(footer).to_bytes(4, "little"), MAGIC))


def row_group_file(md: Struct, g: int, data: bytes, start: int) -> bytes:
    """Row group ``g`` of the file whose footer is ``md``, from its column chunks' bytes ``data``
    (read from ``start``, :func:`copyable_row_group`), as a Parquet file of its own in memory: to
    decode the row group from the bytes already read to copy it, with no second read."""
    rg = shift_row_group(relocated_row_group(md, g, start), len(MAGIC), 0)
    footer = [list(f) for f in md]
    set_field(footer, 4, T_LIST, [T_STRUCT, [rg]])
    set_field(footer, 3, T_I64, required(rg, 3)[2])
    return as_file(encode(footer), data)


def _empty_file_footer() -> Struct:
    data = encode_table(SCHEMA.empty_table()).data.to_pybytes()
    flen = int.from_bytes(data[-8:-4], "little")
    return decode(data[-8 - flen : -8])


#: the footer of an empty sorted file as ``encode_table`` writes it: the schema every copied row
#: group must have been written with, and the footer template of an output that starts with one
_EMPTY_FOOTER = _empty_file_footer()
_SORTED_SCHEMA = encode([required(_EMPTY_FOOTER, 2)])

# ColumnChunk: 1 file_path, 4-7 page index offsets and lengths, 8-9 encryption;
# ColumnMetaData: 7 total_compressed_size, 14-15 bloom filter offset and length
_CHUNK_ELSEWHERE = (1, 8, 9)
_CHUNK_INDEX = (4, 5, 6, 7)
_META_BLOOM = (14, 15)
# Statistics: 1 max, 2 min (deprecated: signed byte order for binary columns in old writers)
_STATS_DEPRECATED = (1, 2)


def copyable_row_group(md: Struct, g: int) -> tuple[int, int] | None:
    """Where row group ``g`` of a file whose footer is ``md`` lies, ``(start, end)`` in bytes,
    when its column chunks can be copied into a sorted file as they are: the file has the sorted
    file schema, the chunks lie one after the other in this file, unencrypted. None otherwise."""
    if encode([required(md, 2)]) != _SORTED_SCHEMA:
        return None
    rgs = field(md, 4)
    cols = field(rgs[2][1][g], 1) if rgs and 0 <= g < len(rgs[2][1]) else None
    start = end = None
    for chunk in cols[2][1] if cols else []:
        meta = field(chunk, 3)
        if meta is None or any(field(chunk, f) is not None for f in _CHUNK_ELSEWHERE):
            return None
        dict_at, data_at = field(meta[2], 11), required(meta[2], 9)
        at = dict_at[2] if dict_at is not None and dict_at[2] else data_at[2]
        if end is not None and at != end:
            return None
        start = at if start is None else start
        end = at + required(meta[2], 7)[2]
    return None if start is None or end is None else (start, end)


def relocated_row_group(md: Struct, g: int, start: int) -> Struct:
    """Row group ``g`` of the footer ``md`` with its offsets made relative to ``start`` (where its
    first column chunk begins, :func:`copyable_row_group`), for :meth:`SpliceWriter.append_row_groups`.
    The page indexes and bloom filters are left out (they are not copied), and so are the
    deprecated statistics (``min``/``max``, which readers trust or not by the writer named in the
    footer: the output's); the deprecated offsets (the row group's, the chunks' ``file_offset``)
    are made what pyarrow writes."""
    rg = [list(f) for f in required(md, 4)[2][1][g]]
    if field(rg, 5) is not None:
        set_field(rg, 5, T_I64, 0)
    cols = field(rg, 1)
    assert cols is not None
    chunks = []
    for chunk in cols[2][1]:
        chunk = [list(f) for f in chunk if f[0] not in _CHUNK_INDEX]
        if field(chunk, 2) is not None:  # deprecated; pyarrow writes 0
            set_field(chunk, 2, T_I64, 0)
        meta = required(chunk, 3)
        meta[2] = [list(f) for f in meta[2] if f[0] not in _META_BLOOM]
        stats = field(meta[2], 12)
        if stats is not None:  # the deprecated min/max: a reader trusts them by the writer's name, ours
            stats[2] = [f for f in stats[2] if f[0] not in _STATS_DEPRECATED]
        _shift(meta[2], _META_OFFSETS, -start)
        chunks.append(chunk)
    cols[2] = [cols[2][0], chunks]
    return rg


def key_values(md: Struct) -> dict[bytes, bytes]:
    f = field(md, 5)
    out: dict[bytes, bytes] = {}
    for kv in f[2][1] if f else []:
        k, v = required(kv, 1), field(kv, 2)
        out[k[2]] = v[2] if v is not None else b""
    return out


def _kv_list(items: dict[bytes, bytes]) -> list[Any]:
    return [T_STRUCT, [[[1, T_BINARY, k], [2, T_BINARY, v]] for k, v in items.items()]]


class _OutputWriter:
    """What :class:`ConcatWriter` and :class:`SpliceWriter` share: ``rel_path`` written under a
    temporary name carrying ``tmp_tag``, row groups gathered from the pieces appended, one footer
    and the rename at :meth:`_commit`, everything removed by :meth:`abort`."""

    def __init__(self, storage: Storage, rel_path: str, *, tmp_tag: str | None = None) -> None:
        self.storage, self.rel_path = storage, rel_path
        self.tmp_rel = storage.staging_name(rel_path, tmp_tag)
        storage.ensure_dir(posixpath.dirname(rel_path))
        self._sink = storage.open_output(self.tmp_rel)
        self._sink.write(MAGIC)
        self._pos = len(MAGIC)
        self._template: Struct | None = None
        self._schema: bytes | None = None
        self._row_groups: list[Struct] = []
        self.entries = self.deletes = 0
        self.first: SortKey | None = None
        self.last: SortKey | None = None
        self._closed = False

    def position(self) -> int:
        return self._pos

    def _commit(self, piece: str, *, kompaktor_first: bool) -> FileInfo:
        """The footer (the first piece's, with the row groups, the entries and the ``kompaktor.*``
        metadata of the whole: before the other key/values, as pyarrow writes them, or after),
        then the output published under its final name."""
        if self._template is None:
            raise ValueError(f"{self.rel_path}: no {piece} appended")
        md = [list(f) for f in self._template]
        set_field(md, 3, T_I64, self.entries)
        set_field(md, 4, T_LIST, [T_STRUCT, self._row_groups])
        ours = _metadata(self.entries, self.deletes, self.first, self.last)
        rest = {k: v for k, v in key_values(self._template).items() if not k.startswith(b"kompaktor.")}
        set_field(md, 5, T_LIST, _kv_list({**ours, **rest} if kompaktor_first else {**rest, **ours}))
        footer = encode(md)
        self._sink.write(footer)
        self._sink.write(len(footer).to_bytes(4, "little") + MAGIC)
        size = int(self._sink.tell())  # as written: see SortedFileWriter.commit
        self._sink.close()
        self._closed = True
        self.storage.publish(self.tmp_rel, self.rel_path)
        return FileInfo(self.rel_path, size, self.entries, self.deletes, self.first, self.last)

    def abort(self) -> None:
        if not self._closed:
            try:
                self._sink.close()
            except Exception:
                pass
            self._closed = True
        self.storage.delete(self.tmp_rel)


class ConcatWriter(_OutputWriter):
    """Writes ``rel_path`` (under a temporary name carrying ``tmp_tag`` until :meth:`commit`)
    from sorted Parquet parts appended in key order."""

    def append(self, part: str, digest: Any = None) -> dict[bytes, bytes]:
        """Copy one part's data after the previous ones; returns its key/value metadata.
        ``digest`` (a ``hashlib`` object) is fed every byte of the part, in file order, as it is
        read: a resumable merge records the part's checksum without reading it twice."""
        with self.storage.open_input(part) as f:
            size = f.size()
            footer = read_footer_bytes(f, size, part)
            md, flen = decode_footer(footer, part), len(footer)
            schema = encode([required(md, 2)])
            if self._template is None:
                self._template, self._schema = md, schema
            elif schema != self._schema:
                raise BadFileError(f"{part}: schema differs from the first part's")
            meta = key_values(md)
            entries = int(meta.get(b"kompaktor.entries", b"0"))
            rgs = field(md, 4)
            if entries:
                first, last = _decode_key(meta.get(b"kompaktor.first")), _decode_key(meta.get(b"kompaktor.last"))
                if self.last is not None and first is not None and first < self.last:
                    raise UnsortedError(f"{self.rel_path}: part {part} starts before the end of the previous one")
                shift = self._pos - len(MAGIC)
                for rg in rgs[2][1] if rgs else []:
                    self._row_groups.append(shift_row_group(rg, shift, len(self._row_groups)))
            if entries or digest is not None:
                f.seek(0)
                head = f.read(len(MAGIC))
                if digest is not None:
                    digest.update(head)
                left = size - 8 - flen - len(MAGIC)
                while left > 0:
                    chunk = f.read(min(COPY_CHUNK, left))
                    if not chunk:
                        raise BadFileError(f"{part}: shorter than its footer says")
                    if entries:
                        self._sink.write(chunk)
                    if digest is not None:
                        digest.update(chunk)
                    left -= len(chunk)
                if digest is not None:
                    digest.update(footer)
                    digest.update(flen.to_bytes(4, "little") + MAGIC)
            if entries:
                self._pos += size - 8 - flen - len(MAGIC)
                self.entries += entries
                self.deletes += int(meta.get(b"kompaktor.deletes", b"0"))
                if self.first is None:
                    self.first = first
                self.last = last
            return meta

    def commit(self) -> FileInfo:
        return self._commit("part", kompaktor_first=False)


class SpliceWriter(_OutputWriter):
    """Writes ``rel_path`` from ranges encoded apart, in key order, with the bytes one
    :class:`~kompaktor.files.sortedfile.SortedFileWriter` writes when given the same tables one
    ``write_table`` call each (every call starts new row groups, so the column chunks are the
    same bytes; only the footer is assembled here).

    Each range arrives as a whole Parquet file in memory (:func:`~kompaktor.files.sortedfile.encode_table`):
    its data bytes are written as they are, its row groups are shifted to where they landed, and
    the footer is pyarrow's: the writer's user key/value metadata first (``kompaktor.*``), then
    the rest (``ARROW:schema``); the column chunks' deprecated ``file_offset`` stays what pyarrow
    writes (0) and is shifted only when set. A range with no entries adds nothing. With no range
    appended, :meth:`commit` refuses (the caller writes an empty file with ``SortedFileWriter``)."""

    def append(self, data: Any, entries: int, deletes: int, first: SortKey | None, last: SortKey | None) -> None:
        """Append one encoded range (``data``: the Parquet file's bytes, any buffer) holding
        ``entries`` entries (``deletes`` delete markers) from key ``first`` to ``last``."""
        if not entries:
            return
        if first is None or last is None:
            raise ValueError("a range with entries needs its first and last keys")
        if self.last is not None and first < self.last:
            raise UnsortedError(f"{self.rel_path}: a range starts before the end of the previous one")
        view = memoryview(data)
        size = len(view)
        flen = int.from_bytes(view[size - 8 : size - 4], "little")
        if bytes(view[:4]) != MAGIC or bytes(view[size - 4 :]) != MAGIC or flen > size - 12:
            raise ValueError("not an encoded Parquet file")
        md = decode(bytes(view[size - 8 - flen : size - 8]))
        self._check_schema(md)
        rgs = field(md, 4)
        self._place(rgs[2][1] if rgs else [])
        self._sink.write(view[len(MAGIC) : size - 8 - flen])
        self._pos += size - 8 - flen - len(MAGIC)
        self._count(entries, deletes, first, last)

    def append_row_groups(
        self, data: Any, row_groups: list[Struct], entries: int, deletes: int, first: SortKey, last: SortKey
    ) -> None:
        """Append row groups copied from an input (docs/architecture.md "Copying row groups
        through"): ``data``, their column chunks' bytes, and their footer entries with offsets
        relative to where ``data`` begins (:func:`relocated_row_group`); ``entries`` entries
        (``deletes`` markers), ``first`` to ``last``."""
        if self.last is not None and first < self.last:
            raise UnsortedError(f"{self.rel_path}: copied row groups start before the end of the previous range")
        if self._template is None:
            self._template, self._schema = [list(f) for f in _EMPTY_FOOTER], _SORTED_SCHEMA
        self._place(row_groups, self._pos)
        self._sink.write(data)
        self._pos += len(memoryview(data))
        self._count(entries, deletes, first, last)

    def _check_schema(self, md: Struct) -> None:
        schema = encode([required(md, 2)])
        if self._template is None:
            self._template, self._schema = md, schema
        elif schema != self._schema:
            raise ValueError("the schema differs from the first range's")

    def _place(self, row_groups: list[Struct], shift: int | None = None) -> None:
        """Row groups whose data is written next, their offsets (those set) moved by ``shift``
        (default: where an encoded file's data, after its magic, lands)."""
        shift = self._pos - len(MAGIC) if shift is None else shift
        for rg in row_groups:
            _shift(rg, (5,), shift)
            cols = field(rg, 1)
            for chunk in cols[2][1] if cols else []:
                for f in chunk:
                    if f[0] in _CHUNK_OFFSETS and f[1] == T_I64 and f[2]:
                        f[2] += shift
                meta = field(chunk, 3)
                if meta is not None:
                    _shift(meta[2], _META_OFFSETS, shift)
            if field(rg, 7) is not None:
                set_field(rg, 7, T_I16, len(self._row_groups))
            self._row_groups.append(rg)

    def _count(self, entries: int, deletes: int, first: SortKey | None, last: SortKey | None) -> None:
        self.entries += entries
        self.deletes += deletes
        if self.first is None:
            self.first = first
        self.last = last

    def commit(self) -> FileInfo:
        return self._commit("range", kompaktor_first=True)
