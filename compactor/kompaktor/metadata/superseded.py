"""Whether a data file adds anything to a table's view: what a restore counts instead of listing
(docs/backup.md "What a restore reports").

After a restore, storage holds files the restored tablets do not reference: inputs of
compactions committed before the backup but not yet collected, compaction outputs and writes
from after it. Which of them were written before or after the backup says nothing about
whether their content is lost (a flush written before the backup but registered after it is a
real write), so the decision is made by content: a file is **superseded** when every entry of
it is present in, or hidden by, the view of the tablets it overlaps —

- a put: the same column key and timestamp is there; or a delete marker of the key at or after
  its timestamp; or at least ``table.iterator.versions`` newer puts of the key (the versioning
  iterator drops it, and no later write can show it again while they are there);
- a delete marker: a marker of the key at or after its timestamp is there;
- either, when the table keeps deletes (the default): its timestamp is at or before the tablet's
  delete horizon. A full compaction dropped markers up to the horizon together with the puts they
  hid, so such a put cannot be told from one that was deleted; and none can be added again (a
  flush or import of it is refused: :mod:`kompaktor.policy.deletes`), which also makes such a
  marker redundant.

Every file a compaction read before the backup passes this test (its entries went into the
output, or were dropped for one of these reasons); a write the view lacks does not.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator

from kompaktor.files.sortedfile import iter_entries
from kompaktor.files.storage import Storage
from kompaktor.model.keys import Entry, SortKey, sort_key
from kompaktor.model.names import file_order_key
from kompaktor.model.tablet import Tablet

_VIEW = -1  # the tag of the view's entries; a candidate's is its index


def adding(storage: Storage, t: Tablet, candidates: list[str], *, max_versions: int, keeps_deletes: bool) -> set[str]:
    """Those of ``candidates`` that hold an entry the view of tablet ``t`` lacks, in one pass over
    the tablet's files and theirs (a restore checks many files against the same tablets)."""
    horizon = t.horizon if keeps_deletes else None
    sources = [_tagged(iter_entries(storage, rel, t.prev, t.end), i) for i, rel in enumerate(candidates)]
    sources += [
        _tagged(iter_entries(storage, p, t.prev, t.end), _VIEW)
        for p in sorted(t.files, key=file_order_key)
        if p not in candidates
    ]
    found: set[int] = set()
    for _ck, group in itertools.groupby(heapq.merge(*sources, key=lambda x: x[0]), key=lambda x: x[0][:4]):
        found |= _adders([(tag, e) for _k, tag, e in group], max_versions, horizon)
        if len(found) == len(candidates):
            break
    return {candidates[i] for i in found}


def _tagged(entries: Iterator[Entry], tag: int) -> Iterator[tuple[SortKey, int, Entry]]:
    for e in entries:
        yield sort_key(e), tag, e


def _adders(group: list[tuple[int, Entry]], max_versions: int, horizon: int | None) -> set[int]:
    """The rules of the module's docstring, for the entries of one column key: the tags of the
    candidates with an entry the view lacks."""
    puts = {e.ts for tag, e in group if tag == _VIEW and not e.deleted}
    marker = max((e.ts for tag, e in group if tag == _VIEW and e.deleted), default=None)
    out = set()
    for tag, e in group:
        if tag == _VIEW or tag in out or (horizon is not None and e.ts <= horizon):
            continue
        if marker is not None and e.ts <= marker:
            continue  # hidden by a marker of the view (or one at least as new)
        if e.deleted or (e.ts not in puts and sum(1 for ts in puts if ts > e.ts) < max_versions):
            out.add(tag)
    return out
