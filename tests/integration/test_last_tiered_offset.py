"""KIP-1023 on a cluster: a replica added to a tiered partition starts at its leader's last
tiered offset + 1. Three brokers in one process, in racks a, b and c, sharing one remote tier.

The leader keeps three segments locally, two of them tiered already. A reassignment adds a
third replica: it takes the leader-epoch lineage and producer snapshot of the last tiered
segment from the remote tier, starts its log after it and fetches from the leader only the
records not tiered yet (none of the leader's local segments below), and joins the ISR. With
the old leader stopped, a consumer in its rack reads every record through it, from offset
0 (the remote tier) to the end (its local log).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.test_follower_fetching import (
    RACKS,
    consume_confluent,
    log_of,
    produce,
    sequence,
)
from tests.integration.test_replica_rebuild import tiered_properties
from tests.integration.waiting import wait_for
from tierbroker.broker.server.embedded import EmbeddedCluster
from tierbroker.storage.topic_partition import TopicPartition

LEGACY_RESOURCES = r"(read|open)_text is deprecated"  # kafka-python's own warning
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", LEGACY_RESOURCES, DeprecationWarning)
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KpTopicPartition

pytestmark = pytest.mark.filterwarnings(f"ignore:{LEGACY_RESOURCES}:DeprecationWarning")

TOPIC = "from-the-last-tiered-offset"
RECORDS = 20_000
SEGMENT_BYTES = 64 * 1024
LOCAL_RETENTION_BYTES = 3 * SEGMENT_BYTES
OLD_LEADER, FOLLOWER, ADDED = 0, 1, 2


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(
        tmp_path / "brokers",
        brokers=3,
        racks=RACKS,
        properties={
            "replica.selector.class": "org.apache.kafka.common.replica.RackAwareReplicaSelector",
            "auto.leader.rebalance.enable": "false",
            **tiered_properties(tmp_path / "remote"),
        },
    ) as running:
        yield running


def metric(cluster: EmbeddedCluster, broker_id: int, name: str) -> float:
    value = cluster.broker(broker_id).registry.get_sample_value(name, {"topic": TOPIC})
    return value or 0.0


def leader_and_isr(cluster: EmbeddedCluster, via: int) -> tuple[int, set[int]]:
    state = cluster.broker(via).cache.states[TopicPartition(TOPIC, 0)]
    return state.leader, set(state.isr)


def test_a_new_replica_starts_after_the_last_tiered_offset_and_serves_everything(
    cluster: EmbeddedCluster,
) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    config = {
        "remote.storage.enable": "true",
        "segment.bytes": str(SEGMENT_BYTES),
        "local.retention.bytes": str(LOCAL_RETENTION_BYTES),
    }
    topic = NewTopic(
        TOPIC, num_partitions=1, replica_assignment=[[OLD_LEADER, FOLLOWER]], config=config
    )
    admin.create_topics([topic])[TOPIC].result(30)
    wait_for(
        lambda: leader_and_isr(cluster, OLD_LEADER) == (OLD_LEADER, {OLD_LEADER, FOLLOWER}),
        "the topic, led by broker 0, both replicas in sync",
    )
    produce(cluster, TOPIC, RECORDS)
    leader_log = log_of(cluster, OLD_LEADER, TOPIC)

    def settled() -> bool:
        """Every rolled segment copied, and local retention has nothing left to delete."""
        segments = leader_log.segments
        return bool(
            leader_log.highest_offset_in_remote_storage + 1 == segments[-1].base_offset
            and leader_log.size_in_bytes - segments[0].size < LOCAL_RETENTION_BYTES
        )

    wait_for(
        lambda: cluster.read(settled),
        "the leader to copy every rolled segment and keep only its local tail",
        show=lambda: (leader_log.highest_offset_in_remote_storage, leader_log.segments),
    )
    local_start, pending_upload, not_tiered_bytes, lineage, producers = cluster.read(
        lambda: (
            leader_log.local_log_start_offset,
            leader_log.highest_offset_in_remote_storage + 1,
            leader_log.segments[-1].size,
            leader_log.leader_epoch_cache.entries,
            set(leader_log.producer_state.producers),
        )
    )
    # Local segments the remote tier holds too: KIP-405 would have the new replica fetch them.
    assert 0 < local_start < pending_upload < RECORDS
    assert producers

    reassigning = KafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers)
    try:
        tp = KpTopicPartition(TOPIC, 0)
        replicas = [OLD_LEADER, FOLLOWER, ADDED]
        assert reassigning.alter_partition_reassignments({tp: replicas}) == {tp: None}
    finally:
        reassigning.close()
    wait_for(
        lambda: leader_and_isr(cluster, OLD_LEADER) == (OLD_LEADER, set(replicas)),
        "the added replica in the ISR",
        show=lambda: leader_and_isr(cluster, OLD_LEADER),
    )
    added = log_of(cluster, ADDED, TOPIC)
    first_segment, log_start, end, added_lineage, added_producers = cluster.read(
        lambda: (
            added.segments[0].base_offset,
            added.log_start_offset,
            added.log_end_offset,
            added.leader_epoch_cache.entries,
            set(added.producer_state.producers),
        )
    )
    assert first_segment == pending_upload
    assert log_start == 0  # below its local log, every record is in the remote tier
    assert end == RECORDS
    assert added_lineage == lineage
    assert added_producers == producers
    assert metric(cluster, ADDED, "BuildRemoteLogAuxStateRequestsPerSec_total") >= 1
    # Only the records not tiered yet crossed over, none of the leader's local segments below.
    assert metric(cluster, ADDED, "ReplicationBytesInPerSec_total") == not_tiered_bytes

    cluster.stop_broker(OLD_LEADER)
    wait_for(
        lambda: leader_and_isr(cluster, ADDED)[0] in (FOLLOWER, ADDED),
        "a new leader",
        show=lambda: leader_and_isr(cluster, ADDED),
    )
    values, fetching = consume_confluent(cluster, TOPIC, RECORDS, RACKS[ADDED])
    assert sequence(values) == list(range(RECORDS))
    assert fetching == {ADDED}
    assert metric(cluster, ADDED, "RemoteFetchBytesPerSec_total") > 0
