"""``kompaktor.spark.write`` says a Kompaktor error that Spark wrapped with its traceback in the
error's own one line and class (docs/spark.md, "Writing")."""

from __future__ import annotations

from kompaktor.model.errors import KompaktorError, NotPermitted
from kompaktor.spark import unwrapped

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
