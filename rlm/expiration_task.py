"""`ExpirationTask`: applies retention to a leader's remote tier and deletes what it gives up.

Retention walks the segments of the leader's own lineage (its leader-epoch entries,
`storage.remote.lineage`), as Kafka's leader does, so a new leader right after a
failover counts and expires what its log holds, not what a diverged one uploaded.
Deleted, oldest first, through DELETE_SEGMENT_STARTED -> RSM delete ->
DELETE_SEGMENT_FINISHED:
- segments past `retention.ms` (by their largest timestamp);
- the oldest segments while the whole log, remote (`remote_log_size`, KIP-852)
  plus the local part not yet copied, exceeds `retention.bytes`;
- segments wholly below the log start offset (DeleteRecords);
- every segment when the topic turned tiering off with remote.log.delete.on.disable;
- copies abandoned in COPY_SEGMENT_STARTED (a crash mid-copy) once older than
  the stuck-copy timeout, and superseded overlapping segments: neither was ever
  read nor counted.
Before deleting, the log start offset moves to the first remaining segment.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable

from tierbroker.rlm.config import RemoteLogManagerConfig
from tierbroker.rlm.metrics import RemoteStorageMetrics
from tierbroker.rlm.tiered_partition import TieredPartition
from tierbroker.storage.log import LogStartOffsetIncrementReason, now_ms
from tierbroker.storage.remote.lineage import lineage_segments
from tierbroker.storage.remote.metadata_manager import RemoteLogMetadataManager
from tierbroker.storage.remote.segment_metadata import (
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    TopicIdPartition,
)
from tierbroker.storage.remote.storage_manager import RemoteStorageManager

log = logging.getLogger(__name__)

STARTED = RemoteLogSegmentState.COPY_SEGMENT_STARTED
DELETE_STARTED = RemoteLogSegmentState.DELETE_SEGMENT_STARTED
DELETE_FINISHED = RemoteLogSegmentState.DELETE_SEGMENT_FINISHED


class SegmentDeleter:
    """Deletes one remote segment through the state machine; shared by the tasks below."""

    def __init__(
        self,
        config: RemoteLogManagerConfig,
        rsm: RemoteStorageManager,
        rlmm: RemoteLogMetadataManager,
        forget_indexes: Callable[[uuid.UUID], None],
    ) -> None:
        self.timeout_s = config.remote_call_timeout_ms / 1000
        self.rsm = rsm
        self.rlmm = rlmm
        self.forget_indexes = forget_indexes

    async def delete(self, metadata: RemoteLogSegmentMetadata) -> None:
        started = (
            metadata
            if metadata.state == DELETE_STARTED
            else metadata.with_state(DELETE_STARTED, now_ms())
        )
        async with asyncio.timeout(self.timeout_s):
            await self.rlmm.update_remote_log_segment_metadata(started)
        async with asyncio.timeout(self.timeout_s):
            await self.rsm.delete_log_segment_data(metadata)
        done = started.with_state(DELETE_FINISHED, now_ms())
        async with asyncio.timeout(self.timeout_s):
            await self.rlmm.update_remote_log_segment_metadata(done)
        self.forget_indexes(metadata.segment_id.id)

    async def delete_partition_index(self, tip: TopicIdPartition) -> None:
        async with asyncio.timeout(self.timeout_s):
            await self.rsm.delete_partition_index(tip)


class ExpirationTask:
    def __init__(
        self,
        partition: TieredPartition,
        config: RemoteLogManagerConfig,
        rlmm: RemoteLogMetadataManager,
        deleter: SegmentDeleter,
        metrics: RemoteStorageMetrics,
    ) -> None:
        self.partition = partition
        self.config = config
        self.rlmm = rlmm
        self.deleter = deleter
        self.metrics = metrics

    def expired_segments(
        self,
    ) -> tuple[list[RemoteLogSegmentMetadata], list[RemoteLogSegmentMetadata]]:
        """(the segments retention gives up, oldest first; the segments of this log's
        lineage it keeps)."""
        p, lg = self.partition, self.partition.log
        cfg = lg.config
        if not cfg.remote_storage_enable:
            gone = self.rlmm.readable_segments(p.tip) if cfg.remote_log_delete_on_disable else []
            return gone, []
        lineage = lg.leader_epoch_cache.entries
        segments = lineage_segments(self.rlmm.readable_segments(p.tip), lineage)
        now = now_ms()
        local_only = sum(
            s.size for s in lg.segments if s.base_offset > lg.highest_offset_in_remote_storage
        )
        excess = (
            self.rlmm.remote_log_size(p.tip, lg.leader_epoch_cache.latest_epoch, lineage)
            + local_only
            - cfg.retention_bytes
            if cfg.retention_bytes >= 0
            else 0
        )
        expired = []
        for segment in segments:
            by_time = cfg.retention_ms >= 0 and segment.max_timestamp_ms < now - cfg.retention_ms
            by_size = excess >= segment.segment_size_bytes
            below_start = segment.end_offset < lg.log_start_offset
            if not (by_time or by_size or below_start):
                break
            expired.append(segment)
            excess -= segment.segment_size_bytes
        self.metrics.delete_lag_bytes.labels(p.topic, p.tip.topic_partition.partition).set(
            sum(s.segment_size_bytes for s in expired)
        )
        return expired, segments[len(expired) :]

    def abandoned_segments(self) -> list[RemoteLogSegmentMetadata]:
        """Copies stuck in COPY_SEGMENT_STARTED, half-deleted and superseded segments."""
        p = self.partition
        cutoff = now_ms() - self.config.stuck_copy_timeout_ms
        stuck = [
            s
            for s in self.rlmm.list_remote_log_segments(p.tip)
            if (s.state == STARTED and s.event_timestamp_ms < cutoff) or s.state == DELETE_STARTED
        ]
        # A half-deleted segment can be superseded too: deleted once. A copy in flight (or
        # undoing itself) is its copier's to finish.
        unique = {s.segment_id.id: s for s in stuck}
        for s in self.rlmm.superseded_segments(p.tip):
            unique.setdefault(s.segment_id.id, s)
        return [s for key, s in unique.items() if key not in p.copying]

    async def run_once(self) -> None:
        p, lg = self.partition, self.partition.log
        if not p.leader or p.restore is not None:  # the copy task restores once ready
            return
        for segment in self.abandoned_segments():
            await self.deleter.delete(segment)  # a failure is the pool's one line
            log.info(
                "%s: removed abandoned remote segment %s (%s)",
                p.tip,
                segment.segment_id.id,
                segment.state.name,
            )
        expired, kept = self.expired_segments()
        if expired:
            # As Kafka does, the log start moves first: no reader is sent to a segment
            # being deleted.
            new_start = kept[0].start_offset if kept else lg.local_log_start_offset
            lg.maybe_increment_log_start_offset(
                min(new_start, lg.high_watermark), LogStartOffsetIncrementReason.SEGMENT_DELETION
            )
            for segment in expired:
                await self.deleter.delete(segment)
        cfg = lg.config
        if (
            not cfg.remote_storage_enable
            and cfg.remote_log_delete_on_disable
            and not p.index_deleted
            and not self.rlmm.readable_segments(p.tip)
        ):  # tiering turned off and its data deleted: the index goes last, as it names none
            await self.deleter.delete_partition_index(p.tip)
            p.index_written, p.index_deleted = None, True
