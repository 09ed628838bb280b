"""`BrokerTopicMetrics`: Kafka's per-topic byte meters for produce and fetch.

`BytesInPerSec` counts record bytes appended by producers, `BytesOutPerSec` record
bytes returned to fetches (local or remote tier), both as Prometheus counters
labelled by topic, as Kafka's `BrokerTopicMetrics` meters are.
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
