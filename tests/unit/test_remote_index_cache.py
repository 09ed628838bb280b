"""RemoteIndexCache: what it holds in memory stays within its byte bound, and the index files
it keeps on disk serve the next start without downloading them again."""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
import os
import tracemalloc
from pathlib import Path

from tests.unit.test_rlm_components import metadata
from tierbroker.rlm import index_cache
from tierbroker.rlm.index_cache import CACHE_DIR, RemoteIndexCache
from tierbroker.storage.remote.segment_metadata import RemoteLogSegmentMetadata
from tierbroker.storage.remote.storage_manager import IndexType


def offset_index(entries: int) -> bytes:
    """Kafka's offset index: relative offset i, position 100_000 * i (big-endian int32s)."""
    return b"".join(i.to_bytes(4, "big") + (100_000 * i).to_bytes(4, "big") for i in range(entries))


def time_index(entries: int) -> bytes:
    """Kafka's time index: timestamp 1_000_000 + 10 * i (int64), relative offset i (int32)."""
    return b"".join(
        (1_000_000 + 10 * i).to_bytes(8, "big") + i.to_bytes(4, "big") for i in range(entries)
    )


# Deep enough that each allocation the cache keeps has one of its frames or the test's in it.
FRAMES = 4


def allocated_through(snapshot: tracemalloc.Snapshot, *files: str) -> int:
    """Bytes still held that were allocated with one of `files` on the stack: what other
    threads of the process allocate meanwhile (a worker shared with other tests) is not counted."""
    kept = snapshot.filter_traces([tracemalloc.Filter(True, f, all_frames=True) for f in files])
    return sum(stat.size for stat in kept.statistics("filename"))


async def fetch_synthetic(m: RemoteLogSegmentMetadata, index_type: IndexType) -> bytes:
    return offset_index(1000) if index_type == IndexType.OFFSET else time_index(1000)


async def lookups_held(directory: Path, max_bytes: int) -> tuple[int, int, int, int]:
    """800 index downloads through one cache: (downloads, its size_bytes, the bytes still
    held that the cache or this module allocated, the bytes of its files)."""
    segments = [metadata(i * 10_000) for i in range(400)]  # 400 x (8 KB + 12 KB) of indexes
    warm_up = RemoteIndexCache(directory / "warm-up", max_bytes, fetch_synthetic)
    await warm_up.lookup_timestamp(metadata(), 0)  # lazy imports and the like: not the cache's
    await warm_up.close()
    del warm_up
    gc.collect()
    tracemalloc.start(FRAMES)
    try:
        cache = RemoteIndexCache(directory, max_bytes, fetch_synthetic)
        for m in segments:
            assert await cache.lookup_offset(m, m.start_offset + 7) == 700_000
            assert await cache.lookup_timestamp(m, 1_000_075) == m.start_offset + 7
        gc.collect()
        held = allocated_through(tracemalloc.take_snapshot(), __file__, index_cache.__file__)
    finally:
        tracemalloc.stop()
    on_disk = sum(p.stat().st_size for p in (directory / CACHE_DIR).iterdir())
    await cache.close()
    return cache.downloads, cache.size_bytes, held, on_disk


def measure_in_this_process(directory: Path, max_bytes: int) -> tuple[int, int, int, int]:
    return asyncio.run(lookups_held(directory, max_bytes))


def test_the_memory_held_stays_within_the_configured_bytes(tmp_path: Path) -> None:
    # Measured in a fresh interpreter: in a worker shared with other tests, what those left
    # behind (hooks, frozen or disabled collection) changes what stays allocated.
    max_bytes = 1 << 20
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        downloads, size_bytes, held, on_disk = pool.apply(
            measure_in_this_process, (tmp_path, max_bytes)
        )
    assert downloads == 800  # every index was loaded, far more than the bound
    assert size_bytes <= max_bytes
    assert held <= max_bytes, f"holds {held} bytes for a bound of {max_bytes}"
    assert on_disk <= size_bytes  # the files are bounded alike


async def test_a_restart_reads_the_files_instead_of_downloading(tmp_path: Path) -> None:
    segments = [metadata(i * 10_000) for i in range(3)]
    first = RemoteIndexCache(tmp_path, 1 << 20, fetch_synthetic)
    for m in segments:
        await first.lookup_offset(m, m.start_offset)
        await first.lookup_timestamp(m, 0)
    await first.close()
    (tmp_path / CACHE_DIR / "leftover.index.tmp").write_bytes(b"torn")  # a write cut short
    torn = tmp_path / CACHE_DIR / f"{segments[2].segment_id.id}.index"
    torn.write_bytes(offset_index(10)[:-3])  # a torn copy: downloaded again

    second = RemoteIndexCache(tmp_path, 1 << 20, fetch_synthetic)
    await second.load()
    for m in segments:
        assert await second.lookup_offset(m, m.start_offset + 999) == 99_900_000
        assert await second.lookup_timestamp(m, 1_000_010) == m.start_offset + 1
    assert second.downloads == 1
    assert sorted(p.name for p in (tmp_path / CACHE_DIR).iterdir()) == sorted(
        f"{m.segment_id.id}.{t}" for m in segments for t in ("index", "timeindex")
    )
    await second.close()


async def test_load_keeps_the_newest_files_within_the_bound(tmp_path: Path) -> None:
    segments = [metadata(i * 10_000) for i in range(6)]
    first = RemoteIndexCache(tmp_path, 1 << 20, fetch_synthetic)
    for m in segments:
        await first.lookup_offset(m, m.start_offset)
    one = first.size_bytes // len(segments)
    await first.close()
    for age, m in enumerate(reversed(segments)):  # file times in the order of the downloads
        path = tmp_path / CACHE_DIR / f"{m.segment_id.id}.index"
        os.utime(path, (path.stat().st_atime, path.stat().st_mtime - age))

    second = RemoteIndexCache(tmp_path, 2 * one + one // 2, fetch_synthetic)
    await second.load()
    assert second.size_bytes == 2 * one
    for m in segments[-2:]:  # the most recent survive the load
        await second.lookup_offset(m, m.start_offset)
    assert second.downloads == 0
    assert len(list((tmp_path / CACHE_DIR).iterdir())) == 2
    await second.close()
