"""`FollowerTask`: a follower's part in tiering (KIP-405's follower task).

Only the leader copies and expires. A follower learns from the metadata manager how far
the remote tier holds its log's lineage, so that its local retention deletes, as the
leader's does, only segments the remote tier already has.
"""

from __future__ import annotations

from tierbroker.storage.log import Log
from tierbroker.storage.remote.metadata_manager import RemoteLogMetadataManager
from tierbroker.storage.remote.segment_metadata import TopicIdPartition


def highest_remote_offset(rlmm: RemoteLogMetadataManager, tip: TopicIdPartition, lg: Log) -> int:
    """The highest offset the remote tier holds of this log's lineage; -1 if none.

    As Kafka's findHighestRemoteOffset: the latest epoch of the log that the remote tier
    holds, capped below where that epoch ends in this log (after an unclean election the
    remote tier may hold a dead lineage's offsets of the same epoch beyond it)."""
    cache = lg.leader_epoch_cache
    for epoch, _ in reversed(cache.entries):
        highest = rlmm.highest_offset_for_epoch(tip, epoch)
        if highest is not None:
            _, end = cache.end_offset_for(epoch, lg.log_end_offset)
            return min(highest, end - 1)
    return -1


class FollowerTask:
    def __init__(self, tip: TopicIdPartition, lg: Log, rlmm: RemoteLogMetadataManager) -> None:
        self.tip = tip
        self.log = lg
        self.rlmm = rlmm

    async def run_once(self) -> None:
        if not self.log.config.remote_storage_enable:
            return
        self.rlmm.require_ready(self.tip)
        self.log.update_highest_offset_in_remote_storage(
            highest_remote_offset(self.rlmm, self.tip, self.log)
        )
