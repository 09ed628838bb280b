"""Three broker processes over a real ZooKeeper (Debian's package, one per module).

- kill -9 of the partition leader during an idempotent acks=all produce, five times with
  different victims, the controller among them: every acknowledged message is read back
  exactly once and in order, and each killed broker restarts and rejoins the ISR;
- a consumer group keeps its committed offsets when its coordinator is killed;
- a consumer in a follower's rack (the brokers run Kafka's RackAwareReplicaSelector)
  reads from that follower, goes back to the leader when the follower is killed, and
  returns to it once it is back, losing nothing.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import NewTopic

from tests.integration.tiering_helpers import metric, metrics
from tests.integration.zk_cluster import (
    AcknowledgedProducer,
    ZooKeeperCluster,
    read_all,
    wait_for,
    zookeeper,  # noqa: F401 (a fixture)
)
from tests.zookeeper import ZooKeeperServer

MESSAGES = 50_000
KILLS = 5


@pytest.fixture
def cluster(
    zookeeper: ZooKeeperServer,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> Iterator[ZooKeeperCluster]:
    selector = {"replica.selector.class": "RackAwareReplicaSelector"}
    running = ZooKeeperCluster(zookeeper, tmp_path, overrides=selector).start()
    yield running
    running.stop()


@pytest.mark.slow
def test_killing_leaders_loses_and_duplicates_nothing_acknowledged(
    cluster: ZooKeeperCluster,
) -> None:
    topic = "failover"
    admin = cluster.admin()
    topic_config = {"min.insync.replicas": "2"}
    admin.create_topics([NewTopic(topic, 1, 3, config=topic_config)])[topic].result(30)
    producer = AcknowledgedProducer(cluster.bootstrap, topic, MESSAGES)
    producer.start()
    victims: list[int] = []
    controller_killed = False
    for round_ in range(KILLS):
        wait_for(lambda r=round_: producer.sent > (r + 1) * MESSAGES // (KILLS + 2), "progress")
        leader, _ = cluster.partition_state(topic, 0)
        victim = leader
        if round_ == KILLS - 1 and not controller_killed:
            victim = cluster.controller()  # the controller is among the victims
        controller_killed |= victim == cluster.controller()
        acknowledged = len(producer.acknowledged)
        cluster.brokers[victim].stop(signal.SIGKILL)
        victims.append(victim)
        # acks=all goes on with a new leader (once the victim's session expires) ...
        wait_for(
            lambda a=acknowledged: len(producer.acknowledged) > min(a + 100, MESSAGES - 1),
            f"acks after killing {victim} (sent {producer.sent}, failed {producer.failed[:3]})",
        )
        cluster.restart(victim)
        # ... and the victim catches up and rejoins the ISR.
        wait_for(lambda: sorted(cluster.partition_state(topic, 0)[1]) == [0, 1, 2], "ISR")
    producer.join(240)
    assert not producer.is_alive()
    assert producer.failed == []
    assert len(set(victims)) > 1 and controller_killed
    read = read_all(cluster.bootstrap, topic, MESSAGES)
    assert read == list(range(MESSAGES))  # each once, in order
    assert sorted(producer.acknowledged) == list(range(MESSAGES))


def test_a_group_keeps_its_offsets_when_its_coordinator_dies(cluster: ZooKeeperCluster) -> None:
    topic, group = "grouped", "survivors"
    admin = cluster.admin()
    admin.create_topics([NewTopic(topic, 3, 3)])[topic].result(30)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(300):
        producer.produce(topic, b"%d" % i, partition=i % 3)
    producer.flush(30)
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    seen = 0
    deadline = time.monotonic() + 60
    while seen < 150 and time.monotonic() < deadline:
        seen += sum(1 for m in consumer.consume(10, 0.5) if m.error() is None)
    consumer.commit(asynchronous=False)
    committed = {
        tp.partition: tp.offset
        for tp in consumer.committed([TopicPartition(topic, p) for p in range(3)], timeout=10)
        if tp.offset >= 0  # a partition not read yet has no commit
    }
    consumer.close()
    assert sum(committed.values()) == seen > 0

    coordinator = int(admin.describe_consumer_groups([group])[group].result(10).coordinator.id)
    cluster.brokers[coordinator].stop(signal.SIGKILL)
    cluster.brokers.pop(coordinator)
    survivor = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group})
    wanted = [TopicPartition(topic, p) for p in range(3)]
    wait_for(
        lambda: (
            {
                tp.partition: tp.offset
                for tp in survivor.committed(wanted, timeout=5)
                if tp.offset >= 0
            }
            == committed
        ),
        "the offsets from the new coordinator",
    )
    survivor.close()


class RackConsumer(threading.Thread):
    """Reads partition 0 from the start with `client.rack` set; remembers the values and
    the brokers librdkafka's statistics say it fetches from."""

    def __init__(self, bootstrap: str, topic: str, rack: str) -> None:
        super().__init__(daemon=True)
        self.topic = topic
        self.values: list[int] = []
        self.fetching: set[int] = set()
        self.stopped = threading.Event()
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"nearby-{time.monotonic_ns()}",
                "enable.auto.commit": False,
                "client.rack": rack,
                "statistics.interval.ms": 200,
                "stats_cb": self._stats,
            }
        )

    def _stats(self, raw: str) -> None:
        brokers: Any = json.loads(raw)["brokers"].values()
        self.fetching = {
            b["nodeid"]
            for b in brokers
            if any(tp["topic"] == self.topic for tp in b.get("toppars", {}).values())
        }

    def run(self) -> None:
        self.consumer.assign([TopicPartition(self.topic, 0, 0)])
        while not self.stopped.is_set():
            for message in self.consumer.consume(1000, 0.2):
                if message.error() is None:
                    self.values.append(int(message.value()))
        self.consumer.close()


