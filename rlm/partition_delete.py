"""`PartitionDeleteTask`: removes every remote segment of a deleted partition.

The partition's delete states (DELETE_PARTITION_MARKED -> STARTED -> FINISHED, Kafka's
`RemotePartitionDeleteState`) and each segment's (through `SegmentDeleter`) are recorded
in the remote metadata, so the work survives a restart: a broker that starts with remote
metadata of a partition whose topic is gone schedules this task again, and it deletes
what is left (a repeated state is a no-op). The metadata manager forgets the partition
at DELETE_PARTITION_FINISHED, so a finished deletion is never scheduled again. The
partition's index in the remote tier (`PartitionIndex`) goes after its segments.

Progress: one log line when a pass starts (segments left), one per
`PROGRESS_EVERY_SEGMENTS` deleted and one at the end; the gauge
`RemoteDeleteLagSegments` (Kafka's name) holds the segments left per partition until
the partition is done. A copy still uploading (`copying`) cannot be recalled: the task
backs off until it has ended, so no object is written after the partition's data is
gone. Runs in the expiration pool, one pass at a time per partition.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Gauge

from tierbroker.rlm.expiration_task import SegmentDeleter
from tierbroker.storage.remote.metadata_manager import RemoteLogMetadataManager
from tierbroker.storage.remote.segment_metadata import (
    RemotePartitionDeleteState,
    TopicIdPartition,
)
from tierbroker.storage.remote.storage_manager import RemoteStorageError

log = logging.getLogger(__name__)

PROGRESS_EVERY_SEGMENTS = 100


def delete_lag_segments_gauge(registry: CollectorRegistry) -> Gauge:
    """`RemoteDeleteLagSegments`: remote segments of deleted partitions not deleted yet."""
    return Gauge(
        "RemoteDeleteLagSegments",
        "Remote segments of deleted partitions not deleted yet",
        ["topic", "partition"],
        registry=registry,
    )


class PartitionDeleteTask:
    def __init__(
        self,
        tip: TopicIdPartition,
        copying: set[uuid.UUID],
        rlmm: RemoteLogMetadataManager,
        deleter: SegmentDeleter,
        lag_segments: Gauge,
        on_done: Callable[[TopicIdPartition], None],
    ) -> None:
        self.tip = tip
        self.copying = copying
        self.rlmm = rlmm
        self.deleter = deleter
        self.lag = lag_segments.labels(
            tip.topic_partition.topic, str(tip.topic_partition.partition)
        )
        self.lag_segments = lag_segments
        self.on_done = on_done

    async def run_once(self) -> None:
        if self.copying:
            raise RemoteStorageError(f"{len(self.copying)} copies still in flight")
        if self.rlmm.remote_partition_delete_state(self.tip) is None:
            await self._put_state(RemotePartitionDeleteState.DELETE_PARTITION_MARKED)
        await self._put_state(RemotePartitionDeleteState.DELETE_PARTITION_STARTED)
        segments = list(self.rlmm.list_remote_log_segments(self.tip))
        total = len(segments)
        self.lag.set(total)
        log.info(
            "%s: deleting the remote data of the deleted partition: %d segments", self.tip, total
        )
        for done, segment in enumerate(segments, start=1):
            await self.deleter.delete(segment)  # a failure: the pool's one line, then a retry
            self.lag.set(total - done)
            if done % PROGRESS_EVERY_SEGMENTS == 0 and done < total:
                log.info("%s: %d of %d remote segments deleted", self.tip, done, total)
        await self.deleter.delete_partition_index(self.tip)  # last: the index names none
        await self._put_state(RemotePartitionDeleteState.DELETE_PARTITION_FINISHED)
        tp = self.tip.topic_partition
        self.lag_segments.remove(tp.topic, str(tp.partition))
        log.info("%s: remote data deleted (%d segments)", self.tip, total)
        self.on_done(self.tip)

    async def _put_state(self, state: RemotePartitionDeleteState) -> None:
        async with asyncio.timeout(self.deleter.timeout_s):
            await self.rlmm.put_remote_partition_delete_metadata(self.tip, state)
