"""`RemoteFetcher`: the consumer's read path straight from the object store.

Per partition it keeps the resolved segment ranges (re-listed at most every
`refresh_interval_s`, or at once when a segment turns out to be gone) and a cursor:
the next offset, the range and byte position it lies at, and records decoded but
not yet returned. A fetch decodes about `chunk_bytes` when the cursor has nothing
buffered, in a thread pool, so the event loop never blocks on the store. The bytes
come from a `ChunkCache`, as the broker's remote reads do: ranged GETs of whole
chunks in the pool, each chunk once, prefetched past the cursor into the following
segments, so the store's latency is paid once per prefetch window.

Records become aiokafka `ConsumerRecord`s built exactly as aiokafka's fetcher builds
them (same field values, headers a tuple of (str, bytes) pairs, checksum None,
serialized sizes -1 for null), with the consumer's deserializers applied. Control
batches are skipped, as consumers do. Read committed (`read_committed`), the ranges end
at the stable end of a `CommittedView` and the records of aborted transactions are left
out, as a read_committed consumer leaves them out.

Missing offsets (a segment deleted by retention while we read it, or a gap
between segments) are skipped forward with a warning when `skip_missing` is set
(the REMOTE_* modes); otherwise the fetch reports them as not covered and the
caller reads them from the broker.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from aiokafka.structs import ConsumerRecord, TopicPartition

from tierbroker.pipeline.committed import CommittedView, SegmentCache, committed_view
from tierbroker.pipeline.discovery import RemoteSegment, SegmentDiscovery, SegmentRange
from tierbroker.pipeline.segments import (
    DEFAULT_CHUNK_BYTES,
    checked_batches,
    first_batch_size,
    parse_batch,
    read_log,
    start_position,
    whole_batches_end,
)
from tierbroker.pipeline.storage import ObjectNotFoundError
from tierbroker.storage.remote.chunk_cache import ChunkCache, RemoteObject

log = logging.getLogger(__name__)

Deserializer = Callable[[bytes | None], Any] | None
RawRecord = tuple[int, int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]
"""(offset, timestamp, timestamp type, key, value, headers) of one decoded record."""


@dataclass(slots=True)
class _Cursor:
    expected: int  # the consumer's position after what this cursor returned
    offset: int  # the next offset to read (past what is buffered)
    range_: SegmentRange | None = None
    position: int = 0  # byte position of the next chunk in range_'s segment
    buffered: deque[RawRecord] = field(default_factory=deque)


@dataclass(slots=True)
class RemoteFetch:
    """What one fetch got: records, the position after them, and whether it is covered."""

    records: list[ConsumerRecord[Any, Any]]
    position: int
    covered: bool = True
    bytes_read: int = 0


@dataclass(slots=True)
class _Ranges:
    ranges: list[SegmentRange]
    listed_at: float


class RemoteFetcher:
    def __init__(
        self,
        discovery: SegmentDiscovery,
        executor: Executor,
        chunks: ChunkCache,
        *,
        refresh_interval_s: float = 2.0,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        key_deserializer: Deserializer = None,
        value_deserializer: Deserializer = None,
        read_committed: bool = False,
    ) -> None:
        self.discovery = discovery
        self.store = discovery.store
        self.executor = executor
        self.chunks = chunks
        self.refresh_interval_s = refresh_interval_s
        self.chunk_bytes = chunk_bytes
        self.key_deserializer = key_deserializer
        self.value_deserializer = value_deserializer
        self.read_committed = read_committed
        self._views: dict[TopicPartition, CommittedView] = {}
        self._segment_txns: dict[TopicPartition, SegmentCache] = {}
        self._ranges: dict[TopicPartition, _Ranges] = {}
        self._cursors: dict[TopicPartition, _Cursor] = {}
        self._gone: set[str] = set()  # segment ids found deleted

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def ranges(self, tp: TopicPartition, refresh: bool = False) -> list[SegmentRange]:
        """The partition's remote ranges, listed again if older than the refresh interval."""
        cached = self._ranges.get(tp)
        now = time.monotonic()
        if refresh or cached is None or now - cached.listed_at >= self.refresh_interval_s:
            ranges = await self._run(self.discovery.ranges, tp.topic, tp.partition)
            ranges = [r for r in ranges if r.segment.segment_id not in self._gone]
            if self.read_committed:
                seen = self._segment_txns.get(tp, {})
                view = await self._run(committed_view, self.store, ranges, seen)
                listed = {r.segment.segment_id for r in ranges}
                self._segment_txns[tp] = {k: v for k, v in seen.items() if k in listed}
                self._views[tp] = view
                ranges = view.trim(ranges)
            cached = self._ranges[tp] = _Ranges(ranges, now)
        return cached.ranges

    async def bounds(self, tp: TopicPartition) -> tuple[int, int] | None:
        """(first offset, last offset + 1) of the remote tier, None if it is empty."""
        ranges = await self.ranges(tp)
        return (ranges[0].first_offset, ranges[-1].last_offset + 1) if ranges else None

    async def covers(self, tp: TopicPartition, offset: int) -> bool:
        """Whether a remote range holds `offset`."""
        return any(r.first_offset <= offset <= r.last_offset for r in await self.ranges(tp))

    def forget(self, tp: TopicPartition) -> None:
        """Drop the partition's cursor (revoked, or repositioned by the caller)."""
        self._cursors.pop(tp, None)

    async def fetch(
        self,
        tp: TopicPartition,
        offset: int,
        max_records: int | None,
        skip_missing: bool,
        until: int | None = None,
    ) -> RemoteFetch:
        """Records of `tp` from `offset` (below `until`): buffered ones, or one more chunk's."""
        cursor = self._cursors.get(tp)
        if cursor is None or cursor.expected != offset:
            cursor = self._cursors[tp] = _Cursor(offset, offset)
        bytes_read = 0
        while not cursor.buffered:
            if cursor.range_ is None and not await self._locate(tp, cursor, skip_missing):
                cursor.expected = cursor.offset
                return RemoteFetch([], cursor.offset, covered=False, bytes_read=bytes_read)
            range_ = cursor.range_
            assert range_ is not None
            try:
                read, position, next_offset = await self._read(tp, range_, cursor)
            except ObjectNotFoundError:
                self._segment_gone(tp, range_)
                cursor.range_ = None
                continue
            ended = position == cursor.position  # no whole batch left in the object
            bytes_read += position - cursor.position
            cursor.position, cursor.offset = position, next_offset
            cursor.buffered.extend(read)
            if ended and next_offset <= range_.last_offset:
                log.warning(
                    "%s: segment %s ends at byte %d before offset %d; skipping to %d",
                    tp,
                    range_.segment.segment_id,
                    position,
                    next_offset,
                    range_.last_offset + 1,
                )
                cursor.offset = range_.last_offset + 1
            if cursor.offset > range_.last_offset:
                cursor.range_ = None
        taken = self._take(tp, cursor, max_records, until)
        if taken:
            cursor.expected = taken[-1].offset + 1 if cursor.buffered else cursor.offset
        elif until is not None and cursor.buffered[0][0] >= until:
            cursor.expected = until  # nothing below `until` left here: the caller goes on there
        return RemoteFetch(taken, cursor.expected, bytes_read=bytes_read)

    def _take(
        self, tp: TopicPartition, cursor: _Cursor, max_records: int | None, until: int | None
    ) -> list[ConsumerRecord[Any, Any]]:
        count = len(cursor.buffered) if max_records is None else max_records
        end = until if until is not None else cursor.offset + 1
        out: list[ConsumerRecord[Any, Any]] = []
        while cursor.buffered and len(out) < count and cursor.buffered[0][0] < end:
            out.append(self._consumer_record(tp, cursor.buffered.popleft()))
        return out

    def _consumer_record(self, tp: TopicPartition, raw: RawRecord) -> ConsumerRecord[Any, Any]:
        offset, timestamp, timestamp_type, key, value, headers = raw
        return ConsumerRecord(
            tp.topic,
            tp.partition,
            offset,
            timestamp,
            timestamp_type,
            self.key_deserializer(key) if self.key_deserializer else key,
            self.value_deserializer(value) if self.value_deserializer else value,
            None,
            len(key) if key is not None else -1,
            len(value) if value is not None else -1,
            headers,  # header values may be None, as aiokafka's are
        )

    async def _locate(self, tp: TopicPartition, cursor: _Cursor, skip_missing: bool) -> bool:
        """Point the cursor at the range holding its offset; False if there is none."""
        ranges = await self.ranges(tp)
        following = [r for r in ranges if r.last_offset >= cursor.offset]
        if not following:
            return False
        range_ = following[0]
        if range_.first_offset > cursor.offset:
            if not skip_missing:
                return False
            log.warning(
                "%s: offsets %d..%d are not in the remote tier (deleted by retention?); "
                "skipping forward to %d",
                tp,
                cursor.offset,
                range_.first_offset - 1,
                range_.first_offset,
            )
            cursor.offset = range_.first_offset
        try:
            position = await self._run(start_position, self.store, range_, cursor.offset)
        except ObjectNotFoundError:
            self._segment_gone(tp, range_)
            return await self._locate(tp, cursor, skip_missing)
        cursor.range_, cursor.position = range_, position
        return True

    def _segment_gone(self, tp: TopicPartition, range_: SegmentRange) -> None:
        segment = range_.segment
        log.warning(
            "%s: remote segment %s (offsets %d..%d) disappeared while reading "
            "(deleted by retention?)",
            tp,
            segment.segment_id,
            segment.start_offset,
            segment.end_offset,
        )
        self._gone.add(segment.segment_id)
        self.discovery.forget(segment)
        self._ranges.pop(tp, None)

    async def _read(
        self, tp: TopicPartition, range_: SegmentRange, cursor: _Cursor
    ) -> tuple[list[RawRecord], int, int]:
        """The next records of the cursor's range: decoded, with the byte position and the
        offset after them."""
        segment, position = range_.segment, cursor.position
        obj = self._object(segment)
        self.chunks.prefetch(self._following(tp, range_, position))
        data = await self.chunks.read(obj, position, position + self.chunk_bytes)
        size = first_batch_size(data)
        if size > len(data):  # one batch larger than a chunk
            data = await self.chunks.read(obj, position, position + size)
        decoded: tuple[list[RawRecord], int, int] = await self._run(
            self._decode, range_, data, position, cursor.offset, self._views.get(tp)
        )
        return decoded

    def _object(self, segment: RemoteSegment) -> RemoteObject:
        async def read(start: int, end: int) -> bytes:
            data: bytes = await self._run(read_log, self.store, segment, start, end)
            return data

        return RemoteObject(id=segment.segment_id, size_bytes=segment.size, read=read)

    def _following(
        self, tp: TopicPartition, range_: SegmentRange, position: int
    ) -> Iterator[tuple[RemoteObject, int]]:
        """What the cursor reads next: the rest of its segment, then the following ranges
        that start at their segment's start."""
        yield self._object(range_.segment), position
        ranges = self._ranges.get(tp)
        for later in ranges.ranges if ranges is not None else ():
            if later.first_offset <= range_.last_offset:
                continue
            if later.first_offset != later.segment.start_offset:
                return
            yield self._object(later.segment), 0

    def _decode(
        self,
        range_: SegmentRange,
        data: memoryview,
        position: int,
        offset: int,
        view: CommittedView | None,
    ) -> tuple[list[RawRecord], int, int]:
        """Decode whole batches (in the executor): records in range (none of an aborted
        transaction, with a `view`), next byte position and offset."""
        batches = checked_batches(data)
        position += whole_batches_end(data)
        records: list[RawRecord] = []
        next_offset = offset
        for batch in batches:
            if batch.base_offset > range_.last_offset:
                next_offset = max(next_offset, range_.last_offset + 1)
                break
            if batch.last_offset < next_offset:
                continue
            aborted = (
                view is not None
                and batch.is_transactional
                and view.is_aborted(batch.producer_id, batch.base_offset)
            )
            if not batch.is_control and not aborted:
                parsed = parse_batch(batch)
                kind = parsed.timestamp_type
                for r in parsed:
                    if next_offset <= r.offset <= range_.last_offset:
                        headers = tuple(r.headers)
                        records.append((r.offset, r.timestamp, kind, r.key, r.value, headers))
            next_offset = max(next_offset, min(batch.next_offset, range_.last_offset + 1))
        return records, position, next_offset
