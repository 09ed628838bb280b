"""`RemoteLogReader`: serves fetches and timestamp lookups from the remote tier.

Every read follows the reading log's lineage (its leader-epoch entries): a read finds
the segment holding the offset in the offset's epoch there (RLMM, as Kafka's
`RemoteLogManager.read`), turns the offset into a byte position with the segment's
offset index (`RemoteIndexCache`), and reads only from there: whole batches, at least
one, never more than the fetch's byte limit, and none past the last offset where the
segment and the lineage agree (a segment of a diverged lineage serves only its common
part). At most `remote.log.reader.max.pending.tasks` reads are in progress at once; a
read whose fetch stopped waiting (`remote.fetch.max.wait.ms`) goes on, so that what it
loads serves the client's retry.

Consumers read sequentially, so a read remembers where the batch after it starts (a
bounded LRU): the next fetch of that segment goes straight there, without its offset
index, and a consumer reading history from a segment's start downloads no index at all.

Bytes come from the `ChunkCache`: each chunk of a segment is fetched once however many
consumers read it, by at most `remote.log.reader.threads` fetches at a time. Each read
first prefetches the chunks from its position on, into the lineage's next segments, so
a consumer reading history sequentially is fed by parallel ranged reads. Each chunk
fetch updates the store's health.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator

from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.protocol.records import BATCH_HEADER_SIZE, BatchView, decode_batch
from tierbroker.rlm.config import RemoteLogManagerConfig
from tierbroker.rlm.index_cache import RemoteIndexCache
from tierbroker.rlm.metrics import RemoteStorageMetrics
from tierbroker.rlm.quota import ByteRateLimiter
from tierbroker.storage.remote.chunk_cache import ChunkCache, RemoteObject
from tierbroker.storage.remote.lineage import Lineage, agreed_end, epoch_for_offset
from tierbroker.storage.remote.metadata_manager import RemoteLogMetadataManager
from tierbroker.storage.remote.segment_metadata import RemoteLogSegmentMetadata, TopicIdPartition
from tierbroker.storage.remote.storage_manager import RemoteStorageManager

log = logging.getLogger(__name__)

BATCHES_PER_LOOKUP = 1 << 20  # the bytes a timestamp lookup reads at a time
NEXT_POSITIONS = 4096  # sequential readers whose next position is remembered


class RemoteLogReader:
    def __init__(
        self,
        config: RemoteLogManagerConfig,
        rlmm: RemoteLogMetadataManager,
        rsm: RemoteStorageManager,
        index_cache: RemoteIndexCache,
        chunks: ChunkCache,
        metrics: RemoteStorageMetrics,
    ) -> None:
        self.config = config
        self.rlmm = rlmm
        self.rsm = rsm
        self.index_cache = index_cache
        self.chunks = chunks
        self.metrics = metrics
        self.limiter = ByteRateLimiter(config.fetch_max_bytes_per_second)
        self._reads: set[asyncio.Task[memoryview]] = set()
        # (segment id, offset) -> the byte position of the batch holding it, where a read ended
        self._next_positions: OrderedDict[tuple[uuid.UUID, int], int] = OrderedDict()

    async def read(
        self,
        tip: TopicIdPartition,
        offset: int,
        max_bytes: int,
        timeout_s: float,
        lineage: Lineage,
    ) -> memoryview:
        """Batches from `offset` of the log whose leader-epoch entries are `lineage`, a view
        into the chunks read (not a copy, unless the batches cross chunks); raises
        TimeoutError if not read within `timeout_s`: the read goes on, so that what it
        loads (the index, the chunks) is cached for the client's retry."""
        if self.pending >= self.config.reader_max_pending_tasks:
            raise KafkaError(ErrorCode.request_timed_out, "remote read queue is full")
        topic = tip.topic_partition.topic
        task = asyncio.get_running_loop().create_task(
            self._read_batches(tip, offset, max_bytes, lineage)
        )
        self._reads.add(task)
        task.add_done_callback(self._read_done)
        try:
            async with asyncio.timeout(timeout_s):
                data = await asyncio.shield(task)
        except TimeoutError:
            raise  # the fetch stopped waiting, the read goes on: not an error
        except Exception:
            self.metrics.fetch_errors.labels(topic).inc()
            raise
        self.metrics.fetch_requests.labels(topic).inc()
        self.metrics.fetch_bytes.labels(topic).inc(len(data))
        return data

    @property
    def pending(self) -> int:
        """Reads in progress, their fetch waiting or not."""
        return len(self._reads)

    def _read_done(self, task: asyncio.Task[memoryview]) -> None:
        self._reads.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # Seen by its fetch, or by none if the fetch stopped waiting: the retry reads again.
            log.debug("remote read failed: %s", task.exception())

    def _object(self, metadata: RemoteLogSegmentMetadata) -> RemoteObject:
        async def read(start: int, end: int) -> bytes:
            await self.limiter.acquire(end - start)
            try:
                data = await self.rsm.fetch_log_segment(metadata, start, end - 1)
            except Exception as e:
                self.metrics.health.failed(e)
                raise
            self.metrics.health.succeeded()
            return data

        return RemoteObject(
            id=metadata.segment_id.id, size_bytes=metadata.segment_size_bytes, read=read
        )

    def _following(
        self,
        tip: TopicIdPartition,
        metadata: RemoteLogSegmentMetadata,
        position: int,
        lineage: Lineage,
    ) -> Iterator[tuple[RemoteObject, int]]:
        """The bytes a sequential reader asks for next: the rest of the segment, then the
        lineage's following segments, each from its start."""
        yield self._object(metadata), position
        while True:
            offset = metadata.end_offset + 1
            following = self.rlmm.remote_log_segment_metadata(
                tip, epoch_for_offset(lineage, offset), offset
            )
            if following is None or following.start_offset != offset:
                return
            metadata = following
            yield self._object(metadata), 0

    async def _read_batches(
        self, tip: TopicIdPartition, offset: int, max_bytes: int, lineage: Lineage
    ) -> memoryview:
        epoch = epoch_for_offset(lineage, offset)
        metadata = self.rlmm.remote_log_segment_metadata(tip, epoch, offset)
        if metadata is None:
            raise KafkaError(
                ErrorCode.offset_out_of_range,
                f"{tip}: offset {offset} of leader epoch {epoch} is not in the remote tier",
            )
        last_agreed = agreed_end(metadata.segment_leader_epochs, metadata.end_offset, lineage)
        # A read from the segment's first offset, or where the last read of it ended,
        # needs no index.
        segment_id = metadata.segment_id.id
        position = self._next_positions.get((segment_id, offset))
        if position is None:
            position = (
                0
                if offset == metadata.start_offset
                else await self.index_cache.lookup_offset(metadata, offset)
            )
        # The chunks from here on start loading now, in parallel with those read first.
        self.chunks.prefetch(self._following(tip, metadata, position, lineage))
        reading = _Reading(self.chunks, self._object(metadata), position)
        start = 0
        while True:  # skip the batches before the offset
            data = await reading.cover(start + BATCH_HEADER_SIZE)
            if len(data) < start + BATCH_HEADER_SIZE:
                raise KafkaError(
                    ErrorCode.offset_out_of_range, f"{tip}: offset {offset} past segment end"
                )
            batch = BatchView(data, start)
            if batch.last_offset >= offset:
                break
            start += batch.size_in_bytes
        # Everything a full fetch takes, at once: batches are then walked in memory.
        data = await reading.cover(start + max_bytes + BATCH_HEADER_SIZE)
        end, next_offset = start, offset
        while len(data) >= end + BATCH_HEADER_SIZE:  # whole batches, at least one
            batch = BatchView(data, end)
            size = batch.size_in_bytes
            if end > start and (end + size - start > max_bytes or batch.last_offset > last_agreed):
                break
            if end == start:  # the first, larger than max_bytes, comes whole
                data = await reading.cover(end + size)
            if len(data) < end + size:
                break  # the segment ends inside the batch
            end += size
            next_offset = batch.last_offset + 1
        if next_offset <= min(metadata.end_offset, last_agreed):
            self._next_positions[(segment_id, next_offset)] = position + end
            if len(self._next_positions) > NEXT_POSITIONS:
                self._next_positions.popitem(last=False)
        return data[start:end]  # a view: no copy on the event loop

    async def _fetch(
        self, metadata: RemoteLogSegmentMetadata, position: int, length: int
    ) -> memoryview:
        return await self.chunks.read(self._object(metadata), position, position + length)

    async def find_offset_by_timestamp(
        self, tip: TopicIdPartition, timestamp_ms: int, starting_offset: int, lineage: Lineage
    ) -> tuple[int, int] | None:
        """(offset, timestamp) of the first remote record at or after `starting_offset` with
        timestamp >= `timestamp_ms`, searching the segments of `lineage` in offset order, as
        Kafka does (a segment of a diverged lineage only up to where it agrees)."""
        for metadata in self.rlmm.readable_segments(tip):
            if metadata.max_timestamp_ms < timestamp_ms or metadata.end_offset < starting_offset:
                continue
            last_agreed = agreed_end(metadata.segment_leader_epochs, metadata.end_offset, lineage)
            if last_agreed < max(metadata.start_offset, starting_offset):
                continue
            from_offset = max(
                await self.index_cache.lookup_timestamp(metadata, timestamp_ms), starting_offset
            )
            position = await self.index_cache.lookup_offset(metadata, from_offset)
            async for batch_bytes in self._batches(metadata, position):
                batch = BatchView(batch_bytes)
                if batch.base_offset > last_agreed:
                    break
                if batch.max_timestamp < timestamp_ms or batch.last_offset < starting_offset:
                    continue
                for record in decode_batch(batch).records:
                    if record.timestamp >= timestamp_ms and record.offset >= starting_offset:
                        return record.offset, record.timestamp
        return None

    async def _batches(
        self, metadata: RemoteLogSegmentMetadata, position: int
    ) -> AsyncIterator[memoryview]:
        """Whole batches from `position` to the segment's end, read a chunk at a time."""
        while position < metadata.segment_size_bytes:
            chunk = await self._fetch(metadata, position, BATCHES_PER_LOOKUP)
            at = 0
            while at + BATCH_HEADER_SIZE <= len(chunk):
                size = BatchView(chunk, at).size_in_bytes
                if at + size > len(chunk):
                    break
                yield chunk[at : at + size]
                at += size
            if at == 0:  # one batch larger than the chunk
                size = BatchView(chunk).size_in_bytes
                yield await self._fetch(metadata, position, size)
                at = size
            position += at

    async def close(self) -> None:
        reads = list(self._reads)
        for task in reads:
            task.cancel()
        await asyncio.gather(*reads, return_exceptions=True)
        await self.chunks.close()
        await self.index_cache.close()


class _Reading:
    """The bytes of one object from `position`, read to whole chunks as a read needs more."""

    def __init__(self, chunks: ChunkCache, obj: RemoteObject, position: int) -> None:
        self.chunks = chunks
        self.obj = obj
        self.position = position
        self.data = memoryview(b"")

    async def cover(self, length: int) -> memoryview:
        """At least `length` bytes from the position (fewer where the object ends)."""
        if len(self.data) < length:
            size = self.chunks.chunk_bytes
            end = -(-(self.position + length) // size) * size
            self.data = await self.chunks.read(self.obj, self.position, end)
        return self.data
