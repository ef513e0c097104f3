"""``kompaktor import --set-time``: every imported entry gets the import's time, as Apache
Accumulo's bulk import with ``tableTime`` does, so no imported put is older than a delete marker a
full compaction already dropped (:mod:`kompaktor.policy.deletes`).

Giving every version of a key the same time would change what the file itself says (a put newer
than a delete marker of its key would sort after it and be hidden by it; versions of one time
cannot be told apart). So each key (row, cf, cq, vis) keeps only its newest entry in the file — a
put, or a delete marker, which then hides the key's older data in the table — stamped with the
import's time. The input must be in key order (checked as for any import, across batches); the
output is too.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kompaktor.files.sortedfile import _key_at, check_sorted, conform, show_key
from kompaktor.model.errors import UnsortedError
from kompaktor.model.keys import SortKey

KEY_COLUMNS = ("row", "cf", "cq", "vis")


def _group_starts(table: pa.Table) -> np.ndarray:
    """Whether each row starts a new key (row, cf, cq, vis), as a boolean array."""
    n = table.num_rows
    starts = np.ones(n, dtype=bool)
    if n > 1:
        differs = np.zeros(n - 1, dtype=bool)
        for name in KEY_COLUMNS:
            col = table.column(name)
            differs |= pc.not_equal(col.slice(1), col.slice(0, n - 1)).to_numpy(zero_copy_only=False)
        starts[1:] = differs
    return starts


def own_view(table: pa.Table, ts: int) -> pa.Table:
    """``table`` (sorted, whole key groups) reduced to each key's newest entry, stamped ``ts``."""
    if table.num_rows == 0:
        return table
    out = table.filter(pa.array(_group_starts(table)))
    return out.set_column(out.schema.get_field_index("ts"), "ts", pa.array(np.full(out.num_rows, ts), pa.int64()))


class TimeSetter:
    """Feeds an import's batches through :func:`own_view`; a key whose versions continue into the
    next batch is held back until its last version is seen."""

    def __init__(self, ts: int, source: str) -> None:
        self.ts = ts
        self.source = source
        self._rows = 0
        self._last: SortKey | None = None
        self._tail: pa.Table | None = None

    def feed(self, batch: pa.Table) -> pa.Table:
        """The rows of whole keys seen so far, restamped; the last key waits for :meth:`finish`."""
        table = conform(batch, self.source)
        if table.num_rows == 0:
            return table
        check_sorted(table, self.source, self._rows)
        if self._last is not None and _key_at(table, 0) < self._last:
            raise UnsortedError(
                f"{self.source}: entries are not in key order at row {self._rows}: "
                f"{show_key(self._last)} then {show_key(_key_at(table, 0))}"
            )
        self._rows += table.num_rows
        self._last = _key_at(table, table.num_rows - 1)
        if self._tail is not None:
            table = pa.concat_tables([self._tail, table])
        held = int(np.flatnonzero(_group_starts(table))[-1])
        self._tail = table.slice(held)
        return own_view(table.slice(0, held), self.ts)

    def finish(self) -> pa.Table | None:
        """The last key's rows, restamped (None when nothing was fed)."""
        tail, self._tail = self._tail, None
        return None if tail is None else own_view(tail, self.ts)
