"""Per-topic and per-partition Prometheus children go with their topic: after DeleteTopics
no broker's registry holds a series labelled with it (byte meters, ConsumerBytesOut,
the remote tier's lags, sizes and counters), while other topics keep theirs."""

from __future__ import annotations

from collections.abc import Callable

from confluent_kafka.admin import AdminClient

from tierbroker.testing import TierbrokerCluster

Factory = Callable[..., TierbrokerCluster]


def series_of(cluster: TierbrokerCluster, topic: str) -> set[str]:
    """The names of every sample labelled with `topic`, on any broker, after the remote
    tier's gauges were refreshed (as a scrape refreshes them)."""

    def read() -> set[str]:
        names = set()
        for server in cluster.embedded.brokers:
            if server.remote is not None:
                server.remote.update_metrics()
            for family in server.registry.collect():
                names |= {s.name for s in family.samples if s.labels.get("topic") == topic}
        return names

    return cluster.embedded.read(read)


def test_deleting_a_topic_removes_its_metric_children(tierbroker_cluster: Factory) -> None:
    cluster = tierbroker_cluster(2, tiering=True)
    for topic in ("doomed", "kept"):
        cluster.create_topic(topic, partitions=2)
        cluster.produce(topic, [b"a", b"b"], partition=0)
        cluster.produce(topic, [b"c"], partition=1)
        assert len(cluster.records(topic, partition=0)) == 2
    cluster.wait_for(
        lambda: {"ConsumerBytesOut_total", "RemoteLogSizeBytes"} <= series_of(cluster, "doomed"),
        "metric children of the topic",
    )

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    admin.delete_topics(["doomed"])["doomed"].result(30)

    cluster.wait_for(lambda: not series_of(cluster, "doomed"), "no series of the deleted topic")
    assert {"BytesInPerSec_total", "ConsumerBytesOut_total"} <= series_of(cluster, "kept")
