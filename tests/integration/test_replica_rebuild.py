"""A follower whose disk was emptied rebuilds a tiered partition from the remote tier: three
brokers in one process, in racks a, b and c, sharing one remote tier, as Kafka does by
default (`follower.fetch.last.tiered.offset.enable=false`, KIP-405 without KIP-1023, which
test_last_tiered_offset.py covers).

Its leader answers its fetch from offset 0 with OFFSET_MOVED_TO_TIERED_STORAGE; it takes
the leader-epoch checkpoint and producer snapshot of the remote segment before the
leader's local log, starts its log there, fetches only the leader's local tail (bytes
counted), rejoins the ISR, and serves every record from offset 0, the remote ones
included, to a consumer in its rack.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tests.integration.test_follower_fetching import (
    RACKS,
    consume_confluent,
    create_topic,
    log_of,
    sequence,
)
from tests.integration.waiting import wait_for
from tierbroker.broker.server.embedded import EmbeddedCluster
from tierbroker.storage.topic_partition import TopicPartition

TOPIC = "rebuilt"
RECORDS = 20_000
SEGMENT_BYTES = 64 * 1024
LOCAL_RETENTION_BYTES = 3 * SEGMENT_BYTES


def tiered_properties(remote_dir: Path) -> dict[str, str]:
    """In-process brokers that tier into `remote_dir` every 200 ms and see a lost follower
    or broker within seconds."""
    return {
        "replica.lag.time.max.ms": "4000",
        "replica.fetch.backoff.ms": "200",
        "zookeeper.session.timeout.ms": "3000",
        "remote.log.storage.system.enable": "true",
        "rsm.config.dir": str(remote_dir),
        "remote.log.manager.task.interval.ms": "200",
        "log.retention.check.interval.ms": "200",
    }


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(
        tmp_path / "brokers",
        brokers=3,
        racks=RACKS,
        properties={
            "replica.selector.class": "org.apache.kafka.common.replica.RackAwareReplicaSelector",
            "follower.fetch.last.tiered.offset.enable": "false",
            **tiered_properties(tmp_path / "remote"),
        },
    ) as running:
        yield running


def produce(cluster: EmbeddedCluster, count: int) -> int:
    """Produce `count` numbered records of about 110 bytes, in batches much smaller than a
    segment; the bytes of their values."""
    producer = Producer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "acks": "all",
            "linger.ms": 5,
            "batch.size": 16384,
            "enable.idempotence": True,
        }
    )
    errors = []
    size = 0
    for i in range(count):
        value = b"%d" % i + b"." * 100
        size += len(value)
        producer.produce(TOPIC, value, on_delivery=lambda e, _m: errors.append(e))
    producer.flush(30)
    assert errors == [None] * count
    return size


def in_sync(cluster: EmbeddedCluster, leader: int) -> set[int]:
    """The partition's ISR as its leader knows it."""
    return set(cluster.broker(leader).replicas.partitions[TopicPartition(TOPIC, 0)].isr)


def metric(cluster: EmbeddedCluster, broker_id: int, name: str) -> float:
    value = cluster.broker(broker_id).registry.get_sample_value(name, {"topic": TOPIC})
    return value or 0.0


def test_a_follower_with_an_emptied_disk_rebuilds_from_the_remote_tier_and_fetches_only_the_tail(
    cluster: EmbeddedCluster,
) -> None:
    leader, (follower, _) = create_topic(
        cluster,
        TOPIC,
        **{
            "remote.storage.enable": "true",
            "segment.bytes": str(SEGMENT_BYTES),
            "local.retention.bytes": str(LOCAL_RETENTION_BYTES),
        },
    )
    produced_bytes = produce(cluster, RECORDS)
    leader_log = log_of(cluster, leader, TOPIC)

    def settled() -> bool:
        """Every rolled segment copied, and local retention has nothing left to delete."""
        segments = leader_log.segments
        return (
            leader_log.highest_offset_in_remote_storage + 1 == segments[-1].base_offset
            and leader_log.size_in_bytes - segments[0].size < LOCAL_RETENTION_BYTES
        )

    wait_for(
        settled,
        "the leader to copy every rolled segment and keep only its local tail",
        show=lambda: (
            leader_log.highest_offset_in_remote_storage,
            leader_log.local_log_start_offset,
            leader_log.size_in_bytes,
        ),
    )
    assert leader_log.local_log_start_offset > RECORDS // 2  # most records are remote only
    local_start = leader_log.local_log_start_offset
    leader_local_bytes = leader_log.size_in_bytes

    cluster.stop_broker(follower)
    wait_for(
        lambda: follower not in in_sync(cluster, leader), "the stopped follower out of the ISR"
    )
    log_dir = cluster.broker(follower).config.log_dir_paths[0]
    shutil.rmtree(log_dir)  # an emptied disk: its logs, checkpoints and remote metadata
    log_dir.mkdir()
    cluster.start_broker(follower)

    wait_for(lambda: follower in in_sync(cluster, leader), "the rebuilt follower back in the ISR")
    rebuilt = log_of(cluster, follower, TOPIC)
    assert rebuilt.log_start_offset == leader_log.log_start_offset == 0
    assert rebuilt.segments[0].base_offset == local_start
    assert rebuilt.log_end_offset == leader_log.log_end_offset == RECORDS
    assert rebuilt.leader_epoch_cache.entries == leader_log.leader_epoch_cache.entries
    # The idempotent producer's state came with the remote segment's snapshot.
    assert set(rebuilt.producer_state.producers) == set(leader_log.producer_state.producers)
    assert metric(cluster, follower, "BuildRemoteLogAuxStateRequestsPerSec_total") >= 1
    # Only the leader's local tail came from the leader, byte for byte.
    fetched = metric(cluster, follower, "ReplicationBytesInPerSec_total")
    assert fetched == leader_local_bytes == leader_log.size_in_bytes
    assert fetched < produced_bytes / 4

    values, fetching = consume_confluent(cluster, TOPIC, RECORDS, RACKS[follower])
    assert sequence(values) == list(range(RECORDS))
    assert fetching == {follower}
    assert metric(cluster, follower, "RemoteFetchBytesPerSec_total") > 0
