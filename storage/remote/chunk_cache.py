"""`ChunkCache`: remote objects read in fixed-size chunks, each chunk fetched once.

An object (a segment's log) is cut into chunks of `chunk.size` bytes: chunk i holds
bytes [i * size, (i + 1) * size). A read asks for the chunks covering its range. One
task fetches a chunk however many readers wait for it (single flight), bounded by the
fetch timeout, and the chunk is then kept in a bounded store (`MemoryChunkStore` or
`DiskChunkStore`, least recently used evicted first) for the readers that follow. A
reader that stops waiting leaves the fetch running, so its retry finds the chunk. A
failed fetch is forgotten: the next read fetches again.

`prefetch` loads the chunks that follow a read, across objects (the caller names them
in read order), up to `fetch.chunk.cache.prefetch.max.size` ahead. It starts a fetch only
on a free slot of the `fetch_slots`, so it never queues ahead of a reader waiting for
one, and only while the chunks prefetched and not yet read fill less than half the
cache, so a slow reader's window cannot push out what others are about to read. The
latest window goes on filling as fetches end (a failed fetch ends it), so the slots stay
busy while its reader waits. A sequential reader so finds its next chunks loaded or in
flight, and the store's latency is paid once per window, not once per chunk.

Objects never change (a segment id is never reused), so a chunk is never stale. Safe to
share between tasks of one event loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

MIB = 1 << 20
DEFAULT_CHUNK_BYTES = 4 * MIB
DEFAULT_CACHE_BYTES = 256 * MIB
DEFAULT_PREFETCH_BYTES = 64 * MIB
ChunkKey = tuple[Hashable, int]  # (object id, chunk index)


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkCacheConfig:
    """The chunk layer's settings (`rsm.config.` properties, Aiven's plugin's names)."""

    chunk_bytes: int = DEFAULT_CHUNK_BYTES  # chunk.size
    cache_class: str = "memory"  # fetch.chunk.cache.class: memory or disk
    cache_bytes: int = DEFAULT_CACHE_BYTES  # fetch.chunk.cache.size
    cache_path: Path | None = None  # fetch.chunk.cache.path (disk)
    prefetch_bytes: int = DEFAULT_PREFETCH_BYTES  # fetch.chunk.cache.prefetch.max.size

    @classmethod
    def from_configs(
        cls, configs: Mapping[str, str], default_path: Path | None = None
    ) -> ChunkCacheConfig:
        """The settings in `configs` (prefix removed); raises ValueError naming a bad one."""
        cache_class = configs.get("fetch.chunk.cache.class", "memory")
        if cache_class not in ("memory", "disk"):
            raise ValueError(f"fetch.chunk.cache.class must be memory or disk, not {cache_class!r}")
        path = configs.get("fetch.chunk.cache.path") or default_path
        if cache_class == "disk" and path is None:
            raise ValueError("fetch.chunk.cache.path is required by fetch.chunk.cache.class=disk")
        return cls(
            chunk_bytes=config_int(configs, "chunk.size", DEFAULT_CHUNK_BYTES, 4096),
            cache_class=cache_class,
            cache_bytes=config_int(configs, "fetch.chunk.cache.size", DEFAULT_CACHE_BYTES, 0),
            cache_path=None if path is None else Path(path),
            prefetch_bytes=config_int(
                configs, "fetch.chunk.cache.prefetch.max.size", DEFAULT_PREFETCH_BYTES, 0
            ),
        )


