"""`TierStateMachine`: a follower that cannot fetch from its log end on a tiered partition
(the leader answered OFFSET_MOVED_TO_TIERED_STORAGE, or an empty follower OFFSET_OUT_OF_RANGE:
a new replica, an emptied disk, a long outage) starts its log at an offset the leader holds
locally instead (`fetch_start`: its local log start, or with KIP-1023 its earliest offset
pending upload), with the state the records below would have given it, read from the
remote tier (Kafka's `TierStateMachine`, `buildRemoteLogAuxState`):

1. that offset S and the leader's epoch there, from `fetch_start`;
2. the epoch of offset S - 1: that one, unless the leader says the epoch before it ends
   after S - 1 (OffsetsForLeaderEpoch), which also skips epochs without records;
3. the remote segment holding S - 1 in that epoch, from the metadata manager; none yet
   (this broker's metadata has not caught up) is an error the fetcher retries;
4. that segment's leader-epoch checkpoint (the lineage from the log's start up to the
   segment's end) and producer snapshot, from the RemoteStorageManager
   (`rlm.remote_log_aux_state`, which a leader restoring its log shares).

All of it is fetched before the log changes (`RemoteLogAuxState.apply`, synchronous):
a remote failure leaves the log as it was. The log then starts at the segment's end + 1
with the leader's log start offset, so only the leader's records from there are fetched
and the records below are read from the remote tier. A start at the leader's log start has
nothing below it to read: the log starts empty there, as a follower of a partition that
is not tiered would. Safe to share: it holds no state of a partition between calls.
"""

from __future__ import annotations

import logging

from tierbroker.broker.replication.fetch_start import FetchStart
from tierbroker.broker.replication.leader_endpoint import LeaderEndpoint
from tierbroker.broker.replication.partition import Partition
from tierbroker.protocol.errors import KafkaError
from tierbroker.rlm.metrics import RemoteStorageMetrics
from tierbroker.rlm.remote_log_aux_state import RemoteLogAuxState, fetch_remote_log_aux_state
from tierbroker.storage.remote.metadata_manager import RemoteLogMetadataManager
from tierbroker.storage.remote.segment_metadata import TopicIdPartition
from tierbroker.storage.remote.storage_manager import RemoteStorageError, RemoteStorageManager

log = logging.getLogger(__name__)


class TierStateMachine:
    def __init__(
        self,
        rlmm: RemoteLogMetadataManager,
        rsm: RemoteStorageManager,
        metrics: RemoteStorageMetrics,
        remote_call_timeout_ms: int,
    ) -> None:
        self.rlmm = rlmm
        self.rsm = rsm
        self.metrics = metrics
        self.timeout_s = remote_call_timeout_ms / 1000

    async def build_remote_log_aux_state(
        self, partition: Partition, leader: LeaderEndpoint, start: FetchStart
    ) -> RemoteLogAuxState:
        """Fetch what `partition`'s log needs to start at `start`.

        Raises KafkaError from the leader (its leadership moved, or it is unreachable)
        and RemoteStorageError when the remote tier cannot provide it yet."""
        topic = partition.topic_partition.topic
        self.metrics.build_aux_state_requests.labels(topic).inc()
        try:
            return await self._build(partition, leader, start)
        except (RemoteStorageError, KafkaError):  # every failure, as Kafka counts them
            self.metrics.build_aux_state_errors.labels(topic).inc()
            raise

    async def _build(
        self, partition: Partition, leader: LeaderEndpoint, start: FetchStart
    ) -> RemoteLogAuxState:
        tp = partition.topic_partition
        if not partition.log.config.remote_storage_enable:
            raise RemoteStorageError(f"{tp}: remote storage is not enabled on this replica yet")
        if start.offset <= start.leader_log_start_offset:
            return RemoteLogAuxState(
                segment=None,
                next_offset=start.offset,
                leader_log_start_offset=start.leader_log_start_offset,
                epochs=[],
                producer_snapshot=None,
            )
        target = start.offset - 1
        target_epoch = start.epoch
        if start.epoch > 0:
            earlier_epoch, earlier_end = await leader.epoch_end_offset(partition, start.epoch - 1)
            if earlier_end > target:
                target_epoch = earlier_epoch
        tip = TopicIdPartition(partition.topic_id, tp)
        self.rlmm.require_ready(tip)  # retried: a partial view misses the segment
        segment = self.rlmm.remote_log_segment_metadata(tip, target_epoch, target)
        if segment is None:
            raise RemoteStorageError(
                f"{tp}: no remote segment holds offset {target} in leader epoch {target_epoch} "
                f"(the follower starts at {start.offset}, the leader's log start is "
                f"{start.leader_log_start_offset})"
            )
        return await fetch_remote_log_aux_state(
            self.rsm, segment, start.leader_log_start_offset, self.timeout_s
        )
