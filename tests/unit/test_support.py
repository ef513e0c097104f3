"""The shared test helpers (tests/support) do what the tiers rely on: a poll returns the first
truthy value and fails naming what it waited for; the entry builder's defaults."""

from __future__ import annotations

import asyncio

import pytest

from kompaktor.model.keys import Entry, sort_key
from tests.support.entries import entries
from tests.support.wait import PollTimeout, apoll, poll


def test_poll_returns_the_first_truthy_value_and_counts_ignored_errors_as_not_yet() -> None:
    calls = iter([KeyError("not yet"), 0, "ready", "later"])

    def check() -> object:
        got = next(calls)
        if isinstance(got, Exception):
            raise got
        return got

    assert poll(check, "ready", timeout=5, every=0.001, ignore=KeyError) == "ready"


def test_poll_fails_naming_what_it_waited_for_and_the_last_error() -> None:
    def check() -> None:
        raise KeyError("missing")

    with pytest.raises(PollTimeout, match=r"waiting for the thing: KeyError\('missing'\)") as info:
        poll(check, "the thing", timeout=0.05, every=0.01, ignore=KeyError)
    assert isinstance(info.value, AssertionError) and isinstance(info.value, TimeoutError)


def test_poll_does_not_swallow_an_error_it_was_not_told_to_ignore() -> None:
    def check() -> None:
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        poll(check, "x", timeout=5, ignore=KeyError)


def test_apoll_lets_the_event_loop_run_while_it_waits() -> None:
    async def scenario() -> str:
        done: list[str] = []
        loop = asyncio.get_running_loop()
        loop.call_later(0.02, done.append, "set by the loop")
        return await apoll(lambda: done and done[0], "the callback", timeout=5, every=0.005)

    assert asyncio.run(scenario()) == "set by the loop"


def test_entries_defaults_and_options() -> None:
    assert entries(range(2), 3) == [
        Entry(b"row00000", b"f", b"q", b"", 1003, False, b"v3-0"),
        Entry(b"row00001", b"f", b"q", b"", 1003, False, b"v3-1"),
    ]
    built = entries(30, prefix="r", width=3, cq=lambda r: b"q%d" % (r % 2), ts=7, deleted=lambda r: r % 10 == 0)
    assert [e.row for e in built[:2]] == [b"r000", b"r001"] and {e.ts for e in built} == {7}
    assert [e.row for e in built if e.deleted] == [b"r000", b"r010", b"r020"]
    assert built == sorted(built, key=sort_key)
