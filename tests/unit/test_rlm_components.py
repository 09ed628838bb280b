"""RLM parts in isolation: the index cache, the task pool, abandoned-copy clean-up."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from rlm.config import RemoteLogManagerConfig
from rlm.expiration_task import ExpirationTask, SegmentDeleter
from rlm.index_cache import RemoteIndexCache
from rlm.metrics import RemoteStorageMetrics
from rlm.task_pool import TaskPool
from rlm.tiered_partition import TieredPartition
from storage.log import Log
from storage.log_config import LogConfig
from storage.remote.segment_metadata import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    TopicIdPartition,
)
from storage.remote.storage_manager import IndexType, RemoteStorageError
from storage.remote.topic_based_rlmm import TopicBasedRemoteLogMetadataManager
from storage.topic_partition import TopicPartition
from tests.unit.test_remote_metadata import MemoryTopic

TIP = TopicIdPartition(uuid.uuid4(), TopicPartition("t", 0))


def metadata(
    start: int = 0,
    state: RemoteLogSegmentState = RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
    event_ms: int = 0,
) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(
        segment_id=RemoteLogSegmentId.generate(TIP),
        start_offset=start,
        end_offset=start + 9,
        max_timestamp_ms=0,
        broker_id=0,
        event_timestamp_ms=event_ms,
        segment_size_bytes=100,
        segment_leader_epochs=((0, start),),
        state=state,
    )


def test_index_cache_downloads_once_and_never_caches_a_failure(tmp_path: Path) -> None:
    calls: list[IndexType] = []
    fail = [True]

    async def fetch(_: RemoteLogSegmentMetadata, index_type: IndexType) -> bytes:
        calls.append(index_type)
        await asyncio.sleep(0.05)
        if fail[0]:
            raise RemoteStorageError("down")
        return (
            (0).to_bytes(4, "big")
            + (0).to_bytes(4, "big")
            + (5).to_bytes(4, "big")
            + (700).to_bytes(4, "big")
        )

    async def run() -> None:
        cache = RemoteIndexCache(tmp_path, 1 << 20, fetch)
        segment = metadata()
        with pytest.raises(RemoteStorageError):
            await cache.lookup_offset(segment, 7)
        fail[0] = False
        positions = await asyncio.gather(*(cache.lookup_offset(segment, 7) for _ in range(10)))
        assert positions == [700] * 10
        assert calls == [
            IndexType.OFFSET,
            IndexType.OFFSET,
        ]  # the failure, then one shared download
        await cache.close()

    asyncio.run(run())


def test_index_cache_evicts_least_recently_used(tmp_path: Path) -> None:
    async def fetch(_: RemoteLogSegmentMetadata, __: IndexType) -> bytes:
        return bytes(8 * 100)

    async def run() -> None:
        cache = RemoteIndexCache(tmp_path, 2000, fetch)
        segments = [metadata(i * 10) for i in range(4)]
        for s in segments:
            await cache.lookup_offset(s, s.start_offset)
        assert cache.size_bytes <= 2000 and cache.downloads == 4
        await cache.lookup_offset(segments[0], 0)  # evicted first: downloaded again
        assert cache.downloads == 5

    asyncio.run(run())


def test_a_hanging_task_never_stalls_other_partitions() -> None:
    runs: dict[str, int] = {"a": 0, "b": 0}

    class Hangs:
        async def run_once(self) -> None:
            await asyncio.sleep(3600)

    class Counts:
        def __init__(self, key: str) -> None:
            self.key = key

        async def run_once(self) -> None:
            runs[self.key] += 1

    async def run() -> None:
        pool = TaskPool("test", size=2, interval_ms=10, backoff_ms=10, backoff_max_ms=50)
        pool.start()
        pool.schedule("hang", Hangs())
        pool.schedule("a", Counts("a"))
        pool.schedule("b", Counts("b"))
        await asyncio.sleep(0.3)
        await pool.stop(1.0)

    asyncio.run(run())
    assert runs["a"] >= 5 and runs["b"] >= 5


def test_retriable_failures_back_off_and_recover() -> None:
    attempts: list[float] = []

    class Flaky:
        async def run_once(self) -> None:
            attempts.append(asyncio.get_running_loop().time())
            if len(attempts) < 4:
                raise RemoteStorageError("throttled")

    async def run() -> None:
        pool = TaskPool("test", size=1, interval_ms=10_000, backoff_ms=20, backoff_max_ms=100)
        pool.start()
        pool.schedule("p", Flaky())
        await asyncio.sleep(0.6)
        await pool.stop(1.0)

    asyncio.run(run())
    assert len(attempts) == 4  # three failures retried soon, then the long interval


def test_copies_stuck_in_copy_segment_started_are_cleaned_up_and_never_counted(
    tmp_path: Path,
) -> None:
    deleted: list[uuid.UUID] = []

    class Rsm:
        async def delete_log_segment_data(self, m: RemoteLogSegmentMetadata) -> None:
            deleted.append(m.segment_id.id)

    async def run() -> None:
        rlmm = TopicBasedRemoteLogMetadataManager(MemoryTopic(), tmp_path)
        await rlmm.start()
        stuck = metadata(0, RemoteLogSegmentState.COPY_SEGMENT_STARTED, event_ms=0)
        fresh = metadata(10, RemoteLogSegmentState.COPY_SEGMENT_STARTED, event_ms=2**62)
        await rlmm.add_remote_log_segment_metadata(stuck)
        await rlmm.add_remote_log_segment_metadata(fresh)
        assert rlmm.remote_log_size(TIP, 0) == 0
        log = Log(
            tmp_path / "t-0",
            TIP.topic_partition,
            LogConfig(remote_storage_enable=True),
            TIP.topic_id,
        )
        config = RemoteLogManagerConfig(stuck_copy_timeout_ms=1000)
        from prometheus_client import CollectorRegistry

        deleter = SegmentDeleter(config, Rsm(), rlmm, lambda _: None)  # type: ignore[arg-type]
        task = ExpirationTask(
            TieredPartition(TIP, log),
            config,
            rlmm,
            deleter,
            RemoteStorageMetrics(CollectorRegistry()),
        )
        await task.run_once()
        assert deleted == [stuck.segment_id.id]  # the fresh copy may still be in progress
        assert [m.segment_id for m in rlmm.list_remote_log_segments(TIP)] == [fresh.segment_id]
        log.close()

    asyncio.run(run())
