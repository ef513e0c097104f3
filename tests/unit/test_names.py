"""File names: one definition of data-file paths, temporary names and their writer's tag."""

from __future__ import annotations

import pytest

from kompaktor.model.names import (
    PREFIXES,
    data_file,
    ecid_nonce,
    file_order_key,
    output_template,
    part_names,
    tmp_name,
    tmp_tag,
)


def test_origins_have_accumulos_prefixes() -> None:
    assert PREFIXES == {"flush": "F", "import": "I", "partial": "C", "full": "A"}
    assert data_file("1f", "import", 42, "0123456789abcdef") == "tables/1f/I000000002a-0123456789abcdef.parquet"
    with pytest.raises(KeyError):
        data_file("1f", "bogus", 1)


def test_output_template_names_like_data_file() -> None:
    t = output_template("1f", ecid_nonce("ECID-0123456789abcdef"))
    assert t["template"] % (t["full"], 42) == data_file("1f", "full", 42, "0123456789abcdef")
    assert t["template"] % (t["partial"], 42) == data_file("1f", "partial", 42, "0123456789abcdef")


def test_a_sequence_handed_out_twice_still_gives_two_names() -> None:
    """Issue 15 §6: after Redis loses its last writes the file counter goes back; the random (or
    ECID-derived) part keeps the names apart."""
    names = {data_file("t", "flush", 7) for _ in range(1000)}
    assert len(names) == 1000
    a, b = (output_template("t", ecid_nonce(e)) for e in ("ECID-00000000000000aa", "ECID-00000000000000bb"))
    assert a["template"] % ("A", 7) != b["template"] % ("A", 7)
    for bad in ("ECID-xyz", "ECID-0123456789ABCDEF", "ECID-%s0123456789abc"):
        with pytest.raises(ValueError):
            ecid_nonce(bad)


def test_files_sort_oldest_first_whatever_their_origin() -> None:
    files = [data_file("t", "full", 3), data_file("t", "flush", 10), data_file("t", "import", 1)]
    assert sorted(files, key=file_order_key) == [files[2], files[0], files[1]]


def test_temporary_names_carry_their_writers_tag() -> None:
    out = data_file("t", "full", 7)
    tmp = tmp_name(out, "ECID-abc")
    assert tmp.startswith("tables/t/") and tmp != out
    assert tmp_tag(tmp) == "ECID-abc" and tmp_tag(out) is None
    done, writing = part_names(out, "ECID-abc", 3)
    assert tmp_tag(done) == tmp_tag(writing) == "ECID-abc" and done != writing
    assert tmp_tag(tmp_name(out)) is not None  # an untagged writer gets a random tag
