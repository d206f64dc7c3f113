"""Every Prometheus metric cronwell exposes, in one place (prefix `cronwell_`, bounded
labels: pool, outcome, reason class, role). Processes take a `Metrics` built on an
injectable registry, so tests read values without global state."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

# Start lag buckets: the SLA is 5 s at p99; resolution where it matters.
_LAG_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 30, 60, 300)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        # scheduler
        self.materialised = Counter(
            "cronwell_occurrences_materialised",
            "Occurrences materialised ahead of time.",
            ["origin"],
            registry=r,
        )
        self.missed = Counter(
            "cronwell_occurrences_missed",
            "Instants recorded as missed (misfire policy).",
            registry=r,
        )
        self.batch_size = Histogram(
            "cronwell_materialise_batch_jobs",
            "Jobs per materialisation batch.",
            buckets=(1, 10, 50, 100, 250, 500, 1000, 2500, 5000),
            registry=r,
        )
        self.batch_seconds = Histogram(
            "cronwell_materialise_batch_seconds", "Duration of a materialisation batch.", registry=r
        )
        self.partitions_owned = Gauge(
            "cronwell_partitions_owned", "Scheduler partitions this replica owns.", registry=r
        )
        self.partition_takeovers = Counter(
            "cronwell_partition_acquisitions",
            "Partitions acquired (startup or takeover).",
            registry=r,
        )
        self.partitions_lost = Counter(
            "cronwell_partition_leases_lost", "Partition leases lost before release.", registry=r
        )
        self.leases_reaped = Counter(
            "cronwell_leases_reaped",
            "Expired occurrence leases reaped, by next state.",
            ["state"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "cronwell_due_not_started",
            "Due occurrences not yet started, per pool: the leading indicator of an SLA miss.",
            ["pool"],
            registry=r,
        )
        self.behind = Gauge(
            "cronwell_jobs_behind",
            "Jobs whose next instant is overdue but not materialised "
            "(a scheduler falling behind or no partition owner).",
            registry=r,
        )
        self.dlq_size = Gauge("cronwell_dlq_size", "Dead-lettered occurrences.", registry=r)
        # worker
        self.start_lag = Histogram(
            "cronwell_start_lag_seconds",
            "Actual start minus nominal time, first attempts.",
            ["pool"],
            buckets=_LAG_BUCKETS,
            registry=r,
        )
        self.outcomes = Counter(
            "cronwell_occurrences",
            "Finished attempts by outcome (succeeded, retry, dead, lease_lost, stale).",
            ["pool", "outcome"],
            registry=r,
        )
        self.running = Gauge(
            "cronwell_attempts_running", "Attempts running in this worker.", ["pool"], registry=r
        )
        self.utilisation = Gauge(
            "cronwell_worker_utilisation_ratio",
            "Running attempts / concurrency.",
            ["pool"],
            registry=r,
        )
        self.lease_lost = Counter(
            "cronwell_lease_lost",
            "Attempts aborted because their lease was taken over.",
            ["pool"],
            registry=r,
        )
        self.fence_rejections = Counter(
            "cronwell_fence_rejections",
            "Completions or fenced writes rejected as stale.",
            ["pool"],
            registry=r,
        )
        # forecast (operator: WorkerPool pre-scaling)
        self.forecast_demand = Gauge(
            "cronwell_forecast_demand",
            "Occurrences forecast over the horizon, per pool (backlog included).",
            ["pool"],
            registry=r,
        )
        self.planned_replicas = Gauge(
            "cronwell_planned_replicas",
            "Worker replicas the forecast plans for the pool now.",
            ["pool"],
            registry=r,
        )

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Expose /metrics on `port` (0 or None: do not serve)."""
        if port:
            start_http_server(port, addr=addr, registry=self.registry)
