"""Input-partition planning of the `tierbroker` Spark source (no pyspark here).

Planning resolves each partition's offset range (`pipeline.spark.bounds`), then
cuts it into pieces: `RemoteSlice`s of the remote segments that hold the offsets,
and, when the read goes through the brokers, a `BrokerRange` for the offsets the
remote tier does not hold (the untiered tail, or a gap). Spark pays tens of
milliseconds of CPU per input partition, so consecutive slices of a partition are
packed into one `Task` of about `maxBytesPerPartition` bytes; a segment larger
than that is cut at offset index entries. A broker range is one task, as Spark's
Kafka source reads one task per Kafka partition. Then Spark's Kafka source
arithmetic applies: `maxRecordsPerPartition` splits tasks with more offsets
evenly, and `minPartitions` splits the largest ones in proportion to their
offsets until there are about that many.

A `Task` carries everything an executor needs: where the store is, how to reach
the brokers, and its pieces, all of one Kafka partition, in offset order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from tierbroker.pipeline.committed import AbortedSpans, is_aborted
from tierbroker.pipeline.discovery import RemoteSegment, SegmentRange
from tierbroker.pipeline.segments import load_offset_index
from tierbroker.pipeline.spark.bounds import TopicView, resolve
from tierbroker.pipeline.spark.options import ReadOptions
from tierbroker.pipeline.storage import ObjectStore

TopicPartitionKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class RemoteSlice:
    """Records [first_offset, last_offset] of a segment, from batches starting in a byte range."""

    segment: RemoteSegment
    first_offset: int
    last_offset: int
    byte_start: int = 0
    byte_end: int | None = None  # exclusive; None: the end of the segment
    seek: bool = False  # find the start from the offset index on the executor

    @property
    def range(self) -> SegmentRange:
        return SegmentRange(self.segment, self.first_offset, self.last_offset)

    @property
    def offsets(self) -> int:
        return self.last_offset - self.first_offset + 1

    @property
    def estimated_bytes(self) -> int:
        if self.byte_end is not None:
            return self.byte_end - self.byte_start
        segment = self.segment
        span = segment.end_offset - segment.start_offset + 1
        return max(1, segment.size * self.offsets // max(span, 1))

    def cut(self, offset: int) -> tuple[RemoteSlice, RemoteSlice]:
        """[first, offset - 1] and [offset, last]; the second seeks its start in the index."""
        return replace(self, last_offset=offset - 1), replace(self, first_offset=offset, seek=True)


@dataclass(frozen=True, slots=True)
class BrokerRange:
    """Offsets [first_offset, end_offset) of a partition, read through the brokers."""

    first_offset: int
    end_offset: int

    @property
    def offsets(self) -> int:
        return self.end_offset - self.first_offset

    def cut(self, offset: int) -> tuple[BrokerRange, BrokerRange]:
        return BrokerRange(self.first_offset, offset), BrokerRange(offset, self.end_offset)


Piece = RemoteSlice | BrokerRange


@dataclass(frozen=True, slots=True)
class Access:
    """How an executor reaches the data: the store, and the brokers if the read uses them."""

    storage: str
    store_options: tuple[tuple[str, str], ...]
    kafka: tuple[tuple[str, str], ...]  # librdkafka settings; empty: no broker reads
    poll_timeout_ms: int
    fail_on_data_loss: bool

    @classmethod
    def of(cls, options: ReadOptions) -> Access:
        return cls(
            options.storage,
            tuple(sorted(options.store_options.items())),
            tuple(sorted(options.kafka.items())) if options.through_broker else (),
            options.poll_timeout_ms,
            options.fail_on_data_loss,
        )


@dataclass(frozen=True, slots=True)
class Task:
    """One input partition: consecutive pieces of one Kafka partition."""

    access: Access
    topic: str
    partition: int
    pieces: tuple[Piece, ...]
    # Read committed: the aborted transactions in the task's offsets, whose records the
    # remote slices leave out (the brokers leave them out).
    aborted: AbortedSpans = field(default_factory=dict)

    def is_aborted(self, producer_id: int, offset: int) -> bool:
        return is_aborted(self.aborted, producer_id, offset)

    @property
    def offsets(self) -> int:
        return sum(p.offsets for p in self.pieces)

    def split(self, parts: int) -> list[Task]:
        """`parts` tasks of about as many offsets each (the last takes the rounding)."""
        tasks: list[Task] = []
        pieces = list(self.pieces)
        remaining = self.offsets
        for part in range(parts):
            take = remaining // (parts - part)
            remaining -= take
            head: list[Piece] = []
            while pieces and take > 0:
                piece = pieces.pop(0)
                if piece.offsets > take:
                    first, rest = piece.cut(piece.first_offset + take)
                    head.append(first)
                    pieces.insert(0, rest)
                    take = 0
                else:
                    head.append(piece)
                    take -= piece.offsets
            if head:
                tasks.append(replace(self, pieces=tuple(head)))
        return tasks


@dataclass(frozen=True, slots=True)
class Interval:
    """Integers in [low, high) (None: unbounded), and among `values` if given."""

    low: int | None = None
    high: int | None = None
    values: frozenset[int] | None = None

    def __contains__(self, x: int) -> bool:
        return (
            (self.low is None or x >= self.low)
            and (self.high is None or x < self.high)
            and (self.values is None or x in self.values)
        )

    def narrowed(self, low: int | None = None, high: int | None = None) -> Interval:
        lows = [x for x in (self.low, low) if x is not None]
        highs = [x for x in (self.high, high) if x is not None]
        return replace(self, low=max(lows, default=None), high=min(highs, default=None))

    def only(self, values: frozenset[int]) -> Interval:
        return replace(self, values=values if self.values is None else self.values & values)

    def clamp(self, start: int, end: int) -> tuple[int, int]:
        """[start, end) narrowed to the interval's bounds (and its values' span)."""
        span = (
            self
            if self.values is None
            else self.narrowed(min(self.values, default=0), max(self.values, default=-1) + 1)
        )
        return (
            start if span.low is None else max(start, span.low),
            end if span.high is None else min(end, span.high),
        )


@dataclass(frozen=True, slots=True)
class Pushed:
    """What the filters Spark pushed down say about the rows to read: partitions and
    offsets exactly; a lowest timestamp, which prunes segments whose largest is below."""

    partitions: Interval = Interval()
    offsets: Interval = Interval()
    timestamp_from_ms: int | None = None

    def interval(self, column: str) -> Interval:
        """The interval of column `partition` or `offset`."""
        return self.partitions if column == "partition" else self.offsets

    def with_interval(self, column: str, interval: Interval) -> Pushed:
        if column == "partition":
            return replace(self, partitions=interval)
        return replace(self, offsets=interval)


NO_FILTERS = Pushed()


def plan(options: ReadOptions, pushed: Pushed = NO_FILTERS) -> list[Task]:
    """The input partitions of a batch read."""
    with TopicView(options) as view:
        bounds = resolve(view, options, lambda tp: tp[1] in pushed.partitions)
        return plan_ranges(view, options, bounds, pushed)


def plan_ranges(
    view: TopicView,
    options: ReadOptions,
    bounds: dict[TopicPartitionKey, tuple[int, int]],
    pushed: Pushed = NO_FILTERS,
) -> list[Task]:
    """The input partitions of offsets [start, end) of each partition in `bounds`."""
    access = Access.of(options)
    tasks: list[Task] = []
    for (topic, partition), (start, end) in sorted(bounds.items()):
        start, end = pushed.offsets.clamp(start, end)
        if start >= end:
            continue
        pieces = _pieces(view, options, (topic, partition), start, end, pushed)
        aborted = view.aborted((topic, partition))
        for group in _pack(pieces, options.max_bytes_per_partition):
            low, high = group[0].first_offset, _end(group[-1])
            overlapping = {
                pid: inside
                for pid, spans in aborted.items()
                if (inside := tuple(s for s in spans if s[0] < high and s[1] >= low))
            }
            tasks.append(Task(access, topic, partition, tuple(group), overlapping))
    if options.max_records_per_partition is not None:
        limit = options.max_records_per_partition
        tasks = [part for t in tasks for part in t.split(math.ceil(t.offsets / limit))]
    if options.min_partitions is not None:
        tasks = _at_least(tasks, options.min_partitions)
    return tasks


def _end(piece: Piece) -> int:
    return piece.end_offset if isinstance(piece, BrokerRange) else piece.last_offset + 1


def _pieces(
    view: TopicView,
    options: ReadOptions,
    tp: TopicPartitionKey,
    start: int,
    end: int,
    pushed: Pushed,
) -> list[Piece]:
    """Remote slices where the remote tier holds the offsets, broker ranges elsewhere;
    segments the filters rule out are skipped (the brokers do not read them either)."""
    pieces: list[Piece] = []
    through_broker = options.through_broker and options.segments is None
    wanted = options.segments
    newer = pushed.timestamp_from_ms
    cursor = start
    for range_ in view.ranges(tp):
        lo, hi = max(range_.first_offset, cursor), min(range_.last_offset, end - 1)
        if lo > hi:
            continue
        if lo > cursor and through_broker:
            pieces.append(BrokerRange(cursor, lo))
        segment = range_.segment
        if (wanted is None or segment.segment_id in wanted) and (
            newer is None or segment.max_timestamp_ms >= newer
        ):
            sliced = SegmentRange(range_.segment, lo, hi)
            pieces.extend(_slices(view.store, sliced, options.max_bytes_per_partition))
        cursor = hi + 1
    if cursor < end and through_broker:
        pieces.append(BrokerRange(cursor, end))
    return pieces


def _slices(store: ObjectStore, range_: SegmentRange, limit: int) -> list[RemoteSlice]:
    """One slice for the range, or several cut at index entries if the segment is large."""
    segment = range_.segment
    whole = RemoteSlice(
        segment,
        range_.first_offset,
        range_.last_offset,
        seek=range_.first_offset > segment.start_offset,
    )
    if segment.size <= limit or segment.indexes_key is None:
        return [whole]
    index = load_offset_index(store, range_)
    if index is None or not len(index):
        return [whole]
    # Cuts at indexed batch starts, about `limit` bytes apart: (position, base offset).
    cuts: list[tuple[int, int]] = [(0, segment.start_offset)]
    for offset, position in index:
        if position - cuts[-1][0] >= limit:
            cuts.append((position, offset))
    slices = []
    for i, (position, first) in enumerate(cuts):
        after = cuts[i + 1] if i + 1 < len(cuts) else None
        if after is not None and after[1] <= range_.first_offset:
            continue  # every batch here ends before the first offset wanted
        if first > range_.last_offset:
            break
        lo = max(first, range_.first_offset)
        hi = range_.last_offset if after is None else min(after[1] - 1, range_.last_offset)
        slices.append(
            RemoteSlice(
                segment,
                lo,
                hi,
                byte_start=max(position, index.position_for(range_.first_offset)),
                byte_end=None if after is None else after[0],
            )
        )
    return slices


def _pack(pieces: list[Piece], target_bytes: int) -> list[list[Piece]]:
    """Consecutive remote slices in groups of about `target_bytes`; each broker range alone."""
    groups: list[list[Piece]] = []
    current: list[Piece] = []
    size = 0
    for piece in pieces:
        if isinstance(piece, BrokerRange):
            if current:
                groups.append(current)
            groups.append([piece])
            current, size = [], 0
            continue
        estimate = piece.estimated_bytes
        if current and size + estimate > target_bytes:
            groups.append(current)
            current, size = [], 0
        current.append(piece)
        size += estimate
    if current:
        groups.append(current)
    return groups


def _at_least(tasks: list[Task], min_partitions: int) -> list[Task]:
    """Spark's `minPartitions`: large tasks split in proportion to their offsets."""
    if len(tasks) >= min_partitions:
        return tasks
    total = sum(t.offsets for t in tasks)

    def parts(size: int, of_total: int, minimum: int) -> int:
        return max(math.floor(size / max(of_total, 1) * minimum + 0.5), 1)  # Scala's round

    unsplit = [t for t in tasks if parts(t.offsets, total, min_partitions) == 1]
    split_total = total - sum(t.offsets for t in unsplit)
    split_minimum = max(min_partitions - len(unsplit), 1)
    unsplit_ids = {id(t) for t in unsplit}
    out: list[Task] = []
    for task in tasks:
        if id(task) in unsplit_ids:
            out.append(task)
        else:
            out.extend(task.split(parts(task.offsets, split_total, split_minimum)))
    return out
