"""The in-process Arrow engine: the key ranges of the plan (:mod:`kompaktor.engines.ranges`)
merged one after the other in this process and streamed into the output file, so its memory is
bounded by the range size, not the job size. No per-job Spark overhead: for groups that hold
only small jobs. The Spark engine (:mod:`kompaktor.engines.spark`) runs the same ranges as Spark
tasks.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa

from kompaktor.engines.api import MergeCancelled, MergeRequest, MergeResult, ProgressFn
from kompaktor.engines.ranges import MERGE_FACTOR, TASK_MEMORY, Bound, InputCursor, open_merge, plan, progress_dict
from kompaktor.files.arrowstack import merge_tables
from kompaktor.files.sortedfile import SortedFileWriter
from kompaktor.files.storage import Storage

#: entries per key range for the in-process engine (bounds its memory: ~5x the range's data)
ARROW_RANGE_ENTRIES = 1_000_000


class ArrowMergeEngine:
    """In-process engine: the key ranges of the plan merged one after the other with Arrow."""

    name = "arrow"

    def __init__(self, range_entries: int = ARROW_RANGE_ENTRIES, task_memory: int = TASK_MEMORY) -> None:
        self.range_entries = range_entries
        #: bytes the merge may hold; one range's input data may take 1/MERGE_FACTOR of it, two
        #: ranges are in flight (one merging, one encoding)
        self.task_memory = task_memory

    def merge(
        self,
        storage: Storage,
        req: MergeRequest,
        *,
        progress: ProgressFn | None = None,
        cancel: threading.Event | None = None,
    ) -> MergeResult:
        started, metas, bytes_in = open_merge(storage, req, cancel)
        ranges = plan(storage, metas, req.prev, req.end, self.range_entries)
        budget = self.task_memory // (2 * MERGE_FACTOR)
        report = progress or (lambda d: None)
        read = written = 0
        report(progress_dict(0, 0, 0, 0, 0, len(ranges), started))
        cursors: list[InputCursor] = []

        def produce(hi: Bound) -> tuple[pa.Table, int]:
            tables: list[pa.Table] = []
            for c in cursors:
                tables.append(c.take(hi, budget - sum(t.nbytes for t in tables)))
            return merge_tables(tables, req.settings), sum(t.num_rows for t in tables)

        w = SortedFileWriter(storage, req.output, tmp_tag=req.tmp_tag)
        # one thread reads and merges range i+1 while this one encodes range i into the output
        # (both release the GIL): two ranges in memory at most
        ahead = ThreadPoolExecutor(1, thread_name_prefix="arrowmerge")
        try:
            cursors.extend(InputCursor(storage, p, req.prev, req.end) for p in req.inputs)
            fut = ahead.submit(produce, ranges[0][1])
            for i in range(len(ranges)):
                out, n = fut.result()
                if cancel is not None and cancel.is_set():
                    raise MergeCancelled(f"merge into {req.output} cancelled after {i} of {len(ranges)} parts")
                if i + 1 < len(ranges):
                    fut = ahead.submit(produce, ranges[i + 1][1])
                w.write_table(out, checked=True)
                read += n
                written += out.num_rows
                report(
                    progress_dict(
                        read,
                        written,
                        round(bytes_in * (i + 1) / len(ranges)),
                        w.position(),
                        i + 1,
                        len(ranges),
                        started,
                    )
                )
            if cancel is not None and cancel.is_set():
                raise MergeCancelled(f"merge into {req.output} cancelled before commit")
            info = w.commit()
        except BaseException:
            w.abort()
            raise
        finally:
            ahead.shutdown(wait=True, cancel_futures=True)
            for c in cursors:
                c.close()
        report(progress_dict(read, written, bytes_in, info.size, len(ranges), len(ranges), started))
        return MergeResult(
            info=info, entries_read=read, entries_written=written, bytes_read=bytes_in, bytes_written=info.size
        )
