"""The one mapping of redis-py's errors to Kompaktor's (kompaktor.connection.redis_errors), as a
``with`` block and as a decorator, and that both Redis adapters — the metadata store and the job
queues — raise through it. No server: the errors are raised by hand."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from kompaktor.connection import redis_errors
from kompaktor.metadata.store import MetadataStore
from kompaktor.model.errors import Fenced, StoreUnavailable
from kompaktor.queues.jobqueue import JobQueues

URL = "redis://:secret@127.0.0.1:6390/0"


@pytest.mark.parametrize(
    ("exc", "kind", "text"),
    [
        (redis.ConnectionError("Error 111 connecting"), StoreUnavailable, "is unreachable: Error 111 connecting"),
        (redis.TimeoutError("Timeout reading"), StoreUnavailable, "is unreachable: Timeout reading"),
        (redis.AuthenticationError("invalid password"), StoreUnavailable, "refused the credentials"),
        (redis.ResponseError("NOAUTH Authentication required."), StoreUnavailable, "requires a password"),
        (redis.ResponseError("DB index is out of range"), StoreUnavailable, "has no such database"),
        (redis.ResponseError("FENCED fencing token 3 is stale"), Fenced, "FENCED fencing token 3 is stale"),
    ],
)
def test_what_a_redis_error_means_is_raised_in_its_place(exc: Exception, kind: type, text: str) -> None:
    with pytest.raises(kind, match=text) as info, redis_errors("the queues' address"):
        raise exc
    assert info.value.__cause__ is exc


def test_the_url_is_redacted_and_a_replica_is_named() -> None:
    with pytest.raises(StoreUnavailable) as info, redis_errors(URL, url=URL):
        raise redis.ConnectionError("Error 111 connecting")
    assert "secret" not in str(info.value) and "redis://***@127.0.0.1:6390/0" in str(info.value)
    with pytest.raises(StoreUnavailable, match="is a read-only replica"), redis_errors(URL, url=URL):
        raise redis.ReadOnlyError("READONLY You can't write against a read only replica.")


def test_other_errors_pass_unchanged() -> None:
    other = redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value")
    with pytest.raises(redis.ResponseError) as info, redis_errors("x"):
        raise other
    assert info.value is other
    with pytest.raises(KeyError), redis_errors("x"):
        raise KeyError("k")
    with redis_errors("x"):
        pass


def test_as_a_decorator() -> None:
    @redis_errors("the queues' address")
    def op(fail: bool) -> str:
        if fail:
            raise redis.ConnectionError("down")
        return "ok"

    assert op(False) == "ok"
    with pytest.raises(StoreUnavailable, match="Redis at the queues' address is unreachable: down"):
        op(True)


class _Down:
    """A redis client whose every command fails as when the server is gone."""

    def register_script(self, source: str) -> Any:
        return object()

    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any, **kwargs: Any) -> Any:
            raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:6390. Connection refused.")

        return fail


def test_both_adapters_raise_through_it() -> None:
    store = MetadataStore(_Down(), URL)  # type: ignore[arg-type]
    with pytest.raises(StoreUnavailable, match=r"Redis at redis://\*\*\*@127.0.0.1:6390/0 is unreachable"):
        store.bookkeeping.counters()
    with pytest.raises(StoreUnavailable, match="Redis at the given URL is unreachable"):
        MetadataStore(_Down()).tables.table_id("t")  # type: ignore[arg-type]
    queues = JobQueues(_Down())  # type: ignore[arg-type]
    with pytest.raises(StoreUnavailable, match="Redis at the queues' address is unreachable"):
        queues.max_size()
