"""`PartitionIndexWriter`: keeps a led partition's `PartitionIndex` in the remote tier true.

The copy task calls it after each run: the index (topic id, partition count, config
overrides, log start offset, leader epoch) is built from the log and the broker's
metadata and written through the plugin only when it differs from the one this
leadership last wrote, so a copy costs no request unless something changed (a new
leader writes it once). A partition whose remote tier holds nothing yet gets none.
A plugin that keeps no index says so once, and is not asked again. Not shared between
tasks beyond the event loop: each call touches one partition's `TieredPartition`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from tierbroker.rlm.tiered_partition import TieredPartition
from tierbroker.storage.remote.partition_index import PartitionIndex, TopicDescription
from tierbroker.storage.remote.storage_manager import RemoteStorageError, RemoteStorageManager

log = logging.getLogger(__name__)

DescribeTopic = Callable[[str], TopicDescription | None]


class PartitionIndexWriter:
    def __init__(
        self,
        rsm: RemoteStorageManager,
        describe_topic: DescribeTopic,
        broker_id: int,
        timeout_s: float,
    ) -> None:
        self.rsm = rsm
        self.describe_topic = describe_topic
        self.broker_id = broker_id
        self.timeout_s = timeout_s
        self.kept = True  # until the plugin says it keeps no index

    def current(self, partition: TieredPartition) -> PartitionIndex | None:
        """The index as it should read now; None while the remote tier holds nothing."""
        lg = partition.log
        topic = self.describe_topic(partition.topic)
        if topic is None or lg.highest_offset_in_remote_storage < 0:
            return None
        return PartitionIndex(
            tip=partition.tip,
            topic=topic,
            log_start_offset=lg.log_start_offset,
            leader_epoch=lg.leader_epoch_cache.latest_epoch,
            broker_id=self.broker_id,
        )

    async def maybe_write(self, partition: TieredPartition) -> None:
        """Write the partition's index if it changed since this leadership last wrote it.

        Raises RemoteStorageError when the write fails or outlasts the call timeout."""
        index = self.current(partition) if self.kept else None
        if index is None or index == partition.index_written:
            return
        try:
            async with asyncio.timeout(self.timeout_s):
                self.kept = await self.rsm.write_partition_index(partition.tip, index.to_json())
        except TimeoutError:
            raise RemoteStorageError(
                f"{partition.tip}: writing the partition index took over {self.timeout_s:g} s"
            ) from None
        if not self.kept:
            log.info("the remote storage plugin keeps no partition index: none is written")
            return
        partition.index_written, partition.index_deleted = index, False
        log.debug("%s: partition index written: %s", partition.tip, index)
