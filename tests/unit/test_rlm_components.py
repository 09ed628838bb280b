"""RLM parts in isolation: the index cache, the task pool, abandoned-copy clean-up."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import random
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tests.unit import virtual_time
from tests.unit.test_remote_metadata import MemoryTopic
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.protocol.records import BatchView, build_batch, iter_batches
from tierbroker.rlm.config import UNLIMITED, RemoteLogManagerConfig
from tierbroker.rlm.copy_task import CopyTask
from tierbroker.rlm.expiration_task import ExpirationTask, SegmentDeleter
from tierbroker.rlm.index_cache import CACHE_DIR, RemoteIndexCache, parse_index
from tierbroker.rlm.metrics import RemoteStorageMetrics
from tierbroker.rlm.partition_index_writer import PartitionIndexWriter
from tierbroker.rlm.quota import ByteRateLimiter
from tierbroker.rlm.remote_reader import RemoteLogReader
from tierbroker.rlm.task_pool import TaskPool
from tierbroker.rlm.tiered_partition import TieredPartition
from tierbroker.storage.log import Log
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.remote.chunk_cache import ChunkCache, ChunkCacheConfig, MemoryChunkStore
from tierbroker.storage.remote.key_layout import INDEXES_SUFFIX, LOG_SUFFIX, MANIFEST_SUFFIX
from tierbroker.storage.remote.local_fs import LocalFsRemoteStorageManager
from tierbroker.storage.remote.request_meter import ObjectStoreMeter
from tierbroker.storage.remote.segment_codec import AS_WRITTEN_TAG
from tierbroker.storage.remote.segment_metadata import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    TopicIdPartition,
)
from tierbroker.storage.remote.storage_manager import IndexType, LogSegmentData, RemoteStorageError
from tierbroker.storage.remote.topic_based_rlmm import TopicBasedRemoteLogMetadataManager
from tierbroker.storage.topic_partition import TopicPartition

TIP = TopicIdPartition(uuid.uuid4(), TopicPartition("t", 0))
LINEAGE = ((0, 0),)  # the leader-epoch entries of `build_log`'s logs


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

    virtual_time.run(run())  # 0.3 s of loop time: about 30 intervals of 10 ms
    assert runs["a"] >= 25 and runs["b"] >= 25


def test_many_partitions_start_as_slots_free_and_each_runs() -> None:
    """Thousands of led partitions: the pool starts tasks only into free slots, oldest due
    first, so a wake-up never creates a task per partition."""
    size, partitions = 3, 2000
    runs: dict[int, int] = {}
    most_started = 0
    all_ran = asyncio.Event()

    class Records:
        def __init__(self, key: int) -> None:
            self.key = key

        async def run_once(self) -> None:
            nonlocal most_started
            started = [t for t in asyncio.all_tasks() if t.get_name().startswith("rlm-test-")]
            most_started = max(most_started, len(started))
            runs[self.key] = runs.get(self.key, 0) + 1
            if len(runs) == partitions:
                all_ran.set()
            await asyncio.sleep(0)

    async def run() -> None:
        pool = TaskPool("test", size=size, interval_ms=3_600_000, backoff_ms=10, backoff_max_ms=50)
        pool.start()
        for key in range(partitions):
            pool.schedule(key, Records(key))
        assert pool.queued == partitions
        await asyncio.wait_for(all_ran.wait(), 30)
        assert pool.queued == 0
        await pool.stop(1.0)

    asyncio.run(run())
    assert runs == dict.fromkeys(range(partitions), 1)
    assert most_started <= size


def test_a_partition_scheduled_anew_while_its_task_runs_gets_the_new_task() -> None:
    ran: list[str] = []
    release, ran_new = asyncio.Event(), asyncio.Event()

    class Named:
        def __init__(self, name: str, wait: bool) -> None:
            self.name, self.wait = name, wait

        async def run_once(self) -> None:
            ran.append(self.name)
            if self.wait:
                await release.wait()
            else:
                ran_new.set()

    async def run() -> None:
        pool = TaskPool("test", size=1, interval_ms=3_600_000, backoff_ms=10, backoff_max_ms=50)
        pool.start()
        pool.schedule("p", Named("old", wait=True))
        await asyncio.sleep(0.01)
        assert ran == ["old"]
        pool.schedule("p", Named("new", wait=False))  # a new leadership while the old runs
        await asyncio.sleep(0.01)
        release.set()
        await asyncio.wait_for(ran_new.wait(), 5)
        await pool.stop(1.0)

    virtual_time.run(run())  # the 10 ms pauses are exact: the old task is still running
    assert ran == ["old", "new"]


def test_retriable_failures_back_off_and_recover() -> None:
    """With the jitter left random: each retry within its back-off cap, then the interval."""
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
        await asyncio.sleep(25)
        await pool.stop(1.0)

    virtual_time.run(run())
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    # Three failures retried within 20, 40 and 80 ms; the success, then every 10 s.
    assert len(attempts) == 6, attempts
    assert all(0 <= gap <= cap for gap, cap in zip(gaps, (0.02, 0.04, 0.08), strict=False))
    assert gaps[3:] == pytest.approx([10.0, 10.0])


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
            RemoteStorageMetrics(CollectorRegistry(), ObjectStoreMeter()),
        )
        await task.run_once()
        assert deleted == [stuck.segment_id.id]  # the fresh copy may still be in progress
        assert [m.segment_id for m in rlmm.list_remote_log_segments(TIP)] == [fresh.segment_id]
        log.close()

    asyncio.run(run())


# =======================================================================================
# Shared fixtures for the tests below: a real Log cut into segments, tiered to LocalFs.
# =======================================================================================

TS0 = int(time.time() * 1000) - 3_600_000  # record timestamps: TS0 + 2 * offset (recent)


def timestamp_of(offset: int) -> int:
    return TS0 + 2 * offset


@dataclasses.dataclass
class Batch:
    base: int
    last: int
    position: int
    size: int
    data: bytes


def build_log(
    directory: Path,
    tip: TopicIdPartition = TIP,
    *,
    batches: int = 150,
    segment_bytes: int = 40_000,
    big_batches: tuple[int, ...] = (),
    seed: int = 7,
) -> Log:
    """A leader's log of `batches` batches of 1 to 9 records (values of varying size), records'
    timestamps TS0 + 2 * offset, rolled every `segment_bytes`; batch numbers in `big_batches`
    hold one 150 KiB record."""
    rng = random.Random(seed)
    lg = Log(
        directory,
        tip.topic_partition,
        LogConfig(
            remote_storage_enable=True, segment_bytes=segment_bytes, index_interval_bytes=4096
        ),
        tip.topic_id,
    )
    offset = 0
    for b in range(batches):
        n = 1 if b in big_batches else rng.randint(1, 9)
        records = []
        for i in range(n):
            size = 150 * 1024 if b in big_batches else rng.randint(10, 900)
            value = bytes((offset + i + j) % 251 for j in range(size))
            records.append((b"%d" % (offset + i), value, [], timestamp_of(offset + i)))
        lg.append_as_leader(bytearray(build_batch(records)), 0)
        offset += n
    lg.update_high_watermark(lg.log_end_offset)
    return lg


def batches_of(lg: Log) -> list[list[Batch]]:
    """Each segment's batches as the local files hold them."""
    table = []
    for s in lg.segments:
        data = s.log_path.read_bytes()
        table.append(
            [
                Batch(
                    v.base_offset,
                    v.last_offset,
                    v.position,
                    v.size_in_bytes,
                    data[v.position : v.position + v.size_in_bytes],
                )
                for v in iter_batches(data)
            ]
        )
    return table


