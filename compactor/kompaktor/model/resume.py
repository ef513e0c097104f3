"""Resumable merges (docs/architecture.md "Long merges resume"): what identifies a job across attempts, and what a merge
records of its finished key ranges. Pure: the Redis side is :mod:`kompaktor.metadata.progress`,
the engines' side :mod:`kompaktor.engines.resume`.

A merge is cut into key ranges written as ordered parts. A resumable merge records each finished
part durably (:class:`PartRecord`: path, key range, entries, size, SHA-256) under the job's
**fingerprint** (:func:`job_fingerprint`), together with the range cuts it used. A later attempt
of the same job — same tablet and range, same input files and sizes, same kind and selection,
same iterator settings, same output format — computes the same fingerprint, finds the record,
uses the recorded cuts (whatever engine or range size picks it up), reuses every part it can
verify and merges only the rest. A changed job has another fingerprint and simply does not
match; its old record is discarded by the compactor or the garbage collector.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Protocol

from kompaktor.model.iterators import IteratorSettings

#: the output format a part is written in (Parquet, the file schema, zstd, the writer's row-group
#: size); part of the fingerprint, so a compactor writing another format never reuses old parts.
#: Bump it when :mod:`kompaktor.files.sortedfile`'s encoding changes.
PART_FORMAT = "parquet-zstd-v1"
#: hex digits of the fingerprint in a part's name (128 bits)
TAG_HEX = 32

Bound = bytes | None


def _hex(b: Bound) -> str | None:
    return None if b is None else b.hex()


def _unhex(s: str | None) -> Bound:
    return None if s is None else bytes.fromhex(s)


def job_fingerprint(
    tablet: str,
    prev: Bound,
    end: Bound,
    files: Mapping[str, int],
    kind: str,
    selection: str | None,
    settings: IteratorSettings,
    part_format: str = PART_FORMAT,
) -> str:
    """SHA-256 (hex) over everything the merged output depends on. ``settings.now_ms`` is left
    out (it is the reservation's clock, different for every attempt): the record keeps the first
    attempt's and a resumed merge adopts it, so every range of one output has the same age-off
    cut."""
    its = asdict(settings)
    its.pop("now_ms")
    doc = {
        "tablet": tablet,
        "range": [_hex(prev), _hex(end)],
        "files": sorted([p, int(s)] for p, s in files.items()),
        "kind": kind,
        "selection": selection,
        "settings": {k: (v.hex() if isinstance(v, bytes) else v) for k, v in sorted(its.items())},
        "format": part_format,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True)
class PartRecord:
    """One finished key range (lo, hi] of a merge, written as the part file ``path``."""

    index: int
    path: str
    lo: Bound
    hi: Bound
    entries_read: int  # input entries merged into it
    entries: int  # entries in the part
    input_bytes: int  # compressed input bytes decoded to merge it (the row groups read)
    size: int  # bytes of the part file
    sha256: str  # of the part file's bytes

    def to_json(self) -> str:
        d = asdict(self)
        d["lo"], d["hi"] = _hex(self.lo), _hex(self.hi)
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> PartRecord:
        d = json.loads(text)
        d["lo"], d["hi"] = _unhex(d["lo"]), _unhex(d["hi"])
        return cls(**d)


@dataclass(frozen=True)
class ResumeState:
    """What an earlier attempt recorded: its cuts (ranges, in order), its clock and its parts."""

    cuts: tuple[tuple[Bound, Bound], ...]
    now_ms: int
    parts: dict[int, PartRecord] = field(default_factory=dict)


def encode_cuts(ranges: Iterable[tuple[Bound, Bound]]) -> list[list[str | None]]:
    return [[_hex(lo), _hex(hi)] for lo, hi in ranges]


def decode_cuts(doc: list[list[str | None]]) -> tuple[tuple[Bound, Bound], ...]:
    return tuple((_unhex(lo), _unhex(hi)) for lo, hi in doc)


def cuts_valid(cuts: tuple[tuple[Bound, Bound], ...], prev: Bound, end: Bound) -> bool:
    """Whether recorded cuts tile (prev, end] in order (a record from another job, or damaged,
    is not used)."""
    if not cuts or cuts[0][0] != prev or cuts[-1][1] != end:
        return False
    for (_lo, hi), (lo2, hi2) in itertools.pairwise(cuts):
        if hi != lo2 or hi is None or (hi2 is not None and hi2 <= hi):
            return False
    return cuts[0][1] is None or prev is None or cuts[0][1] > prev


class ResumeLog(Protocol):
    """Where a resumable merge keeps its progress (the compactor's: Redis, keyed by the job's
    fingerprint). Recording is best effort for the engine: a record that cannot be written only
    means that part is merged again by a later attempt."""

    fingerprint: str

    def load(self) -> ResumeState | None: ...

    def start(self, cuts: tuple[tuple[Bound, Bound], ...], now_ms: int) -> None: ...

    def record(self, part: PartRecord) -> None: ...

    def drop(self, index: int) -> None: ...
