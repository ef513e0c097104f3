"""The identity of a resumable job and its records (issue 23 §2; pure parts)."""

from __future__ import annotations

import pytest

from kompaktor.model.iterators import IteratorSettings
from kompaktor.model.names import resume_fingerprint_prefix, resume_part_name, resume_tag, tmp_tag
from kompaktor.model.resume import PartRecord, cuts_valid, decode_cuts, encode_cuts, job_fingerprint

FILES = {"tables/1/F01-a.parquet": 100, "tables/1/F02-b.parquet": 200}
S = IteratorSettings(max_versions=1, full=True, now_ms=1_000)


def fp(**kw) -> str:
    args = dict(tablet="1;~", prev=None, end=None, files=FILES, kind="SYSTEM", selection=None, settings=S)
    args.update(kw)
    return job_fingerprint(**args)


def test_same_job_same_fingerprint_whatever_the_attempts_clock_or_file_order() -> None:
    assert fp() == fp(settings=IteratorSettings(max_versions=1, full=True, now_ms=99_999))
    assert fp() == fp(files=dict(reversed(list(FILES.items()))))
    assert len(fp()) == 64


@pytest.mark.parametrize(
    "change",
    [
        {"tablet": "1;80"},
        {"prev": b"a"},
        {"end": b"z"},
        {"files": {**FILES, "tables/1/F02-b.parquet": 201}},  # same name, other bytes
        {"files": {"tables/1/F01-a.parquet": 100}},  # an input fewer
        {"files": {**FILES, "tables/1/F03-c.parquet": 5}},  # an input more
        {"kind": "USER", "selection": "UC-1"},
        {"selection": "SEL-2"},
        {"settings": IteratorSettings(max_versions=2, full=True, now_ms=1_000)},
        {"settings": IteratorSettings(max_versions=1, full=False, now_ms=1_000)},
        {"settings": IteratorSettings(max_versions=1, full=True, now_ms=1_000, ageoff_ttl_ms=10)},
        {"settings": IteratorSettings(max_versions=1, full=True, now_ms=1_000, row_start=b"a")},
        {"part_format": "parquet-zstd-v2"},
    ],
)
def test_anything_that_changes_the_output_changes_the_fingerprint(change) -> None:
    assert fp(**change) != fp()


def test_cuts_round_trip_and_must_tile_the_tablet_range() -> None:
    cuts = ((None, b"\x10"), (b"\x10", b"\x80\xff"), (b"\x80\xff", None))
    assert decode_cuts(encode_cuts(cuts)) == cuts
    assert cuts_valid(cuts, None, None)
    assert not cuts_valid(cuts, b"\x00", None)  # another tablet range
    assert not cuts_valid(cuts[:2], None, None)  # does not reach the end
    assert not cuts_valid(((None, b"\x10"), (b"\x11", None)), None, None)  # a gap
    assert not cuts_valid(((None, b"\x10"), (b"\x10", b"\x05"), (b"\x05", None)), None, None)  # not increasing
    assert not cuts_valid((), None, None)
    assert cuts_valid(((b"a", b"m"),), b"a", b"m")


def test_part_record_round_trips() -> None:
    rec = PartRecord(3, "tables/1/_tmp_RES-x_E.p00003.parquet", None, b"\xff", 10, 9, 1234, 567, "ab" * 32)
    assert PartRecord.from_json(rec.to_json()) == rec


def test_part_names_carry_the_resume_tag_not_the_ecid() -> None:
    f = fp()
    name = resume_part_name("tables/1/A0000000009-0123456789abcdef.parquet", f, "ECID-0123456789abcdef", 7)
    assert name.startswith("tables/1/_tmp_RES-") and name.endswith(".p00007.parquet")
    assert tmp_tag(name) == resume_tag(f)
    assert resume_fingerprint_prefix(tmp_tag(name)) == f[:32]
    assert resume_fingerprint_prefix("ECID-0123456789abcdef") is None
    assert resume_fingerprint_prefix(None) is None
    # two attempts never write the same name
    assert name != resume_part_name("tables/1/A1.parquet", f, "ECID-fedcba9876543210", 7)
