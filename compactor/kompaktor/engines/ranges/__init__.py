"""Key-range merge planning and reading, shared by every engine.

A merge is cut into **key ranges on row boundaries**: ``(lo, hi]`` row intervals chosen so that
every range holds about the same number of entries. A column key's versions share its row, so
no range boundary ever separates them, and each range can be merged on its own: read the rows in
``(lo, hi]`` from every input, merge and apply the iterator stack with
:mod:`kompaktor.files.arrowstack`. Concatenating the ranges in order gives exactly
``merged_view`` of the whole inputs.

Neither planning nor reading depends on how the inputs were cut into row groups:

- **Planning** starts from the footers' row-group statistics (min/max ``row``, entries, bytes).
  A row group too big to be a good cut granularity (Spark and Hive write 128 MB row groups; a
  file may be one row group) is *sampled*: only its ``row`` column is read, in batches, and each
  batch becomes a segment (first row, last row, entries) — a fraction of the cost of decoding
  the row group, and only done when the merge needs more than one range.
- **Reading** (:class:`InputCursor`) streams each row group in record batches
  (``ParquetFile.iter_batches``), so a range takes only the rows it needs and an input's memory
  is bounded by the range plus one batch, never by the row-group size.

Statistics only decide the balance of the cut, never correctness; a row group whose rows fall
outside what its footer claims is refused (:class:`BadFileError`), and so is a file whose rows
decrease anywhere (inside a row group or across row groups).

One module per job, this package re-exporting their public names:

- :mod:`.inputs`: the inputs' footers (:class:`InputMeta`, :func:`inspect_inputs`) and
  :func:`~.inputs.reading`, the one place where a failed read becomes a :class:`BadFileError`;
- :mod:`.sampling`: segments of the row groups too big to cut at (:func:`refine_inputs`);
- :mod:`.planning`: the cut into ranges (:func:`plan_ranges`, :func:`plan`);
- :mod:`.cursor`: reading and merging a range (:class:`InputCursor`, :func:`merge_range`);
- :mod:`.copies`: the row groups copied through unchanged (:func:`plan_copies`, :func:`copy_run`);
- :mod:`.progress`: opening a merge and its progress report (:func:`open_merge`, :func:`progress_dict`).
"""

from __future__ import annotations

from kompaktor.engines.ranges.copies import COPY_MIN_BYTES, Copied, CopyRun, Piece, copy_run, plan_copies
from kompaktor.engines.ranges.cursor import (
    BATCH_ROWS,
    MERGE_FACTOR,
    OBJECT_STORE_READ_OPTIONS,
    READ_OPTIONS,
    TASK_MEMORY,
    InputCursor,
    TaskMemoryExceeded,
    merge_range,
    read_range,
)
from kompaktor.engines.ranges.inputs import RANGE_BYTES, Bound, InputMeta, estimate_entries, inspect_inputs
from kompaktor.engines.ranges.planning import plan, plan_ranges
from kompaktor.engines.ranges.progress import open_merge, progress_dict
from kompaktor.engines.ranges.sampling import SAMPLE_SHARE, SEGMENT_ROWS_MAX, SEGMENT_ROWS_MIN, refine_inputs

__all__ = [
    "BATCH_ROWS",
    "Copied",
    "COPY_MIN_BYTES",
    "CopyRun",
    "MERGE_FACTOR",
    "OBJECT_STORE_READ_OPTIONS",
    "Piece",
    "RANGE_BYTES",
    "READ_OPTIONS",
    "SAMPLE_SHARE",
    "SEGMENT_ROWS_MAX",
    "SEGMENT_ROWS_MIN",
    "TASK_MEMORY",
    "Bound",
    "InputCursor",
    "InputMeta",
    "TaskMemoryExceeded",
    "copy_run",
    "estimate_entries",
    "inspect_inputs",
    "merge_range",
    "open_merge",
    "plan",
    "plan_copies",
    "plan_ranges",
    "progress_dict",
    "read_range",
    "refine_inputs",
]
