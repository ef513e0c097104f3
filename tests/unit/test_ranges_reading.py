"""engines.ranges: one mapping of read failures to BadFileError (``inputs.reading``), used by every
part of the package, and the package re-exporting each part's names."""

from __future__ import annotations

import pyarrow as pa
import pytest

import kompaktor.engines.ranges as ranges
from kompaktor.engines.ranges import copies, cursor, inputs, planning, progress, sampling
from kompaktor.engines.ranges.inputs import reading
from kompaktor.model.errors import BadFileError, UnsortedError


def test_missing_file() -> None:
    with pytest.raises(BadFileError, match=r"^t/f\.parquet: input file not found$"), reading("t/f.parquet"):
        raise FileNotFoundError("gone")


@pytest.mark.parametrize("exc", [OSError("disk on fire"), pa.ArrowInvalid("disk on fire")])
def test_unreadable_file(exc: Exception) -> None:
    with pytest.raises(BadFileError, match=r"^f: not a readable Parquet file: disk on fire$") as info, reading("f"):
        raise exc
    assert info.value.__cause__ is exc


def test_unreadable_row_group_names_it_even_when_missing() -> None:
    with (
        pytest.raises(BadFileError, match=r"^f: not a readable Parquet file \(row group 3\): gone$"),
        reading("f", row_group=3),
    ):
        raise FileNotFoundError("gone")


def test_bad_file_passes_through_and_on_error_runs() -> None:
    calls: list[int] = []
    err = UnsortedError("f: entries are not in key order")
    with pytest.raises(UnsortedError) as info, reading("f", on_error=lambda: calls.append(1)):
        raise err
    assert info.value is err
    with pytest.raises(BadFileError), reading("f", on_error=lambda: calls.append(2)):
        raise OSError("x")
    assert calls == [1, 2]


def test_other_errors_are_not_mapped() -> None:
    calls: list[int] = []
    with pytest.raises(ValueError), reading("f", on_error=lambda: calls.append(1)):
        raise ValueError("not a read failure")
    with reading("f", on_error=lambda: calls.append(2)):
        pass
    assert calls == []


def test_the_package_re_exports_each_part() -> None:
    parts = (copies, cursor, inputs, planning, progress, sampling)
    for name in ranges.__all__:
        assert any(getattr(part, name, None) is getattr(ranges, name) for part in parts), name


def test_a_cursor_opens_a_row_group_only_for_a_range_that_needs_it_and_skips_unread(storage) -> None:
    """Issue 37 §2: a range that ends before the next row group leaves it unopened (no byte of it
    read); ``skip`` passes over the next row groups unread (the merge copies them), only at a row
    group's bound."""
    import pyarrow.parquet as pq

    from kompaktor.engines.ranges import InputCursor
    from kompaktor.files.sortedfile import entries_to_table
    from kompaktor.model.keys import Entry

    storage.ensure_dir("in")
    es = [Entry(b"r%03d" % i, b"f", b"q", b"", 1, False, b"v") for i in range(30)]
    pq.write_table(entries_to_table(es), storage.path("in/a.parquet"), row_group_size=10)
    c = InputCursor(storage, "in/a.parquet", None, None)
    try:
        assert c.take(b"r009").num_rows == 10
        first = c.bytes_read
        assert c.take(b"r009x").num_rows == 0 and c.bytes_read == first  # r010.. not needed yet
        c.skip((1,), b"r019")
        assert c.bytes_read == first
        rest = c.take(None)
        assert rest.column("row").to_pylist() == [e.row for e in es[20:]]
        with pytest.raises(RuntimeError, match="not the next ones"):
            c.skip((0,), b"r009")
    finally:
        c.close()
    c = InputCursor(storage, "in/a.parquet", None, None)
    try:
        assert c.take(b"r004").num_rows == 5
        with pytest.raises(RuntimeError, match="while one is being read"):
            c.skip((1,), b"r019")
    finally:
        c.close()