def config_int(configs: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    text = configs.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{name} must be a whole number, not {text!r}") from None
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, not {value}")
    return value


@dataclass(frozen=True, slots=True, eq=False)
class RemoteObject:
    """An object of the remote tier: its id (never reused), size, and a ranged read of
    bytes [start, end)."""

    id: Hashable
    size_bytes: int
    read: Callable[[int, int], Awaitable[bytes]]


class ChunkStore(Protocol):
    """Where chunks are kept; the cache decides what and for how long."""

    async def start(self) -> None: ...

    def put(self, key: ChunkKey, data: bytes) -> None: ...

    async def get(self, key: ChunkKey) -> bytes | None: ...

    def remove(self, key: ChunkKey) -> None: ...

    async def close(self) -> None: ...


class MemoryChunkStore:
    """Chunks in memory."""

    def __init__(self) -> None:
        self._chunks: dict[ChunkKey, bytes] = {}

    async def start(self) -> None:
        pass

    def put(self, key: ChunkKey, data: bytes) -> None:
        self._chunks[key] = data

    async def get(self, key: ChunkKey) -> bytes | None:
        return self._chunks.get(key)

    def remove(self, key: ChunkKey) -> None:
        self._chunks.pop(key, None)

    async def close(self) -> None:
        self._chunks.clear()


class DiskChunkStore:
    """Chunks as files `<dir>/<object id>-<index>`, written and read in the default
    executor. A chunk is served from memory until its file is written. The directory is
    emptied at start: its chunks may be of segments deleted since."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self._live: set[ChunkKey] = set()
        self._writing: dict[ChunkKey, bytes] = {}
        self._writes: set[asyncio.Task[None]] = set()

    def _path(self, key: ChunkKey) -> Path:
        return self.dir / f"{key[0]}-{key[1]}"

    async def start(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self._empty)

    def _empty(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True, exist_ok=True)

    def put(self, key: ChunkKey, data: bytes) -> None:
        self._live.add(key)
        self._writing[key] = data
        task = asyncio.get_running_loop().create_task(self._write(key, data))
        self._writes.add(task)
        task.add_done_callback(self._written)

    async def _write(self, key: ChunkKey, data: bytes) -> None:
        path = self._path(key)
        try:
            await asyncio.get_running_loop().run_in_executor(None, _write_file, path, data)
        finally:
            if self._writing.get(key) is data:
                del self._writing[key]
        if key not in self._live:  # removed while it was written
            path.unlink(missing_ok=True)

    def _written(self, task: asyncio.Task[None]) -> None:
        self._writes.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            # A chunk that could not be written is fetched again by the next read.
            log.warning("chunk cache: cannot write in %s: %s", self.dir, error)

    async def get(self, key: ChunkKey) -> bytes | None:
        if key not in self._live:
            return None
        data = self._writing.get(key)
        if data is not None:
            return data
        path = self._path(key)
        try:
            return await asyncio.get_running_loop().run_in_executor(None, path.read_bytes)
        except FileNotFoundError:
            return None

    def remove(self, key: ChunkKey) -> None:
        self._live.discard(key)
        if self._writing.pop(key, None) is None:
            self._path(key).unlink(missing_ok=True)

    async def close(self) -> None:
        writes = list(self._writes)
        for task in writes:
            task.cancel()
        await asyncio.gather(*writes, return_exceptions=True)


def _write_file(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)  # a reader sees the whole chunk or none


def chunk_store(config: ChunkCacheConfig) -> ChunkStore:
    if config.cache_class == "disk":
        assert config.cache_path is not None
        return DiskChunkStore(config.cache_path)
    return MemoryChunkStore()


class ChunkCache:
    def __init__(
        self,
        config: ChunkCacheConfig,
        store: ChunkStore,
        fetch_slots: int,
        fetch_timeout_s: float,
    ) -> None:
        self.config = config
        self.chunk_bytes = config.chunk_bytes
        self.store = store
        self.fetch_slots = fetch_slots
        self.fetch_timeout_s = fetch_timeout_s
        self._slots = asyncio.Semaphore(fetch_slots)
        self._sizes: OrderedDict[ChunkKey, int] = OrderedDict()  # kept chunks, LRU first
        self._loading: dict[ChunkKey, asyncio.Task[bytes]] = {}
        self._unread: set[ChunkKey] = set()  # prefetched, loaded or loading, not yet read
        self._window: list[tuple[RemoteObject, int]] = []  # the latest prefetch's chunks
        self.held_bytes = 0
        self.fetches = 0
        self.fetched_bytes = 0
        self.misses = 0  # chunks a read waited for

    @property
    def loading(self) -> int:
        """Chunk fetches in flight."""
        return len(self._loading)

    async def start(self) -> None:
        await self.store.start()

    async def read(self, obj: RemoteObject, start: int, end: int) -> memoryview:
        """Bytes [start, end) of `obj` (fewer past its end): a view of one chunk, or the
        join of the chunks the range crosses."""
        end = min(end, obj.size_bytes)
        if start >= end:
            return memoryview(b"")
        size = self.chunk_bytes
        first, last = start // size, (end - 1) // size
        if first == last:
            chunk = await self._chunk(obj, first)
            return memoryview(chunk)[start - first * size : end - first * size]
        chunks = await asyncio.gather(*(self._chunk(obj, i) for i in range(first, last + 1)))
        head = memoryview(chunks[0])[start - first * size :]
        tail = memoryview(chunks[-1])[: end - last * size]
        return memoryview(b"".join((head, *chunks[1:-1], tail)))

    def prefetch(self, following: Iterable[tuple[RemoteObject, int]]) -> None:
        """Load the chunks from each (object, position) of `following`, in order, up to the
        prefetch size: now on the free fetch slots, and as fetches end, until a newer
        window replaces this one."""
        wanted = -(-self.config.prefetch_bytes // self.chunk_bytes)
        window: list[tuple[RemoteObject, int]] = []
        for obj, position in following:
            if len(window) >= wanted:
                break
            first = position // self.chunk_bytes
            last = min(self._count(obj), first + wanted - len(window))
            window += [(obj, index) for index in range(first, last)]
        self._window = window
        self._fill()

    def _fill(self) -> None:
        """Start the latest window's chunks not yet loaded, on free slots, while unread
        prefetched chunks fill less than half the cache."""
        room = self.config.cache_bytes // 2 // self.chunk_bytes
        for obj, index in self._window:
            if len(self._loading) >= self.fetch_slots or len(self._unread) >= room:
                return
            key = (obj.id, index)
            if key not in self._sizes and key not in self._loading:
                self._unread.add(key)
                self._start(obj, index)

    def _count(self, obj: RemoteObject) -> int:
        return -(-obj.size_bytes // self.chunk_bytes)

    async def _chunk(self, obj: RemoteObject, index: int) -> bytes:
        key = (obj.id, index)
        self._unread.discard(key)
        if key in self._sizes:
            self._sizes.move_to_end(key)
            data = await self.store.get(key)
            if data is not None:
                return data
            self._forget(key)  # lost by the store (a file removed underneath)
        self.misses += 1
        loading = self._loading.get(key) or self._start(obj, index)
        # Shielded: a reader that stops waiting does not cancel the fetch others share.
        return await asyncio.shield(loading)

    def _start(self, obj: RemoteObject, index: int) -> asyncio.Task[bytes]:
        key = (obj.id, index)
        task = asyncio.get_running_loop().create_task(self._fetch(obj, index))
        self._loading[key] = task
        task.add_done_callback(lambda t: self._fetched(key, t))
        return task

    async def _fetch(self, obj: RemoteObject, index: int) -> bytes:
        start = index * self.chunk_bytes
        end = min(start + self.chunk_bytes, obj.size_bytes)
        async with self._slots, asyncio.timeout(self.fetch_timeout_s):
            data = await obj.read(start, end)
        self.fetches += 1
        self.fetched_bytes += len(data)
        return data

    def _fetched(self, key: ChunkKey, task: asyncio.Task[bytes]) -> None:
        del self._loading[key]
        if task.cancelled() or task.exception() is not None:  # retrieved: may have no reader
            self._unread.discard(key)
            if not task.cancelled():
                log.debug("chunk %d of %s not fetched: %s", key[1], key[0], task.exception())
                self._window = []  # not again until a read asks
            return
        data = task.result()
        if len(data) > self.config.cache_bytes:  # served to its readers, not kept
            self._unread.discard(key)
            return
        self.store.put(key, data)
        self._sizes[key] = len(data)
        self.held_bytes += len(data)
        while self.held_bytes > self.config.cache_bytes:
            self._forget(next(iter(self._sizes)))
        self._fill()  # the slot is free: the window goes on while its reader waits

    def _forget(self, key: ChunkKey) -> None:
        self._unread.discard(key)
        self.held_bytes -= self._sizes.pop(key)
        self.store.remove(key)

    async def close(self) -> None:
        """Cancel fetches in flight and release the store."""
        loading = list(self._loading.values())
        for task in loading:
            task.cancel()
        await asyncio.gather(*loading, return_exceptions=True)
        await self.store.close()
