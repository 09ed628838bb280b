"""Where a follower that cannot fetch from its log end starts on a tiered partition.

Kafka's `AbstractFetcherThread` decides it before its `TierStateMachine` builds the state
below that offset from the remote tier:

- KIP-405: at the leader's local log start (ListOffsets EARLIEST_LOCAL_TIMESTAMP), so the
  follower replicates every segment the leader still has on disk;
- KIP-1023 (`follower.fetch.last.tiered.offset.enable`): an empty follower starts at the
  leader's earliest offset still pending upload (ListOffsets
  EARLIEST_PENDING_UPLOAD_TIMESTAMP, the last tiered offset + 1), so it replicates only what
  the remote tier does not hold yet. Kafka applies it to an empty replica (log end 0) of a
  tiered, non-compacted partition whose leader has records (`ReplicaFetcherThread.
  shouldFetchFromLastTieredOffset`). A leader answering -1 does not know its remote high
  offset yet: the follower takes the local log start if the leader's log start equals it
  (nothing was uploaded), and asks again after the back-off otherwise.

An answer below the leader's local log start (a stale one below its log start included)
cannot be fetched from the leader: the follower starts at the local log start instead,
as Kafka's `LocalLeaderEndPoint` bounds the same answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from tierbroker.broker.replication.leader_endpoint import LeaderEndpoint
from tierbroker.broker.replication.partition import Partition
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.storage.log import (
    EARLIEST_LOCAL_TIMESTAMP,
    EARLIEST_PENDING_UPLOAD_TIMESTAMP,
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    Log,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchStart:
    """The offset a follower's log starts at, the leader epoch there, and the leader's log
    start: the follower's log start, with the offsets between read from the remote tier."""

    offset: int
    epoch: int
    leader_log_start_offset: int


def should_fetch_from_last_tiered_offset(lg: Log, leader_end_offset: int) -> bool:
    """Kafka's `shouldFetchFromLastTieredOffset`, once the broker config has it on: `lg` is
    empty, tiered and not compacted, and its leader has records."""
    return _empty_and_tiered(lg) and leader_end_offset != 0


def _empty_and_tiered(lg: Log) -> bool:
    return lg.config.remote_storage_enable and not lg.config.compact and lg.log_end_offset == 0


def start_after_last_tiered_offset(
    pending_upload: tuple[int, int], leader_log_start_offset: int, local_start: tuple[int, int]
) -> tuple[int, int]:
    """(offset, epoch) an empty follower starts at, from the leader's answers: its earliest
    offset pending upload, its log start and its local log start (offset, epoch).

    Raises KafkaError OFFSET_NOT_AVAILABLE, retriable, when the leader does not know its
    earliest pending upload and offsets below its local log may be in the remote tier."""
    pending_offset, _ = pending_upload
    local_offset, _ = local_start
    if pending_offset == -1:
        if local_offset == leader_log_start_offset:
            return local_start
        raise KafkaError(
            ErrorCode.offset_not_available,
            f"the leader does not know its earliest offset pending upload yet (log start "
            f"{leader_log_start_offset}, local log start {local_offset})",
        )
    if pending_offset < local_offset:
        return local_start
    return pending_upload


async def fetch_start(
    partition: Partition, leader: LeaderEndpoint, last_tiered_offset_enable: bool
) -> FetchStart:
    """Where `partition`'s log starts, asked of its leader (ListOffsets)."""
    log_start, _ = await leader.list_offset(partition, EARLIEST_TIMESTAMP)
    local_start = await leader.list_offset(partition, EARLIEST_LOCAL_TIMESTAMP)
    start = local_start
    if last_tiered_offset_enable and _empty_and_tiered(partition.log):
        leader_end, _ = await leader.list_offset(partition, LATEST_TIMESTAMP)
        if should_fetch_from_last_tiered_offset(partition.log, leader_end):
            pending = await leader.list_offset(partition, EARLIEST_PENDING_UPLOAD_TIMESTAMP)
            start = start_after_last_tiered_offset(pending, log_start, local_start)
    offset, epoch = start
    return FetchStart(offset=offset, epoch=epoch, leader_log_start_offset=log_start)
