"""Issue 27 §1: nothing in the coordinator reads or pops a structure that grows with the instance
in one call. Redis runs one command at a time; a ZRANGE over a million tablets, or an SPOP of a
million dirty marks, holds every compactor's commit up for as long as it runs. A full scan of a
table with 2.5 chunks of tablets is recorded by Redis' own SLOWLOG (every command, with its
arguments) and each call's size checked."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from kompaktor.coordinator import Coordinator
from kompaktor.files.storage import Storage
from kompaktor.metadata.store import MetadataStore, StoreCore

pytestmark = pytest.mark.redis

CHUNK = 1_000


def test_a_full_scan_reads_tablets_and_dirty_marks_in_bounded_calls(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(StoreCore, "scan_chunk", CHUNK)  # the same code, at a size a test can make
    store = MetadataStore.from_url(redis_url)
    tid = store.tables.create_table("big", [b"%06d" % i for i in range(1, 2500)])
    store.bookkeeping.mark_dirty(store.tables.tablet_ids(tid))
    raw = redis.Redis.from_url(redis_url)
    raw.config_set("slowlog-max-len", 100_000)
    raw.config_set("slowlog-log-slower-than", 0)  # every command
    raw.slowlog_reset()
    try:
        coord = Coordinator(store, Storage.from_uri(str(tmp_path / "files")))
        assert coord.tick()
        log = raw.slowlog_get(100_000)
    finally:
        raw.config_set("slowlog-log-slower-than", 10_000)
        raw.slowlog_reset()
    assert raw.scard("kz:dirty") == 0
    ranges = []
    for e in log:
        args = e["command"].split()
        if args[0].upper() == b"ZRANGE" and args[1].endswith(b":tablets") and args[1].startswith(b"kz:table:"):
            start, stop = int(args[2]), int(args[3])
            assert stop >= 0 and stop - start + 1 <= CHUNK, e["command"]
            ranges.append(start)
        assert b"SPOP" not in e["command"] or b"1000000" not in e["command"], e["command"]
        if args[0].upper() == b"MGET":
            assert len(args) - 1 <= CHUNK, len(args)
    assert {0, CHUNK, 2 * CHUNK} <= set(ranges)  # the table's 2,500 tablets, three calls a time
    assert len(store.tables.tablet_ids(tid)) == 2500