def same_rack_bytes(cluster: ZooKeeperCluster, broker_id: int, topic: str) -> float:
    text = metrics(cluster.brokers[broker_id])
    found = metric(text, "ConsumerBytesOut_total", topic=topic, partition="0", locality="same-rack")
    return found or 0.0


def test_a_consumer_leaves_a_killed_follower_for_the_leader_and_comes_back(
    cluster: ZooKeeperCluster,
) -> None:
    topic, count = "nearby", 15_000
    admin = cluster.admin()
    admin.create_topics([NewTopic(topic, 1, 3, config={"min.insync.replicas": "2"})])[topic].result(
        30
    )
    wait_for(lambda: sorted(cluster.partition_state(topic, 0)[1]) == [0, 1, 2], "ISR")
    leader, _ = cluster.partition_state(topic, 0)
    follower = (leader + 1) % 3
    producer = AcknowledgedProducer(cluster.bootstrap, topic, count)
    consumer = RackConsumer(cluster.bootstrap, topic, "abc"[follower])
    producer.start()
    consumer.start()
    try:
        wait_for(
            lambda: (
                consumer.fetching == {follower} and same_rack_bytes(cluster, follower, topic) > 0
            ),
            "the consumer to fetch from the follower in its rack",
        )
        cluster.brokers[follower].stop(signal.SIGKILL)
        read = len(consumer.values)
        wait_for(
            lambda: consumer.fetching == {leader} and len(consumer.values) > read + 100,
            "the consumer to read on from the leader",
        )
        cluster.restart(follower)
        wait_for(lambda: sorted(cluster.partition_state(topic, 0)[1]) == [0, 1, 2], "ISR")
        wait_for(
            lambda: (
                consumer.fetching == {follower} and same_rack_bytes(cluster, follower, topic) > 0
            ),
            "the consumer to return to the follower",
        )
        producer.join(120)
        assert not producer.is_alive() and producer.failed == []
        wait_for(lambda: len(consumer.values) >= count, "every record", timeout_s=120)
    finally:
        consumer.stopped.set()
        consumer.join(30)
    assert consumer.values == list(range(count))  # each once, in order
    assert sorted(producer.acknowledged) == list(range(count))
