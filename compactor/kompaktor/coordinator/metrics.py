"""The coordinator's Prometheus metrics: the queues of every group (the autoscaling signal among
them). Each coordinator builds its own registry, so several can live in one test process."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

from kompaktor.files.storage import RequestsCollector
from kompaktor.metadata.store import MetadataStore


@dataclass
class QueueMetrics:
    registry: CollectorRegistry
    depth: Gauge
    queued: Gauge
    running: Gauge
    oldest: Gauge
    bytes: Gauge
    rejected: Gauge
    dead: Gauge
    dead_lettered: Gauge
    backup_last: Gauge
    backup_bytes: Gauge
    backup_failures: Counter

    @classmethod
    def create(cls) -> QueueMetrics:
        r = CollectorRegistry()
        r.register(RequestsCollector())
        g = "group"
        return cls(
            r,
            Gauge("kompaktor_queue_depth", "Queued plus running jobs: the autoscaling signal", [g], registry=r),
            Gauge("kompaktor_queued_jobs", "Jobs waiting in the group's queue", [g], registry=r),
            Gauge("kompaktor_running_compactions", "Compactions running in the group", [g], registry=r),
            Gauge("kompaktor_oldest_queued_job_age_seconds", "Age of the oldest queued tablet", [g], registry=r),
            Gauge("kompaktor_queue_bytes", "Bytes of input the group's queued jobs read", [g], registry=r),
            Gauge(
                "kompaktor_rejected_jobs", "Jobs rejected or evicted by the queue bound (cumulative)", [g], registry=r
            ),
            Gauge("kompaktor_dead_compactions", "Dead compactions detected (cumulative)", [], registry=r),
            Gauge("kompaktor_dead_lettered_jobs", "Jobs moved to the dead-letter list", [g], registry=r),
            Gauge(
                "kompaktor_backup_last_success_timestamp_seconds",
                "When this coordinator's last scheduled backup of the metadata was taken (epoch seconds)",
                registry=r,
            ),
            Gauge("kompaktor_backup_last_size_bytes", "Size of the last backup's metadata file", registry=r),
            Counter("kompaktor_backup_failures", "Scheduled backups that failed", registry=r),
        )

    def export(self, store: MetadataStore) -> None:
        """Set every gauge from the queues and counters in the store."""
        queues = store.queues
        for g in sorted(set(queues.groups()) | set(store.fleet.groups())):
            s = queues.stats(g)
            self.depth.labels(g).set(s.depth)
            self.queued.labels(g).set(s.queued)
            self.running.labels(g).set(s.running)
            self.oldest.labels(g).set(s.oldest_age_s)
            self.bytes.labels(g).set(s.bytes)
            self.rejected.labels(g).set(s.rejected)
            self.dead_lettered.labels(g).set(s.dead_lettered)
        self.dead.set(store.bookkeeping.counters().get("dead_compactions", 0))
