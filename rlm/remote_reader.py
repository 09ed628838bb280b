"""`RemoteLogReader`: serves fetches and timestamp lookups from the remote tier.

Every read follows the reading log's lineage (its leader-epoch entries): a read finds
the segment holding the offset in the offset's epoch there (RLMM, as Kafka's
`RemoteLogManager.read`), turns the offset into a byte position with the segment's
offset index (`RemoteIndexCache`), and range-reads only from there: whole batches, at
least one, never more than the fetch's byte limit, and none past the last offset where
the segment and the lineage agree (a segment of a diverged lineage serves only its
common part). Reads run in a bounded pool (`remote.log.reader.threads`, at most
`remote.log.reader.max.pending.tasks` waiting) as tasks owned by the reader: a
fetch that stops waiting (`remote.fetch.max.wait.ms`) does not cancel its read,
whose result waits in a bounded result cache (oldest dropped first) so the
client's retry is served at once. Each read's outcome updates the store's health.

Consumers read a partition sequentially, so a fetch that was served starts the
read its successor will ask for (same partition, the next offset, the same size)
while two reader threads are idle, one left for reads a fetch waits on: the
object store's latency overlaps the response and the client's next request. One
read ahead per fetch, never a chain of them; none with a single reader thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator

from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.protocol.records import BATCH_HEADER_SIZE, BatchView, decode_batch, iter_batches
from tierbroker.rlm.config import RemoteLogManagerConfig
from tierbroker.rlm.index_cache import RemoteIndexCache
from tierbroker.rlm.metrics import RemoteStorageMetrics
from tierbroker.rlm.quota import ByteRateLimiter
from tierbroker.storage.remote.lineage import Lineage, agreed_end, epoch_for_offset
from tierbroker.storage.remote.metadata_manager import RemoteLogMetadataManager
from tierbroker.storage.remote.segment_metadata import RemoteLogSegmentMetadata, TopicIdPartition
from tierbroker.storage.remote.storage_manager import RemoteStorageManager

log = logging.getLogger(__name__)

SLACK_BYTES = 64 * 1024  # read past the index position: batches before the offset, one header
RESULT_CACHE_BYTES = 64 * 1024 * 1024

# partition, fetch offset, max bytes, the reading log's lineage
ReadKey = tuple[TopicIdPartition, int, int, tuple[tuple[int, int], ...]]


class RemoteLogReader:
    def __init__(
        self,
        config: RemoteLogManagerConfig,
        rlmm: RemoteLogMetadataManager,
        rsm: RemoteStorageManager,
        index_cache: RemoteIndexCache,
        metrics: RemoteStorageMetrics,
    ) -> None:
        self.config = config
        self.rlmm = rlmm
        self.rsm = rsm
        self.index_cache = index_cache
        self.metrics = metrics
        self.limiter = ByteRateLimiter(config.fetch_max_bytes_per_second)
        self._slots = asyncio.Semaphore(config.reader_threads)
        self._inflight: dict[ReadKey, asyncio.Task[memoryview]] = {}
        self._results: OrderedDict[ReadKey, memoryview] = OrderedDict()
        self._results_bytes = 0

    @property
    def pending(self) -> int:
        return len(self._inflight)

    async def read(
        self,
        tip: TopicIdPartition,
        offset: int,
        max_bytes: int,
        timeout_s: float,
        lineage: Lineage,
    ) -> memoryview:
        """Batches from `offset` of the log whose leader-epoch entries are `lineage`, a view
        into the range read (not a copy); raises TimeoutError if not read within
        `timeout_s`."""
        key = (tip, offset, max_bytes, tuple(lineage))
        done = self._take(key)
        if done is not None:
            self._read_ahead(key, done)
            return done
        task = self._inflight.get(key)
        if task is None:
            if len(self._inflight) >= self.config.reader_max_pending_tasks:
                raise KafkaError(ErrorCode.request_timed_out, "remote read queue is full")
            task = self._start(key)
        async with asyncio.timeout(timeout_s):
            result = await asyncio.shield(task)
        self._take(key)
        self._read_ahead(key, result)
        return result

    def _read_ahead(self, served_key: ReadKey, served: memoryview) -> None:
        """Start the read following `served` if it is in the remote tier and threads are idle.

        A fetch that asks for a read ahead still in flight shares its outcome, an error
        included; one that failed before is forgotten (its error counted), and the
        fetch that asks next reads again.
        """
        # One thread stays free for reads that a fetch is waiting on.
        if not served or len(self._inflight) >= self.config.reader_threads - 1:
            return
        tip, _, max_bytes, lineage = served_key
        try:
            last = -1
            for batch in iter_batches(served):
                last = batch.last_offset
            key = (tip, last + 1, max_bytes, lineage)
            if key in self._inflight or key in self._results:
                return
            epoch = epoch_for_offset(lineage, last + 1)
            if self.rlmm.remote_log_segment_metadata(tip, epoch, last + 1) is not None:
                self._start(key)
        except Exception:  # a guess never fails the fetch it follows, which was served
            log.warning("%s: no read ahead after offset %d", tip, last, exc_info=True)

    def _start(self, key: ReadKey) -> asyncio.Task[memoryview]:
        task = asyncio.get_running_loop().create_task(self._read(*key))
        self._inflight[key] = task
        task.add_done_callback(lambda t: self._read_done(key, t))
        return task

    def _read_done(self, key: ReadKey, task: asyncio.Task[memoryview]) -> None:
        self._inflight.pop(key, None)
        if task.cancelled() or task.exception() is not None:
            return
        data = task.result()
        self._results[key] = data  # taken by `read`, or kept for the retry of a timed-out fetch
        self._results_bytes += _held_bytes(data)
        while self._results_bytes > RESULT_CACHE_BYTES and self._results:
            _, old = self._results.popitem(last=False)
            self._results_bytes -= _held_bytes(old)

    def _take(self, key: ReadKey) -> memoryview | None:
        data = self._results.pop(key, None)
        if data is not None:
            self._results_bytes -= _held_bytes(data)
        return data

    async def _read(
        self, tip: TopicIdPartition, offset: int, max_bytes: int, lineage: Lineage
    ) -> memoryview:
        async with self._slots:
            try:
                # A timeout scope, not wait_for: no extra task, so a read ahead reaches the
                # remote tier before the loop turns to writing the response it follows.
                async with asyncio.timeout(self.config.remote_call_timeout_ms / 1000):
                    data = await self._read_batches(tip, offset, max_bytes, lineage)
            except Exception as e:
                self.metrics.fetch_errors.labels(tip.topic_partition.topic).inc()
                self.metrics.health.failed(e)
                raise
            self.metrics.health.succeeded()
            self.metrics.fetch_requests.labels(tip.topic_partition.topic).inc()
            self.metrics.fetch_bytes.labels(tip.topic_partition.topic).inc(len(data))
            return data

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
        # A read from the segment's first offset needs no index: it starts at position 0.
        position = (
            0
            if offset == metadata.start_offset
            else await self.index_cache.lookup_offset(metadata, offset)
        )
        chunk = await self._fetch(metadata, position, max_bytes + SLACK_BYTES)
        start = 0
        # Skip batches before the offset; read on if the chunk ends first.
        while True:
            if len(chunk) - start < BATCH_HEADER_SIZE:
                position += start
                chunk = await self._fetch(metadata, position, max_bytes + SLACK_BYTES)
                start = 0
                if len(chunk) < BATCH_HEADER_SIZE:
                    raise KafkaError(
                        ErrorCode.offset_out_of_range, f"{tip}: offset {offset} past segment end"
                    )
            batch = BatchView(chunk, start)
            if batch.last_offset >= offset:
                break
            start += batch.size_in_bytes
        end = start
        while end + BATCH_HEADER_SIZE <= len(chunk):
            batch = BatchView(chunk, end)
            size = batch.size_in_bytes
            if end + size > len(chunk) or (
                end > start and (end + size - start > max_bytes or batch.last_offset > last_agreed)
            ):
                break
            end += size
        if end == start:  # the first batch is larger than the chunk: at least one batch
            first = BatchView(chunk, start).size_in_bytes
            return memoryview(await self._fetch(metadata, position + start, first))
        # A view, not a slice: a slice would copy the range on the event loop.
        return memoryview(chunk)[start:end]

    async def _fetch(self, metadata: RemoteLogSegmentMetadata, position: int, length: int) -> bytes:
        end = min(position + length, metadata.segment_size_bytes) - 1
        if end < position:
            return b""
        await self.limiter.acquire(end - position + 1)
        return await self.rsm.fetch_log_segment(metadata, position, end)

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
    ) -> AsyncIterator[bytes]:
        """Whole batches from `position` to the segment's end, read a chunk at a time."""
        while position < metadata.segment_size_bytes:
            chunk = await self._fetch(metadata, position, SLACK_BYTES * 16)
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
        tasks = list(self._inflight.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.index_cache.close()


def _held_bytes(result: memoryview) -> int:
    """What a cached result keeps alive: the whole range read, not only its view."""
    return memoryview(result.obj).nbytes
