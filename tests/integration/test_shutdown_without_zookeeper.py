"""SIGTERM while ZooKeeper is unreachable: the controlled shutdown cannot be asked for, so
the broker shuts down uncontrolled within `shutdown.timeout.ms` (logs flushed), exits
non-zero with one `error:` line saying why, and loses nothing it acknowledged.

Two broker processes over a ZooKeeper of this test's own (it is stopped and started);
then a lone broker, which has no leadership to hand over but cannot resign as
controller, is bounded the same way.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import NewTopic

from tests.integration.zk_cluster import ZooKeeperCluster, read_all, wait_for
from tests.zookeeper import ZooKeeperServer

# Stops and starts ZooKeeper under acks=all produce: run with nothing beside it.
pytestmark = pytest.mark.alone

SHUTDOWN_TIMEOUT_MS = 5000
RECORDS = 200


@pytest.fixture
def zookeeper(tmp_path: Path) -> Iterator[ZooKeeperServer]:
    server = ZooKeeperServer(tmp_path / "zk").start()
    yield server
    server.stop()


@pytest.fixture
def cluster(zookeeper: ZooKeeperServer, tmp_path: Path) -> Iterator[ZooKeeperCluster]:
    bounded = {
        "shutdown.timeout.ms": str(SHUTDOWN_TIMEOUT_MS),
        "controlled.shutdown.max.retries": "2",
        "controlled.shutdown.retry.backoff.ms": "500",
    }
    running = ZooKeeperCluster(zookeeper, tmp_path, brokers=2, overrides=bounded).start()
    yield running
    running.stop()


def produce(bootstrap: str, topic: str, count: int) -> list[int]:
    """Produce 0..count-1 with acks=all, idempotently; the numbers acknowledged."""
    acknowledged: list[int] = []
    errors: list[str] = []

    def delivered(error: KafkaError | None, message: Message) -> None:
        if error is None:
            acknowledged.append(int(message.value() or b""))
        else:
            errors.append(str(error))

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    for i in range(count):
        producer.produce(topic, b"%d" % i, on_delivery=delivered)
    assert producer.flush(60) == 0, f"undelivered after 60 s; errors {errors[:3]}"
    assert errors == [], errors[:3]
    return acknowledged


def test_sigterm_without_zookeeper_exits_within_the_shutdown_timeout(
    cluster: ZooKeeperCluster, zookeeper: ZooKeeperServer
) -> None:
    topic = "bounded-shutdown"
    admin = cluster.admin()
    admin.create_topics([NewTopic(topic, 1, 2)])[topic].result(30)
    wait_for(lambda: sorted(cluster.partition_state(topic, 0)[1]) == [0, 1], "both in the ISR")
    acknowledged = produce(cluster.bootstrap, topic, RECORDS)
    assert sorted(acknowledged) == list(range(RECORDS))
    leader, _ = cluster.partition_state(topic, 0)
    broker = cluster.brokers[leader]
    assert broker.process is not None

    zookeeper.stop()
    os.kill(broker.process.pid, signal.SIGTERM)
    try:
        code = broker.process.wait(SHUTDOWN_TIMEOUT_MS / 1000 + 10)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running well past shutdown.timeout.ms:\n{broker.log()[-3000:]}")
    assert code != 0, broker.log()[-3000:]
    errors = [line for line in broker.log().splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, broker.log()[-3000:]
    assert "shutdown.timeout.ms" in errors[0] and "uncontrolled" in errors[0], errors

    # Everything acknowledged is there once ZooKeeper and the broker are back.
    zookeeper.start()
    cluster.restart(leader)
    wait_for(lambda: sorted(cluster.partition_state(topic, 0)[1]) == [0, 1], "both in the ISR")
    assert sorted(read_all(cluster.bootstrap, topic, RECORDS)) == list(range(RECORDS))


def test_a_controller_that_cannot_resign_exits_within_the_shutdown_timeout(
    zookeeper: ZooKeeperServer, tmp_path: Path
) -> None:
    """Nothing to hand over (one broker), but resigning as controller writes to ZooKeeper."""
    bounded = {"shutdown.timeout.ms": str(SHUTDOWN_TIMEOUT_MS)}
    cluster = ZooKeeperCluster(zookeeper, tmp_path / "one", brokers=1, overrides=bounded).start()
    broker = cluster.brokers[0]
    assert broker.process is not None
    try:
        zookeeper.stop()
        os.kill(broker.process.pid, signal.SIGTERM)
        code = broker.process.wait(SHUTDOWN_TIMEOUT_MS / 1000 + 10)
    finally:
        cluster.stop()
    errors = [line for line in broker.log().splitlines() if line.startswith("error: ")]
    assert code != 0 and len(errors) == 1, broker.log()[-3000:]
    assert "shutdown.timeout.ms" in errors[0] and "logs flushed" in errors[0], errors
