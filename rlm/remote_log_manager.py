"""`RemoteLogManager`: every remote-tier activity of one broker.

It owns four pools, each with its own concurrency limit: copy (`CopyTask` per
led partition), expiration (`ExpirationTask` per led partition, and deletion of
deleted partitions' data), follower (`FollowerTask` per followed partition), and
remote reads (`RemoteLogReader`). Handlers never
wait on copy or expiration; a remote tier that is slow or down only delays
tiering and remote reads, which back off and resume (see `TaskPool`). The store
is tried once at start, and its health kept from every copy and read since
(`RemoteStorageHealth`).

Stop order: stop the pools (cancelling tasks in flight, with a timeout), the
reader, then close the RLMM (which snapshots) and the RSM.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from tierbroker.rlm.config import RemoteLogManagerConfig
from tierbroker.rlm.copy_task import CopyTask
from tierbroker.rlm.expiration_task import ExpirationTask, SegmentDeleter
from tierbroker.rlm.follower_task import FollowerTask, highest_remote_offset
from tierbroker.rlm.index_cache import RemoteIndexCache
from tierbroker.rlm.metrics import RemoteStorageMetrics
from tierbroker.rlm.partition_delete import PartitionDeleteTask, delete_lag_segments_gauge
from tierbroker.rlm.partition_index_writer import DescribeTopic, PartitionIndexWriter
from tierbroker.rlm.quota import ByteRateLimiter
from tierbroker.rlm.remote_log_aux_state import fetch_remote_log_aux_state
from tierbroker.rlm.remote_reader import RemoteLogReader
from tierbroker.rlm.remote_txn_index import RemoteTransactionIndex
from tierbroker.rlm.task_pool import TaskPool
from tierbroker.rlm.tiered_partition import TieredPartition
from tierbroker.storage.log import Log, LogStartOffsetIncrementReason
from tierbroker.storage.remote.chunk_cache import ChunkCache, ChunkCacheConfig, chunk_store
from tierbroker.storage.remote.lineage import latest_lineage, lineage_segments
from tierbroker.storage.remote.metadata_manager import RemoteLogMetadataManager
from tierbroker.storage.remote.segment_metadata import RemoteLogSegmentMetadata, TopicIdPartition
from tierbroker.storage.remote.storage_manager import RemoteStorageManager
from tierbroker.storage.transaction_index import AbortedTxn

log = logging.getLogger(__name__)


class RemoteLogManager:
    def __init__(
        self,
        config: RemoteLogManagerConfig,
        broker_id: int,
        rsm: RemoteStorageManager,
        rlmm: RemoteLogMetadataManager,
        log_dir: Path,
        registry: CollectorRegistry,
        chunk_config: ChunkCacheConfig | None = None,
        describe_topic: DescribeTopic = lambda _topic: None,
    ) -> None:
        self.config = config
        self.broker_id = broker_id
        self.rsm = rsm
        self.rlmm = rlmm
        self.metrics = RemoteStorageMetrics(registry, rsm.meter)
        self.delete_lag_segments = delete_lag_segments_gauge(registry)
        self.index_cache = RemoteIndexCache(log_dir, config.index_cache_bytes, rsm.fetch_index)
        chunk_config = chunk_config or ChunkCacheConfig()
        self.chunks = ChunkCache(
            chunk_config,
            chunk_store(chunk_config),
            fetch_slots=config.reader_threads,
            fetch_timeout_s=config.remote_call_timeout_ms / 1000,
        )
        self.reader = RemoteLogReader(
            config, rlmm, rsm, self.index_cache, self.chunks, self.metrics
        )
        self.txn_index = RemoteTransactionIndex(rlmm, rsm)
        self.deleter = SegmentDeleter(config, rsm, rlmm, self.index_cache.remove)
        self.copy_limiter = ByteRateLimiter(config.copy_max_bytes_per_second)
        self.index_writer = PartitionIndexWriter(
            rsm, describe_topic, broker_id, config.remote_call_timeout_ms / 1000
        )
        c = config
        self.copier = TaskPool(
            "copy",
            c.copier_pool_size,
            c.task_interval_ms,
            c.task_retry_backoff_ms,
            c.task_retry_backoff_max_ms,
        )
        self.expirer = TaskPool(
            "expiration",
            c.expiration_pool_size,
            c.task_interval_ms,
            c.task_retry_backoff_ms,
            c.task_retry_backoff_max_ms,
        )
        self.follower = TaskPool(
            "follower",
            c.follower_pool_size,
            c.task_interval_ms,
            c.task_retry_backoff_ms,
            c.task_retry_backoff_max_ms,
        )
        self.partitions: dict[TopicIdPartition, TieredPartition] = {}  # led here
        self.followed: dict[TopicIdPartition, Log] = {}

    async def start(self, topic_exists: Callable[[TopicIdPartition], bool]) -> None:
        """Load remote metadata, open the plugin's clients and try the store once (a store
        that fails is a warning: the local tier works without it), start the pools, and
        finish deleting deleted partitions' data."""
        await self.rlmm.start()
        await self.rsm.start()
        await self.metrics.health.check(self.rsm)
        await self.index_cache.load()
        await self.chunks.start()
        self.copier.start()
        self.expirer.start()
        self.follower.start()
        for tip in self.rlmm.partitions():
            if not topic_exists(tip):
                self._schedule_partition_delete(tip, set())

    # Leadership ----------------------------------------------------------------------

    def on_leadership(self, tip: TopicIdPartition, lg: Log) -> None:
        """This broker leads the partition: restore its remote offsets and schedule its tasks."""
        self.follower.cancel(tip)
        self.followed.pop(tip, None)
        self.rlmm.on_partition_leadership_changes([tip], [])
        partition = TieredPartition(tip, lg, restore=lambda: self._restore(tip, lg))
        old = self.partitions.get(tip)
        if old is not None:
            old.leader = False
        self.partitions[tip] = partition
        self.copier.schedule(
            tip,
            CopyTask(
                partition,
                self.broker_id,
                self.config,
                self.rsm,
                self.rlmm,
                self.copy_limiter,
                self.metrics,
                self.index_writer,
            ),
        )
        self.expirer.schedule(
            tip, ExpirationTask(partition, self.config, self.rlmm, self.deleter, self.metrics)
        )

    async def _restore(self, tip: TopicIdPartition, lg: Log) -> None:
        """Once the partition's remote metadata is caught up: what the remote tier holds."""
        if lg.config.remote_storage_enable and lg.log_end_offset == 0:
            await self._maybe_start_after_remote_tier(tip, lg)
        lg.update_highest_offset_in_remote_storage(highest_remote_offset(self.rlmm, tip, lg))
        self._restore_log_start_offset(tip, lg)

    async def _maybe_start_after_remote_tier(self, tip: TopicIdPartition, lg: Log) -> None:
        """An empty log led here while the remote tier holds the partition's history (a
        topic restored from its bucket, or a leader elected with an emptied disk) starts
        after it, as a follower rebuilt from the remote tier does: at the end of the
        latest lineage's last segment, with its leader epochs and producer snapshot.

        Only a leader epoch above every epoch of that lineage continues it (a restored
        topic's first epoch is set so); otherwise the log is left empty, with a warning."""
        readable = self.rlmm.readable_segments(tip)
        if not readable:
            return
        lineage = latest_lineage((s.segment_leader_epochs, s.end_offset) for s in readable)
        last_epoch = lineage[-1][0]
        leader_epoch = lg.leader_epoch_cache.latest_epoch
        if leader_epoch <= last_epoch:
            log.warning(
                "%s: the log is empty and the remote tier holds offsets up to leader epoch %d, "
                "not below this leader's epoch %d: the log is not rebuilt from it",
                tip,
                last_epoch,
                leader_epoch,
            )
            return
        end = self.rlmm.highest_offset_for_epoch(tip, last_epoch)
        last = None if end is None else self.rlmm.remote_log_segment_metadata(tip, last_epoch, end)
        if last is None:
            return
        earliest = lineage_segments(readable, lineage)[0].start_offset
        state = await fetch_remote_log_aux_state(
            self.rsm, last, earliest, self.config.remote_call_timeout_ms / 1000
        )
        if lg.log_end_offset != 0:
            return  # appended to meanwhile: the log is no longer empty
        state.apply(lg)
        # This leader's epoch starts after the restored history, as its appends will.
        lg.leader_epoch_cache.assign(leader_epoch, lg.log_end_offset)

    def _restore_log_start_offset(self, tip: TopicIdPartition, lg: Log) -> None:
        """As Kafka's leader does: the log starts no lower than the remote tier's earliest
        segment, or the local log when the remote tier holds nothing.

        A lost or stale log-start-offset-checkpoint leaves the log start offset below
        what remote retention already deleted; reads there would find nothing."""
        if not lg.config.remote_storage_enable:
            return
        remote = lineage_segments(self.rlmm.readable_segments(tip), lg.leader_epoch_cache.entries)
        earliest = remote[0].start_offset if remote else lg.local_log_start_offset
        lg.maybe_increment_log_start_offset(
            min(earliest, lg.high_watermark), LogStartOffsetIncrementReason.REMOTE_TIER_RESTORED
        )

    def on_following(self, tip: TopicIdPartition, lg: Log) -> None:
        """This broker follows the partition: stop any leader tasks, run the follower task."""
        self._stop_leading(tip)
        self.followed[tip] = lg
        self.rlmm.on_partition_leadership_changes([], [tip])
        self.follower.schedule(tip, FollowerTask(tip, lg, self.rlmm))

    def on_stop(self, tip: TopicIdPartition, delete: bool) -> None:
        """The partition is no longer hosted here; with `delete`, its remote data goes too."""
        partition = self._stop_leading(tip)
        self.follower.cancel(tip)
        self.followed.pop(tip, None)
        self.rlmm.on_stop_partitions([tip])
        self.metrics.forget(tip.topic_partition, topic_deleted=delete)
        if delete:
            self._schedule_partition_delete(tip, partition.copying if partition else set())

    def _stop_leading(self, tip: TopicIdPartition) -> TieredPartition | None:
        partition = self.partitions.pop(tip, None)
        if partition is not None:
            partition.leader = False
        self.copier.cancel(tip)
        self.expirer.cancel(tip)
        return partition

    def _schedule_partition_delete(self, tip: TopicIdPartition, copying: set[uuid.UUID]) -> None:
        log.info("%s: scheduling deletion of its remote data", tip)
        self.expirer.schedule(
            tip,
            PartitionDeleteTask(
                tip, copying, self.rlmm, self.deleter, self.delete_lag_segments, self.expirer.cancel
            ),
        )

    def config_changed(self, tip: TopicIdPartition) -> None:
        """A topic config changed (retention, tiering): re-evaluate soon."""
        self.copier.trigger(tip)
        self.expirer.trigger(tip)

    # Reads ---------------------------------------------------------------------------

    async def read(self, tip: TopicIdPartition, lg: Log, offset: int, max_bytes: int) -> memoryview:
        """Whole batches from `offset` in the remote tier, along `lg`'s leader-epoch lineage.

        Raises TimeoutError after remote.fetch.max.wait.ms (the read goes on)."""
        return await self.reader.read(
            tip,
            offset,
            max_bytes,
            self.config.fetch_max_wait_ms / 1000,
            lg.leader_epoch_cache.entries,
        )

    async def aborted_txns(
        self, tip: TopicIdPartition, lg: Log, fetch_offset: int, records: memoryview
    ) -> list[AbortedTxn]:
        """The aborted transactions a read_committed fetch of remote `records` is told of.

        Raises TimeoutError after remote.fetch.max.wait.ms."""
        async with asyncio.timeout(self.config.fetch_max_wait_ms / 1000):
            return await self.txn_index.aborted_txns(tip, lg, fetch_offset, records)

    async def find_offset_by_timestamp(
        self,
        tip: TopicIdPartition,
        lg: Log,
        timestamp_ms: int,
        starting_offset: int,
        timeout_s: float | None = None,
    ) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or after `timestamp_ms` in the remote
        tier, along `lg`'s leader-epoch lineage.

        Raises TimeoutError after `timeout_s`, or the remote call timeout if that is shorter."""
        limit_s = self.config.remote_call_timeout_ms / 1000
        async with asyncio.timeout(limit_s if timeout_s is None else min(timeout_s, limit_s)):
            return await self.reader.find_offset_by_timestamp(
                tip, timestamp_ms, starting_offset, lg.leader_epoch_cache.entries
            )

    # Status and metrics --------------------------------------------------------------

    def status(self) -> list[dict[str, Any]]:
        """Per led partition: both tiers' offsets, sizes and segment counts, and the copy lag.

        Segments wholly below the log start offset are left out: no reader reaches them and
        expiration is deleting them (it moves the log start offset first)."""
        rows = []
        for tip, p in sorted(self.partitions.items()):
            lg = p.log
            remote, remote_bytes = self._remote_tier(tip, lg)
            if not lg.config.remote_storage_enable and not remote:
                continue
            pending = [
                s
                for s in lg.segments[:-1]
                if s.next_offset - 1 > lg.highest_offset_in_remote_storage
            ]
            rows.append(
                {
                    "topic": tip.topic_partition.topic,
                    "partition": tip.topic_partition.partition,
                    "log_start_offset": lg.log_start_offset,
                    "local_log_start_offset": lg.local_log_start_offset,
                    "log_end_offset": lg.log_end_offset,
                    "local_segments": len(lg.segments),
                    "local_bytes": lg.size_in_bytes,
                    "remote_log_start_offset": remote[0].start_offset if remote else -1,
                    "remote_log_end_offset": lg.highest_offset_in_remote_storage,
                    "remote_segments": len(remote),
                    "remote_bytes": remote_bytes,
                    "copy_lag_segments": len(pending),
                    "copy_lag_bytes": sum(s.size for s in pending),
                }
            )
        return rows

    def _remote_tier(
        self, tip: TopicIdPartition, lg: Log
    ) -> tuple[list[RemoteLogSegmentMetadata], int]:
        """The remote segments readers reach and their bytes in this log's lineage (KIP-852)."""
        lineage = lg.leader_epoch_cache.entries
        counted = {epoch for epoch, _ in lineage}  # what remote_log_size counts
        remote, going_bytes = [], 0
        for s in lineage_segments(self.rlmm.readable_segments(tip), lineage):
            if s.end_offset >= lg.log_start_offset:
                remote.append(s)
            elif s.segment_leader_epochs[-1][0] in counted:
                going_bytes += s.segment_size_bytes
        size = self.rlmm.remote_log_size(tip, lg.leader_epoch_cache.latest_epoch, lineage)
        return remote, size - going_bytes

    def storage_health(self) -> dict[str, Any]:
        """Whether the remote store works, the error if not, and since when (ms)."""
        return self.metrics.health.as_dict()

    def rlmm_snapshot(self) -> None:
        """Let the metadata manager persist its state if it keeps a snapshot."""
        self.rlmm.maybe_snapshot()

    def update_metrics(self) -> None:
        for row in self.status():
            labels = (row["topic"], row["partition"])
            self.metrics.copy_lag_bytes.labels(*labels).set(row["copy_lag_bytes"])
            self.metrics.copy_lag_segments.labels(*labels).set(row["copy_lag_segments"])
            self.metrics.log_size_bytes.labels(*labels).set(row["remote_bytes"])
            self.metrics.metadata_count.labels(*labels).set(row["remote_segments"])
        for tip, lg in self.followed.items():  # every replica reports its remote tier's size
            if lg.config.remote_storage_enable:
                labels = (tip.topic_partition.topic, tip.topic_partition.partition)
                remote, remote_bytes = self._remote_tier(tip, lg)
                self.metrics.log_size_bytes.labels(*labels).set(remote_bytes)
                self.metrics.metadata_count.labels(*labels).set(len(remote))
        self.metrics.pool_queue.labels("copy").set(self.copier.queued)
        self.metrics.pool_queue.labels("expiration").set(self.expirer.queued)
        self.metrics.pool_queue.labels("follower").set(self.follower.queued)
        self.metrics.pool_queue.labels("reader").set(self.reader.pending)

    # Shutdown ------------------------------------------------------------------------

    async def stop(self, timeout_s: float, *, crash: bool = False) -> None:
        """Stop the tasks (waiting `timeout_s` for them) and close the plugins; `crash`:
        the metadata manager persists nothing more, as a killed process would not."""
        for partition in self.partitions.values():
            partition.leader = False
        await self.copier.stop(timeout_s)
        await self.expirer.stop(timeout_s)
        await self.follower.stop(timeout_s)
        await self.reader.close()
        await (self.rlmm.abandon() if crash else self.rlmm.close())
        await self.rsm.close()
