"""`ChunkReader`: the broker's chunk layer for synchronous readers (Spark's Python workers).

A reader asks for plain bytes of a segment's log and names what it will read next; the
`ChunkCache` (`storage.remote.chunk_cache`) behind it fetches each chunk once, by ranged
GETs in a thread pool, and prefetches the window after the read, so a task reading its
slices in order is fed by parallel GETs rather than one at a time. The cache runs on an
event loop of its own, in a daemon thread started with the reader; `close` stops both.
Safe to share between threads: every call hands its work to that loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from tierbroker.pipeline.discovery import RemoteSegment
from tierbroker.pipeline.segments import read_log
from tierbroker.pipeline.storage import ObjectStore
from tierbroker.storage.remote.chunk_cache import (
    ChunkCache,
    ChunkCacheConfig,
    RemoteObject,
    chunk_store,
)

FETCH_TIMEOUT_S = 60.0  # one ranged GET of a chunk, retries included


class ChunkReader:
    def __init__(self, store: ObjectStore, config: ChunkCacheConfig, threads: int) -> None:
        self.store = store
        self._pool = ThreadPoolExecutor(threads, "chunk-reader")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.cache = ChunkCache(
            config, chunk_store(config), fetch_slots=threads, fetch_timeout_s=FETCH_TIMEOUT_S
        )
        asyncio.run_coroutine_threadsafe(self.cache.start(), self._loop).result()

    def read(
        self,
        segment: RemoteSegment,
        start: int,
        end: int,
        following: Sequence[tuple[RemoteSegment, int]] = (),
    ) -> memoryview:
        """Plain bytes [start, end) of `segment`'s log (fewer at its end), prefetching from
        there on, then `following` (segment, position) in order."""

        async def read() -> memoryview:
            plan = [(segment, start), *following]
            self.cache.prefetch((self._object(s), position) for s, position in plan)
            return await self.cache.read(self._object(segment), start, end)

        return asyncio.run_coroutine_threadsafe(read(), self._loop).result()

    def _object(self, segment: RemoteSegment) -> RemoteObject:
        async def read(start: int, end: int) -> bytes:
            loop = asyncio.get_running_loop()
            data: bytes = await loop.run_in_executor(
                self._pool, read_log, self.store, segment, start, end
            )
            return data

        return RemoteObject(id=segment.segment_id, size_bytes=segment.size, read=read)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.cache.close(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
