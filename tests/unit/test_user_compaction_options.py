"""A user compaction's iterator options (``kompaktor compact``, a Compaction resource) of the wrong
type are refused in one line naming the option, before anything is started."""

from __future__ import annotations

import pytest

from kompaktor.metadata.user_compactions import validate_iterators


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"ageoff_ttl_ms": "abc"}, "ageoff_ttl_ms must be an integer"),
        ({"ageoff_ttl_ms": True}, "ageoff_ttl_ms must be an integer"),
        ({"ageoff_ttl_ms": 1.5}, "ageoff_ttl_ms must be an integer"),
        ({"row_regex": 7}, "row_regex must be a string"),
        ({"row_start": 10}, "row_start must be a string"),
        ({"row_end": "zz"}, "row_end must be hex"),
        ({"ageoff_ttl_ms": -1}, "ageoff ttl must be >= 0"),
        ({"row_regex": "("}, "is invalid"),
    ],
)
def test_an_option_of_the_wrong_type_is_refused_in_one_line(options: dict[str, object], says: str) -> None:
    with pytest.raises(ValueError, match=says) as refused:
        validate_iterators(options)
    assert "\n" not in str(refused.value)


def test_good_options_come_back_without_the_unset_ones() -> None:
    got = validate_iterators({"ageoff_ttl_ms": 5, "row_start": "61", "row_end": None, "row_regex": "^a"})
    assert got == {"ageoff_ttl_ms": 5, "row_start": "61", "row_regex": "^a"}
