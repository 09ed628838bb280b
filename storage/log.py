"""`Log`: the log of one partition (Kafka's `UnifiedLog`): what its records mean, over the
segments a `LocalLog` keeps.

Directory `<log.dir>/<topic>-<partition>/` holds the segments (`<base>.log`,
`.index`, `.timeindex`, `.txnindex`), producer snapshots, `leader-epoch-checkpoint` and
`partition.metadata`.

Invariants: log start offset <= high watermark <= log end offset; the last stable
offset (LSO) is the high watermark or, below it, the first offset of the oldest
transaction not decided and replicated; the recovery point is an offset below which
everything was flushed. After a crash, segments from the recovery point on are re-read
and cut at the first torn or corrupt batch (`LogLoader`), and the producer state is
replayed from the newest snapshot at or below it. Not shared between tasks: all calls
come from the event loop, and appends are serialised by the caller (`Partition`).
"""

from __future__ import annotations

import itertools
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.protocol.records import BatchView, iter_batches, whole_batches_size
from tierbroker.protocol.records.control import (
    EndTxnMarker,
    build_end_txn_marker,
    read_end_txn_marker,
)
from tierbroker.storage.checkpoints import read_partition_metadata, write_partition_metadata
from tierbroker.storage.file_cache import LogFileCache
from tierbroker.storage.leader_epoch import LeaderEpochCache
from tierbroker.storage.local_log import LocalLog
from tierbroker.storage.local_log import now_ms as now_ms  # the logs' clock, for their users
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.log_offset_metadata import LogOffsetMetadata
from tierbroker.storage.log_validator import validate_batches
from tierbroker.storage.producer_state import ProducerStateManager
from tierbroker.storage.segment import FileSlice, LogSegment
from tierbroker.storage.topic_partition import TopicPartition
from tierbroker.storage.transaction_index import AbortedTxn

log = logging.getLogger(__name__)

LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL_TIMESTAMP = -4  # KIP-405
LATEST_TIERED_TIMESTAMP = -5  # KIP-1005
EARLIEST_PENDING_UPLOAD_TIMESTAMP = -6  # KIP-1023


class OffsetMovedToTieredStorage(Exception):
    """The offset is below the local log but within the log: it is in the remote tier."""

    def __init__(self, topic_partition: TopicPartition, offset: int) -> None:
        super().__init__(f"{topic_partition}: offset {offset} is in the remote tier")
        self.offset = offset


class AppendOrigin(Enum):
    """Who wrote a leader's batches: a client's are checked against their producer's
    sequences; a coordinator's (offsets committed in a transaction) only against its epoch."""

    CLIENT = "client"
    COORDINATOR = "coordinator"


@dataclass(frozen=True, slots=True)
class AppendOptions:
    transactional_id: str | None = None  # the produce request's
    origin: AppendOrigin = AppendOrigin.CLIENT
    # KIP-890: the coordinator confirmed the transaction has this partition, unless a
    # marker came since (`ProducerStateManager.is_verified`).
    verification_guard: object | None = None

    @property
    def transactional(self) -> bool:
        """Transactional batches may be written (a coordinator writes them without an id)."""
        return self.transactional_id is not None or self.origin == AppendOrigin.COORDINATOR


CLIENT_APPEND = AppendOptions()


class LogStartOffsetIncrementReason(Enum):
    """Why the log start offset moved: said in the log line that records it."""

    CLIENT_RECORD_DELETION = "DeleteRecords"
    SEGMENT_DELETION = "segment deletion"
    REMOTE_TIER_RESTORED = "the remote tier's earliest segment"
    LEADER_OFFSET_INCREMENTED = "the leader's log start offset"


@dataclass(frozen=True, slots=True)
class LogAppendInfo:
    first_offset: int
    last_offset: int
    max_timestamp: int
    log_append_time_ms: int  # -1 unless the topic uses LogAppendTime
    log_start_offset: int
    record_count: int


@dataclass(frozen=True, slots=True)
class FetchDataInfo:
    records: FileSlice | None  # None: nothing at or after the offset yet
    aborted_txns: list[AbortedTxn] | None = None  # read_committed: those the records touch


