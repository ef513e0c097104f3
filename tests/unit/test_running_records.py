"""The failure records and heartbeats as the store reads them: typed at the Redis edge, read
from what Redis holds (JSON written by Lua's cjson; a hash of strings)."""

from __future__ import annotations

import json

from kompaktor.metadata.store.running import FailedJob, FailureRecord, Heartbeat, ResumeCounts


def test_a_failure_record_reads_what_lua_wrote_and_writes_it_back() -> None:
    # as lua/failures.lua stores it: cjson's key order, a whole number without a point
    stored = '{"redirtied":false,"files":["t/A.parquet","t/B.parquet"],"retry_at":1790000002.5,"group":"g",'
    stored += '"last_error":"boom","count":2,"tablet":"1;~"}'
    rec = FailureRecord.from_json(stored)
    assert rec == FailureRecord("1;~", "g", ("t/A.parquet", "t/B.parquet"), "boom", 2, 1790000002.5, False)
    assert json.dumps(rec.to_json(), sort_keys=True) == json.dumps(json.loads(stored), sort_keys=True)


def test_an_empty_file_list_from_cjson_reads_as_empty() -> None:
    rec = FailureRecord.from_json('{"tablet":"1;~","group":"g","files":{},"last_error":"","count":1,"retry_at":0}')
    assert rec.files == () and rec.redirtied is False


def test_a_failed_job_is_reported_in_the_scripts_argument_form() -> None:
    job = FailedJob("1;~", "g", ("a", "b"), "x")
    assert job.to_json() == {"tablet": "1;~", "group": "g", "files": ["a", "b"], "last_error": "x"}


def test_a_heartbeat_reads_its_figures_and_leaves_out_what_was_not_sent() -> None:
    hb = Heartbeat.from_fields(
        {"compactor": "c1", "updated": "1790000000.25", "bytes_read": "4096", "parts": "4.0", "parts_done": "x"}
    )
    assert (hb.compactor, hb.updated, hb.bytes_read, hb.parts) == ("c1", 1790000000.25, 4096, 4)
    assert hb.parts_done is None and hb.entries_read is None and hb.remaining_s is None and hb.resume is None
    assert Heartbeat.from_fields({}) == Heartbeat()


def test_a_resumable_merges_heartbeat_carries_its_resume_counts() -> None:
    fields = {"parts_reused": "3", "entries_reused": "30", "bytes_reused": "3000", "input_bytes_reread": "10"}
    assert Heartbeat.from_fields({**fields, "parts_rejected": "1"}).resume == ResumeCounts(3, 30, 3000, 10, 1)
    assert Heartbeat.from_fields(fields).resume == ResumeCounts(3, 30, 3000, 10, 0)
