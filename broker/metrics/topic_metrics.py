"""`BrokerTopicMetrics`: Kafka's per-topic byte meters for produce and fetch.

`BytesInPerSec` counts record bytes appended by producers, `BytesOutPerSec` record
bytes returned to consumers' fetches (local or remote tier), both as Prometheus
counters labelled by topic, as Kafka's `BrokerTopicMetrics` meters are.
`ConsumerBytesOut` splits those per partition by whether the consumer is in this
broker's rack (`same-rack`, `cross-rack`, `unknown` when either names no rack): the
traffic that fetching from the closest replica (KIP-392) keeps inside a zone.
`served` (`ServedBytesMeter`) counts what consumers and followers fetch, by tier and
rack crossing, for the cost meter.
A partition's children go when it leaves the broker, a topic's when it is deleted
(`forget`), so the registry holds no series of partitions gone.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from tierbroker.broker.metrics.served_bytes import ServedBytesMeter
from tierbroker.storage.topic_partition import TopicPartition

LOCALITIES = ("same-rack", "cross-rack", "unknown")  # of ConsumerBytesOut


class BrokerTopicMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.bytes_in = Counter(
            "BytesInPerSec", "Record bytes produced", ["topic"], registry=registry
        )
        self.bytes_out = Counter(
            "BytesOutPerSec", "Record bytes fetched", ["topic"], registry=registry
        )
        self.consumer_bytes_out = Counter(
            "ConsumerBytesOut",
            "Record bytes fetched by consumers, by the consumer's rack against this broker's",
            ["topic", "partition", "locality"],
            registry=registry,
        )
        self.served = ServedBytesMeter(registry)

    def forget(self, tp: TopicPartition, topic_deleted: bool) -> None:
        """`tp` left this broker: drop its children, and its topic's if the topic was deleted."""
        for locality in LOCALITIES:
            self.consumer_bytes_out.remove(tp.topic, str(tp.partition), locality)
        if topic_deleted:
            self.bytes_in.remove(tp.topic)
            self.bytes_out.remove(tp.topic)
            self.served.forget(tp.topic)
