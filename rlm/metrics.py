"""`RemoteStorageMetrics`: Kafka's remote-storage metrics, per topic, on a Prometheus registry.

Names follow Kafka's (`RemoteCopyBytesPerSec`, `RemoteCopyLagBytes`, ...): counters
for the *PerSec meters (Prometheus derives the rate), gauges for lags and sizes; and
the store's health (`RemoteStorageHealthy`, see `storage_health`), which the same
copies and reads update; and what the plugin asked of its store, read from its meter
at each scrape (`ObjectStoreCollector`): `RemoteStorageRequestsPerSec` by topic and
kind (put, get, list, delete) and `RemoteStorageBytesPerSec` by topic and direction
(upload, download). A partition's gauges go when it leaves the broker, a topic's
counters when it is deleted (`forget`), so the registry holds no series of partitions gone.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from tierbroker.rlm.storage_health import RemoteStorageHealth
from tierbroker.storage.remote.request_meter import ObjectStoreMeter
from tierbroker.storage.topic_partition import TopicPartition


class RemoteStorageMetrics:
    def __init__(self, registry: CollectorRegistry, meter: ObjectStoreMeter) -> None:
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
        self.meter = meter
        registry.register(ObjectStoreCollector(meter))
        self._per_partition = (
            self.copy_lag_bytes,
            self.copy_lag_segments,
            self.delete_lag_bytes,
            self.log_size_bytes,
            self.metadata_count,
        )
        self._per_topic = (
            self.copy_bytes,
            self.fetch_bytes,
            self.copy_requests,
            self.fetch_requests,
            self.copy_errors,
            self.fetch_errors,
            self.build_aux_state_requests,
            self.build_aux_state_errors,
        )

    def forget(self, tp: TopicPartition, topic_deleted: bool) -> None:
        """`tp` left this broker: drop its gauges, and its topic's counters if it was deleted."""
        for gauge in self._per_partition:
            gauge.remove(tp.topic, str(tp.partition))
        if topic_deleted:
            for counter in self._per_topic:
                counter.remove(tp.topic)
            self.meter.forget(tp.topic)


class ObjectStoreCollector(Collector):
    """The counts of a plugin's `ObjectStoreMeter` as Prometheus counters."""

    def __init__(self, meter: ObjectStoreMeter) -> None:
        self.meter = meter

    def collect(self) -> Iterator[CounterMetricFamily]:
        requests = CounterMetricFamily(
            "RemoteStorageRequestsPerSec",
            "Requests to the object store (each attempt), by billing class",
            labels=["topic", "kind"],
        )
        transferred = CounterMetricFamily(
            "RemoteStorageBytesPerSec",
            "Bytes sent to (upload) and received from (download) the object store",
            labels=["topic", "direction"],
        )
        for topic, usage in sorted(self.meter.usage().items()):
            for kind, count in usage.requests.items():
                requests.add_metric([topic, kind.value], count)
            for direction, size in usage.bytes.items():
                transferred.add_metric([topic, direction.value], size)
        yield requests
        yield transferred
