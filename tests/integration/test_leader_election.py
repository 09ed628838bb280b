"""Leadership back to the preferred replica: an operator's ElectLeaders (confluent-kafka's
AdminClient.elect_leaders) and the controller's own leader balance, on three brokers in
one process.

A topic's preferred replica (the first of its assignment) is stopped, so another leads;
once it is back in the ISR, a preferred election makes it lead again in a new leader
epoch, and nothing produced is lost. Kafka's per-partition answers: ELECTION_NOT_NEEDED,
UNKNOWN_TOPIC_OR_PARTITION, NOT_CONTROLLER from a broker that is not the controller.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    ElectionType,
    KafkaError,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.waiting import wait_for
from tests.integration.wire import WireClient, request_module
from tierbroker.broker.server.embedded import EmbeddedCluster
from tierbroker.protocol.errors import ErrorCode
from tierbroker.storage.topic_partition import TopicPartition as Tp

PREFERRED = 1  # the first replica of every assignment below


def start_cluster(directory: Path, auto_balance: bool) -> EmbeddedCluster:
    return EmbeddedCluster(
        directory,
        brokers=3,
        racks=["a", "b", "c"],
        properties={
            "auto.leader.rebalance.enable": str(auto_balance).lower(),
            "leader.imbalance.check.interval.seconds": "1",
            "replica.lag.time.max.ms": "3000",
        },
    ).start()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    running = start_cluster(tmp_path_factory.mktemp("elections"), auto_balance=False)
    yield running
    running.stop()


def leader_and_isr(cluster: EmbeddedCluster, topic: str) -> tuple[int, int, set[int]]:
    """(leader, leader epoch, ISR) of partition 0, as the brokers' metadata says."""
    state = cluster.brokers[0].cache.states[Tp(topic, 0)]
    return state.leader, state.leader_epoch, set(state.isr)


def led_elsewhere(cluster: EmbeddedCluster, topic: str, records: int) -> int:
    """A topic whose preferred replica has been stopped and restarted, and is back in the
    ISR. Returns the leader epoch of the leader elected while it was stopped."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    admin.create_topics(
        [NewTopic(topic, num_partitions=1, replica_assignment=[[PREFERRED, 0, 2]])]
    )[topic].result(30)
    wait_for(lambda: leader_and_isr(cluster, topic)[::2] == (PREFERRED, {0, 1, 2}), "leader")
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all"})
    for i in range(records):
        producer.produce(topic, b"%d" % i)
    assert producer.flush(30) == 0
    cluster.stop_broker(PREFERRED)
    wait_for(lambda: leader_and_isr(cluster, topic)[0] != PREFERRED, "another leader")
    epoch = leader_and_isr(cluster, topic)[1]
    cluster.start_broker(PREFERRED)
    wait_for(lambda: PREFERRED in leader_and_isr(cluster, topic)[2], "the ISR to take it back")
    return epoch


def read(cluster: EmbeddedCluster, topic: str, count: int) -> list[int]:
    consumer = Consumer(
        {"bootstrap.servers": cluster.bootstrap_servers, "group.id": "check", "log_level": 0}
    )
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    values: list[int] = []
    deadline = time.monotonic() + 30
    while len(values) < count and time.monotonic() < deadline:
        values += [int(m.value()) for m in consumer.consume(1000, 0.5) if m.error() is None]
    consumer.close()
    return values


def test_a_preferred_election_gives_leadership_back_and_loses_nothing(
    cluster: EmbeddedCluster,
) -> None:
    topic = "preferred"
    epoch = led_elsewhere(cluster, topic, 500)
    leader, still, _ = leader_and_isr(cluster, topic)
    assert leader != PREFERRED and still == epoch
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    tp = TopicPartition(topic, 0)
    assert admin.elect_leaders(ElectionType.PREFERRED, [tp]).result(30) == {tp: None}
    wait_for(lambda: leader_and_isr(cluster, topic)[:2] == (PREFERRED, epoch + 1), "metadata")
    assert read(cluster, topic, 500) == list(range(500))

    again = admin.elect_leaders(ElectionType.PREFERRED, [tp]).result(30)[tp]
    assert isinstance(again, KafkaError) and again.code() == ErrorCode.election_not_needed
    missing = TopicPartition("no-such-topic", 0)
    unknown = admin.elect_leaders(ElectionType.PREFERRED, [missing]).result(30)[missing]
    assert isinstance(unknown, KafkaError)
    assert unknown.code() == ErrorCode.unknown_topic_or_partition


def test_a_broker_that_is_not_the_controller_answers_not_controller(
    cluster: EmbeddedCluster,
) -> None:
    controller = next(b.broker_id for b in cluster.brokers if b.controller.is_active)
    other = next(b.broker_id for b in cluster.brokers if b.broker_id != controller)
    host, port = cluster.address(other).rsplit(":", 1)
    m = request_module(43, 2)
    with WireClient(int(port), host) as client:
        response = client.request(
            m.ElectLeadersRequest(
                election_type=0,
                topic_partitions=(m.TopicPartitions(topic="preferred", partitions=(0,)),),
                timeout=datetime.timedelta(seconds=5),
            )
        )
    [[result]] = [r.partition_result for r in response.replica_election_results]
    assert result.error_code == ErrorCode.not_controller


def test_the_controller_gives_leadership_back_by_itself(tmp_path: Path) -> None:
    balanced = start_cluster(tmp_path, auto_balance=True)
    try:
        topic = "rebalanced"
        epoch = led_elsewhere(balanced, topic, 100)
        # leader.imbalance.check.interval.seconds=1: one partition of one led elsewhere
        # is above leader.imbalance.per.broker.percentage (10).
        wait_for(
            lambda: leader_and_isr(balanced, topic)[:2] == (PREFERRED, epoch + 1),
            "the leader balance check",
        )
        assert read(balanced, topic, 100) == list(range(100))
    finally:
        balanced.stop()
