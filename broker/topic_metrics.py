"""`BrokerTopicMetrics`: Kafka's per-topic byte meters for produce and fetch.

`BytesInPerSec` counts record bytes appended by producers, `BytesOutPerSec` record
bytes returned to consumers' fetches (local or remote tier), both as Prometheus
counters labelled by topic, as Kafka's `BrokerTopicMetrics` meters are.
`ConsumerBytesOut` splits those per partition by whether the consumer is in this
broker's rack (`same-rack`, `cross-rack`, `unknown` when either names no rack): the
traffic that fetching from the closest replica (KIP-392) keeps inside a zone.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter


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
