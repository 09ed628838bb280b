"""The chunk layer of remote reads: one fetch per chunk, a bounded cache, prefetch."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from tierbroker.storage.remote.chunk_cache import (
    ChunkCache,
    ChunkCacheConfig,
    ChunkStore,
    DiskChunkStore,
    MemoryChunkStore,
    RemoteObject,
)

CHUNK = 4096


class Store:
    """Objects of known bytes whose ranged reads are recorded, slowed and can fail."""

    def __init__(self, delay_s: float = 0.01) -> None:
        self.delay_s = delay_s
        self.reads: list[tuple[str, int, int]] = []
        self.failing: set[tuple[str, int]] = set()  # (object, start) refused once
        self.running = 0
        self.most_running = 0

    def object(self, name: str, size: int) -> RemoteObject:
        data = bytes(i * 7 % 251 for i in range(size))

        async def read(start: int, end: int) -> bytes:
            self.reads.append((name, start, end))
            self.running += 1
            self.most_running = max(self.most_running, self.running)
            try:
                await asyncio.sleep(self.delay_s)
            finally:
                self.running -= 1
            if (name, start) in self.failing:
                self.failing.discard((name, start))
                raise OSError(f"injected: {name} at {start}")
            return data[start:end]

        return RemoteObject(id=name, size_bytes=size, read=read)


def cache(
    store: ChunkStore | None = None,
    *,
    cache_bytes: int = 1 << 20,
    prefetch_bytes: int = 0,
    slots: int = 4,
) -> ChunkCache:
    config = ChunkCacheConfig(
        chunk_bytes=CHUNK, cache_bytes=cache_bytes, prefetch_bytes=prefetch_bytes
    )
    return ChunkCache(config, store or MemoryChunkStore(), fetch_slots=slots, fetch_timeout_s=5)


async def idle(chunks: ChunkCache) -> None:
    """Until the fetches in flight have ended."""
    await asyncio.gather(*chunks._loading.values(), return_exceptions=True)


async def idle_until(chunks: ChunkCache, done: Callable[[], bool]) -> None:
    """Until `done`, waiting on the fetches in flight each time."""
    while not done() and chunks.loading:
        await idle(chunks)


def expected(size: int, start: int, end: int) -> bytes:
    return bytes(i * 7 % 251 for i in range(size))[start : min(end, size)]


async def test_concurrent_readers_share_one_fetch_per_chunk() -> None:
    store, chunks = Store(), cache()
    obj = store.object("a", 5 * CHUNK + 100)
    ranges = [(0, 3 * CHUNK), (100, 2 * CHUNK + 5), (CHUNK, 6 * CHUNK), (4 * CHUNK + 1, 9 * CHUNK)]
    got = await asyncio.gather(*(chunks.read(obj, s, e) for s, e in ranges * 5))
    assert [bytes(g) for g in got] == [expected(obj.size_bytes, s, e) for s, e in ranges * 5]
    assert sorted(store.reads) == [
        ("a", i * CHUNK, min((i + 1) * CHUNK, obj.size_bytes)) for i in range(6)
    ]
    assert (chunks.fetches, chunks.fetched_bytes) == (6, obj.size_bytes)


async def test_a_read_within_one_chunk_is_a_view_of_it() -> None:
    store, chunks = Store(), cache()
    obj = store.object("a", 3 * CHUNK)
    whole = await chunks.read(obj, CHUNK, 2 * CHUNK)
    part = await chunks.read(obj, CHUNK + 10, CHUNK + 20)
    assert part.obj is whole.obj and bytes(part) == expected(obj.size_bytes, CHUNK + 10, CHUNK + 20)
    assert len(await chunks.read(obj, 3 * CHUNK, 4 * CHUNK)) == 0  # past the end: nothing


async def test_the_least_recently_used_chunks_go_first_within_the_bound() -> None:
    store, chunks = Store(0), cache(cache_bytes=2 * CHUNK)
    obj = store.object("a", 4 * CHUNK)
    for i in (0, 1, 0, 2):  # chunk 1 is then the least recently used
        await chunks.read(obj, i * CHUNK, i * CHUNK + 1)
    assert chunks.held_bytes == 2 * CHUNK
    reads = len(store.reads)
    await chunks.read(obj, 0, 1)
    await chunks.read(obj, 2 * CHUNK, 2 * CHUNK + 1)
    assert len(store.reads) == reads  # kept
    await chunks.read(obj, CHUNK, CHUNK + 1)
    assert store.reads[-1] == ("a", CHUNK, 2 * CHUNK)  # evicted, so fetched again


async def test_a_failed_fetch_fails_its_readers_and_the_next_read_fetches_again() -> None:
    store, chunks = Store(), cache()
    obj = store.object("a", 2 * CHUNK)
    store.failing.add(("a", 0))
    results = await asyncio.gather(
        *(chunks.read(obj, 0, 10) for _ in range(3)), return_exceptions=True
    )
    assert all(isinstance(r, OSError) for r in results) and len(store.reads) == 1
    assert bytes(await chunks.read(obj, 0, 10)) == expected(obj.size_bytes, 0, 10)
    assert len(store.reads) == 2


async def test_a_reader_that_stops_waiting_leaves_the_fetch_for_the_next() -> None:
    store, chunks = Store(0.2), cache()
    obj = store.object("a", CHUNK)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await chunks.read(obj, 0, 10)
    assert chunks.loading == 1
    assert bytes(await chunks.read(obj, 0, 10)) == expected(obj.size_bytes, 0, 10)
    assert len(store.reads) == 1


async def test_prefetch_crosses_objects_up_to_its_size_on_free_slots() -> None:
    store, chunks = Store(0.05), cache(prefetch_bytes=5 * CHUNK, slots=4)
    a, b = store.object("a", 2 * CHUNK + 1), store.object("b", 4 * CHUNK)
    chunks.prefetch([(a, CHUNK), (b, 0)])
    assert chunks.loading == 4  # as many as there are slots
    await idle(chunks)
    chunks.prefetch([(a, CHUNK), (b, 0)])  # the same window: the rest of it
    await idle(chunks)
    # a's chunks 1 and 2 and b's 0 to 2: five chunks, however far b goes on.
    assert sorted((name, start) for name, start, _ in store.reads) == [
        ("a", CHUNK),
        ("a", 2 * CHUNK),
        ("b", 0),
        ("b", CHUNK),
        ("b", 2 * CHUNK),
    ]
    assert store.most_running == 4
    misses = chunks.misses
    await chunks.read(b, 0, 3 * CHUNK)
    assert chunks.misses == misses  # found loaded


async def test_prefetch_never_queues_ahead_of_a_reader() -> None:
    store, chunks = Store(0.05), cache(prefetch_bytes=8 * CHUNK, slots=2)
    obj = store.object("a", 16 * CHUNK)
    chunks.prefetch([(obj, 0)])  # both slots
    reading = asyncio.create_task(chunks.read(obj, 10 * CHUNK, 10 * CHUNK + 1))
    await asyncio.sleep(0)
    chunks.prefetch([(obj, 0)])  # no slot free, and the reader waits for the next
    assert chunks.loading == 3
    assert bytes(await reading) == expected(obj.size_bytes, 10 * CHUNK, 10 * CHUNK + 1)
    assert store.most_running == 2
    # The reader's chunk went on the first slot to free up; the window went on after it.
    assert [start for _, start, _ in store.reads][:3] == [0, CHUNK, 10 * CHUNK]


async def test_the_latest_window_goes_on_filling_as_fetches_end() -> None:
    store, chunks = Store(0.02), cache(prefetch_bytes=6 * CHUNK, slots=2)
    obj = store.object("a", 16 * CHUNK)
    chunks.prefetch([(obj, 0)])
    assert chunks.loading == 2
    await idle_until(chunks, lambda: len(store.reads) == 6)
    await idle(chunks)
    # The whole window, two at a time, with no read asking again; nothing past it.
    assert [start for _, start, _ in store.reads] == [i * CHUNK for i in range(6)]
    assert store.most_running == 2


async def test_unread_prefetches_take_at_most_half_the_cache() -> None:
    store, chunks = Store(0), cache(cache_bytes=4 * CHUNK, prefetch_bytes=8 * CHUNK, slots=8)
    obj = store.object("a", 8 * CHUNK)
    chunks.prefetch([(obj, 0)])
    assert chunks.loading == 2
    await idle(chunks)
    chunks.prefetch([(obj, 0)])
    assert chunks.loading == 0  # both still unread
    await chunks.read(obj, 0, 1)
    chunks.prefetch([(obj, CHUNK)])
    assert chunks.loading == 1  # one read: room for one more


async def test_a_disk_store_serves_chunks_from_its_files_and_starts_empty(tmp_path: Path) -> None:
    directory = tmp_path / "chunks"
    directory.mkdir()
    (directory / "left-0").write_bytes(b"from a previous run")
    disk = DiskChunkStore(directory)
    store, chunks = Store(0), cache(disk, cache_bytes=2 * CHUNK)
    await chunks.start()
    assert list(directory.iterdir()) == []
    obj = store.object("a", 3 * CHUNK)
    assert bytes(await chunks.read(obj, 0, 2 * CHUNK)) == expected(obj.size_bytes, 0, 2 * CHUNK)
    await asyncio.gather(*disk._writes)
    assert sorted(p.name for p in directory.iterdir()) == ["a-0", "a-1"]
    (directory / "a-1").write_bytes(b"x" * CHUNK)  # served from the file, not memory
    assert bytes(await chunks.read(obj, CHUNK, CHUNK + 1)) == b"x"
    await chunks.read(obj, 2 * CHUNK, 3 * CHUNK)  # evicts chunk 0
    await asyncio.gather(*disk._writes)
    assert sorted(p.name for p in directory.iterdir()) == ["a-1", "a-2"]
    (directory / "a-2").unlink()  # lost underneath: fetched again
    assert bytes(await chunks.read(obj, 2 * CHUNK, 2 * CHUNK + 5)) == expected(
        obj.size_bytes, 2 * CHUNK, 2 * CHUNK + 5
    )
    assert len(store.reads) == 4
    await chunks.close()


@pytest.mark.parametrize(
    ("configs", "message"),
    [
        ({"chunk.size": "1000"}, "chunk.size must be at least 4096"),
        ({"fetch.chunk.cache.size": "big"}, "fetch.chunk.cache.size must be a whole number"),
        ({"fetch.chunk.cache.class": "redis"}, "fetch.chunk.cache.class must be memory or disk"),
    ],
)
def test_settings_are_checked(configs: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ChunkCacheConfig.from_configs(configs, Path("cache"))


def test_settings_default_to_memory_with_a_prefetch_window() -> None:
    config = ChunkCacheConfig.from_configs({"fetch.chunk.cache.class": "disk"}, Path("d"))
    assert (config.cache_class, config.cache_path, config.chunk_bytes) == (
        "disk",
        Path("d"),
        4 << 20,
    )
    assert ChunkCacheConfig.from_configs({}, Path("d")).prefetch_bytes == 64 << 20