class Log:
    def __init__(
        self,
        directory: Path,
        topic_partition: TopicPartition,
        config: LogConfig,
        topic_id: uuid.UUID,
        *,
        recovery_point: int = 0,
        log_start_offset: int = 0,
        high_watermark: int = 0,
        had_clean_shutdown: bool = False,
        file_cache: LogFileCache | None = None,
    ) -> None:
        """`file_cache`: its log manager's (None: one of its own, for a log outside one)."""
        self.dir = directory
        self.topic_partition = topic_partition
        self.file_cache = LogFileCache.sized_from_rlimit() if file_cache is None else file_cache
        self.dir.mkdir(parents=True, exist_ok=True)
        metadata_path = directory / "partition.metadata"
        stored_id = read_partition_metadata(metadata_path)
        if stored_id is None:
            write_partition_metadata(metadata_path, topic_id)
        elif stored_id != topic_id:
            raise ValueError(f"{metadata_path}: topic id {stored_id} does not match {topic_id}")
        self.topic_id = topic_id
        self.leader_epoch_cache = LeaderEpochCache(directory / "leader-epoch-checkpoint")
        self.producer_state = ProducerStateManager(directory, topic_partition)
        self.local = LocalLog(directory, topic_partition, config, self.file_cache)
        # The high watermark's segment and position, found once per high watermark.
        self._high_watermark = 0
        self._high_watermark_position: tuple[LogSegment, LogOffsetMetadata] | None = None
        self.recovery_point = recovery_point
        self.local.load(
            recovery_point, had_clean_shutdown, log_start_offset, self.leader_epoch_cache
        )
        # With a remote tier, the log may start below the first local segment.
        self.log_start_offset = (
            log_start_offset
            if config.remote_storage_enable
            else max(log_start_offset, self.segments[0].base_offset)
        )
        self.highest_offset_in_remote_storage = -1  # set by the RemoteLogManager
        self._lowest_truncation: int | None = None
        self.high_watermark = min(max(high_watermark, self.log_start_offset), self.log_end_offset)
        self.recovery_point = min(self.recovery_point, self.log_end_offset)
        self.leader_epoch_cache.truncate_from_end(self.log_end_offset, flush=False)
        # After a crash, what a snapshot above the recovery point stands on (the transaction
        # index of the segments between) may be lost; the first segment's is fsynced.
        self._load_producer_state(
            None if had_clean_shutdown else max(self.recovery_point, self.segments[0].base_offset)
        )

    @property
    def config(self) -> LogConfig:
        return self.local.config

    @config.setter
    def config(self, config: LogConfig) -> None:
        self.local.config = config

    @property
    def segments(self) -> list[LogSegment]:
        return self.local.segments

    # Loading -------------------------------------------------------------------------

    def _load_producer_state(self, newest_snapshot: int | None = None) -> None:
        """The newest snapshot (at or below `newest_snapshot`, else the log end offset), then
        the batches after it up to the log end offset; the aborted transactions whose
        markers those batches hold are indexed again.

        Batches below a log start offset inside the first segment are still on disk and
        replayed, so a snapshot and the replay after it never leave a gap. A rolled segment
        whose snapshot a crash lost gets it again here: the copy to the remote tier uploads
        it, and a replica rebuilt from the remote tier loads it.
        """
        first = self.segments[0].base_offset
        upper = self.log_end_offset if newest_snapshot is None else newest_snapshot
        snapshot = self.producer_state.load(first, upper)
        start = snapshot if snapshot >= 0 else first
        for segment in self.segments[self.local.segment_index(start) :]:
            segment.txn_index.truncate_to(start)
            if segment.next_offset <= start:
                continue  # nothing to replay: its index is not read
            _, position = segment.offset_index.lookup(start)
            for batch_position, batch in segment.headers_from(position):
                if batch.has_producer_id and batch.base_offset >= start:
                    if batch.is_control:
                        batch = BatchView(segment.read_batch(batch_position, batch.size_in_bytes))
                    self._update_producer_state(batch, segment)
            rolled = segment is not self.active_segment
            if rolled and not self.producer_state.snapshot_path(segment.next_offset).exists():
                self.producer_state.take_snapshot(segment.next_offset, sync=False)
        self.producer_state.on_high_watermark_updated(self.high_watermark)

    def _update_producer_state(self, batch: BatchView, segment: LogSegment) -> None:
        """Record a written batch of a producer; a marker aborting a transaction indexes it
        in `segment`, the one holding the marker."""
        if not batch.is_control:
            self.producer_state.update(batch)
            return
        completed = self.producer_state.update_marker(batch, read_end_txn_marker(batch))
        if completed is not None and completed.is_aborted:
            segment.txn_index.append(
                AbortedTxn(
                    completed.producer_id,
                    completed.first_offset,
                    completed.last_offset,
                    self.producer_state.last_stable_offset(completed),
                )
            )

    def take_producer_snapshot(self) -> None:
        """Snapshot producer state at the log end offset (clean shutdown)."""
        self.producer_state.take_snapshot(self.log_end_offset)

    # Offsets -------------------------------------------------------------------------

    @property
    def active_segment(self) -> LogSegment:
        return self.local.active_segment

    @property
    def log_end_offset(self) -> int:
        return self.local.log_end_offset

    @property
    def size_in_bytes(self) -> int:
        return self.local.size_in_bytes

    # Appends -------------------------------------------------------------------------

    def append_as_leader(
        self,
        records: bytearray,
        leader_epoch: int,
        validated: tuple[bytearray, list[BatchView]] | None = None,
        options: AppendOptions = CLIENT_APPEND,
    ) -> LogAppendInfo:
        """Validate batches (re-encoding them for a topic `compression.type`: `log_validator`),
        unless `validated` is what `validate_batches` made of them, assign offsets and the
        leader epoch in place, and write them. Without `options.transactional` (a produce
        request that named a transactional id), transactional batches are refused.

        A batch an idempotent producer already wrote is not written again: the answer
        carries the offsets it got the first time.
        """
        if validated is None:
            validated = validate_batches(records, self.config, now_ms(), self.topic_partition)
        records, batches = validated
        guard = options.verification_guard
        if guard is not None:
            producer_id = next(b.producer_id for b in batches if b.is_transactional)
            if not self.producer_state.is_verified(producer_id, guard):
                raise KafkaError(
                    ErrorCode.invalid_txn_state,
                    f"{self.topic_partition}: the transaction of producer {producer_id} ended "
                    "since the coordinator confirmed it",
                )
        duplicate = self.producer_state.check_batches(
            batches, options.transactional, sequenced=options.origin == AppendOrigin.CLIENT
        )
        if duplicate is not None:
            return LogAppendInfo(
                duplicate.base_offset,
                duplicate.last_offset,
                duplicate.timestamp,
                -1,
                self.log_start_offset,
                0,
            )
        append_time = now_ms() if self.config.message_timestamp_type == "LogAppendTime" else -1
        first_offset = next_offset = self.log_end_offset
        max_timestamp = -1
        count = 0
        for batch in batches:
            batch.set_base_offset(next_offset)
            batch.set_partition_leader_epoch(leader_epoch)
            if append_time >= 0:
                batch.set_log_append_time(append_time)
            next_offset = batch.next_offset
            max_timestamp = max(max_timestamp, batch.max_timestamp)
            count += batch.record_count
        self.leader_epoch_cache.assign(leader_epoch, first_offset)
        self._append(batches, records, max_timestamp)
        for batch in batches:
            if batch.has_producer_id:
                self.producer_state.update(batch)
        return LogAppendInfo(
            first_offset, next_offset - 1, max_timestamp, append_time, self.log_start_offset, count
        )

    def append_end_txn_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        marker: EndTxnMarker,
        leader_epoch: int,
        transaction_version: int = 0,
    ) -> LogAppendInfo:
        """Write a transaction coordinator's marker (WriteTxnMarkers) as a control batch.

        Raises INVALID_PRODUCER_EPOCH or TRANSACTION_COORDINATOR_FENCED for a marker of
        an older producer or coordinator epoch (`check_marker`), before anything is written.
        """
        self.producer_state.check_marker(producer_id, producer_epoch, marker, transaction_version)
        data = bytearray(build_end_txn_marker(producer_id, producer_epoch, marker, now_ms()))
        batch = BatchView(data)
        offset = self.log_end_offset
        batch.set_base_offset(offset)
        batch.set_partition_leader_epoch(leader_epoch)
        self.leader_epoch_cache.assign(leader_epoch, offset)
        self._append([batch], data, batch.max_timestamp)
        self._update_producer_state(batch, self.active_segment)
        return LogAppendInfo(offset, offset, batch.max_timestamp, -1, self.log_start_offset, 1)

    def append_as_follower(self, records: bytes | bytearray | memoryview) -> LogAppendInfo | None:
        """Append batches a leader already stamped: offsets, leader epochs and timestamps are
        kept as they are; the epoch cache and producer state follow the batches. A batch
        cut at the end of the fetch is left for the next one; None if nothing is whole.

        Each batch is checked (magic, size, CRC), not its records: the leader validated
        them. Offsets may skip forward (a leader's cleaner removed the batches between),
        never back: that raises OFFSET_OUT_OF_RANGE, a bad batch CORRUPT_MESSAGE, before
        anything is written.
        """
        records = memoryview(records)[: whole_batches_size(records)]
        batches = list(iter_batches(records))
        if not batches:
            return None
        expected = self.log_end_offset
        max_timestamp = -1
        count = 0
        for batch in batches:
            batch.validate()
            if batch.base_offset < expected:
                raise KafkaError(
                    ErrorCode.offset_out_of_range,
                    f"{self.topic_partition}: fetched batch at offset {batch.base_offset}, "
                    f"below {expected}",
                )
            expected = batch.next_offset
            max_timestamp = max(max_timestamp, batch.max_timestamp)
            count += batch.record_count
        self._append(batches, records, max_timestamp)
        for batch in batches:
            if batch.partition_leader_epoch >= 0:
                self.leader_epoch_cache.assign(batch.partition_leader_epoch, batch.base_offset)
            if batch.has_producer_id:
                self._update_producer_state(batch, self.active_segment)
        return LogAppendInfo(
            batches[0].base_offset,
            expected - 1,
            max_timestamp,
            -1,
            self.log_start_offset,
            count,
        )

    def _append(
        self, batches: list[BatchView], data: bytes | bytearray | memoryview, max_timestamp: int
    ) -> None:
        if self.local.should_roll(len(data), max_timestamp):
            self.roll()
        self.local.append(batches, data)

    def roll(self) -> LogSegment:
        """Close the active segment for appends and start a new one at the log end offset."""
        if self.active_segment.is_empty:
            return self.active_segment
        # Not fsynced here, on the produce path (KAFKA-15046): the flush of the rolled
        # segment fsyncs it before the recovery point passes it.
        self.producer_state.take_snapshot(self.log_end_offset, sync=False)
        return self.local.roll()

    # Reads ---------------------------------------------------------------------------

    def read(
        self,
        offset: int,
        max_bytes: int,
        max_offset: int,
        min_one_batch: bool,
        include_aborted_txns: bool = False,
    ) -> FetchDataInfo:
        """Batches from `offset`, below `max_offset` (the high watermark for consumers, the
        LSO for read_committed ones, which `include_aborted_txns` the records touch).

        Raises OFFSET_OUT_OF_RANGE outside [log start offset, log end offset].
        """
        if (
            self.config.remote_storage_enable
            and self.log_start_offset <= offset < self.local_log_start_offset
        ):
            raise OffsetMovedToTieredStorage(self.topic_partition, offset)
        if offset < self.log_start_offset or offset > self.log_end_offset:
            raise KafkaError(
                ErrorCode.offset_out_of_range,
                f"{self.topic_partition}: offset {offset} outside "
                f"[{self.log_start_offset}, {self.log_end_offset}]",
            )
        none = FetchDataInfo(None, [] if include_aborted_txns else None)
        if offset >= max_offset:
            return none
        end = (
            self._high_watermark_segment()
            if max_offset == self.high_watermark
            else self.local.position_of(max_offset)
        )
        found = self.local.read(offset, max_bytes, end, min_one_batch)
        if found is None:
            return none
        segment, records = found
        if not include_aborted_txns:
            return FetchDataInfo(records)
        # Kafka's fetchUpperBoundOffset: the offset after the last batch returned.
        upper = segment.offset_at_position(records.position + records.length)
        return FetchDataInfo(records, self.local.collect_aborted_txns(offset, upper))

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    @high_watermark.setter
    def high_watermark(self, offset: int) -> None:
        if offset != self._high_watermark:
            self._high_watermark = offset
            self._high_watermark_position = None
            self.producer_state.on_high_watermark_updated(offset)

    @property
    def last_stable_offset(self) -> int:
        """What read_committed consumers may read up to (Kafka's lastStableOffset)."""
        first_unstable = self.producer_state.first_unstable_offset
        if first_unstable is None:
            return self.high_watermark
        return min(first_unstable, self.high_watermark)

    def collect_aborted_txns(self, fetch_offset: int, upper_bound: int) -> list[AbortedTxn]:
        """The aborted transactions overlapping [fetch_offset, upper_bound) of the local log."""
        return self.local.collect_aborted_txns(fetch_offset, upper_bound)

    @property
    def log_end_offset_metadata(self) -> LogOffsetMetadata:
        return self.local.log_end_offset_metadata

    @property
    def high_watermark_metadata(self) -> LogOffsetMetadata:
        """Where the high watermark's batch starts; read from batch headers once per
        high watermark (none when it is the log end), as Kafka's highWatermarkMetadata."""
        return self._high_watermark_segment_metadata()[1]

    def _high_watermark_segment(self) -> tuple[LogSegment, int]:
        segment, metadata = self._high_watermark_segment_metadata()
        return segment, metadata.relative_position_in_segment

    def _high_watermark_segment_metadata(self) -> tuple[LogSegment, LogOffsetMetadata]:
        known = self._high_watermark_position
        # Valid while the high watermark stays and its segment is still in the log.
        segments = self.segments
        if (
            known is not None
            and known[0] is segments[self.local.segment_index(known[0].base_offset)]
        ):
            return known
        if self.high_watermark >= self.log_end_offset:
            segment, metadata = self.active_segment, self.log_end_offset_metadata
        else:
            segment, position = self.local.position_of(self.high_watermark)
            metadata = LogOffsetMetadata(
                message_offset=self.high_watermark,
                segment_base_offset=segment.base_offset,
                relative_position_in_segment=position,
            )
        self._high_watermark_position = (segment, metadata)
        return segment, metadata

    def _special_offset(self, timestamp_ms: int) -> int | None:
        """The offset a negative ListOffsets timestamp names; None for MAX_TIMESTAMP."""
        tiered = self.config.remote_storage_enable
        remote_end = self.highest_offset_in_remote_storage
        offsets = {
            LATEST_TIMESTAMP: self.log_end_offset,
            EARLIEST_TIMESTAMP: self.log_start_offset,
            EARLIEST_LOCAL_TIMESTAMP: self.local_log_start_offset,
            LATEST_TIERED_TIMESTAMP: remote_end if tiered else -1,
            EARLIEST_PENDING_UPLOAD_TIMESTAMP: (
                self._earliest_pending_upload_offset() if tiered else -1
            ),
        }
        if timestamp_ms not in offsets and timestamp_ms != MAX_TIMESTAMP:
            # As Kafka: a special timestamp it does not know is one of a newer version.
            raise KafkaError(
                ErrorCode.unsupported_version, f"unknown ListOffsets timestamp {timestamp_ms}"
            )
        return offsets.get(timestamp_ms)

    def _earliest_pending_upload_offset(self) -> int:
        """The first offset not yet in the remote tier, as Kafka's UnifiedLog answers -6
        (KIP-1023); -1 when the remote high offset is not known (a new leader before its
        restore) while offsets below the local log may be tiered: a follower asks again."""
        remote_end = self.highest_offset_in_remote_storage
        if remote_end >= 0:
            return max(remote_end + 1, self.log_start_offset)
        if self.local_log_start_offset == self.log_start_offset:
            return self.log_start_offset  # nothing uploaded yet
        return -1

    def fetch_offset_by_timestamp(self, timestamp_ms: int) -> tuple[int, int, int] | None:
        """(offset, timestamp, leader epoch) for ListOffsets, or None if no batch matches."""
        if timestamp_ms < 0:
            offset = self._special_offset(timestamp_ms)
            if offset is not None:
                epoch = self.leader_epoch_cache.epoch_for_offset(offset) if offset >= 0 else -1
                if timestamp_ms == LATEST_TIMESTAMP:
                    epoch = self.leader_epoch_cache.latest_epoch
                return offset, -1, epoch
        if timestamp_ms == MAX_TIMESTAMP:
            best = max(self.segments, key=lambda s: s.max_timestamp)
            return best.max_timestamp_record()
        found = next(
            (
                hit
                for segment in self.segments
                if segment.max_timestamp >= timestamp_ms
                and (hit := segment.find_offset_by_timestamp(timestamp_ms, self.log_start_offset))
            ),
            None,
        )
        if found is None:
            return None
        offset, timestamp = found
        return offset, timestamp, self.leader_epoch_cache.epoch_for_offset(offset)

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        return self.leader_epoch_cache.end_offset_for(epoch, self.log_end_offset)

    # Offsets moving ------------------------------------------------------------------

    def update_high_watermark(self, offset: int) -> None:
        self.high_watermark = min(max(offset, self.log_start_offset), self.log_end_offset)

    def maybe_increment_log_start_offset(
        self, offset: int, reason: LogStartOffsetIncrementReason
    ) -> bool:
        """Move the log start offset up (DeleteRecords, retention); never past the HW.

        Raises OFFSET_OUT_OF_RANGE above the high watermark; an offset at or below the
        current log start offset changes nothing (returns False)."""
        if offset > self.high_watermark:
            raise KafkaError(
                ErrorCode.offset_out_of_range,
                f"{self.topic_partition}: log start offset {offset} above high watermark "
                f"{self.high_watermark}",
            )
        if offset <= self.log_start_offset:
            return False
        log.info(
            "%s: log start offset %d -> %d (%s)",
            self.topic_partition,
            self.log_start_offset,
            offset,
            reason.value,
        )
        self.log_start_offset = offset
        self.leader_epoch_cache.truncate_from_start(offset)
        return True

    def update_highest_offset_in_remote_storage(self, offset: int) -> None:
        """The remote tier holds every offset up to `offset` (a copy finished); never moves
        down, so local retention never deletes a segment the remote tier lacks."""
        self.highest_offset_in_remote_storage = max(self.highest_offset_in_remote_storage, offset)

    def truncate_to(self, offset: int) -> None:
        """Remove everything at and above `offset` (a follower diverged from its leader)."""
        if offset >= self.log_end_offset:
            # No record to remove, but an epoch this broker began as leader at its log end,
            # without appending, conflicts with the new leader's log: drop it, as Kafka does.
            # Kept, the next fetch names it again and the leader answers the same divergence.
            self.leader_epoch_cache.truncate_from_end(self.log_end_offset)
            return
        if offset <= self.log_start_offset or offset < self.segments[0].base_offset:
            # Below the local log (its older part is in the remote tier): start over there.
            self.truncate_fully_and_start_at(offset)
            return
        self._note_truncation(offset)
        self.local.truncate_to(offset)
        self.leader_epoch_cache.truncate_from_end(self.log_end_offset)
        # The batch holding `offset` went whole, possibly below the log start offset.
        self.log_start_offset = min(self.log_start_offset, self.log_end_offset)
        self.high_watermark = min(self.high_watermark, self.log_end_offset)
        self.recovery_point = min(self.recovery_point, self.log_end_offset)
        self.producer_state.truncate_to(self.log_end_offset)
        self._load_producer_state()

    def truncate_fully_and_start_at(self, offset: int, log_start_offset: int | None = None) -> None:
        """Empty the log and start it again at `offset` (a follower far behind its leader).

        `log_start_offset` (at most `offset`), as Kafka's truncateFullyAndStartAt: a
        follower rebuilt from the remote tier keeps the leader's log start below its
        local log, so the records between are read from the remote tier."""
        self._note_truncation(offset)
        self.local.truncate_fully_and_start_at(offset)
        self.high_watermark = self.recovery_point = offset
        self.log_start_offset = (
            offset if log_start_offset is None else min(log_start_offset, offset)
        )
        self.leader_epoch_cache.clear()
        self.producer_state.truncate_to(-1)
        self.producer_state.clear()

    def _note_truncation(self, offset: int) -> None:
        lowest = self._lowest_truncation
        self._lowest_truncation = offset if lowest is None else min(lowest, offset)

    def take_lowest_truncation(self) -> int | None:
        """The lowest offset the log was truncated to since the last call, if any: what
        was clean above it is gone (the cleaner's checkpoint must not stay above it)."""
        offset, self._lowest_truncation = self._lowest_truncation, None
        return offset

    def load_producer_snapshot(self, data: bytes) -> None:
        """Install `data` as the producer snapshot at the log end offset and load it (a log
        started from the remote tier takes the snapshot uploaded with the segment before)."""
        self.producer_state.install_snapshot(self.log_end_offset, data)
        self._load_producer_state()

    # Retention -----------------------------------------------------------------------

    def delete_old_segments(self) -> list[LogSegment]:
        """Local retention by time, size and log start offset; returns the removed segments.

        The active segment is kept; time and size apply only with `cleanup.policy`
        delete. Without a remote tier, `retention.*` apply and the log start offset moves
        to the first kept segment. With one, `local.retention.*` apply, only segments
        wholly in the remote tier go, and the log start offset stays where the remote
        tier starts. With copies disabled (`remote.log.copy.disable`, KIP-950) nothing
        more reaches the remote tier, so local retention is the topic's again, as in
        Kafka (its local and total retention are then equal).
        """
        remote = self.config.remote_storage_enable and not self.config.remote_log_copy_disable
        retention_ms = (
            self.config.effective_local_retention_ms if remote else self.config.retention_ms
        )
        retention_bytes = (
            self.config.effective_local_retention_bytes if remote else self.config.retention_bytes
        )
        if not (self.config.delete or remote):  # compact: what the log start offset passed
            retention_ms = retention_bytes = -1
        now = now_ms()
        deletable: list[LogSegment] = []
        excess = self.size_in_bytes - retention_bytes if retention_bytes >= 0 else 0
        for segment, following in itertools.pairwise(self.segments):
            last_offset = following.base_offset - 1
            below_start = last_offset < self.log_start_offset
            expired = retention_ms >= 0 and now - segment.largest_timestamp_ms() > retention_ms
            oversized = excess >= segment.size
            if following.base_offset > self.high_watermark or not (
                expired or oversized or below_start
            ):
                break
            if remote and not below_start and last_offset > self.highest_offset_in_remote_storage:
                break  # not in the remote tier yet: local deletion waits for the copy
            deletable.append(segment)
            excess -= segment.size
        if not deletable:
            return []
        if not remote:
            self.log_start_offset = max(
                self.log_start_offset, self.segments[len(deletable)].base_offset
            )
            self.leader_epoch_cache.truncate_from_start(self.log_start_offset)
        first_kept = self.segments[len(deletable)].base_offset
        # Unless a flush covered the segments deleted here, the snapshot their last roll
        # took is not fsynced; a crash would lose the state of the producers they held.
        if self.recovery_point < first_kept:
            self.producer_state.flush_snapshot(first_kept)
        # A snapshot below the first kept segment cannot be replayed from: load ignores it.
        self.producer_state.delete_snapshots_below(first_kept)
        self.local.remove_segments(deletable)
        return deletable

    # Cleaning ------------------------------------------------------------------------

    def replace_segments(
        self, base_offset: int, replaced: Sequence[LogSegment], sizes: Sequence[int]
    ) -> LogSegment | None:
        """Swap a cleaned segment in (`LocalLog.replace_segments`)."""
        return self.local.replace_segments(base_offset, replaced, sizes)

    @property
    def local_log_start_offset(self) -> int:
        return max(self.log_start_offset, self.segments[0].base_offset)

    def take_deleted(self, older_than_ms: int) -> list[LogSegment]:
        """The segments removed at or before `older_than_ms`, for `delete_segment_files`."""
        return self.local.take_deleted(older_than_ms)

    # Lifecycle -----------------------------------------------------------------------

    def segments_to_flush(self, up_to_offset: int) -> list[LogSegment]:
        """The segments holding offsets between the recovery point and `up_to_offset`."""
        return self.local.segments_to_flush(self.recovery_point, up_to_offset)

    def flush(self, up_to_offset: int | None = None) -> None:
        """fsync segments holding offsets below `up_to_offset`; advance the recovery point."""
        target = self.log_end_offset if up_to_offset is None else up_to_offset
        flush_segments(self.segments_to_flush(target), self.producer_state, self.leader_epoch_cache)
        self.recovery_point = max(self.recovery_point, target)

    def close(self) -> None:
        self.local.close()
        try:
            self.leader_epoch_cache.flush()
        except OSError as e:
            log.error("%s: leader-epoch-checkpoint not written at close: %s", self.dir, e)


def flush_segments(
    segments: list[LogSegment],
    producer_state: ProducerStateManager,
    leader_epoch_cache: LeaderEpochCache,
) -> None:
    """fsync each segment and the producer snapshot its roll took (the active one has none).

    The leader-epoch checkpoint is written first: the recovery point moves past these
    segments afterwards, and load rebuilds epochs only above the recovery point.
    """
    leader_epoch_cache.flush()
    for segment in segments:
        segment.flush()
        producer_state.flush_snapshot(segment.next_offset)