def metadata_of(
    tip: TopicIdPartition,
    s: object,
    state: RemoteLogSegmentState = RemoteLogSegmentState.COPY_SEGMENT_STARTED,
) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(
        segment_id=RemoteLogSegmentId.generate(tip),
        start_offset=s.base_offset,  # type: ignore[attr-defined]
        end_offset=s.next_offset - 1,  # type: ignore[attr-defined]
        max_timestamp_ms=s.max_timestamp,  # type: ignore[attr-defined]
        broker_id=0,
        event_timestamp_ms=int(time.time() * 1000),
        segment_size_bytes=s.size,  # type: ignore[attr-defined]
        segment_leader_epochs=((0, s.base_offset),),  # type: ignore[attr-defined]
        state=state,
    )


def segment_data(s: object) -> LogSegmentData:
    return LogSegmentData(
        log_segment=s.log_path,  # type: ignore[attr-defined]
        offset_index=s.offset_index.path,  # type: ignore[attr-defined]
        time_index=s.time_index.path,  # type: ignore[attr-defined]
        transaction_index=None,
        producer_snapshot_index=None,
        leader_epoch_index=b"0\n1\n0 %d\n" % s.base_offset,  # type: ignore[attr-defined]
    )


async def tier_rolled_segments(
    lg: Log, rsm: LocalFsRemoteStorageManager, rlmm: TopicBasedRemoteLogMetadataManager
) -> list[RemoteLogSegmentMetadata]:
    """Copy every rolled segment, as CopyTask does, without CopyTask."""
    copied = []
    for s in lg.segments[:-1]:
        m = metadata_of(TIP, s)
        await rlmm.add_remote_log_segment_metadata(m)
        await rsm.copy_log_segment_data(m, segment_data(s))
        finished = m.with_state(RemoteLogSegmentState.COPY_SEGMENT_FINISHED, m.event_timestamp_ms)
        await rlmm.update_remote_log_segment_metadata(finished)
        copied.append(finished)
    lg.update_highest_offset_in_remote_storage(copied[-1].end_offset)
    return copied


def local_fs(root: Path) -> LocalFsRemoteStorageManager:
    rsm = LocalFsRemoteStorageManager()
    rsm.configure({"dir": str(root)})
    return rsm


def remote_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def events_of(topic: MemoryTopic, segment_id: uuid.UUID) -> list[str]:
    """The states recorded in the metadata topic for one segment, in order."""
    states = []
    for records in topic.records.values():
        for _, value in records:
            event = json.loads(value)
            if event["type"] == "segment" and event["metadata"]["segment_id"] == str(segment_id):
                states.append(event["metadata"]["state"])
    return states


def expected_read(table: list[list[Batch]], offset: int, max_bytes: int) -> bytes:
    """Kafka's answer: whole batches from the one holding `offset`, within `max_bytes` but at
    least one, never past the end of the segment holding it."""
    for segment in table:
        for i, b in enumerate(segment):
            if b.base <= offset <= b.last:
                out, total = [b.data], b.size
                for nxt in segment[i + 1 :]:
                    if total + nxt.size > max_bytes:
                        break
                    out.append(nxt.data)
                    total += nxt.size
                return b"".join(out)
    raise AssertionError(f"offset {offset} is in no batch")


def new_reader(
    tmp_path: Path,
    rlmm: TopicBasedRemoteLogMetadataManager,
    rsm: LocalFsRemoteStorageManager,
    *,
    chunk_bytes: int = 8192,
    prefetch_bytes: int = 32768,
    **config: int,
) -> RemoteLogReader:
    """A reader of segments of about 40 KB, read in chunks of `chunk_bytes`."""
    rlm_config = RemoteLogManagerConfig(**config)
    chunks = ChunkCache(
        ChunkCacheConfig(
            chunk_bytes=chunk_bytes, cache_bytes=16 << 20, prefetch_bytes=prefetch_bytes
        ),
        MemoryChunkStore(),
        fetch_slots=rlm_config.reader_threads,
        fetch_timeout_s=30,
    )
    return RemoteLogReader(
        rlm_config,
        rlmm,
        rsm,
        RemoteIndexCache(tmp_path / "logdir", 1 << 20, rsm.fetch_index),
        chunks,
        RemoteStorageMetrics(CollectorRegistry(), ObjectStoreMeter()),
    )


async def tiered_reader(
    tmp_path: Path, lg: Log, rsm: LocalFsRemoteStorageManager, **config: int
) -> tuple[RemoteLogReader, list[RemoteLogSegmentMetadata]]:
    """Tier `lg`'s rolled segments to `rsm`: a reader over them, and what was copied."""
    rlmm = TopicBasedRemoteLogMetadataManager(MemoryTopic(), tmp_path)
    await rlmm.start()
    copied = await tier_rolled_segments(lg, rsm, rlmm)
    return new_reader(tmp_path, rlmm, rsm, **config), copied


async def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


