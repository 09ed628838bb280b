"""A tiered topic on S3 (moto's server) across four broker processes over a real ZooKeeper,
its two replicas on brokers hosting no replica of `__remote_log_metadata` (one partition,
replication factor 1): they read the metadata from its leader over the wire. The
partition's leader is killed (kill -9) while it has segments to copy, twice, during an
idempotent acks=all produce; each killed broker restarts and rejoins the ISR.

Afterwards no segment is in the bucket twice, none lacks its manifest, and every
acknowledged record is read from offset 0 by confluent-kafka.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import NewTopic

from tests.integration.moto_server import (
    MotoServer,
    moto,  # noqa: F401 (a fixture)
)
from tests.integration.test_tiered_failover_s3 import (
    PADDING,
    SEGMENT_BYTES,
    STUCK_COPY_TIMEOUT_MS,
    TOPIC,
    Bucket,
    copying,
    start_tiered_cluster,
)
from tests.integration.zk_cluster import (
    AcknowledgedProducer,
    ZooKeeperCluster,
    read_all,
    wait_for,
    zookeeper,  # noqa: F401 (a fixture)
)
from tests.zookeeper import ZooKeeperServer

# Kills leaders while copies are under way: the rates it relies on hold on an idle machine.
pytestmark = [pytest.mark.slow, pytest.mark.alone]

MESSAGES = 10_000
KILLS = 2
METADATA = "__remote_log_metadata"
METADATA_ON_ONE_BROKER = {
    "remote.log.metadata.topic.num.partitions": "1",
    "remote.log.metadata.topic.replication.factor": "1",
}


@pytest.fixture
def cluster(
    zookeeper: ZooKeeperServer,  # noqa: F811 (the fixture)
    moto: MotoServer,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> Iterator[ZooKeeperCluster]:
    running = start_tiered_cluster(zookeeper, moto, tmp_path, 4, METADATA_ON_ONE_BROKER)
    yield running
    running.stop()


def test_leaders_without_a_metadata_replica_upload_nothing_twice(
    cluster: ZooKeeperCluster,
    moto: MotoServer,  # noqa: F811 (the fixture)
) -> None:
    wait_for(lambda: cluster.partition_state(METADATA, 0)[0] >= 0, "the metadata topic")
    host = cluster.partition_state(METADATA, 0)[0]
    replicas = [b for b in sorted(cluster.brokers) if b != host][:2]
    config = {
        "remote.storage.enable": "true",
        "segment.bytes": str(SEGMENT_BYTES),
        "local.retention.bytes": str(2 * SEGMENT_BYTES),
    }
    topic = NewTopic(TOPIC, num_partitions=1, replica_assignment=[replicas], config=config)
    admin = cluster.admin()  # kept: a client destroyed early fails the creation
    admin.create_topics([topic])[TOPIC].result(30)
    wait_for(lambda: sorted(cluster.partition_state(TOPIC, 0)[1]) == replicas, "ISR")
    producer = AcknowledgedProducer(cluster.bootstrap, TOPIC, MESSAGES, PADDING)
    producer.start()
    for round_ in range(KILLS):
        wait_for(lambda r=round_: producer.sent > (r + 1) * MESSAGES // (KILLS + 2), "progress")
        leader, _ = cluster.partition_state(TOPIC, 0)
        wait_for(lambda v=leader: copying(cluster, v), f"broker {leader} to have a copy due")
        acknowledged = len(producer.acknowledged)
        cluster.brokers[leader].stop(signal.SIGKILL)
        wait_for(
            lambda a=acknowledged: len(producer.acknowledged) > min(a + 100, MESSAGES - 1),
            f"acks after killing {leader} (sent {producer.sent}, failed {producer.failed[:3]})",
        )
        cluster.restart(leader)
        wait_for(lambda: sorted(cluster.partition_state(TOPIC, 0)[1]) == replicas, "ISR")
    producer.join(120)
    assert not producer.is_alive() and producer.failed == []
    assert sorted(producer.acknowledged) == list(range(MESSAGES))

    def settled() -> bool:
        """Every rolled segment copied and abandoned copies removed."""
        leader, _ = cluster.partition_state(TOPIC, 0)
        bucket = Bucket.of(moto)
        return not copying(cluster, leader) and not bucket.orphans and not bucket.duplicates()

    # Within the stuck-copy timeout and a few task intervals; what is left is reported below.
    with contextlib.suppress(AssertionError):
        wait_for(settled, "the remote tier", timeout_s=30 + STUCK_COPY_TIMEOUT_MS / 1000)
    bucket = Bucket.of(moto)
    assert bucket.orphans == []
    assert bucket.duplicates() == []
    assert bucket.gaps() == [] and bucket.manifests[0].start == 0
    assert read_all(cluster.bootstrap, TOPIC, MESSAGES) == list(range(MESSAGES))
