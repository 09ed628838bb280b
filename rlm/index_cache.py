"""`RemoteIndexCache`: offset and time indexes of remote segments, LRU-bounded, kept on disk.

In memory an index is its file's bytes, searched in place by the local log's
index readers (`OffsetEntries`, `TimeEntries`, with base offset 0: lookups add the
segment's start offset); `size_bytes` counts what the cache really holds (the
bytes and a fixed per-entry overhead), and stays under
`remote.log.index.file.cache.total.size.bytes` by evicting the least recently
used index. Each index also has a file `<log.dir>/remote-log-index-cache/<segment
id>.<index type>` (Kafka's file layout: big-endian entries), written atomically
(temp file, rename) and removed with its entry. As Kafka's cache does, `load()`
at start reads the files a previous run left, so a restart does not download
them again; a file that is not whole entries in order is deleted (the next lookup
downloads the index). A segment's indexes never change (its id is unique), so a
file is never stale. Concurrent lookups of one index share a single download; a
failed download is not cached, so the next lookup tries again. Safe to share
between tasks on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path

from tierbroker.storage.indexes import IndexEntries, OffsetEntries, TimeEntries
from tierbroker.storage.remote.segment_metadata import RemoteLogSegmentMetadata
from tierbroker.storage.remote.storage_manager import IndexType

log = logging.getLogger(__name__)

CACHE_DIR = "remote-log-index-cache"
_READERS: dict[IndexType, type[IndexEntries]] = {
    IndexType.OFFSET: OffsetEntries,
    IndexType.TIMESTAMP: TimeEntries,
}
# The entry object, its key (tuple, UUID) and its slot in the OrderedDict, measured.
ENTRY_OVERHEAD_BYTES = 400

Fetcher = Callable[[RemoteLogSegmentMetadata, IndexType], Awaitable[bytes]]
_Key = tuple[uuid.UUID, IndexType]


class _Entry:
    """One index: its entries relative to the segment's start offset, and what it holds."""

    __slots__ = ("index", "size_bytes")

    def __init__(self, index: IndexEntries) -> None:
        self.index = index
        self.size_bytes = sys.getsizeof(index.data) + ENTRY_OVERHEAD_BYTES


def parse_index(index_type: IndexType, data: bytes) -> _Entry:
    """Kafka's index file bytes as an entry; a torn last entry is ignored."""
    reader = _READERS[index_type]
    return _Entry(reader(data[: len(data) - len(data) % reader.entry.size], 0))


class RemoteIndexCache:
    def __init__(self, log_dir: Path, max_bytes: int, fetch: Fetcher) -> None:
        self.dir = log_dir / CACHE_DIR
        self.max_bytes = max_bytes
        self._fetch = fetch
        self._entries: OrderedDict[_Key, _Entry] = OrderedDict()
        self._loading: dict[_Key, asyncio.Task[_Entry]] = {}
        self.size_bytes = 0
        self.downloads = 0

    def _path(self, key: _Key) -> Path:
        return self.dir / f"{key[0]}.{key[1].value}"

    async def load(self) -> None:
        """Take in the files a previous run left (oldest first, so the newest are kept)."""
        found = await asyncio.get_running_loop().run_in_executor(None, self._read_dir)
        for key, entry in found:
            self._put(key, entry)

    def _read_dir(self) -> list[tuple[_Key, _Entry]]:
        self.dir.mkdir(parents=True, exist_ok=True)
        files = []
        for path in self.dir.iterdir():
            segment_id, _, suffix = path.name.partition(".")
            try:
                key = (uuid.UUID(segment_id), IndexType(suffix))
            except ValueError:
                key = None
            if key is None or key[1] not in _READERS:
                path.unlink()  # a temp file of a write cut short, or not ours
                continue
            files.append((path.stat().st_mtime_ns, key, path))
        found = []
        for _, key, path in sorted(files, key=lambda f: f[0]):
            data = path.read_bytes()
            entry = parse_index(key[1], data)
            index = entry.index
            if len(data) % index.entry.size or len(index.increasing()) != len(index):
                log.warning("deleting %s: not an index of whole entries in order", path)
                path.unlink()
                continue
            found.append((key, entry))
        return found

    async def lookup_offset(self, metadata: RemoteLogSegmentMetadata, offset: int) -> int:
        """The position of the last index entry with offset <= `offset` (0 if none)."""
        index = (await self._get(metadata, IndexType.OFFSET)).index
        i = index.floor(offset - metadata.start_offset)
        return index.value(i) if i >= 0 else 0

    async def lookup_timestamp(self, metadata: RemoteLogSegmentMetadata, timestamp_ms: int) -> int:
        """The offset of the last time index entry at or before `timestamp_ms`, or the start."""
        index = (await self._get(metadata, IndexType.TIMESTAMP)).index
        i = index.floor(timestamp_ms)
        return metadata.start_offset + (index.value(i) if i >= 0 else 0)

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

    def _download_done(self, key: _Key, task: asyncio.Task[_Entry]) -> None:
        self._loading.pop(key, None)
        if not task.cancelled():
            task.exception()  # seen here, so an unawaited failure is not reported as lost

    async def _download(self, metadata: RemoteLogSegmentMetadata, index_type: IndexType) -> _Entry:
        data = await self._fetch(metadata, index_type)
        self.downloads += 1
        key = (metadata.segment_id.id, index_type)
        await asyncio.get_running_loop().run_in_executor(None, self._write, key, data)
        entry = parse_index(index_type, data)
        self._put(key, entry)
        return entry

    def _write(self, key: _Key, data: bytes) -> None:
        path = self._path(key)
        tmp = path.with_name(path.name + ".tmp")
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data)
        os.replace(tmp, path)  # a crash leaves the whole file or none (the temp is removed)

    def _put(self, key: _Key, entry: _Entry) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self.size_bytes -= old.size_bytes
        self._entries[key] = entry
        self.size_bytes += entry.size_bytes
        self._evict()

    def _evict(self) -> None:
        while self.size_bytes > self.max_bytes and len(self._entries) > 1:
            key, entry = self._entries.popitem(last=False)
            self.size_bytes -= entry.size_bytes
            self._path(key).unlink(missing_ok=True)

    async def close(self) -> None:
        """Cancel downloads in flight; the files stay for the next start."""
        tasks = list(self._loading.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def remove(self, segment_id: uuid.UUID) -> None:
        """Forget a deleted segment's indexes."""
        for index_type in (IndexType.OFFSET, IndexType.TIMESTAMP):
            key = (segment_id, index_type)
            entry = self._entries.pop(key, None)
            if entry is not None:
                self.size_bytes -= entry.size_bytes
            self._path(key).unlink(missing_ok=True)