# =======================================================================================
# RemoteLogReader
# =======================================================================================


async def test_remote_reads_are_whole_batches_from_the_one_holding_the_offset(
    tmp_path: Path,
) -> None:
    lg = build_log(tmp_path / "t-0")
    assert len(lg.segments) >= 5
    table = batches_of(lg)
    rsm = local_fs(tmp_path / "remote")
    reader, _ = await tiered_reader(tmp_path, lg, rsm)
    remote_end = lg.segments[-1].base_offset
    offsets = sorted({0, 1, remote_end - 1, *random.Random(1).sample(range(remote_end), 60)})
    # every batch's first and last offset, and the offsets around segment boundaries
    offsets += [b.base for seg in table[:-1] for b in seg[:2] + seg[-2:]]
    offsets += [b.last for seg in table[:-1] for b in seg[:2] + seg[-2:]]
    for offset in offsets:
        for max_bytes in (1, 700, 5_000, 33_000, 1 << 20):
            got = await reader.read(TIP, offset, max_bytes, 5, LINEAGE)
            want = expected_read(table[:-1], offset, max_bytes)
            assert got == want, (offset, max_bytes, len(got), len(want))
            first = BatchView(got)
            assert first.base_offset <= offset <= first.last_offset
            assert len(got) <= max(max_bytes, first.size_in_bytes)
    with pytest.raises(KafkaError) as raised:  # not in the remote tier: the active segment
        await reader.read(TIP, remote_end, 1000, 5, LINEAGE)
    assert raised.value.code == ErrorCode.offset_out_of_range
    await reader.close()
    lg.close()


async def test_a_remote_batch_larger_than_the_fetch_and_the_read_chunk_comes_whole(
    tmp_path: Path,
) -> None:
    lg = build_log(tmp_path / "t-0", batches=60, segment_bytes=400_000, big_batches=(20, 21, 45))
    table = batches_of(lg)
    rsm = local_fs(tmp_path / "remote")
    reader, _ = await tiered_reader(tmp_path, lg, rsm)
    bigs = [b for seg in table[:-1] for b in seg if b.size > 100_000]
    assert len(bigs) >= 2
    for big in bigs:
        for max_bytes in (1, 1000, 100_000, 200_000, 400_000):
            got = await reader.read(TIP, big.base, max_bytes, 5, LINEAGE)
            assert got == expected_read(table[:-1], big.base, max_bytes), (big.base, max_bytes)
            assert got[: big.size] == big.data
        before = big.base - 1  # the batch before: the big one only fits a large fetch
        got = await reader.read(TIP, before, 100_000, 5, LINEAGE)
        assert got == expected_read(table[:-1], before, 100_000)
    await reader.close()
    lg.close()


class SlowLocalFs(LocalFsRemoteStorageManager):
    """Segment reads take `delay_s`, and wait for `gate` while it is cleared."""

    def __init__(self, root: Path, delay_s: float) -> None:
        super().__init__()
        self.configure({"dir": str(root)})
        self.delay_s = delay_s
        self.gate = asyncio.Event()
        self.gate.set()
        self.reads: list[tuple[int, int]] = []  # (segment base offset, start position)
        self.returned: list[bytes] = []

    async def fetch_log_segment(
        self, metadata: RemoteLogSegmentMetadata, start: int, end: int | None = None
    ) -> bytes:
        self.reads.append((metadata.start_offset, start))
        await asyncio.sleep(self.delay_s)
        await self.gate.wait()
        data = await super().fetch_log_segment(metadata, start, end)
        self.returned.append(data)
        return data


async def test_a_remote_read_within_one_chunk_is_a_view_of_it_not_a_copy(tmp_path: Path) -> None:
    lg = build_log(tmp_path / "t-0")
    table = batches_of(lg)
    rsm = SlowLocalFs(tmp_path / "remote", 0)
    reader, _ = await tiered_reader(tmp_path, lg, rsm, chunk_bytes=1 << 20, reader_threads=1)
    got = await reader.read(TIP, 10, 5000, 5, LINEAGE)
    assert got == expected_read(table[:-1], 10, 5000)
    [data] = rsm.returned  # the whole segment: it is smaller than a chunk
    assert len(got) < len(data)
    assert got.obj is data  # the payload was not copied on the event loop
    await reader.close()
    lg.close()


async def test_a_read_that_outlives_the_fetch_leaves_its_chunks_loading_for_the_retry(
    tmp_path: Path,
) -> None:
    lg = build_log(tmp_path / "t-0")
    table = batches_of(lg)
    rsm = SlowLocalFs(tmp_path / "remote", 0)
    rsm.gate.clear()  # the remote tier cannot answer until the test says so
    reader, _ = await tiered_reader(tmp_path, lg, rsm)
    with pytest.raises(TimeoutError):  # answered at the fetch's wait, not the read's
        await reader.read(TIP, 10, 5000, 0.1, LINEAGE)
    [first, *_] = rsm.reads
    assert reader.chunks.loading > 0  # the chunks go on loading without the fetch
    rsm.gate.set()
    await wait_until(lambda: reader.chunks.loading == 0, "the abandoned chunks to load")
    rsm.gate.clear()  # a retry that read the remote tier again would now time out
    got = await reader.read(TIP, 10, 5000, 0.1, LINEAGE)  # the client's retry
    assert got == expected_read(table[:-1], 10, 5000)
    assert rsm.reads.count(first) == 1, "the retry read the remote tier again"
    rsm.gate.set()
    await reader.close()
    lg.close()


