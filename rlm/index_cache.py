"""`RemoteIndexCache`: offset and time indexes of remote segments, on local disk, LRU-bounded.

Files live in `<log.dir>/remote-log-index-cache/<segment id>.<index type>`. The
total size stays under `remote.log.index.file.cache.total.size.bytes` by evicting
the least recently used segment's files. Concurrent lookups of one index share a
single download; a failed download is not cached, so the next lookup tries
again. On start the directory is emptied: entries are cheap to fetch again.
Safe to share between tasks on the event loop.
"""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path

from storage.indexes import IndexEntries, OffsetEntries, TimeEntries
from storage.remote.segment_metadata import RemoteLogSegmentMetadata
from storage.remote.storage_manager import IndexType

CACHE_DIR = "remote-log-index-cache"

Fetcher = Callable[[RemoteLogSegmentMetadata, IndexType], Awaitable[bytes]]


class _Entry:
    __slots__ = ("index", "size")

    def __init__(self, index: IndexEntries, size: int) -> None:
        self.index, self.size = index, size


class RemoteIndexCache:
    def __init__(self, log_dir: Path, max_bytes: int, fetch: Fetcher) -> None:
        self.dir = log_dir / CACHE_DIR
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self._fetch = fetch
        self._entries: OrderedDict[tuple[uuid.UUID, IndexType], _Entry] = OrderedDict()
        self._loading: dict[tuple[uuid.UUID, IndexType], asyncio.Task[_Entry]] = {}
        self.size_bytes = 0
        self.downloads = 0

    async def lookup_offset(self, metadata: RemoteLogSegmentMetadata, offset: int) -> int:
        """The position of the last index entry with offset <= `offset` (0 if none)."""
        index = (await self._get(metadata, IndexType.OFFSET)).index
        i = index.floor(offset)
        return index.value(i) if i >= 0 else 0

    async def lookup_timestamp(self, metadata: RemoteLogSegmentMetadata, timestamp_ms: int) -> int:
        """The offset of the last time index entry at or before `timestamp_ms`, or the start."""
        index = (await self._get(metadata, IndexType.TIMESTAMP)).index
        i = index.floor(timestamp_ms)
        return index.value(i) if i >= 0 else metadata.start_offset

    async def _get(self, metadata: RemoteLogSegmentMetadata, index_type: IndexType) -> _Entry:
        key = (metadata.segment_id.id, index_type)
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            return entry
        # One download per index, in a task of its own: a requester that gives up
        # (remote.fetch.max.wait.ms) does not cancel it, so the next one finds it cached.
        loading = self._loading.get(key)
        if loading is None:
            loading = asyncio.get_running_loop().create_task(self._download(metadata, index_type))
            self._loading[key] = loading
            loading.add_done_callback(lambda task: self._download_done(key, task))
        return await asyncio.shield(loading)

    def _download_done(self, key: tuple[uuid.UUID, IndexType], task: asyncio.Task[_Entry]) -> None:
        self._loading.pop(key, None)
        if not task.cancelled():
            task.exception()  # seen here, so an unawaited failure is not reported as lost

    async def _download(self, metadata: RemoteLogSegmentMetadata, index_type: IndexType) -> _Entry:
        data = await self._fetch(metadata, index_type)
        self.downloads += 1
        path = self.dir / f"{metadata.segment_id.id}.{index_type.value}"
        await asyncio.get_running_loop().run_in_executor(None, path.write_bytes, data)
        reader = OffsetEntries if index_type == IndexType.OFFSET else TimeEntries
        entry = _Entry(reader(data, metadata.start_offset), len(data))
        key = (metadata.segment_id.id, index_type)
        self._entries[key] = entry
        self.size_bytes += entry.size
        self._evict()
        return entry

    def _evict(self) -> None:
        while self.size_bytes > self.max_bytes and len(self._entries) > 1:
            (segment_id, index_type), entry = self._entries.popitem(last=False)
            self.size_bytes -= entry.size
            (self.dir / f"{segment_id}.{index_type.value}").unlink(missing_ok=True)

    async def close(self) -> None:
        """Cancel downloads in flight."""
        tasks = list(self._loading.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def remove(self, segment_id: uuid.UUID) -> None:
        """Forget a deleted segment's indexes."""
        for index_type in (IndexType.OFFSET, IndexType.TIMESTAMP):
            entry = self._entries.pop((segment_id, index_type), None)
            if entry is not None:
                self.size_bytes -= entry.size
                (self.dir / f"{segment_id}.{index_type.value}").unlink(missing_ok=True)
