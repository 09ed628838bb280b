"""`ManifestCache`: how each remote segment is stored, for a storage plugin's reads.

A plugin reads a segment's objects knowing their `StoredFormat`s (`segment_codec`): a
segment whose custom metadata says it is stored as written needs nothing more; a
segment the plugin copies is put here at once; another's manifest is read once (one
request shared by concurrent reads; a failed one is forgotten) and kept for the last
`segment.manifest.cache.size` segments read (Aiven's name; 1,000), with its transform,
whose data key is so unwrapped once. Safe to share between tasks of one event loop.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass

from tierbroker.storage.remote.chunk_cache import config_int
from tierbroker.storage.remote.key_layout import LOG_SUFFIX
from tierbroker.storage.remote.segment_codec import (
    AS_WRITTEN_TAG,
    PLAIN,
    KeyRing,
    SegmentDecodeError,
    SegmentTransform,
    StoredFormat,
    decode_range,
)
from tierbroker.storage.remote.segment_metadata import RemoteLogSegmentMetadata

DEFAULT_SIZE = 1000


def manifest_cache_size(configs: Mapping[str, str]) -> int:
    """`segment.manifest.cache.size`: how many segments' formats a plugin keeps."""
    return config_int(configs, "segment.manifest.cache.size", DEFAULT_SIZE, 1)


@dataclass(frozen=True, slots=True)
class StoredSegment:
    """How a segment's log is stored, and the transform that reads its log and indexes
    (None: both stored as written)."""

    log: StoredFormat
    transform: SegmentTransform | None

    async def read_chunked(
        self,
        size: int,
        start: int,
        end: int | None,
        get: Callable[[int, int], Awaitable[bytes]],
        decode_in: Executor | None,
    ) -> bytes:
        """Plain bytes [start, end] (end inclusive, None: to the log's `size`) of a log
        stored transformed: `get` fetches stored bytes [a, b), decoded in `decode_in`."""
        assert self.transform is not None
        stop = size if end is None else min(end + 1, size)
        if start >= stop:
            return b""
        stored_start, stored_end = self.log.stored_range(start, stop)
        data = await get(stored_start, stored_end)
        return await asyncio.get_running_loop().run_in_executor(
            decode_in, decode_range, self.transform, self.log, start, stop, data
        )


AS_WRITTEN = StoredSegment(PLAIN, None)


class ManifestCache:
    def __init__(
        self,
        keys: KeyRing,
        read_manifest: Callable[[RemoteLogSegmentMetadata], Awaitable[bytes]],
        size: int = DEFAULT_SIZE,
    ) -> None:
        self.keys = keys
        self._read_manifest = read_manifest
        self.size = size
        self._segments: OrderedDict[uuid.UUID, StoredSegment] = OrderedDict()
        self._reading: dict[uuid.UUID, asyncio.Task[StoredSegment]] = {}

    def put(self, segment_id: uuid.UUID, stored: StoredSegment) -> None:
        self._segments[segment_id] = stored
        self._segments.move_to_end(segment_id)
        while len(self._segments) > self.size:
            self._segments.popitem(last=False)

    def remove(self, segment_id: uuid.UUID) -> None:
        self._segments.pop(segment_id, None)

    async def get(self, metadata: RemoteLogSegmentMetadata) -> StoredSegment:
        if metadata.custom_metadata == AS_WRITTEN_TAG:
            return AS_WRITTEN
        segment_id = metadata.segment_id.id
        stored = self._segments.get(segment_id)
        if stored is not None:
            self._segments.move_to_end(segment_id)
            return stored
        reading = self._reading.get(segment_id)
        if reading is None:
            reading = asyncio.get_running_loop().create_task(self._read(metadata))
            self._reading[segment_id] = reading
            reading.add_done_callback(lambda task: self._read_done(segment_id, task))
        # Shielded: a reader that gives up does not cancel the read others share.
        return await asyncio.shield(reading)

    def _read_done(self, segment_id: uuid.UUID, task: asyncio.Task[StoredSegment]) -> None:
        self._reading.pop(segment_id, None)
        if not task.cancelled():
            task.exception()  # seen here: its readers may all have stopped waiting

    async def _read(self, metadata: RemoteLogSegmentMetadata) -> StoredSegment:
        segment_id = metadata.segment_id.id
        try:
            objects = json.loads(await self._read_manifest(metadata))["objects"]
        except (ValueError, KeyError, TypeError) as e:
            raise SegmentDecodeError(f"segment {segment_id}: its manifest is damaged: {e}") from e
        log_format = StoredFormat.from_json(objects[LOG_SUFFIX])
        # One transform serves both objects: the indexes are stored as the log is.
        transform = (
            None
            if log_format.plain
            else SegmentTransform.for_read(segment_id, log_format, self.keys)
        )
        stored = StoredSegment(log_format, transform)
        self.put(segment_id, stored)
        return stored
