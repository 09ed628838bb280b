"""`ReplicaManager`: the partitions this broker hosts, and appends and reads across them.

Handlers call it with plain values and get plain results back; it decides which
partition answers, what error a partition gets, when a fetch must wait, and when
a read goes to the remote tier (an offset below the local log but within the
log, served through the RemoteLogManager's reader pool).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

from tierbroker.broker.long_lived import LongLivedObjects
from tierbroker.broker.partition import OffsetAndEpoch, Partition
from tierbroker.broker.purgatory import Purgatory
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.protocol.records import InvalidRecordError
from tierbroker.rlm.remote_log_manager import RemoteLogManager
from tierbroker.storage.file_cache import LOG_FILES
from tierbroker.storage.log import LogStartOffsetIncrementReason, OffsetMovedToTieredStorage
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.log_manager import LogManager
from tierbroker.storage.remote.segment_metadata import TopicIdPartition
from tierbroker.storage.remote.storage_manager import RemoteStorageError
from tierbroker.storage.segment import FileSlice
from tierbroker.storage.topic_partition import TopicPartition

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
    records: FileSlice | memoryview | None = None  # a view: read from the remote tier

    @property
    def size(self) -> int:
        if self.records is None:
            return 0
        return self.records.length if isinstance(self.records, FileSlice) else len(self.records)


@dataclass(frozen=True, slots=True)
class FetchParams:
    max_wait_ms: int
    min_bytes: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class _RemoteRead:
    index: int  # position in the fetch's results
    partition: Partition
    offset: int
    max_bytes: int


class ReplicaManager:
    def __init__(self, broker_id: int, log_manager: LogManager) -> None:
        self.broker_id = broker_id
        self.log_manager = log_manager
        self.partitions: dict[TopicPartition, Partition] = {}
        self.fetch_purgatory = Purgatory()
        self.remote: RemoteLogManager | None = None
        self.long_lived = LongLivedObjects()

    # Leadership ----------------------------------------------------------------------

    def make_leader(
        self, tp: TopicPartition, topic_id: uuid.UUID, config: LogConfig, leader_epoch: int
    ) -> Partition:
        log_ = self.log_manager.get_or_create_log(tp, topic_id, config)
        # As Kafka's makeLeader: the new epoch starts at the log end offset.
        log_.leader_epoch_cache.assign(leader_epoch, log_.log_end_offset)
        partition = Partition(log_, self.broker_id, leader_epoch)
        self.partitions[tp] = partition
        if self.remote is not None:
            self.remote.on_leadership(TopicIdPartition(topic_id, tp), log_)
        self.long_lived.partition_led()
        return partition

    def attach_remote_log_manager(self, remote: RemoteLogManager) -> None:
        """Tiering starts: hand every partition led so far to the RemoteLogManager."""
        self.remote = remote
        for tp, partition in self.partitions.items():
            remote.on_leadership(TopicIdPartition(partition.topic_id, tp), partition.log)
        self.long_lived.freeze()

    def stop_replica(self, tp: TopicPartition, delete: bool) -> None:
        partition = self.partitions.pop(tp, None)
        if partition is not None and self.remote is not None:
            self.remote.on_stop(TopicIdPartition(partition.topic_id, tp), delete)
        if delete:
            self.log_manager.delete_log(tp)
        self.fetch_purgatory.notify(tp)

    def on_log_dir_offline(self, log_dir: Path) -> None:
        """Wake fetches waiting on the dir's partitions: they now answer KAFKA_STORAGE_ERROR."""
        for tp, partition in self.partitions.items():
            if partition.log.dir.parent == log_dir:
                self.fetch_purgatory.notify(tp)

    def update_config(self, tp: TopicPartition, config: LogConfig) -> None:
        partition = self.partitions.get(tp)
        if partition is not None:
            partition.log.config = config
            if self.remote is not None:
                self.remote.config_changed(TopicIdPartition(partition.topic_id, tp))

    def partition_or_error(self, tp: TopicPartition) -> Partition:
        """The partition, if hosted here and its log dir is online (else KAFKA_STORAGE_ERROR)."""
        partition = self.partitions.get(tp)
        if partition is None:
            raise KafkaError(ErrorCode.unknown_topic_or_partition, f"{tp} is not hosted here")
        if not self.log_manager.is_online(partition.log):
            raise KafkaError(
                ErrorCode.kafka_storage_error,
                f"{tp}: log dir {partition.log.dir.parent} is offline",
            )
        return partition

    # Produce -------------------------------------------------------------------------

    def append_records(
        self, entries: dict[TopicPartition, bytes]
    ) -> dict[TopicPartition, ProduceResult]:
        """Append to each partition as leader; errors stay per partition.

        An append that fails on I/O (ENOSPC, EIO) left nothing behind; it is answered
        KAFKA_STORAGE_ERROR and takes its log dir offline.
        """
        results = {}
        for tp, records in entries.items():
            try:
                partition = self.partition_or_error(tp)
                info = partition.append_records_to_leader(bytearray(records))
            except OSError as e:
                error = self.log_manager.storage_error(
                    partition.log.dir.parent, tp, e, f"appending to {tp}"
                )
                results[tp] = ProduceResult(error.code, error_message=str(error))
                continue
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

    def delete_records(self, tp: TopicPartition, offset: int) -> int:
        """DeleteRecords: move the log start offset (-1: to the high watermark); returns it."""
        log_ = self.partition_or_error(tp).log
        target = log_.high_watermark if offset == -1 else offset
        if target < 0:
            raise KafkaError(
                ErrorCode.offset_out_of_range, f"{tp}: cannot delete records below {offset}"
            )
        log_.maybe_increment_log_start_offset(
            target, LogStartOffsetIncrementReason.CLIENT_RECORD_DELETION
        )
        log_.delete_old_segments()
        return log_.log_start_offset

    # Fetch ---------------------------------------------------------------------------

    async def fetch_messages(
        self, params: FetchParams, requests: list[FetchRequestPartition]
    ) -> list[FetchResultPartition]:
        """Read every requested partition; wait up to max_wait_ms for min_bytes (delayed fetch).

        Offsets in the remote tier are read concurrently, each within the byte budget
        left when its turn came, so several remote partitions never exceed fetch.max.bytes.
        A waiting fetch that finds, when woken, its offset gone from the local log (local
        retention deleted it meanwhile) completes and reads the remote tier, as Kafka's
        DelayedFetch completes for an offset on an older segment.
        """
        results, remote = self._read(params, requests)
        if params.max_wait_ms > 0 and requests and not self._satisfied(params, results, remote):
            keys = [r.topic_partition for r in requests]
            await self.fetch_purgatory.wait_until(
                keys,
                params.max_wait_ms / 1000,
                lambda: self._satisfied(params, *self._read(params, requests)),
            )
            results, remote = self._read(params, requests)
        if remote:
            await self._read_remote(results, remote)
        return results

    @staticmethod
    def _satisfied(
        params: FetchParams, results: list[FetchResultPartition], remote: list[_RemoteRead]
    ) -> bool:
        """A delayed fetch completes on an error, a remote read, or min_bytes of local data."""
        if remote or any(r.error != ErrorCode.none for r in results):
            return True
        return sum(r.size for r in results) >= params.min_bytes

    def _read(
        self, params: FetchParams, requests: list[FetchRequestPartition]
    ) -> tuple[list[FetchResultPartition], list[_RemoteRead]]:
        bytes_left = params.max_bytes
        min_one_batch = (
            True  # KIP-74: the first partition with data returns a batch even if too big
        )
        results: list[FetchResultPartition] = []
        remote: list[_RemoteRead] = []
        for request in requests:
            budget = min(bytes_left, request.max_bytes)
            result = self._read_partition(request, budget, min_one_batch)
            if isinstance(result, _RemoteRead):
                remote.append(replace(result, index=len(results)))
                results.append(FetchResultPartition(ErrorCode.none))
                bytes_left -= budget  # reserved: the remote read may use all of it
                min_one_batch = False
                continue
            if result.records is not None:
                bytes_left -= result.size
                min_one_batch = False
            results.append(result)
        return results, remote

    def _read_partition(
        self, request: FetchRequestPartition, max_bytes: int, min_one_batch: bool
    ) -> FetchResultPartition | _RemoteRead:
        try:
            partition = self.partition_or_error(request.topic_partition)
            if max_bytes <= 0 and not min_one_batch:
                return FetchResultPartition(
                    ErrorCode.none, partition.high_watermark, partition.log.log_start_offset
                )
            data = partition.read(
                request.fetch_offset, max_bytes, min_one_batch, request.current_leader_epoch
            )
            records = data.records
            return FetchResultPartition(
                ErrorCode.none,
                partition.high_watermark,
                partition.log.log_start_offset,
                # Too many log files held open: a response must not hold one more.
                memoryview(records.read())
                if records is not None and LOG_FILES.under_pressure
                else records,
            )
        except OffsetMovedToTieredStorage:
            if self.remote is None:
                return self._error(request, ErrorCode.offset_out_of_range)
            budget = (
                max_bytes if max_bytes > 0 else 1
            )  # min one batch: the reader returns a whole one
            return _RemoteRead(
                -1, self.partitions[request.topic_partition], request.fetch_offset, budget
            )
        except KafkaError as e:
            return self._error(request, e.code)

    def _error(self, request: FetchRequestPartition, code: ErrorCode) -> FetchResultPartition:
        hosted = self.partitions.get(request.topic_partition)
        if hosted is None:
            return FetchResultPartition(code)
        return FetchResultPartition(code, hosted.high_watermark, hosted.log.log_start_offset)

    async def _read_remote(
        self, results: list[FetchResultPartition], reads: list[_RemoteRead]
    ) -> None:
        assert self.remote is not None
        remote = self.remote
        outcomes = await asyncio.gather(
            *(
                remote.read(
                    TopicIdPartition(r.partition.topic_id, r.partition.topic_partition),
                    r.offset,
                    r.max_bytes,
                )
                for r in reads
            ),
            return_exceptions=True,
        )
        for read, outcome in zip(reads, outcomes, strict=True):
            lg = read.partition.log
            if isinstance(outcome, memoryview):
                results[read.index] = FetchResultPartition(
                    ErrorCode.none, lg.high_watermark, lg.log_start_offset, outcome
                )
                continue
            code = _remote_error_code(outcome)
            log.info(
                "remote read of %s at offset %d: %s",
                read.partition.topic_partition,
                read.offset,
                code.name.upper() if code != ErrorCode.kafka_storage_error else outcome,
            )
            results[read.index] = FetchResultPartition(code, lg.high_watermark, lg.log_start_offset)

    # Offsets -------------------------------------------------------------------------

    async def fetch_offset_for_timestamp(
        self,
        tp: TopicPartition,
        timestamp_ms: int,
        current_leader_epoch: int,
        timeout_s: float | None = None,
    ) -> OffsetAndEpoch | None:
        """ListOffsets; a timestamp in the remote tier is looked up there, off the request loop.

        A remote lookup outliving `timeout_s` (or the remote call timeout) is REQUEST_TIMED_OUT.
        """
        partition = self.partition_or_error(tp)
        lg = partition.log
        if timestamp_ms >= 0 and self.remote is not None and lg.config.remote_storage_enable:
            partition.check_leader_epoch(current_leader_epoch)
            tip = TopicIdPartition(partition.topic_id, tp)
            try:
                found = await self.remote.find_offset_by_timestamp(
                    tip, timestamp_ms, lg.log_start_offset, timeout_s
                )
            except TimeoutError as e:
                raise KafkaError(ErrorCode.request_timed_out, f"{tp}: remote lookup") from e
            except RemoteStorageError as e:
                raise KafkaError(ErrorCode.kafka_storage_error, f"{tp}: remote tier: {e}") from e
            if found is not None and found[0] < lg.local_log_start_offset:
                offset, timestamp = found
                return OffsetAndEpoch(
                    offset, timestamp, lg.leader_epoch_cache.epoch_for_offset(offset)
                )
        return partition.fetch_offset_for_timestamp(timestamp_ms, current_leader_epoch)

    def last_offset_for_leader_epoch(
        self, tp: TopicPartition, current_leader_epoch: int, leader_epoch: int
    ) -> tuple[int, int]:
        return self.partition_or_error(tp).last_offset_for_leader_epoch(
            current_leader_epoch, leader_epoch
        )


def _remote_error_code(error: BaseException) -> ErrorCode:
    if isinstance(error, KafkaError):
        return error.code
    if isinstance(error, TimeoutError):
        return ErrorCode.request_timed_out  # the read goes on; the client's retry finds it
    return ErrorCode.kafka_storage_error
