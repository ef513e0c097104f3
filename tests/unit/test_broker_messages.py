"""The broker's requests as types: each one parses from the wire 0.2.0's compactors send (a
rolling upgrade has them talk to a newer broker), goes back to the same document, and a request
the broker does not know, or with an argument of the wrong shape, is refused in one line."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest

from kompaktor.metadata import broker_messages as m
from kompaktor.model.resume import PartRecord
from kompaktor.model.tablet import FileMeta

HELD = {"ecid": "ECID-1", "cap": "secret"}
HIST = {"op": "history", **HELD, "outcome": "failed", "figures": {}, "max_records": 10, "max_age_s": 60}
META = FileMeta(100, 10, 1, b"a", b"z", 5, 7)
PART = PartRecord(0, "tables/1/P1.parquet", None, b"m", 30, 3, 900, 10, "0" * 64).to_json()

#: each request as 0.2.0's metadata/brokered.py put it on the wire (besides op, reply and exp)
WIRE_0_2_0: dict[str, dict[str, Any]] = {
    "reserve": {"group": "g", "token": None, "compactor": "c1"},
    "register": {"group": "g", "compactor": "c1", "state": "busy", "ecid": "ECID-1", "token": "t"},
    "unregister": {"group": "g", "compactor": "c1", "keep": True, "token": None},
    "mark_drained": {"group": "g", "token": None, "compactor": "c1"},
    "count_written": {"n": 4096},
    "heartbeat": {**HELD, "progress": {"entries_read": "10", "phase": "merge"}},
    "commit": {**HELD, "meta": META.to_json()},
    "release": dict(HELD),
    "failure": {**HELD, "reason": "boom"},
    "drop_heartbeat": dict(HELD),
    "progress_start": {**HELD, "fp": "f" * 64, "cuts": [[None, "6d"], ["6d", None]], "now_ms": 1234},
    "progress_part": {**HELD, "fp": "f" * 64, "part": PART},
    "progress_drop": {**HELD, "fp": "f" * 64, "index": 2},
    "progress_forget": {**HELD, "fp": "f" * 64},
}

#: the requests this release added (a broker of 0.2.0 refuses them as unknown)
WIRE_NEW: dict[str, dict[str, Any]] = {
    "history": {
        **HELD,
        "outcome": "committed",
        "reason": "",
        "engine": "arrow",
        "figures": {"input_entries": 120, "output_bytes": 900, "merge_s": 1.5, "queued_s": None, "resumed_parts": 2},
        "max_records": 100,
        "max_age_s": 3600.0,
    },
}
WIRE = {**WIRE_0_2_0, **WIRE_NEW}


def _wire(op: str, args: dict[str, Any]) -> str:
    return json.dumps({"op": op, "reply": "r" * 32, "exp": 99.5, **args})


def test_every_operation_has_a_type() -> None:
    assert set(m.REQUESTS) == set(WIRE)


@pytest.mark.parametrize("op", sorted(WIRE))
def test_a_request_of_the_previous_release_parses_and_goes_back_unchanged(op: str) -> None:
    got = m.envelope(_wire(op, WIRE[op]))
    assert got is not None
    env, doc = got
    assert env == m.Envelope("r" * 32, 99.5)
    req = m.decode(doc)
    assert type(req) is m.REQUESTS[op] and req.op == op
    again = json.loads(m.encode(req, env))
    assert again["op"] == op and again["reply"] == env.reply
    sent = {k: v for k, v in WIRE[op].items() if not (k == "token" and v is None)}
    if op == "history":  # the figures not given go out as not known
        sent["figures"] = {**dict.fromkeys(f.name for f in dataclasses.fields(m.Figures)), **sent["figures"]}
    assert {k: v for k, v in again.items() if k in sent} == sent


def test_a_history_record_carries_what_only_its_compactor_measured() -> None:
    """The figures are the history record's fields of the same names; the broker sets the rest."""
    from kompaktor.metadata.history import OUTCOMES, Record

    record_fields = {f.name for f in dataclasses.fields(Record)}
    assert {f.name for f in dataclasses.fields(m.Figures)} <= record_fields
    assert set(m.REPORTED) == set(OUTCOMES) - {"killed"}
    req = m.decode({"op": "history", **WIRE["history"]})
    assert req == m.History(
        "ECID-1", "secret", "committed", "", "arrow", m.Figures(120, 900, None, None, None, 1.5, None, 2), 100, 3600.0
    )


def test_a_heartbeat_keeps_bounded_fields_and_drops_the_ones_the_broker_sets() -> None:
    progress = {"compactor": "spoof", "updated": "0", "k" * 100: "v" * 300}
    req = m.decode({"op": "heartbeat", **HELD, "progress": progress})
    assert isinstance(req, m.Heartbeat)
    assert req.progress == {"k" * m.PROGRESS_KEY_MAX: "v" * m.PROGRESS_VALUE_MAX}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"op": "drop_tables"}, "unknown request 'drop_tables'"),
        ({"op": 7}, "unknown request 7"),
        ({}, "unknown request None"),
        ({"op": "register", "group": "g", "compactor": "c", "state": "root", "ecid": None}, "bad compactor state"),
        ({"op": "reserve", "group": "", "compactor": "c"}, "bad group"),
        ({"op": "reserve", "group": "g", "compactor": "x" * 300}, "bad compactor id"),
        ({"op": "count_written", "n": -1}, "bad byte count"),
        ({"op": "count_written", "n": True}, "bad byte count"),
        ({"op": "commit", "ecid": "E"}, "needs its ECID and its holder's secret"),
        ({"op": "commit", **HELD, "meta": {"size": 1}}, "bad file description"),
        ({"op": "heartbeat", **HELD, "progress": {str(i): i for i in range(40)}}, "bad progress"),
        ({"op": "progress_drop", **HELD, "fp": "f", "index": "2"}, "bad part index"),
        ({"op": "progress_forget", **HELD}, "needs the record's fingerprint"),
        ({"op": "progress_start", **HELD, "fp": "f", "cuts": 3, "now_ms": 1}, "bad cuts"),
        ({**HIST, "outcome": "killed"}, "bad outcome 'killed': a compactor reports one of committed"),
        ({**HIST, "outcome": None}, "bad outcome None"),
        ({**HIST, "max_records": 0}, "bad history bounds"),
        ({**HIST, "max_age_s": "1"}, "bad history bounds"),
        ({**HIST, "figures": {"output_bytes": -1}}, "bad output_bytes in a history record: -1"),
        ({**HIST, "figures": {"merge_s": "fast"}}, "bad merge_s in a history record"),
        ({**HIST, "figures": {"group": "other"}}, "bad figures in a history record"),
        ({**HIST, "figures": {"resumed_parts": None}}, "bad resumed_parts"),
        ({**HIST, "engine": "x" * 300}, "bad engine"),
    ],
)
def test_a_bad_request_is_refused_in_one_line(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(m.Refused, match=re.escape(message)) as err:
        m.decode(doc)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("raw", ["not json", "{}", '{"reply": "short", "exp": 1}', '{"reply": 5, "exp": 1}'])
def test_a_request_with_nowhere_to_answer_is_malformed(raw: str) -> None:
    assert m.envelope(raw) is None
