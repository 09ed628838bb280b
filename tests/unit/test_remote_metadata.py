"""Remote metadata: the segment state machine, KIP-852 running totals, overlaps, snapshots."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage.remote.metadata_cache import RemoteLogMetadataCache
from storage.remote.segment_metadata import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    TopicIdPartition,
)
from storage.remote.topic_based_rlmm import TopicBasedRemoteLogMetadataManager
from storage.topic_partition import TopicPartition

TIP = TopicIdPartition(uuid.uuid4(), TopicPartition("t", 0))
STARTED, FINISHED = (
    RemoteLogSegmentState.COPY_SEGMENT_STARTED,
    RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
)
DELETE_STARTED = RemoteLogSegmentState.DELETE_SEGMENT_STARTED
DELETE_FINISHED = RemoteLogSegmentState.DELETE_SEGMENT_FINISHED


def segment(
    start: int, end: int, epoch: int = 0, size: int = 100, state: RemoteLogSegmentState = FINISHED
) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(
        segment_id=RemoteLogSegmentId.generate(TIP),
        start_offset=start,
        end_offset=end,
        max_timestamp_ms=end,
        broker_id=0,
        event_timestamp_ms=0,
        segment_size_bytes=size,
        segment_leader_epochs=((epoch, start),),
        state=state,
    )


def test_transitions_follow_the_state_machine() -> None:
    s = segment(0, 9, state=STARTED)
    assert s.with_state(FINISHED, 1).state == FINISHED
    assert s.with_state(STARTED, 1).state == STARTED  # repeating a state is allowed
    with pytest.raises(ValueError, match="not allowed"):
        s.with_state(DELETE_FINISHED, 1)
    with pytest.raises(ValueError, match="not allowed"):
        s.with_state(FINISHED, 1).with_state(STARTED, 2)


def test_started_segments_are_never_read_nor_counted() -> None:
    cache = RemoteLogMetadataCache()
    cache.put(segment(0, 9, state=STARTED))
    assert cache.segment_for_offset(TIP, 5) is None
    assert cache.remote_log_size(TIP, 0) == 0
    assert cache.highest_offset(TIP) == -1


def test_remote_log_size_at_100k_segments_comes_from_running_totals() -> None:
    cache = RemoteLogMetadataCache()
    for i in range(100_000):
        cache.put(segment(i * 10, i * 10 + 9, epoch=i // 25_000, size=1000 + i % 7))
    expected = sum(1000 + i % 7 for i in range(100_000))

    class NoScan(list):  # type: ignore[type-arg]
        def __iter__(self) -> Iterator[object]:
            raise AssertionError("remote_log_size listed the segments")

    state = cache._partitions[TIP]
    state.readable = NoScan(state.readable)
    assert cache.remote_log_size(TIP, 3) == expected
    assert cache.remote_log_size(TIP, 1) == sum(1000 + i % 7 for i in range(50_000))
    assert cache.highest_offset_for_epoch(TIP, 2) == 75_000 * 10 - 1


def test_overlaps_are_neither_leaked_nor_counted_twice() -> None:
    cache = RemoteLogMetadataCache()
    first = segment(0, 99)
    cache.put(first)
    retried = segment(0, 99)  # a retried copy of the same range
    cache.put(retried)
    inner = segment(10, 50)  # wholly inside
    cache.put(inner)
    wider = segment(0, 199, epoch=1, size=300)  # a new leader's copy covering both
    cache.put(wider)
    assert cache.remote_log_size(TIP, 1) == 300
    superseded = {m.segment_id for m in cache.superseded_segments(TIP)}
    assert superseded == {first.segment_id, retried.segment_id, inner.segment_id}
    assert cache.segment_for_offset(TIP, 150) == wider
    for m in cache.superseded_segments(TIP):  # expiration deletes them
        cache.put(m.with_state(DELETE_STARTED, 1))
        cache.put(m.with_state(DELETE_STARTED, 1).with_state(DELETE_FINISHED, 2))
    assert cache.superseded_segments(TIP) == [] and cache.segment_count(TIP) == 1


def test_highest_offset_per_epoch_after_deletions() -> None:
    cache = RemoteLogMetadataCache()
    a, b, c = segment(0, 9, epoch=0), segment(10, 19, epoch=0), segment(20, 29, epoch=1)
    for s in (a, b, c):
        cache.put(s)
    assert cache.highest_offset_for_epoch(TIP, 0) == 19
    cache.put(b.with_state(DELETE_STARTED, 1))
    assert cache.highest_offset_for_epoch(TIP, 0) == 9
    cache.put(a.with_state(DELETE_STARTED, 1))
    assert cache.highest_offset_for_epoch(TIP, 0) is None
    assert cache.highest_offset_for_epoch(TIP, 1) == 29


class MemoryTopic:
    def __init__(self) -> None:
        self.records: dict[int, list[tuple[bytes, bytes]]] = {}

    @property
    def num_partitions(self) -> int:
        return 4

    async def append(self, partition: int, key: bytes, value: bytes) -> int:
        self.records.setdefault(partition, []).append((key, value))
        return len(self.records[partition]) - 1

    def read(self, partition: int, start_offset: int) -> Iterator[tuple[int, bytes, bytes | None]]:
        for offset, (key, value) in enumerate(self.records.get(partition, [])):
            if offset >= start_offset:
                yield offset, key, value


def test_a_restart_replays_only_events_after_the_snapshot(tmp_path: Path) -> None:
    topic = MemoryTopic()

    async def run() -> None:
        rlmm = TopicBasedRemoteLogMetadataManager(topic, tmp_path)
        await rlmm.start()
        for i in range(10):
            s = segment(i * 10, i * 10 + 9, state=STARTED)
            await rlmm.add_remote_log_segment_metadata(s)
            await rlmm.update_remote_log_segment_metadata(s.with_state(FINISHED, 1))
        rlmm.snapshot()
        later = segment(100, 109, state=STARTED)
        await rlmm.add_remote_log_segment_metadata(later)
        await rlmm.update_remote_log_segment_metadata(later.with_state(FINISHED, 1))
        await rlmm.close()
        again = TopicBasedRemoteLogMetadataManager(topic, tmp_path)
        await again.start()
        assert again.replayed_events == 0  # close() snapshotted everything
        assert again.remote_log_size(TIP, 0) == rlmm.remote_log_size(TIP, 0) == 1100
        assert [m.start_offset for m in again.readable_segments(TIP)] == list(range(0, 110, 10))
        (tmp_path / "remote-log-metadata.snapshot").unlink()
        from_zero = TopicBasedRemoteLogMetadataManager(topic, tmp_path)
        await from_zero.start()
        assert from_zero.replayed_events == 22 and from_zero.remote_log_size(TIP, 0) == 1100

    asyncio.run(run())
