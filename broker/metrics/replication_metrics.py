"""`ReplicationMetrics`: what an operator watches of replication, with Kafka's metric names.

Gauges are computed when Prometheus scrapes (no bookkeeping on the request path):
`UnderReplicatedPartitions` and `UnderMinIsrPartitionCount` (partitions led here with
an ISR short of their replicas, or of min.insync.replicas), `LeaderCount`,
`PartitionCount`, `ActiveControllerCount` and `OfflinePartitionsCount` (on the active
controller: partitions without a live leader), `MaxLag` and `ConsumerLag` per partition
(a follower's distance to its leader's high watermark, Kafka's FetcherLagMetrics), and
`ReplicationBytesInPerSec` per topic (record bytes its followers fetched; forgotten when
the topic is deleted).
`IsrShrinksPerSec` and `IsrExpandsPerSec` count committed ISR changes.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tierbroker.broker.controller.controller import Controller
from tierbroker.broker.metadata.zk_data import NO_LEADER
from tierbroker.broker.replication.replica_manager import ReplicaManager
from tierbroker.storage.topic_partition import TopicPartition


class ReplicationMetrics(Collector):
    def __init__(
        self, replicas: ReplicaManager, controller: Controller, registry: CollectorRegistry
    ) -> None:
        self.replicas = replicas
        self.controller = controller
        self.isr_shrinks = Counter("IsrShrinksPerSec", "ISR shrinks", registry=registry)
        self.isr_expands = Counter("IsrExpandsPerSec", "ISR expansions", registry=registry)
        registry.register(self)
        replicas.stop_listeners.append(self.partition_stopped)

    def isr_changed(self, expanded: bool) -> None:
        (self.isr_expands if expanded else self.isr_shrinks).inc()

    def partition_stopped(self, tp: TopicPartition, topic_deleted: bool) -> None:
        """A deleted topic's ReplicationBytesInPerSec series goes with it."""
        if topic_deleted:
            self.replicas.fetchers.bytes_fetched.pop(tp.topic, None)

    def collect(self) -> Iterator[Metric]:
        led = [p for p in self.replicas.partitions.values() if p.is_leader]
        yield _gauge(
            "UnderReplicatedPartitions",
            "Partitions led here whose ISR lacks a replica",
            sum(1 for p in led if p.is_under_replicated),
        )
        yield _gauge(
            "UnderMinIsrPartitionCount",
            "Partitions led here whose ISR is smaller than min.insync.replicas",
            sum(1 for p in led if p.is_under_min_isr),
        )
        yield _gauge("LeaderCount", "Partitions led here", len(led))
        yield _gauge("PartitionCount", "Partitions hosted here", len(self.replicas.partitions))
        active = self.controller.is_active
        yield _gauge("ActiveControllerCount", "1 on the active controller", int(active))
        offline = 0
        if active:
            live = self.controller.live_brokers
            offline = sum(
                1
                for s in self.controller.states.values()
                if s.leader == NO_LEADER or s.leader not in live
            )
        yield _gauge("OfflinePartitionsCount", "Partitions without a live leader", offline)
        lags = self.replicas.fetchers.lags()
        yield _gauge(
            "MaxLag", "The largest lag of a followed partition", max(lags.values(), default=0)
        )
        per_partition = GaugeMetricFamily(
            "ConsumerLag",
            "A follower's lag behind its leader's high watermark",
            labels=["topic", "partition"],
        )
        for tp, lag in sorted(lags.items()):
            per_partition.add_metric([tp.topic, str(tp.partition)], lag)
        yield per_partition
        fetched = CounterMetricFamily(
            "ReplicationBytesInPerSec",
            "Record bytes this broker's followers fetched from their leaders",
            labels=["topic"],
        )
        for topic, size in sorted(self.replicas.fetchers.bytes_fetched.items()):
            fetched.add_metric([topic], size)
        yield fetched


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)
