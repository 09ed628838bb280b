"""Several listeners: clients are told the addresses of the listener they came in on, and
brokers replicate over the inter-broker listener."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.waiting import wait_for
from tierbroker.broker.metadata import zk_data as zk
from tierbroker.broker.server.broker_server import BrokerServer
from tierbroker.broker.server.embedded import EmbeddedCluster

LISTENERS = {
    "listeners": "CLIENT://127.0.0.1:0,INTERNAL://127.0.0.1:0",
    "listener.security.protocol.map": "CLIENT:PLAINTEXT,INTERNAL:PLAINTEXT",
    "inter.broker.listener.name": "INTERNAL",
    "offsets.topic.num.partitions": "3",
    "log.dir.min.free.bytes": "0",
    "group.initial.rebalance.delay.ms": "0",
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    directory: Path = tmp_path_factory.mktemp("listeners")
    with EmbeddedCluster(directory, brokers=3, properties=LISTENERS) as cluster:
        yield cluster


def bootstrap(cluster: EmbeddedCluster, listener: str) -> str:
    return ",".join(
        f"{x.host}:{x.port}" for b in cluster.brokers for x in [b.endpoints.listener(listener)]
    )


def ports(broker: BrokerServer, listener: str) -> int:
    return broker.endpoints.listener(listener).port


@pytest.mark.parametrize("listener", ["CLIENT", "INTERNAL"])
def test_metadata_names_the_brokers_on_the_listener_asked(
    cluster: EmbeddedCluster, listener: str
) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap(cluster, listener)})
    told = {b.id: b.port for b in admin.list_topics(timeout=10).brokers.values()}
    assert told == {b.broker_id: ports(b, listener) for b in cluster.brokers}
    nodes = admin.describe_cluster(request_timeout=10).result(10).nodes
    assert {n.id: n.port for n in nodes} == told


def test_the_registration_lists_every_listener_as_kafka_writes_it(
    cluster: EmbeddedCluster,
) -> None:
    broker = cluster.brokers[0]
    data, _ = cluster.call(broker.store.get(zk.broker_path(broker.broker_id)), 10)
    registration = json.loads(data)
    assert registration["endpoints"] == [
        f"CLIENT://127.0.0.1:{ports(broker, 'CLIENT')}",
        f"INTERNAL://127.0.0.1:{ports(broker, 'INTERNAL')}",
    ]
    assert registration["listener_security_protocol_map"] == {
        "CLIENT": "PLAINTEXT",
        "INTERNAL": "PLAINTEXT",
    }
    assert (registration["host"], registration["port"]) == (None, -1)  # no PLAINTEXT listener


def test_replicas_follow_on_the_inter_broker_listener_and_groups_on_the_clients(
    cluster: EmbeddedCluster,
) -> None:
    servers = bootstrap(cluster, "CLIENT")
    admin = AdminClient({"bootstrap.servers": servers})
    admin.create_topics([NewTopic("replicated", 3, 3)])["replicated"].result(30)
    producer = Producer({"bootstrap.servers": servers, "acks": "all"})
    for i in range(300):
        producer.produce("replicated", str(i).encode(), partition=i % 3)
    assert producer.flush(30) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": servers,
            "group.id": "on-clients",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe(["replicated"])
    seen: set[bytes] = set()
    wait_for(lambda: _poll_into(consumer, seen) >= 300, "every record read", timeout_s=60)
    consumer.close()
    # Followers fetch on INTERNAL; clients came in on CLIENT only.
    by_listener = {
        (c.listener.name, c.ip) for b in cluster.brokers for c in b.socket_server.connections
    }
    assert ("INTERNAL", "127.0.0.1") in by_listener
    fetchers = [
        f for b in cluster.brokers for f in b.replicas.fetchers.fetchers.values() if f.partitions
    ]
    internal_ports = {ports(b, "INTERNAL") for b in cluster.brokers}
    assert fetchers and all(f.client.port in internal_ports for f in fetchers)


def _poll_into(consumer: Consumer, seen: set[bytes]) -> int:
    """Read what has arrived (up to 500 records, waiting at most half a second)."""
    for message in consumer.consume(500, 0.5):
        if message.error() is None:
            seen.add(message.value())
    return len(seen)


def test_connections_are_counted_per_listener(cluster: EmbeddedCluster) -> None:
    broker = cluster.brokers[0]
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{ports(broker, 'CLIENT')}"})
    admin.list_topics(timeout=10)

    def sample(name: str, listener: str) -> float:
        return broker.registry.get_sample_value(name, {"listener": listener}) or 0.0

    assert sample("connection_creation_total", "CLIENT") >= 1
    assert sample("successful_authentication_total", "CLIENT") >= 1
    assert sample("connection_count", "INTERNAL") >= 1  # followers fetching
    assert sample("failed_authentication_total", "CLIENT") == 0
