"""`RemoteLogMetadataCache`: what the remote tier holds, per partition, in memory.

Per partition it keeps every segment not yet DELETE_SEGMENT_FINISHED and indexes of the
readable (COPY_SEGMENT_FINISHED) ones: by start offset; per leader epoch, by the epoch's
first offset in each segment (Kafka's `RemoteLogLeaderEpochState`), so that
`segment_for_offset(tp, epoch, offset)` answers with a segment holding that offset *in
that epoch*, never one of another lineage; per last epoch, by end offset, with running
byte totals; and the highest remote offset of each epoch. Each epoch's parent and start,
read from the segments that cross from one epoch to the next, give the lineage ending in
an epoch (`lineage.lineage_ending_in`), and `remote_log_size(tp, epoch)` sums, per epoch
of that lineage, the total of the segments ending in it less the few that run past the
lineage's end of it (another lineage's): O(epochs), never a scan of the segments (KIP-852).

Overlaps: a finished segment holding every record of another finished segment (the
other's last record, (epoch, end offset), and an earlier or equal start: a retried
copy, or a new leader copying again) *supersedes* it: the other is dropped from the
indexes and totals and left for expiration to delete, so it is neither read, counted
twice, nor leaked. Segments of two lineages over the same offsets both stay readable,
each in its own epochs. A COPY_SEGMENT_STARTED segment is never read nor counted.

Memory: a segment costs about 650 bytes (its metadata object, ids and ints, and its
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
from tierbroker.storage.remote.lineage import (
    Lineage,
    epoch_end_in,
    epoch_ranges,
    learn_parents,
    lineage_ending_in,
)
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
class _EpochIndex:
    """Readable segments holding records of one epoch, by the epoch's first offset in each,
    and `reach[i]`, the highest offset of the epoch in segments 0..i: non-decreasing, so
    the first segment reaching an offset is found by bisection even where uploads of two
    lineages nest, and its last entry is the epoch's highest remote offset. An insertion
    or removal updates `reach` from there until it is unchanged: O(1) when segments
    come in order and go oldest first."""

    starts: list[int] = field(default_factory=list)
    segments: list[RemoteLogSegmentMetadata] = field(default_factory=list)
    reach: list[int] = field(default_factory=list)

    def insert(self, first: int, metadata: RemoteLogSegmentMetadata, epoch: int) -> None:
        i = bisect.bisect_right(self.starts, first)
        self.starts.insert(i, first)
        self.segments.insert(i, metadata)
        self.reach.insert(i, -1)
        self._update_reach(i, epoch)

    def remove(self, first: int, metadata: RemoteLogSegmentMetadata, epoch: int) -> None:
        i = self.segments.index(metadata, bisect.bisect_left(self.starts, first))
        del self.starts[i]
        del self.segments[i]
        del self.reach[i]
        self._update_reach(i, epoch)

    def _update_reach(self, i: int, epoch: int) -> None:
        for k in range(i, len(self.reach)):
            reach = max(self.reach[k - 1] if k else -1, _epoch_end(self.segments[k], epoch))
            if reach == self.reach[k] and k > i:
                return
            self.reach[k] = reach

    def holding(self, offset: int, epoch: int) -> RemoteLogSegmentMetadata | None:
        """A segment holding `offset` of the epoch: the one starting last before it (as
        Kafka answers), or else the first reaching it."""
        i = bisect.bisect_right(self.starts, offset) - 1
        if i < 0 or self.reach[i] < offset:
            return None
        floor = self.segments[i]
        if floor.segment_leader_epochs[-1][0] == epoch:  # the common case, inline
            end = floor.end_offset
        else:
            end = _epoch_end(floor, epoch)
        if end >= offset:
            return floor
        return self.segments[bisect.bisect_left(self.reach, offset, 0, i)]


@dataclass(slots=True)
class _PartitionState:
    tip: TopicIdPartition  # the one object its segments' ids refer to
    segments: dict[object, RemoteLogSegmentMetadata] = field(default_factory=dict)
    starts: list[int] = field(default_factory=list)  # readable segments, by start offset
    readable: list[RemoteLogSegmentMetadata] = field(default_factory=list)
    superseded: set[object] = field(default_factory=set)
    by_epoch: dict[int, _EpochIndex] = field(default_factory=dict)
    by_last_epoch: dict[int, list[RemoteLogSegmentMetadata]] = field(default_factory=dict)
    size_by_last_epoch: dict[int, int] = field(default_factory=dict)
    parents: dict[int, tuple[int, int]] = field(default_factory=dict)  # epoch: (parent, start)
    lineages: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # until a change
    delete_state: RemotePartitionDeleteState | None = None


def _end(m: RemoteLogSegmentMetadata) -> int:
    return m.end_offset


def _last_epoch(m: RemoteLogSegmentMetadata) -> int:
    return m.segment_leader_epochs[-1][0]


def _epoch_end(m: RemoteLogSegmentMetadata, epoch: int) -> int:
    """The last offset of `epoch` in `m`, which holds some of it."""
    end = epoch_end_in(m.segment_leader_epochs, m.end_offset, epoch)
    assert end is not None
    return end


class RemoteLogMetadataCache:
    def __init__(self, freeze_every: int = FREEZE_EVERY_SEGMENTS) -> None:
        self._partitions: dict[TopicIdPartition, _PartitionState] = {}
        # Called with a partition just before `put` or `put_partition_delete` changes it,
        # so a snapshot taken over several turns can copy the partition as it was.
        self.before_change: Callable[[TopicIdPartition], None] | None = None
        self._long_lived = LongLivedObjects(freeze_every)

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
        learn_parents(metadata.segment_leader_epochs, state.parents)
        state.lineages.clear()
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
        learn_parents(metadata.segment_leader_epochs, state.parents)
        state.lineages.clear()
        if superseded:
            state.superseded.add(metadata.segment_id.id)
        elif metadata.state == FINISHED:
            self._add_readable(state, metadata)
        self._long_lived.added()

    def _covering(
        self, state: _PartitionState, metadata: RemoteLogSegmentMetadata
    ) -> RemoteLogSegmentMetadata | None:
        """A readable segment holding every record of `metadata`: its last record and an
        earlier or equal start (then the records before agree too). Of those holding the
        last record, the latest and the earliest starting are asked."""
        epoch, first, last = epoch_ranges(metadata.segment_leader_epochs, metadata.end_offset)[-1]
        index = state.by_epoch.get(epoch)
        if index is None:
            return None
        i = bisect.bisect_right(index.starts, first) - 1
        if i < 0 or index.reach[i] < last:
            return None
        for c in (index.segments[i], index.segments[bisect.bisect_left(index.reach, last, 0, i)]):
            if c.start_offset <= metadata.start_offset and _epoch_end(c, epoch) >= last:
                return c
        return None

    def _index(self, state: _PartitionState, metadata: RemoteLogSegmentMetadata) -> None:
        if self._covering(state, metadata) is not None:
            state.superseded.add(metadata.segment_id.id)
            return
        # Segments whose last record this one holds, starting at or after it.
        for epoch, first, last in epoch_ranges(metadata.segment_leader_epochs, metadata.end_offset):
            index = state.by_epoch.get(epoch)
            if index is None:
                continue
            lo = bisect.bisect_left(index.starts, first)
            hi = bisect.bisect_right(index.starts, last)
            inner = [
                s
                for s in index.segments[lo:hi]
                if _last_epoch(s) == epoch
                and s.end_offset <= last
                and s.start_offset >= metadata.start_offset
            ]
            for s in inner:
                self._unindex(state, s)
                state.superseded.add(s.segment_id.id)
        self._add_readable(state, metadata)

    def _add_readable(self, state: _PartitionState, metadata: RemoteLogSegmentMetadata) -> None:
        lo = bisect.bisect_right(state.starts, metadata.start_offset)
        state.starts.insert(lo, metadata.start_offset)
        state.readable.insert(lo, metadata)
        for epoch, first, _ in epoch_ranges(metadata.segment_leader_epochs, metadata.end_offset):
            index = state.by_epoch.get(epoch)
            if index is None:
                index = state.by_epoch[epoch] = _EpochIndex()
            index.insert(first, metadata, epoch)
        epoch = _last_epoch(metadata)
        ending = state.by_last_epoch.get(epoch)
        if ending is None:
            ending = state.by_last_epoch[epoch] = []
        ending.insert(bisect.bisect_right(ending, metadata.end_offset, key=_end), metadata)
        state.size_by_last_epoch[epoch] = (
            state.size_by_last_epoch.get(epoch, 0) + metadata.segment_size_bytes
        )

    def _unindex(self, state: _PartitionState, metadata: RemoteLogSegmentMetadata) -> None:
        try:
            i = state.readable.index(
                metadata, bisect.bisect_left(state.starts, metadata.start_offset)
            )
        except ValueError:
            return  # superseded: never indexed
        state.lineages.clear()
        del state.starts[i]
        del state.readable[i]
        for epoch, first, _ in epoch_ranges(metadata.segment_leader_epochs, metadata.end_offset):
            index = state.by_epoch[epoch]
            index.remove(first, metadata, epoch)
            if not index.segments:
                del state.by_epoch[epoch]
        epoch = _last_epoch(metadata)
        ending = state.by_last_epoch[epoch]
        del ending[
            ending.index(metadata, bisect.bisect_left(ending, metadata.end_offset, key=_end))
        ]
        state.size_by_last_epoch[epoch] -= metadata.segment_size_bytes
        if not ending:
            del state.by_last_epoch[epoch]
            del state.size_by_last_epoch[epoch]

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
        self, tip: TopicIdPartition, leader_epoch: int, offset: int
    ) -> RemoteLogSegmentMetadata | None:
        """A readable segment holding `offset` in `leader_epoch` (Kafka's
        `remoteLogSegmentMetadata(tp, epochForOffset, offset)`), if any: O(log n)."""
        state = self._partitions.get(tip)
        index = state.by_epoch.get(leader_epoch) if state else None
        if index is None:
            return None
        return index.holding(offset, leader_epoch)

    def lineage(self, tip: TopicIdPartition, leader_epoch: int) -> list[tuple[int, int]]:
        """The lineage ending in `leader_epoch`, as the remote tier knows it
        (`lineage.lineage_ending_in`); empty if it holds no epoch up to it."""
        state = self._partitions.get(tip)
        if state is None:
            return []
        found = state.lineages.get(leader_epoch)
        if found is None:

            def span(epoch: int) -> tuple[int, int] | None:
                index = state.by_epoch.get(epoch)
                if index is None:
                    return None
                return index.starts[0], index.reach[-1]

            found = lineage_ending_in(leader_epoch, sorted(state.by_epoch), state.parents, span)
            state.lineages[leader_epoch] = found
        return found

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
        index = state.by_epoch.get(epoch) if state else None
        return index.reach[-1] if index else None

    def highest_offset(self, tip: TopicIdPartition) -> int:
        """The last offset readable from the remote tier, or -1."""
        state = self._partitions.get(tip)
        return state.readable[-1].end_offset if state and state.readable else -1

    def start_offset(self, tip: TopicIdPartition) -> int | None:
        state = self._partitions.get(tip)
        return state.readable[0].start_offset if state and state.readable else None

    def remote_log_size(
        self, tip: TopicIdPartition, leader_epoch: int, lineage: Lineage | None = None
    ) -> int:
        """Bytes of the readable segments in the lineage ending in `leader_epoch` (KIP-852):
        `lineage` if given (a log's own leader-epoch entries), else the one the remote tier
        tells. Per epoch of the lineage, the segments ending in it, less those ending past
        the lineage's end of it (none unless lineages diverged there)."""
        state = self._partitions.get(tip)
        if state is None:
            return 0
        if lineage is None:
            lineage = self.lineage(tip, leader_epoch)
        total = 0
        for i, (epoch, _) in enumerate(lineage):
            size = state.size_by_last_epoch.get(epoch, 0)
            if (
                size
                and i + 1 < len(lineage)
                and state.by_epoch[epoch].reach[-1] >= lineage[i + 1][1]
            ):
                ending = state.by_last_epoch[epoch]
                past = bisect.bisect_right(ending, lineage[i + 1][1] - 1, key=_end)
                size -= sum(m.segment_size_bytes for m in ending[past:])
            total += size
        return total

    def segment_count(self, tip: TopicIdPartition) -> int:
        state = self._partitions.get(tip)
        return len(state.segments) if state else 0

    def partitions(self) -> list[TopicIdPartition]:
        return list(self._partitions)

    def delete_state(self, tip: TopicIdPartition) -> RemotePartitionDeleteState | None:
        state = self._partitions.get(tip)
        return state.delete_state if state else None
