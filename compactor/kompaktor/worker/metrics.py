"""The compactor's Prometheus metrics. Each compactor builds its own registry, so several can
live in one test process."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kompaktor.files.storage import RequestsCollector


@dataclass
class CompactorMetrics:
    registry: CollectorRegistry
    running: Gauge
    completed: Counter
    failed: Counter
    cancelled: Counter
    entries_read: Counter
    entries_written: Counter
    bytes_read: Counter
    bytes_written: Counter
    duration: Histogram
    resume_parts_reused: Counter
    resume_bytes_reused: Counter
    resume_parts_rejected: Counter

    @classmethod
    def create(cls) -> CompactorMetrics:
        r = CollectorRegistry()
        r.register(RequestsCollector())
        g = ["group"]
        return cls(
            r,
            Gauge("kompaktor_compactor_running", "Compactions running in this compactor", g, registry=r),
            Counter("kompaktor_compactions_completed", "Compactions committed", g, registry=r),
            Counter("kompaktor_compactions_failed", "Compactions failed", g, registry=r),
            Counter("kompaktor_compactions_cancelled", "Compactions cancelled or released", g, registry=r),
            Counter("kompaktor_entries_read", "Entries read by merges", g, registry=r),
            Counter("kompaktor_entries_written", "Entries written by merges", g, registry=r),
            Counter("kompaktor_bytes_read", "Bytes read by merges", g, registry=r),
            Counter("kompaktor_bytes_written", "Bytes written by merges", g, registry=r),
            Histogram(
                "kompaktor_compaction_duration_seconds",
                "Duration of committed compactions",
                g,
                registry=r,
                buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800),
            ),
            Counter(
                "kompaktor_resume_parts_reused",
                "Key ranges of merges taken from an earlier attempt's recorded parts instead of merged again",
                g,
                registry=r,
            ),
            Counter(
                "kompaktor_resume_bytes_reused",
                "Compressed input bytes of the key ranges taken from an earlier attempt (not read again)",
                g,
                registry=r,
            ),
            Counter(
                "kompaktor_resume_parts_rejected",
                "Recorded parts that failed verification (size, checksum, range) and were merged again",
                g,
                registry=r,
            ),
        )
