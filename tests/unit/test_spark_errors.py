"""``kompaktor.spark.write`` says a Kompaktor error that Spark wrapped with its traceback in the
error's own one line and class (docs/spark.md, "Writing")."""

from __future__ import annotations

import re

import pytest

from kompaktor.model.errors import KompaktorError, NotPermitted
from kompaktor.spark import unwrapped
from kompaktor.spark.source import count_option

WRAPPED = """[PYTHON_DATA_SOURCE_ERROR] Failed to create Python data source writer: Traceback (most recent call last):
  File "/x/pyspark/sql/worker/write_into_data_source.py", line 150, in main
    writer = data_source.writer(schema, overwrite)
  File "/x/kompaktor/spark/source.py", line 142, in writer
    return begin_write(endpoint(options), table_option(options), write_id, run_entries=runs)
kompaktor.model.errors.NotPermitted: Redis at redis://compactor:***@127.0.0.1:1/0 denied a command to this user: NOPERM
 SQLSTATE: 38000"""


def test_a_quoted_kompaktor_error_comes_back_as_itself_in_one_line() -> None:
    got = unwrapped(RuntimeError(WRAPPED))
    assert type(got) is NotPermitted
    assert str(got) == "Redis at redis://compactor:***@127.0.0.1:1/0 denied a command to this user: NOPERM"


def test_anything_else_stays_as_spark_said_it() -> None:
    plain = RuntimeError("[TASK_FAILED] executor lost\nValueError: x")
    assert unwrapped(plain) is plain


def test_an_error_class_that_needs_more_than_a_message_is_a_kompaktor_error() -> None:
    got = unwrapped(RuntimeError("kompaktor.model.errors.ConditionFailed: rejected: write new\n"))
    assert type(got) is KompaktorError and str(got) == "rejected: write new"


def test_a_count_option_is_a_whole_number_of_at_least_one_or_a_one_line_refusal() -> None:
    assert count_option({}, "piece_entries", 7) == 7
    assert count_option({"piece_entries": "50"}, "piece_entries", 7) == 50
    for bad in ("0", "-3", "1e6", "many"):
        said = f"option piece_entries: {bad!r} is not a whole number of at least 1"
        with pytest.raises(KompaktorError, match=f"^{re.escape(said)}$"):
            count_option({"piece_entries": bad}, "piece_entries", 7)
