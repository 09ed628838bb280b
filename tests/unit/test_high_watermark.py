"""The leader's high watermark: the lowest log end offset of the ISR and of caught-up
followers that may join it; a follower that may not (gone, or shutting down) holds
nothing back, as in Kafka."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tierbroker.broker.metadata.zk_data import PartitionState
from tierbroker.broker.replication.partition import FollowerFetch, Partition
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.protocol.records import build_batch
from tierbroker.storage.log import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, Log, now_ms
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.topic_partition import TopicPartition

TP = TopicPartition("hw", 0)
REPLICAS = (0, 1, 2)


def leader(tmp_path: Path, eligible: set[int]) -> Partition:
    """Broker 0 leading with ISR {0, 1}; broker 2 caught up on an empty log, outside it."""
    log = Log(tmp_path / "hw-0", TP, LogConfig(), uuid.uuid4())
    partition = Partition(log, 0, is_isr_eligible=lambda broker_id: broker_id in eligible)
    partition.make_leader(PartitionState(0, 1, (0, 1), 1, 0), REPLICAS)
    fetch(partition, 2, 0)  # at the log end: caught up, for replica.lag.time.max.ms
    return partition


def fetch(partition: Partition, replica_id: int, offset: int) -> None:
    partition.update_follower_fetch_state(FollowerFetch(replica_id, 1, offset, 1, 0, 1), now_ms())


def test_a_caught_up_follower_that_may_join_the_isr_is_waited_for(tmp_path: Path) -> None:
    partition = leader(tmp_path, eligible={1, 2})
    partition.append_records_to_leader(bytearray(build_batch([(None, b"v", [], 0)] * 5)), -1)
    fetch(partition, 1, 5)
    assert partition.high_watermark == 0
    assert partition.check_enough_replicas(5) is None
    fetch(partition, 2, 5)
    assert partition.high_watermark == 5
    assert partition.check_enough_replicas(5) == ErrorCode.none


def test_a_caught_up_follower_shutting_down_holds_nothing_back(tmp_path: Path) -> None:
    partition = leader(tmp_path, eligible={1})
    partition.append_records_to_leader(bytearray(build_batch([(None, b"v", [], 0)] * 5)), -1)
    fetch(partition, 1, 5)
    assert partition.high_watermark == 5
    assert partition.check_enough_replicas(5) == ErrorCode.none


def test_a_new_leader_answers_offset_not_available_until_its_high_watermark_is_current(
    tmp_path: Path,
) -> None:
    """Kafka's rule: while a new leader's high watermark lags the start of its epoch, the
    committed end is unknown; latest, and a lookup past the high watermark, are retriable."""
    log = Log(tmp_path / "hw-0", TP, LogConfig(), uuid.uuid4())
    partition = Partition(log, 0, is_isr_eligible=lambda _broker_id: True)
    partition.make_follower(PartitionState(1, 0, (0, 1), 1, 0), (0, 1))
    # Five records replicated, the leader's high watermark not yet passed on.
    partition.append_records_to_follower(build_batch([(None, b"v", [], 0)] * 5), 0, 0)
    partition.make_leader(PartitionState(0, 1, (0, 1), 1, 1), (0, 1))
    assert partition.high_watermark == 0 and partition.leader_epoch_start_offset == 5

    for timestamp in (LATEST_TIMESTAMP, 0):
        with pytest.raises(KafkaError) as lagging:
            partition.fetch_offset_for_timestamp(timestamp, 1)
        assert lagging.value.code == ErrorCode.offset_not_available
    earliest = partition.fetch_offset_for_timestamp(EARLIEST_TIMESTAMP, 1)
    assert earliest is not None and earliest.offset == 0

    fetch(partition, 1, 5)  # the follower at the log end: the high watermark is current
    assert partition.high_watermark == 5
    latest = partition.fetch_offset_for_timestamp(LATEST_TIMESTAMP, 1)
    assert latest is not None and latest.offset == 5
    first = partition.fetch_offset_for_timestamp(0, 1)
    assert first is not None and first.offset == 0
