"""Successive leader changes with lagging followers leave no divergent logs (KIP-101,
KIP-279): three brokers in one process.

The leader takes records acknowledged by itself alone (acks=1) while both followers are
held; it stops and a follower leads in a new epoch; records go on; the old leader comes
back as a follower and must drop the tail only it had; the new leader stops in turn.
Afterwards every replica holds the same batches (offset, leader epoch, CRC), and what
was acknowledged by the ISR (acks=all) is there exactly once, in order.
"""

from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.held_fetcher import hold_fetcher
from tests.integration.waiting import wait_for
from tierbroker.broker.server.embedded import EmbeddedCluster
from tierbroker.protocol.records import iter_batches
from tierbroker.storage.topic_partition import TopicPartition as Tp

TOPIC = "diverging"


def produce(cluster: EmbeddedCluster, prefix: bytes, count: int, acks: str) -> None:
    producer = Producer(
        {"bootstrap.servers": cluster.bootstrap_servers, "acks": acks, "linger.ms": 5}
    )
    for i in range(count):
        producer.produce(TOPIC, b"%s-%d" % (prefix, i))
    assert producer.flush(30) == 0


def leader(cluster: EmbeddedCluster) -> int:
    return cluster.brokers[0].cache.states[Tp(TOPIC, 0)].leader


def batches(cluster: EmbeddedCluster, broker_id: int) -> list[tuple[int, int, int, int]]:
    """(base offset, last offset, partition leader epoch, CRC) of each batch on disk."""
    log_dir = Path(cluster.broker(broker_id).config.log_dir_paths[0]) / f"{TOPIC}-0"
    return [
        (b.base_offset, b.last_offset, b.partition_leader_epoch, b.crc)
        for segment in sorted(log_dir.glob("*.log"))
        for b in iter_batches(segment.read_bytes())
    ]


def read_all(cluster: EmbeddedCluster, count: int) -> list[bytes]:
    """Every record from offset 0: `count` of them, and then 1 s in which no more come."""
    consumer = Consumer(
        {"bootstrap.servers": cluster.bootstrap_servers, "group.id": "check", "log_level": 0}
    )
    consumer.assign([TopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(values) < count and time.monotonic() < deadline:
        values += [m.value() for m in consumer.consume(1000, 0.2) if m.error() is None]
    values += [m.value() for m in consumer.consume(1000, 1) if m.error() is None]
    consumer.close()
    return values


def test_replicas_agree_after_successive_elections_with_lagging_followers(
    tmp_path: Path,
) -> None:
    with EmbeddedCluster(
        tmp_path,
        brokers=3,
        properties={
            # Held followers stay in the ISR: leadership can move to them.
            "replica.lag.time.max.ms": "60000",
            "auto.leader.rebalance.enable": "false",
        },
    ) as cluster:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
        topic = NewTopic(TOPIC, num_partitions=1, replica_assignment=[[0, 1, 2]])
        admin.create_topics([topic])[TOPIC].result(30)
        wait_for(lambda: leader(cluster) == 0, "broker 0 to lead")
        produce(cluster, b"a", 100, "all")

        held = [hold_fetcher(cluster, follower, 0) for follower in (1, 2)]
        produce(cluster, b"b", 50, "1")  # on broker 0 alone
        # Checked before the stop: a controlled shutdown may already make broker 0 follow
        # its successor, which truncates the b records.
        assert batches(cluster, 0)[-1][1] == 149  # broker 0 holds a and b
        cluster.stop_broker(0)  # a follower leads, in epoch 1, without the b records
        for h in held:
            cluster.call(h.release())
        [new_leader] = wait_for(lambda: {leader(cluster)} & {1, 2}, "a follower to lead")
        produce(cluster, b"c", 30, "all")
        cluster.start_broker(0)  # it follows, and must truncate its b records

        cluster.stop_broker(new_leader)  # epoch 2, led by one of the others
        wait_for(lambda: leader(cluster) not in (new_leader, -1), "another leader")
        produce(cluster, b"d", 20, "all")
        cluster.start_broker(new_leader)

        wait_for(
            lambda: set(cluster.brokers[0].cache.states[Tp(TOPIC, 0)].isr) == {0, 1, 2},
            "every replica in the ISR",
        )
        wait_for(
            lambda: batches(cluster, 0) == batches(cluster, 1) == batches(cluster, 2),
            "identical replicas",
        )
        epochs = {epoch for _, _, epoch, _ in batches(cluster, 0)}
        assert epochs == {0, 1, 2}
        expected = [
            b"%s-%d" % (p, i) for p, n in ((b"a", 100), (b"c", 30), (b"d", 20)) for i in range(n)
        ]
        assert read_all(cluster, len(expected)) == expected
