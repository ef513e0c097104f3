"""Whether a file adds anything to a tablet's view (kompaktor.metadata.superseded; docs/backup.md
"What a restore reports"): each rule of the module on a file of one entry, against a view written
here, and decided the other way when the rule does not apply. No server: sorted files in a local
directory and tablets built here."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from kompaktor.files.sortedfile import SortedFileWriter
from kompaktor.files.storage import Storage
from kompaktor.metadata.superseded import adding
from kompaktor.model.keys import Entry
from kompaktor.model.tablet import Tablet


def put(row: bytes, ts: int) -> Entry:
    return Entry(row, b"f", b"q", b"", ts, False, b"v%d" % ts)


def delete(row: bytes, ts: int) -> Entry:
    return Entry(row, b"f", b"q", b"", ts, True, b"")


@pytest.fixture
def storage(tmp_path: Path) -> Storage:
    return Storage.from_uri(str(tmp_path / "files"))


_SEQ = itertools.count(1)


def _file(storage: Storage, prefix: str, entries: list[Entry]) -> str:
    w = SortedFileWriter(storage, f"tables/1/{prefix}{next(_SEQ):010x}.parquet")
    w.write_entries(sorted(entries, key=lambda e: (e.row, e.cf, e.cq, e.vis, -e.ts, not e.deleted)))
    return w.commit().path


def _adds(
    storage: Storage,
    view: list[Entry],
    candidate: list[Entry],
    *,
    versions: int = 1,
    horizon: int | None = None,
    keeps: bool = True,
) -> bool:
    rel = _file(storage, "F", candidate)
    return adding(storage, _tablet(storage, view, horizon), [rel], max_versions=versions, keeps_deletes=keeps) == {rel}


def _tablet(storage: Storage, view: list[Entry], horizon: int | None = None) -> Tablet:
    files = [_file(storage, "A", view)] if view else []
    return Tablet("1;", "1", None, None, dict.fromkeys(files), {}, None, None, None, 1, horizon)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "view, candidate, versions, horizon, expected",
    [
        ([put(b"a", 5)], [put(b"a", 5)], 1, None, False),  # present
        ([], [put(b"a", 5)], 1, None, True),  # missing
        ([delete(b"a", 7)], [put(b"a", 5)], 1, None, False),  # hidden by a newer marker
        ([delete(b"a", 5)], [put(b"a", 5)], 1, None, False),  # ... or one at its time
        ([delete(b"a", 4)], [put(b"a", 5)], 1, None, True),  # an older marker hides nothing
        ([put(b"a", 7)], [put(b"a", 5)], 1, None, False),  # one newer version, one kept
        ([put(b"a", 7)], [put(b"a", 5)], 2, None, True),  # ... two kept: it would show
        ([put(b"a", 7), put(b"a", 6)], [put(b"a", 5)], 2, None, False),
        ([put(b"b", 7)], [put(b"a", 5)], 1, None, True),  # another key's version hides nothing
        ([], [put(b"a", 5)], 1, 5, False),  # at the delete horizon: dropped with its marker
        ([], [put(b"a", 6)], 1, 5, True),  # after it
        ([delete(b"a", 9)], [delete(b"a", 8)], 1, None, False),  # a marker with a newer one there
        ([put(b"a", 9)], [delete(b"a", 8)], 1, None, True),  # a marker still hides older imports
        ([], [delete(b"a", 8)], 1, 8, False),  # a marker at the horizon: such puts are refused
    ],
)
def test_each_rule(
    storage: Storage, view: list[Entry], candidate: list[Entry], versions: int, horizon: int | None, expected: bool
) -> None:
    assert _adds(storage, view, candidate, versions=versions, horizon=horizon) is expected


def test_the_horizon_counts_only_where_deletes_are_kept(storage: Storage) -> None:
    """With table.delete.semantics=accumulo an old put written later shows: it is not superseded."""
    assert _adds(storage, [], [put(b"a", 5)], horizon=5, keeps=False) is True


def test_a_file_is_superseded_only_when_every_entry_is(storage: Storage) -> None:
    view = [put(b"a", 5), delete(b"c", 9)]
    assert _adds(storage, view, [put(b"a", 5), put(b"c", 3)]) is False
    assert _adds(storage, view, [put(b"a", 5), put(b"c", 3), put(b"d", 1)]) is True


def test_many_files_in_one_pass(storage: Storage) -> None:
    """What a restore does: every unreferenced file overlapping a tablet checked in one pass."""
    t = _tablet(storage, [put(b"a", 5), put(b"b", 7), delete(b"c", 9)])
    old = _file(storage, "F", [put(b"a", 5), put(b"b", 6), put(b"c", 2)])
    new = _file(storage, "F", [put(b"b", 8)])
    lost = _file(storage, "F", [put(b"a", 5), put(b"d", 1)])
    assert adding(storage, t, [old, new, lost], max_versions=1, keeps_deletes=True) == {new, lost}
