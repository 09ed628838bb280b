"""A tiered topic on S3 (moto's server) across five broker processes over a real ZooKeeper,
its three replicas on brokers hosting no replica of `__remote_log_metadata` (one
partition, replication factor 1), so one broker hosts neither. Its leadership moves, as
an operator moves it, between and during idempotent acks=all produces:
- a reassignment that only changes the replicas' order, then a preferred election
  (ElectLeaders) hands leadership to the new first replica; the old leader, whose epoch
  of that move holds no record, follows its successor and rejoins the ISR;
- during a produce, a reassignment onto the fifth broker, which must complete (that
  replica rebuilds from the remote tier and joins the ISR), then a preferred election
  makes it the leader.

Then a follower is stopped, its partition directory deleted, and restarted: it rebuilds
from the remote tier, its local log starting at or after the leader's local log start,
fetching only the leader's local tail, and rejoins the ISR.

Afterwards no segment is in the bucket twice, none lacks its manifest, the manifests
cover the remote tier from offset 0, and every acknowledged record is read from offset 0
by confluent-kafka.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import ElectionType
from confluent_kafka import TopicPartition as CkTopicPartition
from confluent_kafka.admin import NewTopic

from tests.integration.moto_server import (
    MotoServer,
    moto,  # noqa: F401 (a fixture)
)
from tests.integration.test_tiered_failover_elsewhere_s3 import METADATA, METADATA_ON_ONE_BROKER
from tests.integration.test_tiered_failover_s3 import (
    PADDING,
    SEGMENT_BYTES,
    STUCK_COPY_TIMEOUT_MS,
    TOPIC,
    Bucket,
    copying,
    start_tiered_cluster,
)
from tests.integration.test_zookeeper_reassignment import (
    LEGACY_RESOURCES,  # kafka-python's import-time warning, filtered there
    KafkaAdminClient,
)
from tests.integration.test_zookeeper_reassignment import TopicPartition as KpTopicPartition
from tests.integration.tiering_helpers import (
    check_rebuilt_from_the_tail,
    metric,
    metrics,
    status,
)
from tests.integration.zk_cluster import (
    AcknowledgedProducer,
    ZooKeeperCluster,
    read_all,
    wait_for,
    zookeeper,  # noqa: F401 (a fixture)
)
from tests.zookeeper import ZooKeeperServer

# Five broker processes and a produce spanning the moves: run on an otherwise idle machine.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.alone,
    pytest.mark.filterwarnings(f"ignore:{LEGACY_RESOURCES}:DeprecationWarning"),
]

MESSAGES = 10_000
PRODUCED_BYTES = sum(len(b"%d" % i) + PADDING for i in range(MESSAGES))


@pytest.fixture
def cluster(
    zookeeper: ZooKeeperServer,  # noqa: F811 (the fixture)
    moto: MotoServer,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> Iterator[ZooKeeperCluster]:
    running = start_tiered_cluster(zookeeper, moto, tmp_path, 5, METADATA_ON_ONE_BROKER)
    yield running
    running.stop()


def reassign(cluster: ZooKeeperCluster, target: list[int]) -> None:
    """Move the partition to `target` (kafka-python's admin client) and wait until the move
    is done: none listed in progress, the replicas as asked."""
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    tp = KpTopicPartition(TOPIC, 0)
    try:
        assert admin.alter_partition_reassignments({tp: target}) == {tp: None}
        wait_for(
            lambda: (
                admin.list_partition_reassignments() == {} and cluster.replicas(TOPIC, 0) == target
            ),
            f"the move to {target}",
            show=lambda: (
                admin.list_partition_reassignments(),
                cluster.replicas(TOPIC, 0),
                cluster.partition_state(TOPIC, 0),
            ),
        )
    finally:
        admin.close()  # before any broker stops: kafka-python leaves its socket otherwise


def elect_preferred(cluster: ZooKeeperCluster) -> int:
    """A preferred election (ElectLeaders): the first replica leads; its id."""
    tp = CkTopicPartition(TOPIC, 0)
    assert cluster.admin().elect_leaders(ElectionType.PREFERRED, [tp]).result(30) == {tp: None}
    preferred = cluster.replicas(TOPIC, 0)[0]
    wait_for(lambda: cluster.partition_state(TOPIC, 0)[0] == preferred, f"{preferred} to lead")
    return preferred


def local_log_start(cluster: ZooKeeperCluster, broker: int) -> int:
    """The base offset of the broker's oldest local segment of the partition."""
    directory = cluster.brokers[broker].data_dir / "logs" / f"{TOPIC}-0"
    return min(int(p.stem) for p in directory.glob("*.log"))


def test_leadership_moves_and_an_erased_follower_rebuilds_from_the_remote_tier(
    cluster: ZooKeeperCluster,
    moto: MotoServer,  # noqa: F811 (the fixture)
) -> None:
    wait_for(lambda: cluster.partition_state(METADATA, 0)[0] >= 0, "the metadata topic")
    host = cluster.partition_state(METADATA, 0)[0]
    first, second, third, fifth = [b for b in sorted(cluster.brokers) if b != host]
    config = {
        "min.insync.replicas": "2",
        "remote.storage.enable": "true",
        "segment.bytes": str(SEGMENT_BYTES),
        "local.retention.bytes": str(2 * SEGMENT_BYTES),
    }
    replicas = [first, second, third]
    topic = NewTopic(TOPIC, num_partitions=1, replica_assignment=[replicas], config=config)
    admin = cluster.admin()  # kept: a client destroyed early fails the creation
    admin.create_topics([topic])[TOPIC].result(30)
    wait_for(lambda: sorted(cluster.partition_state(TOPIC, 0)[1]) == replicas, "ISR")
    half = MESSAGES // 2
    before = AcknowledgedProducer(cluster.bootstrap, TOPIC, half, PADDING)
    before.start()
    before.join(120)
    wait_for(lambda: status(cluster.brokers[first], TOPIC)["remote_segments"] > 0, "a copy")
    # Nothing produced meanwhile: the leader's epoch of the reordering move stays empty, and
    # the leader, now a follower, must drop it to fetch from its successor.
    reassign(cluster, [second, first, third])  # the same replicas, another preferred one
    assert elect_preferred(cluster) == second

    after = AcknowledgedProducer(cluster.bootstrap, TOPIC, MESSAGES - half, PADDING, half)
    after.start()
    wait_for(lambda: copying(cluster, second), f"broker {second} to have a copy due")
    moved = [fifth, second, first]
    reassign(cluster, moved)  # the fifth broker rebuilds from the remote tier to join
    assert elect_preferred(cluster) == fifth
    after.join(120)
    for producer in (before, after):
        assert not producer.is_alive() and producer.failed == []
    assert sorted(before.acknowledged + after.acknowledged) == list(range(MESSAGES))

    erased = second  # the former leader `first` must still be in sync at the end
    leader_start = status(cluster.brokers[fifth], TOPIC)["local_log_start_offset"]
    assert leader_start > 0
    cluster.brokers[erased].stop()
    wait_for(lambda: erased not in cluster.partition_state(TOPIC, 0)[1], "the ISR to shrink")
    shutil.rmtree(cluster.brokers[erased].data_dir / "logs" / f"{TOPIC}-0")
    cluster.restart(erased)
    wait_for(
        lambda: sorted(cluster.partition_state(TOPIC, 0)[1]) == sorted(moved),
        f"erased broker {erased} back in the ISR",
        show=lambda: cluster.partition_state(TOPIC, 0),
    )
    assert local_log_start(cluster, erased) >= leader_start
    check_rebuilt_from_the_tail(
        lambda name: metric(metrics(cluster.brokers[erased]), name, topic=TOPIC) or 0.0,
        PRODUCED_BYTES,
    )

    def settled() -> bool:
        """Every rolled segment copied and abandoned copies removed."""
        bucket = Bucket.of(moto)
        return not copying(cluster, fifth) and not bucket.orphans and not bucket.duplicates()

    # Within the stuck-copy timeout and a few task intervals; what is left is reported below.
    with contextlib.suppress(AssertionError):
        wait_for(settled, "the remote tier", timeout_s=30 + STUCK_COPY_TIMEOUT_MS / 1000)
    bucket = Bucket.of(moto)
    assert bucket.orphans == []
    assert bucket.duplicates() == []
    assert bucket.gaps() == [] and bucket.manifests[0].start == 0
    assert read_all(cluster.bootstrap, TOPIC, MESSAGES) == list(range(MESSAGES))
