"""`ReplicaManager`: the partitions this broker hosts, and appends and reads across them.

Handlers call it with plain values and get plain results back; it decides which
partition answers, what error a partition gets, and when a fetch must wait.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from broker.partition import OffsetAndEpoch, Partition
from broker.purgatory import Purgatory
from protocol.errors import ErrorCode, KafkaError
from protocol.records import InvalidRecordError
from storage.log_config import LogConfig
from storage.log_manager import LogManager
from storage.segment import FileSlice
from storage.topic_partition import TopicPartition

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ProduceResult:
    error: ErrorCode
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class FetchRequestPartition:
    topic_partition: TopicPartition
    fetch_offset: int
    max_bytes: int
    current_leader_epoch: int = -1


@dataclass(frozen=True, slots=True)
class FetchResultPartition:
    error: ErrorCode
    high_watermark: int = -1
    log_start_offset: int = -1
    records: FileSlice | None = None


@dataclass(frozen=True, slots=True)
class FetchParams:
    max_wait_ms: int
    min_bytes: int
    max_bytes: int


class ReplicaManager:
    def __init__(self, broker_id: int, log_manager: LogManager) -> None:
        self.broker_id = broker_id
        self.log_manager = log_manager
        self.partitions: dict[TopicPartition, Partition] = {}
        self.fetch_purgatory = Purgatory()

    # Leadership ----------------------------------------------------------------------

    def make_leader(
        self, tp: TopicPartition, topic_id: uuid.UUID, config: LogConfig, leader_epoch: int
    ) -> Partition:
        log_ = self.log_manager.get_or_create_log(tp, topic_id, config)
        # As Kafka's makeLeader: the new epoch starts at the log end offset.
        log_.leader_epoch_cache.assign(leader_epoch, log_.log_end_offset)
        partition = Partition(log_, self.broker_id, leader_epoch)
        self.partitions[tp] = partition
        return partition

    def stop_replica(self, tp: TopicPartition, delete: bool) -> None:
        self.partitions.pop(tp, None)
        if delete:
            self.log_manager.delete_log(tp)
        self.fetch_purgatory.notify(tp)

    def update_config(self, tp: TopicPartition, config: LogConfig) -> None:
        partition = self.partitions.get(tp)
        if partition is not None:
            partition.log.config = config

    def partition_or_error(self, tp: TopicPartition) -> Partition:
        partition = self.partitions.get(tp)
        if partition is None:
            raise KafkaError(ErrorCode.unknown_topic_or_partition, f"{tp} is not hosted here")
        return partition

    # Produce -------------------------------------------------------------------------

    def append_records(
        self, entries: dict[TopicPartition, bytes]
    ) -> dict[TopicPartition, ProduceResult]:
        """Append to each partition as leader; errors stay per partition."""
        results = {}
        for tp, records in entries.items():
            try:
                partition = self.partition_or_error(tp)
                info = partition.append_records_to_leader(bytearray(records))
            except InvalidRecordError as e:
                log.info("produce to %s refused: %s", tp, e)
                results[tp] = ProduceResult(e.code, error_message=str(e))
                continue
            except KafkaError as e:
                results[tp] = ProduceResult(e.code, error_message=str(e))
                continue
            results[tp] = ProduceResult(
                ErrorCode.none, info.first_offset, info.log_append_time_ms, info.log_start_offset
            )
            self.fetch_purgatory.notify(tp)
        return results

    # Fetch ---------------------------------------------------------------------------

    async def fetch_messages(
        self, params: FetchParams, requests: list[FetchRequestPartition]
    ) -> list[FetchResultPartition]:
        """Read every requested partition; wait up to max_wait_ms for min_bytes (delayed fetch)."""
        results = self._read(params, requests)
        if params.max_wait_ms <= 0 or not requests or self._satisfied(params, results):
            return results
        keys = [r.topic_partition for r in requests]
        await self.fetch_purgatory.wait_until(
            keys,
            params.max_wait_ms / 1000,
            lambda: self._satisfied(params, self._read(params, requests)),
        )
        return self._read(params, requests)

    @staticmethod
    def _satisfied(params: FetchParams, results: list[FetchResultPartition]) -> bool:
        if any(r.error != ErrorCode.none for r in results):
            return True
        return sum(r.records.length for r in results if r.records) >= params.min_bytes

    def _read(
        self, params: FetchParams, requests: list[FetchRequestPartition]
    ) -> list[FetchResultPartition]:
        bytes_left = params.max_bytes
        min_one_batch = (
            True  # KIP-74: the first partition with data returns a batch even if too big
        )
        results = []
        for request in requests:
            result = self._read_partition(
                request, min(bytes_left, request.max_bytes), min_one_batch
            )
            if result.records is not None:
                bytes_left -= result.records.length
                min_one_batch = False
            results.append(result)
        return results

    def _read_partition(
        self, request: FetchRequestPartition, max_bytes: int, min_one_batch: bool
    ) -> FetchResultPartition:
        try:
            partition = self.partition_or_error(request.topic_partition)
            if max_bytes <= 0 and not min_one_batch:
                return FetchResultPartition(
                    ErrorCode.none, partition.high_watermark, partition.log.log_start_offset
                )
            data = partition.read(
                request.fetch_offset, max_bytes, min_one_batch, request.current_leader_epoch
            )
            return FetchResultPartition(
                ErrorCode.none,
                partition.high_watermark,
                partition.log.log_start_offset,
                data.records,
            )
        except KafkaError as e:
            hosted = self.partitions.get(request.topic_partition)
            if hosted is None:
                return FetchResultPartition(e.code)
            return FetchResultPartition(e.code, hosted.high_watermark, hosted.log.log_start_offset)

    def delete_records(self, tp: TopicPartition, offset: int) -> int:
        """DeleteRecords: move the log start offset (-1: to the high watermark); returns it."""
        log_ = self.partition_or_error(tp).log
        target = log_.high_watermark if offset == -1 else offset
        if target < 0:
            raise KafkaError(
                ErrorCode.offset_out_of_range, f"{tp}: cannot delete records below {offset}"
            )
        log_.maybe_increment_log_start_offset(target)
        log_.delete_old_segments()
        return log_.log_start_offset

    # Offsets -------------------------------------------------------------------------

    def fetch_offset_for_timestamp(
        self, tp: TopicPartition, timestamp_ms: int, current_leader_epoch: int
    ) -> OffsetAndEpoch | None:
        return self.partition_or_error(tp).fetch_offset_for_timestamp(
            timestamp_ms, current_leader_epoch
        )

    def last_offset_for_leader_epoch(
        self, tp: TopicPartition, current_leader_epoch: int, leader_epoch: int
    ) -> tuple[int, int]:
        return self.partition_or_error(tp).last_offset_for_leader_epoch(
            current_leader_epoch, leader_epoch
        )
