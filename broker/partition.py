"""`Partition`: one partition's replica on this broker: its log, leader epoch and high watermark.

For now every partition has one replica, this broker, which is its leader and the
whole ISR: the high watermark follows the log end offset on each append. Appends
are synchronous on the event loop, so they are serialised by construction.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.storage.log import FetchDataInfo, Log, LogAppendInfo
from tierbroker.storage.topic_partition import TopicPartition


@dataclass(frozen=True, slots=True)
class OffsetAndEpoch:
    offset: int
    timestamp: int
    leader_epoch: int


class Partition:
    def __init__(self, log: Log, leader_id: int, leader_epoch: int) -> None:
        self.log = log
        self.leader_id = leader_id
        self.leader_epoch = leader_epoch
        # A new leader whose ISR is itself: everything in its log is committed.
        self.log.update_high_watermark(self.log.log_end_offset)

    @property
    def topic_partition(self) -> TopicPartition:
        return self.log.topic_partition

    @property
    def topic_id(self) -> uuid.UUID:
        return self.log.topic_id

    @property
    def high_watermark(self) -> int:
        return self.log.high_watermark

    def check_leader_epoch(self, current_leader_epoch: int) -> None:
        """Fence a client whose view of the leader epoch differs (-1: no check), as Kafka does."""
        if current_leader_epoch < 0 or current_leader_epoch == self.leader_epoch:
            return
        fenced = current_leader_epoch < self.leader_epoch
        raise KafkaError(
            ErrorCode.fenced_leader_epoch if fenced else ErrorCode.unknown_leader_epoch,
            f"{self.topic_partition}: client's leader epoch {current_leader_epoch}, "
            f"current {self.leader_epoch}",
        )

    def append_records_to_leader(self, records: bytearray) -> LogAppendInfo:
        info = self.log.append_as_leader(records, self.leader_epoch)
        # The ISR is this replica alone: everything appended is committed.
        self.log.update_high_watermark(self.log.log_end_offset)
        return info

    def read(
        self, offset: int, max_bytes: int, min_one_batch: bool, current_leader_epoch: int
    ) -> FetchDataInfo:
        self.check_leader_epoch(current_leader_epoch)
        return self.log.read(offset, max_bytes, self.log.high_watermark, min_one_batch)

    def fetch_offset_for_timestamp(
        self, timestamp_ms: int, current_leader_epoch: int
    ) -> OffsetAndEpoch | None:
        self.check_leader_epoch(current_leader_epoch)
        found = self.log.fetch_offset_by_timestamp(timestamp_ms)
        if found is None:
            return None
        offset, timestamp, epoch = found
        if timestamp_ms >= 0 and offset >= self.log.high_watermark:
            return None
        return OffsetAndEpoch(min(offset, self.log.high_watermark), timestamp, epoch)

    def last_offset_for_leader_epoch(
        self, current_leader_epoch: int, leader_epoch: int
    ) -> tuple[int, int]:
        self.check_leader_epoch(current_leader_epoch)
        return self.log.end_offset_for_epoch(leader_epoch)
