"""`RemoteLogMetadataCache`: what the remote tier holds, per partition, in memory.

Per partition it keeps every segment not yet DELETE_SEGMENT_FINISHED, an index of
the readable (COPY_SEGMENT_FINISHED) ones by start offset, the highest remote
offset of each leader epoch, and running byte totals keyed by each segment's
first epoch, so `remote_log_size(tp, epoch)` sums a handful of epochs, never the
segments (KIP-852).

Overlaps: a finished segment whose offsets lie wholly inside another finished
segment (a retried copy, or a new leader copying again) is *superseded*: it is
dropped from the readable index and the totals and left for expiration to
delete, so it is neither read, counted twice, nor leaked. A COPY_SEGMENT_STARTED
segment is never read nor counted.

Memory: a segment costs about 600 bytes (its metadata object, ids and ints, and its
index entries); the segments of a partition share one `TopicIdPartition`, so one read
back from the metadata topic does not carry its own copy. Every query but
`all_segments` and the list copies is O(log n) or O(epochs). Segments stored are
moved out of the cyclic collector's full walks in batches (`LongLivedObjects`): at a
million, one walk held the loop for 2.8 s. Not shared between tasks: callers are on the
event loop.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from tierbroker.storage.long_lived import LongLivedObjects
from tierbroker.storage.remote.segment_metadata import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    RemotePartitionDeleteState,
    TopicIdPartition,
)

FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
FREEZE_EVERY_SEGMENTS = 20_000  # segment states stored between two freezes of the heap


@dataclass(slots=True)
class _PartitionState:
    tip: TopicIdPartition  # the one object its segments' ids refer to
    segments: dict[object, RemoteLogSegmentMetadata] = field(default_factory=dict)
    starts: list[int] = field(default_factory=list)  # readable segments, by start offset
    readable: list[RemoteLogSegmentMetadata] = field(default_factory=list)
    superseded: set[object] = field(default_factory=set)
    size_by_first_epoch: dict[int, int] = field(default_factory=dict)
    highest_offset_by_epoch: dict[int, int] = field(default_factory=dict)
    delete_state: RemotePartitionDeleteState | None = None


class RemoteLogMetadataCache:
    def __init__(self) -> None:
        self._partitions: dict[TopicIdPartition, _PartitionState] = {}
        # Called with a partition just before `put` or `put_partition_delete` changes it,
        # so a snapshot taken over several turns can copy the partition as it was.
        self.before_change: Callable[[TopicIdPartition], None] | None = None
        self._long_lived = LongLivedObjects(FREEZE_EVERY_SEGMENTS)

    def _state(self, tip: TopicIdPartition) -> _PartitionState:
        state = self._partitions.get(tip)
        if state is None:
            state = self._partitions[tip] = _PartitionState(tip)
        return state

    @staticmethod
    def _interned(
        state: _PartitionState, metadata: RemoteLogSegmentMetadata
    ) -> RemoteLogSegmentMetadata:
        """`metadata` referring to its partition's one `TopicIdPartition` object."""
        if metadata.segment_id.topic_id_partition is state.tip:
            return metadata
        return replace(metadata, segment_id=RemoteLogSegmentId(state.tip, metadata.segment_id.id))

    # Updates -------------------------------------------------------------------------

    def check(self, metadata: RemoteLogSegmentMetadata) -> None:
        """Raise ValueError if `metadata` is not a legal next state of its segment."""
        state = self._partitions.get(metadata.topic_id_partition)
        current = state.segments.get(metadata.segment_id.id) if state else None
        if current is not None and not current.state.can_become(metadata.state):
            raise ValueError(
                f"segment {metadata.segment_id.id} of {metadata.topic_id_partition}: "
                f"{current.state.name} -> {metadata.state.name} is not allowed"
            )

    def put(self, metadata: RemoteLogSegmentMetadata) -> None:
        """Add a segment or move it to a new state; a repeated state is a no-op."""
        self.check(metadata)
        if self.before_change is not None:
            self.before_change(metadata.topic_id_partition)
        state = self._state(metadata.topic_id_partition)
        key = metadata.segment_id.id
        current = state.segments.get(key)
        if current is not None and current.state == metadata.state:
            return
        if current is not None and current.state == FINISHED:
            self._unindex(state, current)
        if metadata.state == RemoteLogSegmentState.DELETE_SEGMENT_FINISHED:
            state.segments.pop(key, None)
            state.superseded.discard(key)
            return
        metadata = self._interned(state, metadata)
        state.segments[key] = metadata
        if metadata.state == FINISHED:
            self._index(state, metadata)
        self._long_lived.added()

    def contains(self, metadata: RemoteLogSegmentMetadata) -> bool:
        state = self._partitions.get(metadata.topic_id_partition)
        return state is not None and metadata.segment_id.id in state.segments

    def restore_partition(
        self, tip: TopicIdPartition, delete_state: RemotePartitionDeleteState | None
    ) -> None:
        """Load a partition from a snapshot, before its segments."""
        self._state(tip).delete_state = delete_state

    def restore(self, metadata: RemoteLogSegmentMetadata, superseded: bool) -> None:
        """Load a segment from a snapshot, with the overlap verdict it had when saved:
        cheapest for a partition's readable segments in offset order."""
        state = self._state(metadata.topic_id_partition)
        metadata = self._interned(state, metadata)
        state.segments[metadata.segment_id.id] = metadata
        if superseded:
            state.superseded.add(metadata.segment_id.id)
        elif metadata.state == FINISHED:
            self._add_readable(state, metadata)
        self._long_lived.added()

    def _index(self, state: _PartitionState, metadata: RemoteLogSegmentMetadata) -> None:
        lo = bisect.bisect_left(state.starts, metadata.start_offset)
        # Wholly inside a readable segment that starts before or at the same offset?
        covering = [state.readable[j] for j in (lo - 1, lo) if 0 <= j < len(state.readable)]
        if any(
            c.start_offset <= metadata.start_offset and c.end_offset >= metadata.end_offset
            for c in covering
        ):
            state.superseded.add(metadata.segment_id.id)
            return
        while lo < len(state.readable) and state.readable[lo].end_offset <= metadata.end_offset:
            inner = state.readable[lo]  # starts at or after the new one and ends within it
            self._unindex(state, inner)
            state.superseded.add(inner.segment_id.id)
        self._add_readable(state, metadata)

    def _add_readable(self, state: _PartitionState, metadata: RemoteLogSegmentMetadata) -> None:
        lo = bisect.bisect_left(state.starts, metadata.start_offset)
        state.starts.insert(lo, metadata.start_offset)
        state.readable.insert(lo, metadata)
        epoch = metadata.first_epoch
        state.size_by_first_epoch[epoch] = (
            state.size_by_first_epoch.get(epoch, 0) + metadata.segment_size_bytes
        )
        for (e, _), end in zip(metadata.segment_leader_epochs, _epoch_ends(metadata), strict=True):
            state.highest_offset_by_epoch[e] = max(state.highest_offset_by_epoch.get(e, -1), end)

    def _unindex(self, state: _PartitionState, metadata: RemoteLogSegmentMetadata) -> None:
        try:
            i = state.readable.index(
                metadata, bisect.bisect_left(state.starts, metadata.start_offset)
            )
        except ValueError:
            return  # superseded: never indexed
        del state.starts[i]
        del state.readable[i]
        epoch = metadata.first_epoch
        state.size_by_first_epoch[epoch] -= metadata.segment_size_bytes
        if not state.size_by_first_epoch[epoch]:
            del state.size_by_first_epoch[epoch]
        # Epochs grow with offsets, so if this segment held an epoch's highest offset, the
        # epoch's highest remaining offset is in the segment just before it, or nowhere.
        previous = (
            dict(
                zip(state.readable[i - 1].epochs(), _epoch_ends(state.readable[i - 1]), strict=True)
            )
            if i > 0
            else {}
        )
        for e, end in zip(metadata.epochs(), _epoch_ends(metadata), strict=True):
            if state.highest_offset_by_epoch.get(e) != end:
                continue
            if e in previous:
                state.highest_offset_by_epoch[e] = previous[e]
            else:
                del state.highest_offset_by_epoch[e]

    def put_partition_delete(
        self, tip: TopicIdPartition, delete_state: RemotePartitionDeleteState
    ) -> None:
        if self.before_change is not None:
            self.before_change(tip)
        self._state(tip).delete_state = delete_state
        if delete_state == RemotePartitionDeleteState.DELETE_PARTITION_FINISHED:
            self._partitions.pop(tip, None)

    # Queries -------------------------------------------------------------------------

    def segment_for_offset(
        self, tip: TopicIdPartition, offset: int
    ) -> RemoteLogSegmentMetadata | None:
        """The readable segment holding `offset`."""
        state = self._partitions.get(tip)
        if state is None:
            return None
        i = bisect.bisect_right(state.starts, offset) - 1
        if i >= 0 and state.readable[i].end_offset >= offset:
            return state.readable[i]
        return None

    def readable_segments(self, tip: TopicIdPartition) -> list[RemoteLogSegmentMetadata]:
        state = self._partitions.get(tip)
        return list(state.readable) if state else []

    def all_segments(self, tip: TopicIdPartition) -> Iterator[RemoteLogSegmentMetadata]:
        state = self._partitions.get(tip)
        if state is not None:
            yield from sorted(
                state.segments.values(), key=lambda m: (m.start_offset, m.event_timestamp_ms)
            )

    def segment_lists(
        self, tip: TopicIdPartition
    ) -> tuple[list[RemoteLogSegmentMetadata], list[RemoteLogSegmentMetadata]]:
        """(readable segments by start offset, every segment not yet deleted, unordered):
        cheap copies of references (segments are immutable), so a snapshot can be taken on
        the event loop and written elsewhere."""
        state = self._partitions.get(tip)
        return (list(state.readable), list(state.segments.values())) if state else ([], [])

    def superseded_segments(self, tip: TopicIdPartition) -> list[RemoteLogSegmentMetadata]:
        state = self._partitions.get(tip)
        if state is None:
            return []
        return [state.segments[k] for k in state.superseded if k in state.segments]

    def highest_offset_for_epoch(self, tip: TopicIdPartition, epoch: int) -> int | None:
        state = self._partitions.get(tip)
        return state.highest_offset_by_epoch.get(epoch) if state else None

    def highest_offset(self, tip: TopicIdPartition) -> int:
        """The last offset readable from the remote tier, or -1."""
        state = self._partitions.get(tip)
        return state.readable[-1].end_offset if state and state.readable else -1

    def start_offset(self, tip: TopicIdPartition) -> int | None:
        state = self._partitions.get(tip)
        return state.readable[0].start_offset if state and state.readable else None

    def remote_log_size(self, tip: TopicIdPartition, leader_epoch: int) -> int:
        """Bytes of readable segments whose data starts in an epoch <= `leader_epoch` (KIP-852)."""
        state = self._partitions.get(tip)
        if state is None:
            return 0
        return sum(
            size for epoch, size in state.size_by_first_epoch.items() if epoch <= leader_epoch
        )

    def segment_count(self, tip: TopicIdPartition) -> int:
        state = self._partitions.get(tip)
        return len(state.segments) if state else 0

    def partitions(self) -> list[TopicIdPartition]:
        return list(self._partitions)

    def delete_state(self, tip: TopicIdPartition) -> RemotePartitionDeleteState | None:
        state = self._partitions.get(tip)
        return state.delete_state if state else None


def _epoch_ends(metadata: RemoteLogSegmentMetadata) -> list[int]:
    """The last offset of each epoch within the segment."""
    starts = [start for _, start in metadata.segment_leader_epochs]
    return [next_start - 1 for next_start in starts[1:]] + [metadata.end_offset]
