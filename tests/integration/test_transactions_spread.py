"""Transactions on four brokers, more than any of the topics' replicas: `__transaction_state`
and `__consumer_offsets` with two replicas, the data topic with one, a partition on each
broker. A transaction then spans partitions whose leaders hold neither its coordinator's
partition nor its group's, so every leader checks or adds its partition with a coordinator
elsewhere and takes its marker from it.

confluent-kafka (transactions v1: AddPartitionsToTxn, then checks by the leaders) commits
and aborts across the four; Kafka's Java client (transactions v2: each leader adds its
partition) runs the commit, abort, send-offsets and fencing program of the Java tests.
"""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition

from tests.apache_kafka import run_java
from tests.integration.test_java_client import TRANSACTIONS_V2, results
from tierbroker.testing import cluster_fixture
from tierbroker.testing.cluster import TierbrokerCluster

BROKERS = 4
TIMEOUT_S = 30.0
four_brokers = cluster_fixture(
    "module",
    brokers=BROKERS,
    broker_config={
        "transaction.state.log.replication.factor": 2,
        "offsets.topic.replication.factor": 2,
    },
)


def read(bootstrap: str, topic: str, isolation: str, expected: int) -> list[bytes]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex, "isolation.level": isolation}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(BROKERS)])
    values: list[bytes] = []
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while len(values) < expected and time.monotonic() < deadline:
            values += [m.value() for m in consumer.consume(100, 0.2) if m.error() is None]
        values += [m.value() for m in consumer.consume(100, 0.5) if m.error() is None]
    finally:
        consumer.close()
    return sorted(values)


def test_a_transaction_across_a_partition_on_each_broker(four_brokers: TierbrokerCluster) -> None:
    topic = f"spread-{uuid.uuid4().hex[:8]}"
    four_brokers.create_topic(topic, partitions=BROKERS, replication_factor=1)
    assert {four_brokers.leader(topic, p) for p in range(BROKERS)} == set(range(BROKERS))
    p = Producer({"bootstrap.servers": four_brokers.bootstrap_servers, "transactional.id": topic})
    p.init_transactions(TIMEOUT_S)
    for outcome in ("committed", "aborted"):
        p.begin_transaction()
        for partition in range(BROKERS):
            p.produce(topic, b"%s-%d" % (outcome.encode(), partition), partition=partition)
        p.flush(TIMEOUT_S)
        (p.commit_transaction if outcome == "committed" else p.abort_transaction)(TIMEOUT_S)
    committed = sorted(b"committed-%d" % i for i in range(BROKERS))
    aborted = sorted(b"aborted-%d" % i for i in range(BROKERS))
    bootstrap = four_brokers.bootstrap_servers
    assert read(bootstrap, topic, "read_committed", BROKERS) == committed
    assert read(bootstrap, topic, "read_uncommitted", 2 * BROKERS) == sorted(committed + aborted)


def test_the_java_clients_v2_transactions(four_brokers: TierbrokerCluster) -> None:
    name = f"spread-java-{uuid.uuid4().hex[:8]}"
    printed = results(
        run_java("Transactions.java", four_brokers.bootstrap_servers, name, name, name, "1")
    )
    assert printed == TRANSACTIONS_V2
