"""Partition reassignment over a real ZooKeeper, three broker processes: kafka-python's
KafkaAdminClient moves a partition from brokers {0,1} to {1,2} while confluent-kafka
produces with acks=all. The topic znode holds Kafka's JSON (`adding_replicas`,
`removing_replicas`, empty once done), every acknowledged record is read back and
broker 0 deletes its log of the partition."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import NewTopic
from kazoo.client import KazooClient

from tests.integration.test_zookeeper_cluster import AcknowledgedProducer, read_all
from tests.integration.zk_cluster import ZooKeeperCluster, wait_for
from tests.zookeeper import ZooKeeperServer

LEGACY_RESOURCES = r"(read|open)_text is deprecated"  # kafka-python's, not the broker's
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", LEGACY_RESOURCES, DeprecationWarning)
    from kafka import KafkaAdminClient, TopicPartition

pytestmark = pytest.mark.filterwarnings(f"ignore:{LEGACY_RESOURCES}:DeprecationWarning")

RECORDS = 3_000


@pytest.fixture
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    server = ZooKeeperServer(tmp_path_factory.mktemp("zk")).start()
    yield server
    server.stop()


@pytest.fixture
def cluster(zookeeper: ZooKeeperServer, tmp_path: Path) -> Iterator[ZooKeeperCluster]:
    running = ZooKeeperCluster(zookeeper, tmp_path).start()
    yield running
    running.stop()


def test_a_partition_moves_over_zookeeper(
    cluster: ZooKeeperCluster, zookeeper: ZooKeeperServer
) -> None:
    topic = "moving"
    creating = cluster.admin()
    creating.create_topics([NewTopic(topic, 1, replica_assignment=[[0, 1]])])[topic].result(30)
    producer = AcknowledgedProducer(cluster.bootstrap, topic, RECORDS)
    producer.start()
    wait_for(lambda: len(producer.acknowledged) > RECORDS // 3, "records acknowledged first")

    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    zk = KazooClient(hosts=zookeeper.connect + cluster.chroot)
    zk.start()
    try:
        tp = TopicPartition(topic, 0)
        assert admin.alter_partition_reassignments({tp: [1, 2]}) == {tp: None}
        wait_for(lambda: admin.list_partition_reassignments() == {}, "the move to complete")
        producer.join(180)
        data, _ = zk.get(f"/brokers/topics/{topic}")
        znode = json.loads(data)
        assert znode["partitions"] == {"0": [1, 2]}
        assert znode["adding_replicas"] == {} and znode["removing_replicas"] == {}

        def state() -> dict[str, Any]:
            return json.loads(zk.get(f"/brokers/topics/{topic}/partitions/0/state")[0])

        # (a follower may drop out of the ISR for a moment on a loaded machine)
        wait_for(
            lambda: (s := state())["leader"] in (1, 2) and sorted(s["isr"]) == [1, 2],
            "the new replicas to lead and be the ISR",
        )
    finally:
        zk.stop()
        zk.close()
        admin.close()
    assert producer.failed == []
    assert sorted(read_all(cluster.bootstrap, topic, RECORDS)) == sorted(producer.acknowledged)
    assert len(producer.acknowledged) == RECORDS
    old = cluster.brokers[0].data_dir / "logs" / f"{topic}-0"
    wait_for(lambda: not old.exists(), "broker 0 to delete its log")
