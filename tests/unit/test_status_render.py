"""`kompaktor status` as a person reads it (``metadata.status.render``): the lines scripts parse
stay byte for byte what they were, and a running resumable merge adds its own line, last."""

from __future__ import annotations

import copy
import io
from typing import Any

from rich.console import Console

from kompaktor.metadata.status import human_bytes, render, resumable_line

STATUS: dict[str, Any] = {
    "groups": {
        "large": {
            "queued": 2,
            "running": 1,
            "depth": 3,
            "compactors": 1,
            "busy": 1,
            "draining": 0,
            "oldest_queued_age_s": 12.345,
            "rejected": 0,
            "dead_compactions_recovered": 1,
            "compactions_committed": 7,
            "dead_lettered": 0,
        },
        "small": {
            "queued": 0,
            "running": 1,
            "depth": 1,
            "compactors": 2,
            "busy": 1,
            "draining": 0,
            "oldest_queued_age_s": 0.0,
            "rejected": 0,
            "dead_compactions_recovered": 0,
            "compactions_committed": 41,
            "dead_lettered": 1,
        },
    },
    "tables": {
        "t": {
            "id": "1",
            "state": "ONLINE",
            "tablets": 2,
            "files": 9,
            "files_per_tablet": {"min": 4, "median": 4.5, "max": 5, "histogram": {"4": 1, "5": 1}},
            "running_compactions": 2,
            "entries": 1000,
        }
    },
    "user_compactions": [
        {"id": "UC-000001", "table": "t", "state": "RUNNING", "tablets_done": 1, "tablets_total": 2, "message": ""}
    ],
    "dead_letters": {},
    "retries_pending": 1,
    "counters": {},
}

#: what `kompaktor status` printed for STATUS before resumable merges were shown (rendered by the
#: code of main at c8aee70, 100 columns)
BEFORE = (
    "                                          compactor groups                                          \n"
    "┏━━━━━━━┳━━━━━━━━┳━━━━━━━━━┳━━━━━━━━━━━━┳━━━━━━┳━━━━━━━━━━━━┳━━━━━━━━━━━┳━━━━━━━━━━━━━┳━━━━━━━━━━━━┓\n"
    "┃       ┃        ┃         ┃            ┃      ┃     oldest ┃           ┃        dead ┃            ┃\n"
    "┃ group ┃ queued ┃ running ┃ compactors ┃ busy ┃     queued ┃ committed ┃   recovered ┃ dead-lett… ┃\n"
    "┡━━━━━━━╇━━━━━━━━╇━━━━━━━━━╇━━━━━━━━━━━━╇━━━━━━╇━━━━━━━━━━━━╇━━━━━━━━━━━╇━━━━━━━━━━━━━╇━━━━━━━━━━━━┩\n"
    "│ large │      2 │       1 │          1 │    1 │      12.3s │         7 │           1 │          0 │\n"
    "│ small │      0 │       1 │          2 │    1 │       0.0s │        41 │           0 │          1 │\n"
    "└───────┴────────┴─────────┴────────────┴──────┴────────────┴───────────┴─────────────┴────────────┘\n"
    "                                   tables                                   \n"
    "┏━━━━━━━┳━━━━━━━━┳━━━━━━━━━┳━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━┓\n"
    "┃ table ┃ state  ┃ tablets ┃ files ┃ files/tablet min·median·max ┃ running ┃\n"
    "┡━━━━━━━╇━━━━━━━━╇━━━━━━━━━╇━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━┩\n"
    "│ t     │ ONLINE │ 2       │ 9     │ 4·4.5·5                     │ 2       │\n"
    "└───────┴────────┴─────────┴───────┴─────────────────────────────┴─────────┘\n"
    "failed jobs waiting out their backoff before a retry: 1\n"
    "                    user compactions                    \n"
    "┏━━━━━━━━━━━┳━━━━━━━┳━━━━━━━━━┳━━━━━━━━━━━━━━┳━━━━━━━━━┓\n"
    "┃ id        ┃ table ┃ state   ┃ tablets done ┃ message ┃\n"
    "┡━━━━━━━━━━━╇━━━━━━━╇━━━━━━━━━╇━━━━━━━━━━━━━━╇━━━━━━━━━┩\n"
    "│ UC-000001 │ t     │ RUNNING │ 1/2          │         │\n"
    "└───────────┴───────┴─────────┴──────────────┴─────────┘\n"
)

RESUMABLE = {
    "ecid": "ECID-7",
    "table": "t",
    "tablet": "1;m",
    "group": "large",
    "compactor": "c-1",
    "input_bytes": 10 << 30,
    "parts_done": 30,
    "parts": 40,
    "parts_reused": 24,
    "entries_reused": 2_400_000,
    "bytes_reused": 6 << 30,
    "input_bytes_reread": 3 << 30,
    "parts_rejected": 1,
}


def text(status: dict[str, Any]) -> str:
    buf = io.StringIO()
    Console(file=buf, width=100, color_system=None, force_terminal=False).print(render(status))
    return buf.getvalue()


def test_without_a_resumable_merge_the_output_is_what_it_was() -> None:
    assert text(STATUS) == BEFORE


def test_a_resumable_merge_adds_its_line_after_everything_else() -> None:
    status = copy.deepcopy(STATUS)
    status["resumable_merges"] = [RESUMABLE, {**RESUMABLE, "ecid": "ECID-8", "parts_reused": 0, "bytes_reused": 0}]
    out = text(status)
    assert out.startswith(BEFORE)
    added = out.removeprefix(BEFORE)
    # one paragraph per merge, each starting a line (rich wraps it at the terminal's width)
    assert sum(line.startswith("resumable merge ECID-") for line in added.splitlines()) == 2
    assert " ".join(added.split()) == " ".join(resumable_line(r) for r in status["resumable_merges"])
    assert resumable_line(RESUMABLE) == (
        "resumable merge ECID-7 on t (group large, compactor c-1): 30/40 parts done, 24 reused (6.0 GiB of "
        "input not read again), 1 rejected; input re-read 3.0 GiB of 10.0 GiB"
    )


def test_human_bytes() -> None:
    assert [human_bytes(n) for n in (0, 1023, 1024, 1536, 5 << 20, 3 << 30, 2 << 50, 5000 << 50)] == [
        "0 B",
        "1023 B",
        "1.0 KiB",
        "1.5 KiB",
        "5.0 MiB",
        "3.0 GiB",
        "2.0 PiB",
        "5000.0 PiB",
    ]
