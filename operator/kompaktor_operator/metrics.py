"""The operator's own Prometheus metrics: what it reconciled, what the scaler did, what the
builtin external metrics API answered.

Owns: the operator's registry (its own ``CollectorRegistry``, one per ``Runtime``, served by
``kompaktor operator --metrics-port``; nothing from prometheus_client's global registry) and the few helpers the
handlers call. Series are labelled by ``group`` as the coordinator's and the compactors' are (a
CompactorGroup's name is unique across namespaces: the store keys groups by name), so a dashboard
joins them. Must not import: kopf, redis, kube.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kompaktor import __version__
from kompaktor.resources import api

#: ``result`` of a reconcile: applied; refused (an invalid or disallowed spec: the operator
#: will not retry it, the resource's Ready condition says why); error (anything else: retried).
RESULTS = ("ok", "refused", "error")
KINDS = (api.SERVICE_KIND, api.GROUP_KIND, api.COMPACTION_KIND)


@dataclass
class OperatorMetrics:
    registry: CollectorRegistry
    reconciles: Counter
    reconcile_seconds: Histogram
    replicas: Gauge
    desired: Gauge
    draining: Gauge
    replica_changes: Counter
    drain_requests: Counter
    pods_deleted: Counter
    scaler_errors: Counter
    metrics_api_requests: Counter

    @classmethod
    def create(cls) -> OperatorMetrics:
        # long as a list is: one declaration per metric, in the order of the fields above
        r = CollectorRegistry()
        g = "group"
        m = cls(
            r,
            Counter(
                "kompaktor_operator_reconciles",
                "Reconciles of a CompactionService, CompactorGroup or "
                "Compaction, by result (ok, refused: invalid or disallowed spec, error: retried)",
                ["kind", "result"],
                registry=r,
            ),
            Histogram(
                "kompaktor_operator_reconcile_duration_seconds",
                "Time one reconcile took",
                ["kind"],
                buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
                registry=r,
            ),
            Gauge(
                "kompaktor_operator_group_replicas",
                "Replicas the scaler set on the group's Deployment",
                [g],
                registry=r,
            ),
            Gauge(
                "kompaktor_operator_group_desired_replicas",
                "Replicas the autoscaler asked for (the CompactorGroup's spec.replicas)",
                [g],
                registry=r,
            ),
            Gauge(
                "kompaktor_operator_group_draining_pods",
                "Compactor pods chosen to go that are still finishing a job or acknowledging the drain",
                [g],
                registry=r,
            ),
            Counter(
                "kompaktor_operator_replica_changes",
                "Changes of the Deployment's replicas by the scaler",
                [g, "direction"],
                registry=r,
            ),
            Counter(
                "kompaktor_operator_drain_requests",
                "Drain requests sent to compactors before a scale-down",
                [g],
                registry=r,
            ),
            Counter(
                "kompaktor_operator_pods_deleted",
                "Drained compactor pods deleted (no longer needed as victims: the Deployment replaces them)",
                [g],
                registry=r,
            ),
            Counter(
                "kompaktor_operator_scaler_errors",
                "Scaler passes that failed (Redis or the API server unreachable or refusing); retried on the next pass",
                [g],
                registry=r,
            ),
            Counter(
                "kompaktor_operator_metrics_api_requests",
                "Requests to the builtin external.metrics.k8s.io API, by HTTP status code",
                ["code"],
                registry=r,
            ),
        )
        Gauge("kompaktor_operator_build_info", "The operator's version (always 1)", ["version"], registry=r).labels(
            __version__
        ).set(1)
        for kind in KINDS:  # every series exists from the start: rate() and absent() work at once
            m.reconcile_seconds.labels(kind)
            for result in RESULTS:
                m.reconciles.labels(kind, result)
        return m

    def forget_group(self, group: str) -> None:
        """Drop a deleted group's series (a gauge would otherwise show its last replicas forever)."""
        for metric in (
            self.replicas,
            self.desired,
            self.draining,
            self.drain_requests,
            self.pods_deleted,
            self.scaler_errors,
        ):
            try:
                metric.remove(group)
            except KeyError:
                pass
        for direction in ("up", "down"):
            try:
                self.replica_changes.remove(group, direction)
            except KeyError:
                pass
