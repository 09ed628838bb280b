"""A topic znode another tool wrote, in a shape no broker writes, over a real ZooKeeper:
the controller and every broker log and skip it, and topics are still created and their
leaders elected again when a leader dies."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import NewTopic
from kazoo.client import KazooClient

from tests.integration.zk_cluster import (
    ZooKeeperCluster,
    wait_for,
    zookeeper,  # noqa: F401 (a fixture)
)
from tests.zookeeper import ZooKeeperServer


@pytest.fixture
def cluster(
    zookeeper: ZooKeeperServer,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> Iterator[ZooKeeperCluster]:
    running = ZooKeeperCluster(zookeeper, tmp_path, brokers=2).start()
    yield running
    running.stop()


def test_a_foreign_topic_znode_does_not_stop_elections(cluster: ZooKeeperCluster) -> None:
    client = KazooClient(hosts=cluster.zookeeper.connect + cluster.chroot)
    client.start()
    try:
        client.create("/brokers/topics/a-foreign", b"not json", makepath=True)
    finally:
        client.stop()
        client.close()
    admin = cluster.admin()
    admin.create_topics([NewTopic("t", 1, 2)])["t"].result(30)
    leader, _ = cluster.partition_state("t", 0)
    cluster.brokers[leader].stop(signal.SIGKILL)
    wait_for(lambda: cluster.partition_state("t", 0)[0] not in (leader, -1), "a new leader")