async def test_a_sequential_reader_finds_each_chunk_loaded_across_segments(tmp_path: Path) -> None:
    lg = build_log(tmp_path / "t-0")
    table = batches_of(lg)
    rsm = SlowLocalFs(tmp_path / "remote", 0.01)
    reader, copied = await tiered_reader(tmp_path, lg, rsm)
    chunks = reader.chunks
    offset = 0
    while offset <= copied[-1].end_offset:  # a consumer reading the remote tier in order
        misses = chunks.misses
        got = await reader.read(TIP, offset, 5000, 5, LINEAGE)
        assert got == expected_read(table[:-1], offset, 5000), offset
        if offset:
            assert chunks.misses == misses, f"the fetch at {offset} waited for the store"
        offset = list(iter_batches(got))[-1].last_offset + 1
        await wait_until(lambda: chunks.loading == 0, "the prefetch to finish")
    # Every chunk of every segment fetched once: none twice, none past the remote tier's end.
    expected = [
        (m.start_offset, i * 8192) for m in copied for i in range(-(-m.segment_size_bytes // 8192))
    ]
    assert sorted(rsm.reads) == expected
    assert len(copied) > 2
    assert reader.index_cache.downloads == 0  # each read started where the one before ended
    await reader.close()
    lg.close()


async def test_without_prefetch_a_read_fetches_only_what_it_asks_for(tmp_path: Path) -> None:
    lg = build_log(tmp_path / "t-0")
    rsm = SlowLocalFs(tmp_path / "remote", 0.01)
    reader, copied = await tiered_reader(tmp_path, lg, rsm, prefetch_bytes=0)
    offset, fetches = 0, 0
    while offset <= copied[-1].end_offset:
        got = await reader.read(TIP, offset, 5000, 5, LINEAGE)
        assert reader.chunks.loading == 0, f"a prefetch started after the fetch at {offset}"
        fetches += 1
        offset = list(iter_batches(got))[-1].last_offset + 1
    assert fetches > 2 and len(rsm.reads) == reader.chunks.misses
    await reader.close()
    lg.close()


async def test_a_prefetch_that_fails_leaves_the_read_alone_and_is_fetched_again(
    tmp_path: Path,
) -> None:
    lg = build_log(tmp_path / "t-0")
    table = batches_of(lg)
    rsm = SlowLocalFs(tmp_path / "remote", 0)
    refused: list[int] = []
    real = rsm.fetch_log_segment

    async def refuse_once(
        metadata: RemoteLogSegmentMetadata, start: int, end: int | None = None
    ) -> bytes:
        if start > 0 and start not in refused:
            refused.append(start)
            raise RemoteStorageError("injected: prefetch refused")
        return await real(metadata, start, end)

    rsm.fetch_log_segment = refuse_once  # type: ignore[method-assign]
    reader, copied = await tiered_reader(tmp_path, lg, rsm)
    assert await reader.read(TIP, 0, 5000, 5, LINEAGE) == expected_read(table[:-1], 0, 5000)
    await wait_until(lambda: reader.chunks.loading == 0, "the prefetch to fail")
    assert refused, "nothing was prefetched"
    offset = copied[0].end_offset - 2  # in a chunk whose prefetch failed
    got = await reader.read(TIP, offset, 5000, 5, LINEAGE)
    assert got == expected_read(table[:-1], offset, 5000)
    await reader.close()
    lg.close()


async def test_a_read_from_a_segment_start_needs_no_index(tmp_path: Path) -> None:
    lg = build_log(tmp_path / "t-0")
    table = batches_of(lg)
    reader, copied = await tiered_reader(
        tmp_path, lg, local_fs(tmp_path / "remote"), reader_threads=1
    )
    for segment in copied:
        got = await reader.read(TIP, segment.start_offset, 5000, 5, LINEAGE)
        assert got == expected_read(table[:-1], segment.start_offset, 5000)
    assert reader.index_cache.downloads == 0
    middle = copied[1].start_offset + 3
    assert await reader.read(TIP, middle, 5000, 5, LINEAGE) == expected_read(
        table[:-1], middle, 5000
    )
    assert reader.index_cache.downloads == 1
    await reader.close()
    lg.close()


async def test_remote_offsets_by_timestamp(tmp_path: Path) -> None:
    lg = build_log(tmp_path / "t-0")
    rsm = local_fs(tmp_path / "remote")
    reader, copied = await tiered_reader(tmp_path, lg, rsm)
    remote_end = copied[-1].end_offset
    for k in [
        0,
        1,
        2,
        57,
        remote_end - 1,
        remote_end,
        *random.Random(3).sample(range(remote_end), 40),
    ]:
        assert await reader.find_offset_by_timestamp(TIP, timestamp_of(k), 0, LINEAGE) == (
            k,
            timestamp_of(k),
        )
        if k < remote_end:  # between two records: the next one
            assert await reader.find_offset_by_timestamp(TIP, timestamp_of(k) + 1, 0, LINEAGE) == (
                k + 1,
                timestamp_of(k + 1),
            )
    assert await reader.find_offset_by_timestamp(TIP, 0, 0, LINEAGE) == (0, TS0)
    assert await reader.find_offset_by_timestamp(TIP, 0, 77, LINEAGE) == (77, timestamp_of(77))
    assert (
        await reader.find_offset_by_timestamp(TIP, timestamp_of(remote_end) + 1, 0, LINEAGE) is None
    )
    await reader.close()
    lg.close()


# =======================================================================================
# RemoteIndexCache
# =======================================================================================


def offset_index_bytes(entries: int) -> bytes:
    return b"".join(i.to_bytes(4, "big") + (i * 100).to_bytes(4, "big") for i in range(entries))


async def test_concurrent_lookups_share_one_download_even_when_a_requester_gives_up(
    tmp_path: Path,
) -> None:
    downloads: list[tuple[uuid.UUID, IndexType]] = []
    gate = asyncio.Event()

    async def fetch(m: RemoteLogSegmentMetadata, index_type: IndexType) -> bytes:
        downloads.append((m.segment_id.id, index_type))
        await gate.wait()
        return offset_index_bytes(10)

    cache = RemoteIndexCache(tmp_path, 1 << 20, fetch)
    a = metadata(0)
    with pytest.raises(TimeoutError):  # a fetch stops waiting (remote.fetch.max.wait.ms)
        await asyncio.wait_for(cache.lookup_offset(a, 5), 0.05)
    lookups = [asyncio.ensure_future(cache.lookup_offset(a, o)) for o in range(10)]
    other = asyncio.ensure_future(cache.lookup_offset(metadata(100), 105))
    await asyncio.sleep(0.05)
    gate.set()
    assert await asyncio.gather(*lookups) == [o * 100 for o in range(10)]
    assert await other == 500
    assert downloads.count((a.segment_id.id, IndexType.OFFSET)) == 1
    assert len(downloads) == 2
    assert await cache.lookup_offset(a, 3) == 300 and len(downloads) == 2
    await cache.close()


async def test_a_failed_index_download_is_not_cached(tmp_path: Path) -> None:
    attempts = 0

    async def fetch(_: RemoteLogSegmentMetadata, __: IndexType) -> bytes:
        nonlocal attempts
        attempts += 1
        await asyncio.sleep(0.01)
        if attempts <= 2:
            raise RemoteStorageError("503 Slow Down")
        return offset_index_bytes(4)

    cache = RemoteIndexCache(tmp_path, 1 << 20, fetch)
    m = metadata(0)
    for expected_attempts in (1, 2):
        with pytest.raises(RemoteStorageError):
            await cache.lookup_offset(m, 2)
        assert attempts == expected_attempts
    assert await cache.lookup_offset(m, 2) == 200 and attempts == 3
    assert await cache.lookup_offset(m, 3) == 300 and attempts == 3
    assert (tmp_path / CACHE_DIR / f"{m.segment_id.id}.index").stat().st_size == 32
    await cache.close()


async def test_index_cache_evicts_the_least_recently_used_by_total_bytes(tmp_path: Path) -> None:
    downloads: list[int] = []

    async def fetch(m: RemoteLogSegmentMetadata, _: IndexType) -> bytes:
        downloads.append(m.start_offset)
        return offset_index_bytes(100)  # 800 bytes

    held = parse_index(IndexType.OFFSET, offset_index_bytes(100)).size_bytes
    cache = RemoteIndexCache(tmp_path, 3 * held + held // 2, fetch)  # room for three
    a, b, c, d = (metadata(i * 10) for i in range(4))
    for m in (a, b, c):
        await cache.lookup_offset(m, m.start_offset)
    await cache.lookup_offset(a, 0)  # a is now the most recently used
    await cache.lookup_offset(d, 30)  # evicts the least recently used: b, not a
    assert downloads == [0, 10, 20, 30]
    await cache.lookup_offset(a, 0)
    assert downloads == [0, 10, 20, 30], "a was evicted although used more recently than b"
    await cache.lookup_offset(b, 10)
    assert downloads == [0, 10, 20, 30, 10]
    on_disk = remote_files(tmp_path / CACHE_DIR)
    assert cache.size_bytes == 3 * held and [p.stat().st_size for p in on_disk] == [800] * 3
    cache.remove(b.segment_id.id)
    assert cache.size_bytes == 2 * held and len(remote_files(tmp_path / CACHE_DIR)) == 2
    await cache.close()


# =======================================================================================
# TaskPool
# =======================================================================================


def test_retriable_failures_back_off_exponentially_up_to_the_maximum(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """With the jitter pinned to its upper bound, retries come after 40, 80, 160, 200, 200 ms;
    after a success the interval applies and the back-off starts over. Each failure is one
    line saying when the task runs again."""
    monkeypatch.setattr("tierbroker.rlm.task_pool.random.uniform", lambda low, high: high)
    runs: list[float] = []
    outcomes = iter(["fail"] * 5 + ["ok"] + ["fail", "ok"] + ["ok"] * 100)

    class Flaky:
        async def run_once(self) -> None:
            runs.append(asyncio.get_running_loop().time())
            if next(outcomes) == "fail":
                raise RemoteStorageError("503 Slow Down")

    async def run() -> None:
        pool = TaskPool("t", size=1, interval_ms=600, backoff_ms=40, backoff_max_ms=200)
        pool.start()
        pool.schedule("p", Flaky())
        await asyncio.sleep(2)
        await pool.stop(1.0)

    with caplog.at_level(logging.INFO, logger="tierbroker.rlm.task_pool"):
        virtual_time.run(run())
    gaps = [b - a for a, b in itertools.pairwise(runs)]
    assert gaps[:8] == pytest.approx([0.04, 0.08, 0.16, 0.2, 0.2, 0.6, 0.04, 0.6])
    assert [(r.levelno, r.getMessage(), r.exc_info) for r in caplog.records] == [
        (
            logging.WARNING,
            f"t task of p failed (attempt {n}), retrying in {s}s: 503 Slow Down",
            None,
        )
        for n, s in [(1, "0.04"), (2, "0.08"), (3, "0.16"), (4, "0.20"), (5, "0.20"), (1, "0.04")]
    ]


def test_a_store_that_refuses_is_one_line_per_failure_at_the_maximum_back_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A configuration mistake (a missing bucket) does not pass with time: retried at the
    maximum back-off, one line each time, never a traceback."""
    runs: list[float] = []
    refusal = RemoteStorageError(
        "S3 bucket 'gone' does not exist: create it, or fix rsm.config.storage.s3.bucket.name",
        retriable=False,
    )

    class Refused:
        async def run_once(self) -> None:
            runs.append(asyncio.get_running_loop().time())
            raise refusal

    async def run() -> None:
        pool = TaskPool("copy", size=1, interval_ms=10, backoff_ms=1, backoff_max_ms=30_000)
        pool.start()
        pool.schedule("t-0", Refused())
        await asyncio.sleep(100)
        await pool.stop(1.0)

    with caplog.at_level(logging.INFO, logger="tierbroker.rlm.task_pool"):
        virtual_time.run(run())
    assert [b - a for a, b in itertools.pairwise(runs)] == pytest.approx([30.0] * 3)
    assert [(r.levelno, r.getMessage(), r.exc_info) for r in caplog.records] == [
        (
            logging.WARNING,
            f"copy task of t-0 failed (attempt {n}), retrying in 30.00s: {refusal}",
            None,
        )
        for n in range(1, 5)
    ]


def test_a_bug_in_a_task_is_retried_at_the_maximum_back_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Never a hot loop; its traceback is logged once, then one line per failure, and once
    more after the task succeeded in between."""
    runs: list[float] = []
    outcomes = iter(["bug"] * 3 + ["ok", "bug"] + ["ok"] * 100)

    class Broken:
        async def run_once(self) -> None:
            runs.append(asyncio.get_running_loop().time())
            if next(outcomes) == "bug":
                raise ValueError("a bug")

    async def run() -> None:
        pool = TaskPool("t", size=1, interval_ms=10, backoff_ms=1, backoff_max_ms=150)
        pool.start()
        pool.schedule("p", Broken())
        await asyncio.sleep(0.5)
        await pool.stop(1.0)

    with caplog.at_level(logging.INFO, logger="tierbroker.rlm.task_pool"):
        virtual_time.run(run())
    assert [b - a for a, b in itertools.pairwise(runs)][:4] == pytest.approx(
        [0.15, 0.15, 0.15, 0.01]
    )
    line = "t task of p failed (attempt {}), retrying in 0.15s: ValueError: a bug"
    assert [(r.levelno, r.getMessage(), r.exc_info is not None) for r in caplog.records] == [
        (logging.ERROR, line.format(1), True),
        (logging.WARNING, line.format(2), False),
        (logging.WARNING, line.format(3), False),
        (logging.ERROR, line.format(1), True),
    ]


async def test_a_hanging_partition_never_stalls_the_others_nor_piles_up() -> None:
    runs: dict[str, int] = {}
    hanging_runs = 0

    class Hangs:
        async def run_once(self) -> None:
            nonlocal hanging_runs
            hanging_runs += 1
            await asyncio.Event().wait()  # forever

    class Counts:
        def __init__(self, key: str) -> None:
            self.key = key

        async def run_once(self) -> None:
            runs[self.key] = runs.get(self.key, 0) + 1
            await asyncio.sleep(0.005)

    pool = TaskPool("t", size=2, interval_ms=20, backoff_ms=10, backoff_max_ms=50)
    pool.start()
    pool.schedule("hang", Hangs())
    for k in "abcde":
        pool.schedule(k, Counts(k))
    await wait_until(
        lambda: len(runs) == 5 and min(runs.values()) >= 5, "every partition to run", 5
    )
    assert hanging_runs == 1  # never started again while its run hangs
    await pool.stop(1.0)


async def test_stop_cancels_running_tasks_and_nothing_runs_afterwards() -> None:
    cancelled: list[str] = []
    runs = 0

    class Long:
        async def run_once(self) -> None:
            nonlocal runs
            runs += 1
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.append("long")
                raise

    class Short:
        async def run_once(self) -> None:
            nonlocal runs
            runs += 1

    pool = TaskPool("t", size=4, interval_ms=10, backoff_ms=10, backoff_max_ms=10)
    pool.start()
    pool.schedule("long", Long())
    pool.schedule("short", Short())
    await wait_until(lambda: runs >= 5, "a few runs")
    await pool.stop(2.0)
    assert cancelled == ["long"]  # cancelled by stop(), not left to outlive its timeout
    after = runs
    await asyncio.sleep(0.1)
    assert runs == after, "tasks ran after stop()"
    leftovers = [
        t
        for t in asyncio.all_tasks()
        if t is not asyncio.current_task() and "rlm-t" in t.get_name()
    ]
    assert leftovers == []


async def test_cancel_stops_a_partition_and_trigger_runs_one_at_once() -> None:
    runs: dict[str, int] = {"a": 0, "b": 0}

    class Counts:
        def __init__(self, key: str) -> None:
            self.key = key

        async def run_once(self) -> None:
            runs[self.key] += 1

    pool = TaskPool("t", size=2, interval_ms=60_000, backoff_ms=10, backoff_max_ms=10)
    pool.start()
    pool.schedule("a", Counts("a"))
    pool.schedule("b", Counts("b"))
    await wait_until(lambda: runs == {"a": 1, "b": 1}, "the first runs")
    pool.cancel("a")
    pool.trigger("a")  # no longer scheduled: nothing happens
    pool.trigger("b")
    await wait_until(lambda: runs["b"] == 2, "the triggered run", 1)
    await asyncio.sleep(0.05)
    assert runs == {"a": 1, "b": 2}
    await pool.stop(1.0)


# =======================================================================================
# CopyTask
# =======================================================================================


class PartialCopyThenFail(LocalFsRemoteStorageManager):
    """Uploads the log and one index, then fails without cleaning up (a crash mid-copy,
    or a plugin that leaves what it wrote), while `fail` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.fail = True
        self.delete_fails = False

    async def copy_log_segment_data(
        self, metadata: RemoteLogSegmentMetadata, data: LogSegmentData
    ) -> bytes:
        if not self.fail:
            return await super().copy_log_segment_data(metadata, data)
        log = data.log_segment.read_bytes()
        await self._run(self._write, self.layout.segment_key(metadata, LOG_SUFFIX), log)
        await self._run(self._write, self.layout.segment_key(metadata, INDEXES_SUFFIX), b"partial")
        raise RemoteStorageError("injected: connection reset mid-copy")

    async def delete_log_segment_data(self, metadata: RemoteLogSegmentMetadata) -> None:
        if self.delete_fails:
            raise RemoteStorageError("injected: delete failed")
        await super().delete_log_segment_data(metadata)


def copy_task(
    partition: TieredPartition,
    rsm: LocalFsRemoteStorageManager,
    rlmm: TopicBasedRemoteLogMetadataManager,
) -> CopyTask:
    return CopyTask(
        partition,
        0,
        RemoteLogManagerConfig(),
        rsm,
        rlmm,
        ByteRateLimiter(UNLIMITED),
        RemoteStorageMetrics(CollectorRegistry(), ObjectStoreMeter()),
        PartitionIndexWriter(rsm, lambda _topic: None, 0, 60.0),
    )


async def test_a_failed_copy_deletes_what_it_uploaded_and_records_delete_segment_finished(
    tmp_path: Path,
) -> None:
    lg = build_log(tmp_path / "t-0")
    topic = MemoryTopic()
    rlmm = TopicBasedRemoteLogMetadataManager(topic, tmp_path)
    await rlmm.start()
    rsm = PartialCopyThenFail()
    rsm.configure({"dir": str(tmp_path / "remote")})
    partition = TieredPartition(TIP, lg)
    task = copy_task(partition, rsm, rlmm)
    with pytest.raises(RemoteStorageError):  # raised, so the pool backs off
        await task.run_once()
    assert remote_files(tmp_path / "remote") == [], "a failed copy left objects behind"
    (failed_id,) = {
        uuid.UUID(json.loads(v)["metadata"]["segment_id"])
        for r in topic.records.values()
        for _, v in r
    }
    assert events_of(topic, failed_id) == [
        "COPY_SEGMENT_STARTED",
        "DELETE_SEGMENT_STARTED",
        "DELETE_SEGMENT_FINISHED",
    ]
    assert list(rlmm.list_remote_log_segments(TIP)) == []
    assert lg.highest_offset_in_remote_storage == -1 and partition.copying == set()
    lg.config = dataclasses.replace(lg.config, local_retention_bytes=0)
    assert lg.delete_old_segments() == [], (
        "local retention deleted a segment not in the remote tier"
    )

    rsm.fail = False
    await task.run_once()
    rolled = lg.segments[:-1]
    readable = rlmm.readable_segments(TIP)
    assert [(m.start_offset, m.end_offset) for m in readable] == [
        (s.base_offset, s.next_offset - 1) for s in rolled
    ]
    assert lg.highest_offset_in_remote_storage == rolled[-1].next_offset - 1
    for m, s in zip(readable, rolled, strict=True):
        assert events_of(topic, m.segment_id.id) == [
            "COPY_SEGMENT_STARTED",
            "COPY_SEGMENT_FINISHED",
        ]
        log_object = tmp_path / "remote" / rsm.layout.segment_key(m, LOG_SUFFIX)
        assert log_object.read_bytes() == s.log_path.read_bytes()
        assert (tmp_path / "remote" / rsm.layout.segment_key(m, MANIFEST_SUFFIX)).exists()
    lg.close()


class Wordy(LocalFsRemoteStorageManager):
    """Returns more custom metadata than Kafka's default limit allows."""

    async def copy_log_segment_data(
        self, metadata: RemoteLogSegmentMetadata, data: LogSegmentData
    ) -> bytes:
        await super().copy_log_segment_data(metadata, data)
        return b"x" * 129


async def test_custom_metadata_is_kept_with_the_segment_and_over_its_limit_undoes_the_copy(
    tmp_path: Path,
) -> None:
    lg = build_log(tmp_path / "t-0")
    rlmm = TopicBasedRemoteLogMetadataManager(MemoryTopic(), tmp_path)
    await rlmm.start()
    wordy = Wordy()
    wordy.configure({"dir": str(tmp_path / "remote")})
    with pytest.raises(RemoteStorageError, match=r"129 bytes, over .*max\.bytes=128") as raised:
        await copy_task(TieredPartition(TIP, lg), wordy, rlmm).run_once()
    assert not raised.value.retriable
    assert remote_files(tmp_path / "remote") == [] and rlmm.readable_segments(TIP) == []

    await copy_task(TieredPartition(TIP, lg), local_fs(tmp_path / "remote"), rlmm).run_once()
    readable = rlmm.readable_segments(TIP)
    assert readable and {m.custom_metadata for m in readable} == {AS_WRITTEN_TAG}
    lg.close()


async def test_a_failed_copy_whose_clean_up_fails_is_finished_by_expiration(tmp_path: Path) -> None:
    lg = build_log(tmp_path / "t-0", batches=40)
    topic = MemoryTopic()
    rlmm = TopicBasedRemoteLogMetadataManager(topic, tmp_path)
    await rlmm.start()
    rsm = PartialCopyThenFail()
    rsm.configure({"dir": str(tmp_path / "remote")})
    rsm.delete_fails = True
    partition = TieredPartition(TIP, lg)
    with pytest.raises(RemoteStorageError):
        await copy_task(partition, rsm, rlmm).run_once()
    (left,) = rlmm.list_remote_log_segments(TIP)
    assert left.state == RemoteLogSegmentState.DELETE_SEGMENT_STARTED
    assert rlmm.remote_log_size(TIP, 0) == 0 and rlmm.readable_segments(TIP) == []
    rsm.delete_fails = False
    config = RemoteLogManagerConfig()
    deleter = SegmentDeleter(config, rsm, rlmm, lambda _: None)
    await ExpirationTask(
        partition,
        config,
        rlmm,
        deleter,
        RemoteStorageMetrics(CollectorRegistry(), ObjectStoreMeter()),
    ).run_once()
    assert list(rlmm.list_remote_log_segments(TIP)) == []
    assert remote_files(tmp_path / "remote") == []
    assert events_of(topic, left.segment_id.id)[-1] == "DELETE_SEGMENT_FINISHED"
    lg.close()


async def test_copy_moves_the_remote_high_offset_only_after_copy_segment_finished(
    tmp_path: Path,
) -> None:
    lg = build_log(tmp_path / "t-0")
    hw_segment = lg.segments[3]
    lg.high_watermark = hw_segment.base_offset + 1  # segment 3 is not wholly committed
    rlmm = TopicBasedRemoteLogMetadataManager(MemoryTopic(), tmp_path)
    await rlmm.start()
    seen: list[tuple[str, int]] = []
    update = rlmm.update_remote_log_segment_metadata

    async def recording_update(m: RemoteLogSegmentMetadata) -> None:
        seen.append((m.state.name, lg.highest_offset_in_remote_storage))
        await update(m)

    rlmm.update_remote_log_segment_metadata = recording_update  # type: ignore[method-assign]
    rsm = local_fs(tmp_path / "remote")
    await copy_task(TieredPartition(TIP, lg), rsm, rlmm).run_once()
    ends = [s.next_offset - 1 for s in lg.segments[:3]]
    assert seen == [("COPY_SEGMENT_FINISHED", h) for h in [-1, *ends[:-1]]]
    assert [m.end_offset for m in rlmm.readable_segments(TIP)] == ends  # oldest first, below HW
    assert lg.highest_offset_in_remote_storage == ends[-1]
    lg.close()


async def test_each_segment_carries_the_leader_epoch_lineage_up_to_its_end(
    tmp_path: Path,
) -> None:
    """As Kafka uploads it: a replica rebuilt from the remote tier learns every epoch
    before a segment from that segment alone."""
    lg = build_log(tmp_path / "t-0")
    s0, s1, s2 = lg.segments[:3]
    lg.leader_epoch_cache.assign(3, s1.base_offset + 1)  # epoch 0 from offset 0 (the build)
    lg.leader_epoch_cache.assign(5, s2.base_offset + 1)
    rlmm = TopicBasedRemoteLogMetadataManager(MemoryTopic(), tmp_path)
    await rlmm.start()
    rsm = local_fs(tmp_path / "remote")
    await copy_task(TieredPartition(TIP, lg), rsm, rlmm).run_once()
    by_start = {m.start_offset: m for m in rlmm.readable_segments(TIP)}
    first = await rsm.fetch_index(by_start[s0.base_offset], IndexType.LEADER_EPOCH)
    third = await rsm.fetch_index(by_start[s2.base_offset], IndexType.LEADER_EPOCH)
    assert first.decode().split("\n")[1:-1] == ["1", "0 0"]
    assert third.decode().split("\n")[1:-1] == [
        "3",
        "0 0",
        f"3 {s1.base_offset + 1}",
        f"5 {s2.base_offset + 1}",
    ]
    # The segment's own epochs are its metadata's, clipped to its start.
    assert by_start[s2.base_offset].segment_leader_epochs == (
        (3, s2.base_offset),
        (5, s2.base_offset + 1),
    )
    lg.close()


# =======================================================================================
# ExpirationTask
# =======================================================================================


async def test_expiration_removes_stuck_copies_with_their_objects_and_never_counts_them(
    tmp_path: Path,
) -> None:
    lg = build_log(tmp_path / "t-0")
    rlmm = TopicBasedRemoteLogMetadataManager(MemoryTopic(), tmp_path)
    await rlmm.start()
    rsm = local_fs(tmp_path / "remote")
    partition = TieredPartition(TIP, lg)
    s0, s1, s2 = lg.segments[:3]
    now = int(time.time() * 1000)
    stuck = dataclasses.replace(metadata_of(TIP, s0), event_timestamp_ms=now - 10_000)
    in_progress = dataclasses.replace(metadata_of(TIP, s1), event_timestamp_ms=now - 10_000)
    fresh = dataclasses.replace(metadata_of(TIP, s2), event_timestamp_ms=now)
    for m, s in ((stuck, s0), (in_progress, s1), (fresh, s2)):
        await rlmm.add_remote_log_segment_metadata(m)
        await rsm.copy_log_segment_data(m, segment_data(s))  # its objects exist, unconfirmed
    partition.copying.add(in_progress.segment_id.id)  # this broker is still copying it
    assert rlmm.remote_log_size(TIP, 0) == 0 and rlmm.readable_segments(TIP) == []
    config = RemoteLogManagerConfig(stuck_copy_timeout_ms=5_000)
    deleter = SegmentDeleter(config, rsm, rlmm, lambda _: None)
    task = ExpirationTask(
        partition,
        config,
        rlmm,
        deleter,
        RemoteStorageMetrics(CollectorRegistry(), ObjectStoreMeter()),
    )
    await task.run_once()
    left = {m.segment_id.id for m in rlmm.list_remote_log_segments(TIP)}
    assert left == {in_progress.segment_id.id, fresh.segment_id.id}
    kept_prefixes = {rsm.layout.segment_key(m, LOG_SUFFIX) for m in (in_progress, fresh)}
    logs = {
        str(p.relative_to(tmp_path / "remote"))
        for p in remote_files(tmp_path / "remote")
        if p.suffix == ".log"
    }
    assert logs == kept_prefixes, "the stuck copy's objects were not deleted"
    assert rlmm.remote_log_size(TIP, 0) == 0
    lg.close()


async def test_expiration_deletes_superseded_copies_and_their_objects_only(tmp_path: Path) -> None:
    lg = build_log(tmp_path / "t-0")
    rlmm = TopicBasedRemoteLogMetadataManager(MemoryTopic(), tmp_path)
    await rlmm.start()
    rsm = local_fs(tmp_path / "remote")
    copied = await tier_rolled_segments(lg, rsm, rlmm)
    size = rlmm.remote_log_size(TIP, 0)
    s1 = lg.segments[1]
    retry = metadata_of(TIP, s1)  # a second copy of segment 1's range (a retried upload)
    await rlmm.add_remote_log_segment_metadata(retry)
    await rsm.copy_log_segment_data(retry, segment_data(s1))
    await rlmm.update_remote_log_segment_metadata(
        retry.with_state(RemoteLogSegmentState.COPY_SEGMENT_FINISHED, 1)
    )
    assert rlmm.remote_log_size(TIP, 0) == size
    partition = TieredPartition(TIP, lg)
    config = RemoteLogManagerConfig()
    deleter = SegmentDeleter(config, rsm, rlmm, lambda _: None)
    await ExpirationTask(
        partition,
        config,
        rlmm,
        deleter,
        RemoteStorageMetrics(CollectorRegistry(), ObjectStoreMeter()),
    ).run_once()
    assert [m.segment_id for m in rlmm.readable_segments(TIP)] == [m.segment_id for m in copied]
    assert rlmm.superseded_segments(TIP) == []
    assert len(list(rlmm.list_remote_log_segments(TIP))) == len(copied)
    logs = [p for p in remote_files(tmp_path / "remote") if p.suffix == ".log"]
    assert len(logs) == len(copied)
    assert rlmm.remote_log_size(TIP, 0) == size
    lg.close()


async def test_remote_retention_by_bytes_deletes_the_oldest_and_moves_the_log_start(
    tmp_path: Path,
) -> None:
    lg = build_log(tmp_path / "t-0", batches=300)
    rlmm = TopicBasedRemoteLogMetadataManager(MemoryTopic(), tmp_path)
    await rlmm.start()
    rsm = local_fs(tmp_path / "remote")
    copied = await tier_rolled_segments(lg, rsm, rlmm)
    active = lg.segments[-1].size
    keep = 3  # keep about three remote segments' worth plus the local-only part
    retention = sum(m.segment_size_bytes for m in copied[-keep:]) + active
    lg.config = dataclasses.replace(lg.config, retention_bytes=retention)
    partition = TieredPartition(TIP, lg)
    config = RemoteLogManagerConfig()
    deleter = SegmentDeleter(config, rsm, rlmm, lambda _: None)
    await ExpirationTask(
        partition,
        config,
        rlmm,
        deleter,
        RemoteStorageMetrics(CollectorRegistry(), ObjectStoreMeter()),
    ).run_once()
    left = rlmm.readable_segments(TIP)
    assert [m.segment_id for m in left] == [m.segment_id for m in copied[-keep:]]
    assert lg.log_start_offset == left[0].start_offset
    assert rlmm.remote_log_size(TIP, 0) + active <= retention
    assert len([p for p in remote_files(tmp_path / "remote") if p.suffix == ".log"]) == keep
    lg.close()
