"""engines.ranges: one mapping of read failures to BadFileError (``inputs.reading``), used by every
part of the package, and the package re-exporting each part's names."""

from __future__ import annotations

import pyarrow as pa
import pytest

import kompaktor.engines.ranges as ranges
from kompaktor.engines.ranges import cursor, inputs, planning, progress, sampling
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
    parts = (cursor, inputs, planning, progress, sampling)
    for name in ranges.__all__:
        assert any(getattr(part, name, None) is getattr(ranges, name) for part in parts), name
