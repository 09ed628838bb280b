"""`CopyTask`: copies a leader's rolled segments to the remote tier, oldest first (KIP-405).

A segment is eligible once it is rolled (never the active one), its last offset is
below the last stable offset (so below the high watermark, and no transaction it
holds is undecided), and it is past the topic's copy lag (KIP-1241's delayed upload,
`remote.copy.lag.ms` / `.bytes`: old enough, or far enough behind the log end), so
segments local retention keeps anyway are not uploaded early. Local retention deletes
only what is copied, so a delayed segment stays local until its copy.

For each: COPY_SEGMENT_STARTED is recorded, the RSM uploads the segment, its indexes
(the transaction index if it has aborted transactions, which its metadata says:
`txn_index_empty`), producer snapshot and leader-epoch lineage, then
COPY_SEGMENT_FINISHED is recorded and only then does the partition's remote high
offset move, which is what local retention waits for. A store call that fails or
outlasts the remote call timeout (a hung upload: cancelled, and the plugin cleans up
what it began) records DELETE_SEGMENT_STARTED, removes what was uploaded and
DELETE_SEGMENT_FINISHED, then raises for back-off (the pool logs it and retries).
Each copy's outcome updates the store's health. After the copies, the partition's
index in the remote tier is brought up to date (`PartitionIndexWriter`: a write only
when it changed).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from tierbroker.rlm.config import RemoteLogManagerConfig
from tierbroker.rlm.metrics import RemoteStorageMetrics
from tierbroker.rlm.partition_index_writer import PartitionIndexWriter
from tierbroker.rlm.quota import ByteRateLimiter
from tierbroker.rlm.tiered_partition import TieredPartition
from tierbroker.storage.log import now_ms
from tierbroker.storage.remote.metadata_manager import RemoteLogMetadataManager
from tierbroker.storage.remote.segment_metadata import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
)
from tierbroker.storage.remote.storage_manager import (
    LogSegmentData,
    RemoteStorageError,
    RemoteStorageManager,
)
from tierbroker.storage.segment import LogSegment

log = logging.getLogger(__name__)


def segment_epochs(
    entries: list[tuple[int, int]], start: int, end: int
) -> tuple[tuple[int, int], ...]:
    """The (epoch, start offset) entries covering offsets [start, end], clipped to start."""
    found = []
    for i, (epoch, epoch_start) in enumerate(entries):
        epoch_end = entries[i + 1][1] - 1 if i + 1 < len(entries) else end
        if epoch_end >= start and epoch_start <= end:
            found.append((epoch, max(epoch_start, start)))
    return tuple(found) or ((0, start),)


def past_copy_lag(age_ms: int, bytes_behind: int, lag_ms: int, lag_bytes: int) -> bool:
    """Whether a rolled segment `age_ms` old (by its largest timestamp), with `bytes_behind`
    bytes of log after it, may be copied under the effective copy lags (KIP-1241; the KIP is
    Kafka 4.4's, after 4.3.1, and this follows its `RLMCopyTask.candidateLogSegments`).

    A lag of 0 copies at once; a negative one (-1 with unlimited local retention) never
    passes; when both are set, either one passing suffices. A timestamp in the future
    counts as old enough, as in Kafka."""
    if lag_ms == 0 or lag_bytes == 0:
        return True
    by_time = lag_ms > 0 and (age_ms < 0 or age_ms >= lag_ms)
    by_size = lag_bytes > 0 and bytes_behind >= lag_bytes
    return by_time or by_size


class CopyTask:
    def __init__(
        self,
        partition: TieredPartition,
        broker_id: int,
        config: RemoteLogManagerConfig,
        rsm: RemoteStorageManager,
        rlmm: RemoteLogMetadataManager,
        limiter: ByteRateLimiter,
        metrics: RemoteStorageMetrics,
        index_writer: PartitionIndexWriter,
    ) -> None:
        self.partition = partition
        self.broker_id = broker_id
        self.timeout_s = config.remote_call_timeout_ms / 1000
        self.custom_metadata_max_bytes = config.custom_metadata_max_bytes
        self.rsm = rsm
        self.rlmm = rlmm
        self.limiter = limiter
        self.metrics = metrics
        self.index_writer = index_writer

    def eligible_segments(self) -> list[LogSegment]:
        """The rolled segments to copy now, oldest first; the first one the copy lag holds
        back ends the list (Kafka's copy task stops there too)."""
        lg = self.partition.log
        copied = lg.highest_offset_in_remote_storage
        lag_ms = lg.config.effective_remote_copy_lag_ms
        lag_bytes = lg.config.effective_remote_copy_lag_bytes
        now = now_ms()
        behind = lg.size_in_bytes
        eligible = []
        for s in lg.segments[:-1]:
            behind -= s.size
            # Below the LSO: no undecided transaction's data goes up (Kafka's copy task).
            if s.next_offset > lg.last_stable_offset:
                break
            if s.next_offset - 1 <= copied or s.next_offset - 1 < lg.log_start_offset:
                continue
            try:
                age_ms = now - s.largest_timestamp_ms()
            except OSError:
                age_ms = -1  # as Kafka: a timestamp that cannot be read does not hold it back
            if not past_copy_lag(age_ms, behind, lag_ms, lag_bytes):
                break
            eligible.append(s)
        return eligible

    async def run_once(self) -> None:
        lg = self.partition.log
        if self.partition.restore is not None and self.partition.leader:
            if not lg.config.remote_storage_enable:
                return  # nothing remote to restore, nothing to copy
            self.rlmm.require_ready(self.partition.tip)
            await self.partition.restore()
            self.partition.restore = None
        if not self.partition.leader or not lg.config.remote_storage_enable:
            return
        if not lg.config.remote_log_copy_disable:
            for segment in self.eligible_segments():
                if not self.partition.leader:
                    return
                await self.copy(segment)
        await self.index_writer.maybe_write(self.partition)

    async def copy(self, segment: LogSegment) -> None:
        p, lg = self.partition, self.partition.log
        end = segment.next_offset - 1
        epochs = segment_epochs(lg.leader_epoch_cache.entries, segment.base_offset, end)
        metadata = RemoteLogSegmentMetadata(
            segment_id=RemoteLogSegmentId.generate(p.tip),
            start_offset=segment.base_offset,
            end_offset=end,
            max_timestamp_ms=segment.max_timestamp,
            broker_id=self.broker_id,
            event_timestamp_ms=now_ms(),
            segment_size_bytes=segment.size,
            segment_leader_epochs=epochs,
            txn_index_empty=not segment.txn_index.entries,
        )
        snapshot = lg.producer_state.snapshot_path(segment.next_offset)
        data = LogSegmentData(
            log_segment=segment.log_path,
            offset_index=segment.offset_index.path,
            time_index=segment.time_index.path,
            transaction_index=None if metadata.txn_index_empty else segment.txn_index.path,
            producer_snapshot_index=snapshot if snapshot.exists() else None,
            # The whole lineage up to the segment's end, as Kafka uploads it: a replica
            # rebuilt from the remote tier needs every epoch before this segment too.
            leader_epoch_index=_epoch_checkpoint(
                tuple((e, start) for e, start in lg.leader_epoch_cache.entries if start <= end)
            ),
        )
        p.copying.add(metadata.segment_id.id)
        try:
            async with asyncio.timeout(self.timeout_s):
                await self.rlmm.add_remote_log_segment_metadata(metadata)
            await self.limiter.acquire(segment.size)
            try:
                custom = await self._upload(metadata, data)
            except Exception as e:  # reported once, with its back-off, by the copy pool
                self.metrics.copy_errors.labels(p.topic).inc()
                self.metrics.health.failed(e)
                await self._abandon(metadata)
                raise
            self.metrics.health.succeeded()
            if not p.leader:
                # Stopped or deleted meanwhile: what was uploaded is removed, never finished.
                log.info(
                    "%s: no longer led; undoing the copy of %d-%d", p.tip, segment.base_offset, end
                )
                await self._abandon(metadata)
                return
            if custom is not None and len(custom) > self.custom_metadata_max_bytes:
                await self._abandon(metadata)  # as Kafka: the copy is undone and fails
                raise RemoteStorageError(
                    f"{p.tip}: the storage plugin's custom metadata for segment "
                    f"{metadata.segment_id.id} is {len(custom)} bytes, over "
                    "remote.log.metadata.custom.metadata.max.bytes="
                    f"{self.custom_metadata_max_bytes}",
                    retriable=False,
                )
            finished = replace(metadata, custom_metadata=custom).with_state(
                RemoteLogSegmentState.COPY_SEGMENT_FINISHED, now_ms()
            )
            async with asyncio.timeout(self.timeout_s):
                await self.rlmm.update_remote_log_segment_metadata(finished)
        finally:
            p.copying.discard(metadata.segment_id.id)
        lg.update_highest_offset_in_remote_storage(end)
        self.metrics.copy_requests.labels(p.topic).inc()
        self.metrics.copy_bytes.labels(p.topic).inc(segment.size)
        log.info(
            "%s: copied segment %d-%d (%d bytes) to the remote tier",
            p.tip,
            segment.base_offset,
            end,
            segment.size,
        )

    async def _upload(
        self, metadata: RemoteLogSegmentMetadata, data: LogSegmentData
    ) -> bytes | None:
        """The RSM's copy (its custom metadata), cancelled past the call timeout: a hung
        upload never holds the partition's copies (the plugin cleans up what a cancelled
        copy began)."""
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self.rsm.copy_log_segment_data(metadata, data)
        except TimeoutError:
            raise RemoteStorageError(
                f"copying segment {metadata.start_offset}-{metadata.end_offset} "
                f"({metadata.segment_id.id}) took over {self.timeout_s:g} s: cancelled",
                retriable=True,
            ) from None

    async def _abandon(self, metadata: RemoteLogSegmentMetadata) -> None:
        """Remove a failed copy's objects; if that fails too, expiration retries it later.

        Logged at DEBUG: when the store fails, so does this, and the copy's failure says why."""
        try:
            started = metadata.with_state(RemoteLogSegmentState.DELETE_SEGMENT_STARTED, now_ms())
            async with asyncio.timeout(self.timeout_s):
                await self.rlmm.update_remote_log_segment_metadata(started)
            async with asyncio.timeout(self.timeout_s):
                await self.rsm.delete_log_segment_data(metadata)
            done = started.with_state(RemoteLogSegmentState.DELETE_SEGMENT_FINISHED, now_ms())
            async with asyncio.timeout(self.timeout_s):
                await self.rlmm.update_remote_log_segment_metadata(done)
        except Exception as e:
            log.debug(
                "%s: cleaning up the failed copy %s failed: %s",
                metadata.topic_id_partition,
                metadata.segment_id.id,
                e,
            )


def _epoch_checkpoint(epochs: tuple[tuple[int, int], ...]) -> bytes:
    lines = ["0", str(len(epochs)), *(f"{epoch} {start}" for epoch, start in epochs)]
    return ("\n".join(lines) + "\n").encode()
