"""The leader's high watermark: the lowest log end offset of the ISR and of caught-up
followers that may join it; a follower that may not (gone, or shutting down) holds
nothing back, as in Kafka."""

from __future__ import annotations

import uuid
from pathlib import Path

from tierbroker.broker.cluster.zk_data import PartitionState
from tierbroker.broker.partition import FollowerFetch, Partition
from tierbroker.protocol.errors import ErrorCode
from tierbroker.protocol.records import build_batch
from tierbroker.storage.log import Log, now_ms
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
