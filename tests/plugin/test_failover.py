"""Failover with `tierbroker_cluster`: three brokers in racks a, b and c, a topic with
replication factor 3 and min.insync.replicas=2. Killing a leader (no controlled shutdown)
moves leadership to another in-sync replica and acks=all goes on with nothing lost, while
a group consumer keeps reading; a clean stop hands leadership over first; a broker
started again on its data catches up and rejoins the ISR; an expired metadata session
leaves the broker leading and serving.

A broker that goes leaves every ISR at once, whatever it was (the controller, a follower
in a controlled shutdown), not after replica.lag.time.max.ms, which these clusters set
longer than any wait here: acks=all never waits for a broker that is gone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer

from tierbroker.storage.log_manager import CLEAN_SHUTDOWN_FILE
from tierbroker.storage.topic_partition import TopicPartition
from tierbroker.testing import TierbrokerCluster

Factory = Callable[..., TierbrokerCluster]
TOPIC = "ledger"
LAG_MS = 300_000  # replica.lag.time.max.ms: no leader drops a follower on its own here


@pytest.fixture
def cluster(tierbroker_cluster: Factory) -> TierbrokerCluster:
    cluster = tierbroker_cluster(
        3, racks=["a", "b", "c"], broker_config={"replica.lag.time.max.ms": LAG_MS}
    )
    cluster.create_topic(TOPIC, config={"min.insync.replicas": 2})
    return cluster


def numbered(start: int, end: int) -> list[bytes]:
    return [b"%d" % i for i in range(start, end)]


def test_killing_the_leader_loses_no_acknowledged_record(cluster: TierbrokerCluster) -> None:
    cluster.produce(TOPIC, numbered(0, 100))
    old_leader = cluster.leader(TOPIC)

    cluster.kill_broker(old_leader)

    new_leader = cluster.leader(TOPIC)
    assert new_leader not in (old_leader, -1)
    assert old_leader not in cluster.isr(TOPIC)
    assert not cluster.broker(old_leader).running
    cluster.produce(TOPIC, numbered(100, 150))  # acks=all with an ISR of two
    assert [r.value for r in cluster.records(TOPIC)] == numbered(0, 150)

    cluster.start_broker(old_leader)
    cluster.wait_for(lambda: old_leader in cluster.isr(TOPIC), "the old leader in the ISR")
    assert cluster.broker(old_leader).running
    cluster.kill_broker(new_leader)  # the restarted broker holds every record
    assert [r.value for r in cluster.records(TOPIC)] == numbered(0, 150)


def test_a_killed_broker_crashes_and_recovers_at_its_next_start(
    cluster: TierbrokerCluster,
) -> None:
    cluster.produce(TOPIC, numbered(0, 100))
    victim = cluster.leader(TOPIC)
    server = cluster.embedded.broker(victim)
    log_dirs = server.config.log_dir_paths

    cluster.kill_broker(victim)  # returns once its session expired and leadership moved

    assert all(not (d / CLEAN_SHUTDOWN_FILE).exists() for d in log_dirs)
    assert cluster.leader(TOPIC) not in (victim, -1)
    cluster.start_broker(victim)
    cluster.wait_for(lambda: victim in cluster.isr(TOPIC), "the crashed broker in the ISR")
    # Alone, the partition is under min.insync.replicas and, as in Kafka, its high
    # watermark stays where it is: the recovered broker must know it before the others go.
    restarted = cluster.embedded.broker(victim)
    hosted = restarted.replicas.partitions[TopicPartition(TOPIC, 0)]
    cluster.wait_for(
        lambda: cluster.embedded.read(lambda: hosted.high_watermark) == 100,
        "the high watermark known to the recovered broker",
    )
    for other in {0, 1, 2} - {victim}:
        cluster.stop_broker(other)  # the recovered broker alone serves every record
    assert cluster.leader(TOPIC) == victim
    assert [r.value for r in cluster.records(TOPIC)] == numbered(0, 100)


def test_a_group_consumer_reads_on_across_a_killed_leader(cluster: TierbrokerCluster) -> None:
    cluster.produce(TOPIC, numbered(0, 50))
    values: list[bytes] = []
    first_half = threading.Event()

    def application() -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": cluster.bootstrap_servers,
                "group.id": "reconciler",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        consumer.subscribe([TOPIC])
        try:
            while len(values) < 100:
                message = consumer.poll(0.5)
                if message is None or message.error() is not None:
                    continue  # a dropped connection is a transient error to the client
                values.append(message.value())
                consumer.commit(message, asynchronous=False)
                if len(values) == 50:
                    first_half.set()
        finally:
            consumer.close()

    reader = threading.Thread(target=application)
    reader.start()
    try:
        assert first_half.wait(30)
        cluster.kill_broker(cluster.leader(TOPIC))
        cluster.produce(TOPIC, numbered(50, 100))
    finally:
        reader.join(60)
    assert not reader.is_alive()
    assert values == numbered(0, 100)
    assert cluster.committed("reconciler") == {(TOPIC, 0): 100}


def test_a_clean_stop_hands_leadership_over_first(cluster: TierbrokerCluster) -> None:
    cluster.produce(TOPIC, numbered(0, 10))
    leader = cluster.leader(TOPIC)

    cluster.stop_broker(leader)

    assert cluster.leader(TOPIC) not in (leader, -1)
    assert [r.value for r in cluster.records(TOPIC)] == numbered(0, 10)


def test_killing_the_controller_takes_it_out_of_every_isr(cluster: TierbrokerCluster) -> None:
    controller = cluster.controller
    cluster.produce(TOPIC, numbered(0, 10))

    cluster.kill_broker(controller)  # returns once no ISR holds it

    assert cluster.controller not in (controller, -1)
    assert controller not in cluster.isr(TOPIC)
    cluster.produce(TOPIC, numbered(10, 20))
    assert [r.value for r in cluster.records(TOPIC)] == numbered(0, 20)


def test_a_follower_stopped_cleanly_leaves_the_isr(cluster: TierbrokerCluster) -> None:
    cluster.produce(TOPIC, numbered(0, 10))
    follower = next(b for b in (0, 1, 2) if b not in (cluster.leader(TOPIC), cluster.controller))

    cluster.stop_broker(follower)

    assert cluster.isr(TOPIC) == {0, 1, 2} - {follower}
    cluster.produce(TOPIC, numbered(10, 20))
    assert [r.value for r in cluster.records(TOPIC)] == numbered(0, 20)


def test_an_expired_session_leaves_the_broker_serving(cluster: TierbrokerCluster) -> None:
    cluster.produce(TOPIC, numbered(0, 10))
    leader = cluster.leader(TOPIC)

    cluster.expire_session(leader)

    cluster.wait_for(
        lambda: cluster.leader(TOPIC) != -1 and len(cluster.isr(TOPIC)) == 3,
        "a leader and a full ISR again",
    )
    cluster.produce(TOPIC, numbered(10, 20))
    assert [r.value for r in cluster.records(TOPIC)] == numbered(0, 20)
