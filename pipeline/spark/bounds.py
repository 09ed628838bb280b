"""What a read sees of its topics, and where each partition's read starts and ends.

`TopicView` joins the remote tier (listings and manifests) with, when
`kafka.bootstrap.servers` is set, the brokers' metadata: a partition exists if
either knows it; its earliest offset is the lower of the remote tier's first
offset and the brokers' log start; its latest offset is the brokers' high
watermark, or without brokers the end of the remote tier. A timestamp becomes the
first offset whose record timestamp is >= it, from the remote tier's manifests
and indexes where it holds such a record, else from the brokers (ListOffsets).

Answers are cached until `refresh()`: a batch plans from one view of the topic,
a stream refreshes once per micro-batch.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING

from tierbroker.pipeline.committed import (
    AbortedSpans,
    CommittedView,
    SegmentCache,
    committed_view,
)
from tierbroker.pipeline.discovery import SegmentDiscovery, SegmentRange
from tierbroker.pipeline.segments import offset_for_timestamp
from tierbroker.pipeline.spark.options import EARLIEST, LATEST, Bound, ReadOptions

if TYPE_CHECKING:
    from tierbroker.pipeline.spark.kafka_client import BrokerMetadata

TopicPartitionKey = tuple[str, int]


class TopicView:
    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self.store = options.open()
        self.discovery = SegmentDiscovery(
            self.store, cluster=options.cluster, entropy_bits=options.entropy_bits
        )
        self.broker: BrokerMetadata | None = None
        if options.through_broker:
            from tierbroker.pipeline.spark.kafka_client import BrokerMetadata

            self.broker = BrokerMetadata(options.kafka)
        self._ranges: dict[TopicPartitionKey, list[SegmentRange]] = {}
        # Read committed: each partition's view, and what its segments say of transactions.
        self._committed: dict[TopicPartitionKey, CommittedView] = {}
        self._segment_txns: dict[TopicPartitionKey, SegmentCache] = {}
        self._watermarks: dict[TopicPartitionKey, tuple[int, int]] = {}

    def close(self) -> None:
        try:
            if self.broker is not None:
                self.broker.close()
        finally:
            self.store.close()

    def __enter__(self) -> TopicView:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def refresh(self) -> None:
        """Forget cached ranges and offsets (manifests stay cached: they never change)."""
        self._ranges.clear()
        self._watermarks.clear()

    def topic_partitions(self) -> list[TopicPartitionKey]:
        """The partitions `assign`, `subscribe` or `subscribePattern` (and `partitions`) name."""
        options = self.options
        if options.assign is not None:
            return [(t, p) for t, parts in sorted(options.assign.items()) for p in parts]
        if options.pattern is not None:
            pattern = re.compile(options.pattern)
            names = set(self.discovery.topics())
            if self.broker is not None:
                names |= set(self.broker.topics())
            topics = sorted(n for n in names if pattern.fullmatch(n))
        else:
            topics = options.subscribe
        found: list[TopicPartitionKey] = []
        for topic in topics:
            partitions = set(self.discovery.partitions(topic))
            if self.broker is not None:
                partitions |= set(self.broker.partitions(topic))
            wanted = options.partitions
            found += [(topic, p) for p in sorted(partitions) if wanted is None or p in wanted]
        return found

    def ranges(self, tp: TopicPartitionKey) -> list[SegmentRange]:
        """The remote tier's offset ranges of the partition, in offset order (read committed:
        up to what the store proves decided)."""
        cached = self._ranges.get(tp)
        if cached is None:
            cached = self.discovery.ranges(*tp)
            if self.options.read_committed:
                seen = self._segment_txns.get(tp, {})
                committed = self._committed[tp] = committed_view(self.store, cached, seen)
                listed = {r.segment.segment_id for r in cached}
                self._segment_txns[tp] = {k: v for k, v in seen.items() if k in listed}
                cached = committed.trim(cached)
            self._ranges[tp] = cached
        return cached

    def stable_end(self, tp: TopicPartitionKey) -> int | None:
        """Read committed: the offset the remote tier is read to, exclusive (what the store
        proves decided); None when reading uncommitted."""
        self.ranges(tp)
        committed = self._committed.get(tp)
        return None if committed is None else committed.stable_end

    def _marks(self, tp: TopicPartitionKey) -> tuple[int, int] | None:
        if self.broker is None:
            return None
        cached = self._watermarks.get(tp)
        if cached is None:
            cached = self._watermarks[tp] = self.broker.watermarks(*tp)
        return cached

    def aborted(self, tp: TopicPartitionKey) -> AbortedSpans:
        """The partition's aborted transactions the remote tier records (none unless read
        committed)."""
        self.ranges(tp)
        committed = self._committed.get(tp)
        return {} if committed is None else committed.aborted

    def earliest(self, tp: TopicPartitionKey) -> int:
        ranges, marks = self.ranges(tp), self._marks(tp)
        candidates = [ranges[0].first_offset] if ranges else []
        if marks is not None:
            candidates.append(marks[0])
        return min(candidates, default=0)

    def latest(self, tp: TopicPartitionKey) -> int:
        ranges, marks = self.ranges(tp), self._marks(tp)
        remote_end = ranges[-1].last_offset + 1 if ranges else 0
        return remote_end if marks is None else max(marks[1], remote_end)

    def offset_for_timestamp(self, tp: TopicPartitionKey, timestamp_ms: int) -> int | None:
        ranges = self.ranges(tp)
        if ranges:
            found = offset_for_timestamp(self.store, ranges, timestamp_ms)
            if found is not None:
                return found
        if self.broker is not None:
            return self.broker.offset_for_timestamp(*tp, timestamp_ms)
        return None


def resolve(
    view: TopicView,
    options: ReadOptions,
    keep: Callable[[TopicPartitionKey], bool] = lambda tp: True,
) -> dict[TopicPartitionKey, tuple[int, int]]:
    """[start, end) of every partition of a batch read (that `keep` keeps)."""
    bounds = {}
    for tp in filter(keep, view.topic_partitions()):
        start = offset_of(view, tp, options.starting, "startingOffsets", True, options)
        end = offset_of(view, tp, options.ending, "endingOffsets", False, options)
        bounds[tp] = (start, end)
    return bounds


def offset_of(
    view: TopicView,
    tp: TopicPartitionKey,
    bound: Bound,
    name: str,
    starting: bool,
    options: ReadOptions,
) -> int:
    """The offset `bound` stands for in the partition, within [earliest, latest]."""
    earliest, latest = view.earliest(tp), view.latest(tp)
    topic, partition = tp
    default = EARLIEST if starting else LATEST
    timestamp = bound.timestamp_of(topic, partition)
    if timestamp is not None:
        found = view.offset_for_timestamp(tp, timestamp)
        if found is not None:
            return min(max(found, earliest), latest)
        if starting and not options.latest_when_no_match:
            raise ValueError(
                f"No offset matched from request of topic-partition {topic}-{partition} and "
                f"timestamp {timestamp}; startingOffsetsByTimestampStrategy=latest starts "
                "such partitions at the latest offset"
            )
        return latest
    offsets = None if bound.by_time else bound.parsed_offsets(name)
    if offsets is None and not bound.by_time:
        value = EARLIEST if bound.offsets == "earliest" else LATEST
    else:
        value = (offsets or {}).get(topic, {}).get(str(partition), default)
    if value == EARLIEST:
        return earliest
    if value == LATEST:
        return latest
    return min(max(value, earliest), latest)
