"""`RemoteStorageMetrics`: Kafka's remote-storage metrics, per topic, on a Prometheus registry.

Names follow Kafka's (`RemoteCopyBytesPerSec`, `RemoteCopyLagBytes`, ...): counters
for the *PerSec meters (Prometheus derives the rate), gauges for lags and sizes; and
the store's health (`RemoteStorageHealthy`, see `storage_health`), which the same
copies and reads update.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from tierbroker.rlm.storage_health import RemoteStorageHealth


class RemoteStorageMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, ["topic"], registry=registry)

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ("topic", "partition")) -> Gauge:
            return Gauge(name, doc, list(labels), registry=registry)

        self.copy_bytes = counter("RemoteCopyBytesPerSec", "Bytes copied to the remote tier")
        self.fetch_bytes = counter("RemoteFetchBytesPerSec", "Bytes read from the remote tier")
        self.copy_requests = counter("RemoteCopyRequestsPerSec", "Segments copied")
        self.fetch_requests = counter("RemoteFetchRequestsPerSec", "Remote reads served")
        self.copy_errors = counter("RemoteCopyErrorsPerSec", "Failed segment copies")
        self.fetch_errors = counter("RemoteFetchErrorsPerSec", "Failed remote reads")
        self.build_aux_state_requests = counter(
            "BuildRemoteLogAuxStateRequestsPerSec",
            "Follower logs rebuilt from the remote tier (attempts)",
        )
        self.build_aux_state_errors = counter(
            "BuildRemoteLogAuxStateErrorsPerSec",
            "Attempts to rebuild a follower's log from the remote tier that failed",
        )
        self.copy_lag_bytes = gauge("RemoteCopyLagBytes", "Bytes of rolled segments not yet copied")
        self.copy_lag_segments = gauge("RemoteCopyLagSegments", "Rolled segments not yet copied")
        self.delete_lag_bytes = gauge(
            "RemoteDeleteLagBytes", "Bytes past retention not yet deleted"
        )
        self.log_size_bytes = gauge("RemoteLogSizeBytes", "Bytes in the remote tier")
        self.metadata_count = gauge("RemoteLogMetadataCount", "Remote segments known")
        self.pool_queue = gauge(
            "RemoteLogManagerPoolQueueSize", "Tasks waiting for a slot", ("pool",)
        )
        self.health = RemoteStorageHealth(registry)
