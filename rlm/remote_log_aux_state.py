"""`RemoteLogAuxState`: what a log needs to start after a remote segment, read from the
remote tier (Kafka's `buildRemoteLogAuxState`): the segment's leader-epoch checkpoint
(the lineage from the log's start up to the segment's end) and its producer snapshot.

A follower far behind its leader (`broker.replication.tier_state_machine`) and a leader
whose log is empty while the remote tier holds the partition's history (a restored
topic, `RemoteLogManager`) both fetch it whole, then apply it at once: a remote failure
leaves the log as it was.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from tierbroker.storage.checkpoints import parse_epoch_entries
from tierbroker.storage.leader_epoch import check_increasing
from tierbroker.storage.log import Log
from tierbroker.storage.remote.segment_metadata import RemoteLogSegmentMetadata
from tierbroker.storage.remote.storage_manager import (
    IndexType,
    RemoteResourceNotFoundError,
    RemoteStorageError,
    RemoteStorageManager,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class RemoteLogAuxState:
    """What a log needs to start at `next_offset`, fetched from the remote tier
    (`segment`, the one ending just below; None: nothing below is readable)."""

    segment: RemoteLogSegmentMetadata | None
    next_offset: int
    leader_log_start_offset: int
    epochs: list[tuple[int, int]]  # (epoch, start offset) up to the segment's end
    producer_snapshot: bytes | None  # None: none, or the segment was uploaded without one

    def apply(self, lg: Log) -> None:
        """Empty `lg` and start it at `next_offset` with this state."""
        lg.truncate_fully_and_start_at(self.next_offset, self.leader_log_start_offset)
        lg.leader_epoch_cache.restore(self.epochs)
        if self.producer_snapshot is not None:
            lg.load_producer_snapshot(self.producer_snapshot)
        log.info(
            "%s: log rebuilt from the remote tier: starts at %d (log start %d), %d leader "
            "epochs, %d producers, from remote segment %s",
            lg.topic_partition,
            self.next_offset,
            lg.log_start_offset,
            len(self.epochs),
            len(lg.producer_state.producers),
            "none" if self.segment is None else self.segment.segment_id.id,
        )


async def fetch_remote_log_aux_state(
    rsm: RemoteStorageManager,
    segment: RemoteLogSegmentMetadata,
    log_start_offset: int,
    timeout_s: float,
) -> RemoteLogAuxState:
    """The state after `segment`, its indexes fetched within `timeout_s`.

    Raises RemoteStorageError when they cannot be fetched or parsed."""
    tp = segment.topic_id_partition.topic_partition
    try:
        async with asyncio.timeout(timeout_s):
            checkpoint = await rsm.fetch_index(segment, IndexType.LEADER_EPOCH)
            snapshot = await _producer_snapshot(rsm, segment)
    except TimeoutError:
        raise RemoteStorageError(
            f"{tp}: indexes of remote segment {segment.segment_id.id} not fetched within "
            f"{timeout_s} s"
        ) from None
    source = f"leader-epoch checkpoint of remote segment {segment.segment_id.id}"
    try:
        lineage = parse_epoch_entries(checkpoint.decode(), source)
        epochs = [(e, start) for e, start in lineage if start <= segment.end_offset]
        check_increasing(epochs, source)
    except (ValueError, UnicodeDecodeError) as e:
        raise RemoteStorageError(f"{tp}: {e}", retriable=False) from None
    return RemoteLogAuxState(
        segment=segment,
        next_offset=segment.end_offset + 1,
        leader_log_start_offset=log_start_offset,
        epochs=epochs,
        producer_snapshot=snapshot,
    )


async def _producer_snapshot(
    rsm: RemoteStorageManager, segment: RemoteLogSegmentMetadata
) -> bytes | None:
    try:
        return await rsm.fetch_index(segment, IndexType.PRODUCER_SNAPSHOT)
    except RemoteResourceNotFoundError:
        return None
