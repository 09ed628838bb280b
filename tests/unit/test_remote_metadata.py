"""Remote metadata: the segment state machine, KIP-852 running totals, overlaps, snapshots."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tierbroker.storage.remote.metadata_cache import RemoteLogMetadataCache
from tierbroker.storage.remote.segment_metadata import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    RemotePartitionDeleteState,
    TopicIdPartition,
)
from tierbroker.storage.remote.topic_based_rlmm import TopicBasedRemoteLogMetadataManager
from tierbroker.storage.topic_partition import TopicPartition

TIP = TopicIdPartition(uuid.uuid4(), TopicPartition("t", 0))
STARTED, FINISHED = (
    RemoteLogSegmentState.COPY_SEGMENT_STARTED,
    RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
)
DELETE_STARTED = RemoteLogSegmentState.DELETE_SEGMENT_STARTED
DELETE_FINISHED = RemoteLogSegmentState.DELETE_SEGMENT_FINISHED


def segment(
    start: int,
    end: int,
    epoch: int = 0,
    size: int = 100,
    state: RemoteLogSegmentState = FINISHED,
    tip: TopicIdPartition = TIP,
) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(
        segment_id=RemoteLogSegmentId.generate(tip),
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
    assert cache.segment_for_offset(TIP, 0, 5) is None
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
    # A new leader's copy covering both: epoch 0's records, then its own from 100.
    wider = dataclasses.replace(segment(0, 199, size=300), segment_leader_epochs=((0, 0), (1, 100)))
    cache.put(wider)
    assert cache.remote_log_size(TIP, 1) == 300
    superseded = {m.segment_id for m in cache.superseded_segments(TIP)}
    assert superseded == {first.segment_id, retried.segment_id, inner.segment_id}
    assert cache.segment_for_offset(TIP, 1, 150) == wider
    assert cache.segment_for_offset(TIP, 0, 50) == wider
    assert cache.segment_for_offset(TIP, 0, 150) is None  # 150 is in epoch 1
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
        self.created = False

    @property
    def num_partitions(self) -> int:
        return 4

    async def ensure_created(self) -> None:
        self.created = True

    def follow(self, on_records: Callable[[int], None]) -> None:
        pass

    async def close(self) -> None:
        pass

    async def append(self, partition: int, key: bytes, value: bytes) -> int:
        self.records.setdefault(partition, []).append((key, value))
        return len(self.records[partition]) - 1

    def read(self, partition: int, start_offset: int) -> Iterator[tuple[int, bytes, bytes | None]]:
        for offset, (key, value) in enumerate(self.records.get(partition, [])):
            if offset >= start_offset:
                yield offset, key, value

    async def fetch(
        self, partition: int, start_offset: int
    ) -> tuple[list[tuple[int, bytes, bytes | None]], int]:
        return list(self.read(partition, start_offset)), len(self.records.get(partition, []))


def test_a_restart_replays_only_events_after_the_snapshot(tmp_path: Path) -> None:
    topic = MemoryTopic()

    async def run() -> None:
        rlmm = TopicBasedRemoteLogMetadataManager(topic, tmp_path)
        await rlmm.start()
        assert topic.created  # at start, not on the first copy
        for i in range(10):
            s = segment(i * 10, i * 10 + 9, state=STARTED)
            await rlmm.add_remote_log_segment_metadata(s)
            await rlmm.update_remote_log_segment_metadata(s.with_state(FINISHED, 1))
        await rlmm.snapshot()
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


def test_an_abandoned_manager_leaves_the_events_after_its_last_snapshot_to_replay(
    tmp_path: Path,
) -> None:
    topic = MemoryTopic()

    async def run() -> None:
        rlmm = TopicBasedRemoteLogMetadataManager(topic, tmp_path)
        await rlmm.start()
        first = segment(0, 9, state=STARTED)
        await rlmm.add_remote_log_segment_metadata(first)
        await rlmm.update_remote_log_segment_metadata(first.with_state(FINISHED, 1))
        await rlmm.snapshot()
        later = segment(10, 19, state=STARTED)
        await rlmm.add_remote_log_segment_metadata(later)
        await rlmm.update_remote_log_segment_metadata(later.with_state(FINISHED, 1))
        await rlmm.abandon()  # as a crash: no snapshot at close
        again = TopicBasedRemoteLogMetadataManager(topic, tmp_path)
        await again.start()
        assert again.replayed_events == 2  # the later segment's two events
        assert [m.start_offset for m in again.readable_segments(TIP)] == [0, 10]

    asyncio.run(run())


# ---------------------------------------------------------------------------------------
# The state machine, exhaustively, at every layer that accepts a state.
# ---------------------------------------------------------------------------------------

ALL_STATES = (STARTED, FINISHED, DELETE_STARTED, DELETE_FINISHED)
# KIP-405: the allowed moves (a repeated state is a no-op and always accepted).
ALLOWED = {
    STARTED: {STARTED, FINISHED, DELETE_STARTED},
    FINISHED: {FINISHED, DELETE_STARTED},
    DELETE_STARTED: {DELETE_STARTED, DELETE_FINISHED},
    DELETE_FINISHED: {DELETE_FINISHED},
}
PATH_TO = {  # how a segment reaches each state through allowed moves
    STARTED: (STARTED,),
    FINISHED: (STARTED, FINISHED),
    DELETE_STARTED: (STARTED, FINISHED, DELETE_STARTED),
    DELETE_FINISHED: (STARTED, FINISHED, DELETE_STARTED, DELETE_FINISHED),
}


def in_state(s: RemoteLogSegmentMetadata, state: RemoteLogSegmentState) -> RemoteLogSegmentMetadata:
    """`s` moved through allowed states up to `state`."""
    m = s
    for i, step in enumerate(PATH_TO[state][1:], start=1):
        m = m.with_state(step, i)
    return m


@pytest.mark.parametrize("source", ALL_STATES, ids=lambda s: s.name)
@pytest.mark.parametrize("target", ALL_STATES, ids=lambda s: s.name)
def test_with_state_allows_exactly_kip405_moves(
    source: RemoteLogSegmentState, target: RemoteLogSegmentState
) -> None:
    m = in_state(segment(0, 9, state=STARTED), source)
    if target in ALLOWED[source]:
        moved = m.with_state(target, 99)
        assert moved.state == target and moved.segment_id == m.segment_id
        assert (moved.start_offset, moved.end_offset) == (m.start_offset, m.end_offset)
    else:
        with pytest.raises(ValueError):
            m.with_state(target, 99)


def cache_view(cache: RemoteLogMetadataCache, tip: TopicIdPartition = TIP) -> dict[str, object]:
    """Everything the cache answers about a partition."""
    return {
        "readable": [m.segment_id.id for m in cache.readable_segments(tip)],
        "all": sorted((str(m.segment_id.id), m.state) for m in cache.all_segments(tip)),
        "superseded": sorted(str(m.segment_id.id) for m in cache.superseded_segments(tip)),
        "size": [cache.remote_log_size(tip, e) for e in range(4)],
        "highest": [cache.highest_offset_for_epoch(tip, e) for e in range(4)],
        "highest_offset": cache.highest_offset(tip),
        "start_offset": cache.start_offset(tip),
        "count": cache.segment_count(tip),
    }


@pytest.mark.parametrize("source", ALL_STATES[:3], ids=lambda s: s.name)
@pytest.mark.parametrize("target", ALL_STATES, ids=lambda s: s.name)
def test_cache_applies_allowed_moves_ignores_repeats_and_refuses_the_rest(
    source: RemoteLogSegmentState, target: RemoteLogSegmentState
) -> None:
    """Through `put`: a repeat changes nothing (even with a new event time), a forbidden move
    raises and leaves the cache exactly as it was."""
    cache = RemoteLogMetadataCache()
    other = segment(100, 199, size=7)
    cache.put(other)  # a FINISHED neighbour
    s = segment(0, 99, size=1000, state=STARTED)
    for step in PATH_TO[source]:
        cache.put(in_state(s, step))
    before = cache_view(cache)
    current = in_state(s, source)
    if target == source:
        cache.put(dataclasses.replace(current, event_timestamp_ms=12345))
        assert cache_view(cache) == before  # repeated: a no-op, never counted twice
    elif target in ALLOWED[source]:
        cache.put(current.with_state(target, 50))
        view = cache_view(cache)
        assert (target == FINISHED) == (s.segment_id.id in view["readable"])  # type: ignore[operator]
        assert view["size"][0] == 7 + (1000 if target == FINISHED else 0)  # type: ignore[index]
    else:
        with pytest.raises(ValueError):
            cache.put(dataclasses.replace(current, state=target, event_timestamp_ms=50))
        assert cache_view(cache) == before


def test_a_finished_copy_repeated_is_counted_once() -> None:
    cache = RemoteLogMetadataCache()
    s = segment(0, 99, size=500, state=STARTED)
    cache.put(s)
    finished = s.with_state(FINISHED, 1)
    for t in range(5):  # a retried COPY_SEGMENT_FINISHED event
        cache.put(dataclasses.replace(finished, event_timestamp_ms=t))
    assert cache.remote_log_size(TIP, 0) == 500
    assert [m.segment_id for m in cache.readable_segments(TIP)] == [finished.segment_id]


async def test_a_deleted_segment_is_never_resurrected_by_a_late_event(tmp_path: Path) -> None:
    """After DELETE_SEGMENT_FINISHED the segment is unknown, as in Kafka: a late event for it
    (a copy that finished after its partition was deleted) is refused when published and
    skipped when found on replay, so it is never read nor counted again."""
    topic = MemoryTopic()
    rlmm = TopicBasedRemoteLogMetadataManager(topic, tmp_path)
    await rlmm.start()
    s = segment(0, 99, size=500, state=STARTED)
    for state in PATH_TO[DELETE_FINISHED]:
        moved = in_state(s, state)
        if state == STARTED:
            await rlmm.add_remote_log_segment_metadata(moved)
        else:
            await rlmm.update_remote_log_segment_metadata(moved)
    late = dataclasses.replace(s, state=FINISHED, event_timestamp_ms=99)
    with pytest.raises(ValueError, match="unknown"):
        await rlmm.update_remote_log_segment_metadata(late)
    with pytest.raises(ValueError, match="added in"):
        await rlmm.add_remote_log_segment_metadata(late)
    # The same late event written to the topic by someone else: replay skips it.
    partition = next(iter(topic.records))
    topic.records[partition].append(
        (b"k", json.dumps({"type": "segment", "metadata": late.to_json()}).encode())
    )
    replayed = TopicBasedRemoteLogMetadataManager(topic, tmp_path)
    await replayed.start()
    for m in (rlmm, replayed):
        assert m.readable_segments(TIP) == [], "a deleted segment became readable again"
        assert m.remote_log_size(TIP, 0) == 0, "a deleted segment is counted again"
        assert m.remote_log_segment_metadata(TIP, 0, 50) is None


async def test_a_refused_update_does_not_poison_the_metadata_topic(tmp_path: Path) -> None:
    """A forbidden transition raises; the broker must still start afterwards with the same
    state (the event must not be recorded, or replay must skip it)."""
    topic = MemoryTopic()
    rlmm = TopicBasedRemoteLogMetadataManager(topic, tmp_path)
    await rlmm.start()
    s = segment(0, 99, state=STARTED)
    await rlmm.add_remote_log_segment_metadata(s)
    finished = s.with_state(FINISHED, 1)
    await rlmm.update_remote_log_segment_metadata(finished)
    before = rlmm_view(rlmm)
    with pytest.raises(ValueError):  # FINISHED -> STARTED
        await rlmm.update_remote_log_segment_metadata(dataclasses.replace(finished, state=STARTED))
    assert rlmm_view(rlmm) == before
    again = TopicBasedRemoteLogMetadataManager(topic, tmp_path)  # a crash: no snapshot
    await again.start()  # must not raise
    assert rlmm_view(again) == before


# ---------------------------------------------------------------------------------------
# COPY_SEGMENT_STARTED is invisible to readers and to the size.
# ---------------------------------------------------------------------------------------


def test_copy_started_segments_are_not_read_counted_nor_ending_an_epoch() -> None:
    cache = RemoteLogMetadataCache()
    done = segment(0, 99, size=100)
    cache.put(done)
    pending = segment(100, 199, size=1_000, state=STARTED)  # a copy in flight
    overlapping = segment(0, 99, size=1_000, state=STARTED)  # a retry of a finished range
    cache.put(pending)
    cache.put(overlapping)
    assert cache.segment_for_offset(TIP, 0, 150) is None
    assert cache.segment_for_offset(TIP, 0, 50) == done
    assert cache.readable_segments(TIP) == [done]
    assert cache.remote_log_size(TIP, 0) == 100
    assert cache.highest_offset(TIP) == 99
    assert cache.highest_offset_for_epoch(TIP, 0) == 99
    assert cache.superseded_segments(TIP) == []  # a started copy supersedes nothing
    assert {m.segment_id for m in cache.all_segments(TIP)} == {
        done.segment_id,
        pending.segment_id,
        overlapping.segment_id,
    }  # but it is listed, so expiration can clean it up


# ---------------------------------------------------------------------------------------
# KIP-852: remote_log_size from running totals.
# ---------------------------------------------------------------------------------------


class _NoScanList(list):  # type: ignore[type-arg]
    def __iter__(self) -> Iterator[object]:
        raise AssertionError("remote_log_size scanned a segment list")

    def __reversed__(self) -> Iterator[object]:
        raise AssertionError("remote_log_size scanned a segment list")


class _NoScanDict(dict):  # type: ignore[type-arg]
    def __iter__(self) -> Iterator[object]:
        raise AssertionError("remote_log_size scanned the segments")

    def values(self):  # type: ignore[no-untyped-def]
        raise AssertionError("remote_log_size scanned the segments")

    def items(self):  # type: ignore[no-untyped-def]
        raise AssertionError("remote_log_size scanned the segments")

    def keys(self):  # type: ignore[no-untyped-def]
        raise AssertionError("remote_log_size scanned the segments")


async def test_remote_log_size_of_100k_segments_through_the_rlmm_never_lists_them(
    tmp_path: Path,
) -> None:
    rlmm = TopicBasedRemoteLogMetadataManager(MemoryTopic(), tmp_path)
    await rlmm.start()
    sizes = [1000 + (i * 7919) % 997 for i in range(100_000)]
    epochs = [i // 20_000 for i in range(100_000)]  # epochs 0..4
    for i in range(100_000):
        rlmm.cache.put(segment(i * 10, i * 10 + 9, epoch=epochs[i], size=sizes[i]))
    # Retention deletes the 1,000 oldest; a retried copy of a range and a contained one arrive.
    for i in range(1000):
        m = rlmm.cache.segment_for_offset(TIP, epochs[i], i * 10)
        assert m is not None
        rlmm.cache.put(m.with_state(DELETE_STARTED, 1))
    rlmm.cache.put(segment(50_000, 50_009, epoch=epochs[5000], size=1))  # retry: superseded
    rlmm.cache.put(segment(60_002, 60_005, epoch=epochs[6000], size=1))  # contained: superseded
    state = rlmm.cache._partitions[TIP]
    state.readable = _NoScanList(state.readable)
    state.starts = _NoScanList(state.starts)
    state.segments = _NoScanDict(state.segments)
    for epoch in range(5):
        pairs = enumerate(zip(sizes, epochs, strict=True))
        expected = sum(s for i, (s, e) in pairs if i >= 1000 and e <= epoch)
        assert rlmm.remote_log_size(TIP, epoch) == expected, epoch
    assert rlmm.remote_log_size(TIP, 99) == sum(sizes[1000:])
    assert rlmm.remote_log_size(TopicIdPartition(uuid.uuid4(), TopicPartition("x", 0)), 0) == 0


# ---------------------------------------------------------------------------------------
# Overlaps: neither leaked nor counted twice.
# ---------------------------------------------------------------------------------------


def test_a_retried_copy_of_the_same_range_is_counted_once_and_listed_for_deletion() -> None:
    cache = RemoteLogMetadataCache()
    original, retry = segment(0, 99, size=100), segment(0, 99, size=100)
    neighbour = segment(100, 199, size=10)
    for m in (original, neighbour, retry):
        cache.put(m)
    assert cache.remote_log_size(TIP, 0) == 110
    assert [m.segment_id for m in cache.superseded_segments(TIP)] == [retry.segment_id]
    assert cache.readable_segments(TIP) == [original, neighbour]
    assert cache.segment_count(TIP) == 3  # the retry is still known: not leaked
    for state in (DELETE_STARTED, DELETE_FINISHED):  # expiration deletes the retry
        cache.put(in_state(retry, state))
        assert cache.remote_log_size(TIP, 0) == 110
        assert cache.readable_segments(TIP) == [original, neighbour]
    assert cache.superseded_segments(TIP) == [] and cache.segment_count(TIP) == 2


@pytest.mark.parametrize("inner_first", [True, False], ids=["inner-first", "outer-first"])
@pytest.mark.parametrize(
    "inner_range", [(10, 50), (0, 50), (150, 199), (0, 199)], ids=lambda r: f"{r[0]}-{r[1]}"
)
def test_a_contained_segment_is_superseded_in_either_order(
    inner_first: bool, inner_range: tuple[int, int]
) -> None:
    cache = RemoteLogMetadataCache()
    outer = segment(0, 199, size=300)
    inner = segment(*inner_range, size=50)
    after = segment(200, 299, size=20)
    order = [inner, outer, after] if inner_first else [outer, after, inner]
    if inner_range == (0, 199) and inner_first:
        # The same range twice: whichever came first stays, the other is the duplicate.
        kept, dropped = inner, outer
    else:
        kept, dropped = outer, inner
    for m in order:
        cache.put(m)
    assert cache.readable_segments(TIP) == [kept, after]
    assert [m.segment_id for m in cache.superseded_segments(TIP)] == [dropped.segment_id]
    assert cache.remote_log_size(TIP, 0) == kept.segment_size_bytes + 20
    assert cache.segment_for_offset(TIP, 0, inner_range[0]) == kept
    assert cache.highest_offset_for_epoch(TIP, 0) == 299
    # Expiration deletes the superseded one: nothing changes for readers, nothing is left.
    cache.put(in_state(dropped, DELETE_STARTED))
    cache.put(in_state(dropped, DELETE_FINISHED))
    assert cache.readable_segments(TIP) == [kept, after]
    assert cache.remote_log_size(TIP, 0) == kept.segment_size_bytes + 20
    assert cache.superseded_segments(TIP) == [] and cache.segment_count(TIP) == 2


def test_a_wider_copy_supersedes_every_segment_it_covers() -> None:
    cache = RemoteLogMetadataCache()
    small = [segment(i * 10, i * 10 + 9, size=10) for i in range(5)]  # 0..49
    tail = segment(50, 59, size=10)
    for m in (*small, tail):
        cache.put(m)
    wide = segment(0, 49, size=45)  # a new leader's copy of the same offsets
    cache.put(wide)
    assert cache.readable_segments(TIP) == [wide, tail]
    assert {m.segment_id for m in cache.superseded_segments(TIP)} == {m.segment_id for m in small}
    assert cache.remote_log_size(TIP, 1) == 55
    assert cache.segment_count(TIP) == 7
    for m in small:
        cache.put(in_state(m, DELETE_STARTED))
        cache.put(in_state(m, DELETE_FINISHED))
    assert cache.remote_log_size(TIP, 1) == 55 and cache.segment_count(TIP) == 2
    assert cache.segment_for_offset(TIP, 0, 25) == wide


# ---------------------------------------------------------------------------------------
# highest_offset_for_epoch as segments come and go.
# ---------------------------------------------------------------------------------------


def multi_epoch(
    start: int, end: int, epochs: tuple[tuple[int, int], ...], size: int = 10
) -> RemoteLogSegmentMetadata:
    return dataclasses.replace(segment(start, end, size=size), segment_leader_epochs=epochs)


def test_highest_offset_for_epoch_with_segments_spanning_epochs_and_deletions() -> None:
    cache = RemoteLogMetadataCache()
    a = multi_epoch(0, 99, ((0, 0),))
    b = multi_epoch(100, 199, ((0, 100), (1, 150)))  # epoch 0 ends at 149, epoch 1 at 199
    c = multi_epoch(200, 299, ((1, 200), (3, 260)))  # epoch 1 ends at 259, epoch 3 at 299
    d = multi_epoch(300, 399, ((3, 300),))
    for m in (a, b, c, d):
        cache.put(m)
    assert [cache.highest_offset_for_epoch(TIP, e) for e in range(5)] == [149, 259, None, 399, None]
    cache.put(in_state(d, DELETE_STARTED))  # the newest goes (e.g. an unclean truncation)
    assert [cache.highest_offset_for_epoch(TIP, e) for e in range(5)] == [149, 259, None, 299, None]
    cache.put(in_state(a, DELETE_STARTED))  # retention, oldest first
    assert [cache.highest_offset_for_epoch(TIP, e) for e in range(5)] == [149, 259, None, 299, None]
    cache.put(in_state(b, DELETE_STARTED))
    assert [cache.highest_offset_for_epoch(TIP, e) for e in range(5)] == [
        None,
        259,
        None,
        299,
        None,
    ]
    cache.put(in_state(c, DELETE_STARTED))
    assert [cache.highest_offset_for_epoch(TIP, e) for e in range(5)] == [None] * 5
    assert cache.highest_offset(TIP) == -1 and cache.remote_log_size(TIP, 9) == 0


def test_highest_offset_for_epoch_ignores_started_and_deleted_copies() -> None:
    cache = RemoteLogMetadataCache()
    a = segment(0, 99)
    cache.put(a)
    cache.put(segment(100, 199, state=STARTED))
    assert cache.highest_offset_for_epoch(TIP, 0) == 99
    b = segment(100, 199, state=STARTED)
    cache.put(b)
    cache.put(b.with_state(FINISHED, 1))
    assert cache.highest_offset_for_epoch(TIP, 0) == 199
    cache.put(b.with_state(FINISHED, 1).with_state(DELETE_STARTED, 2))
    assert cache.highest_offset_for_epoch(TIP, 0) == 99


# ---------------------------------------------------------------------------------------
# Snapshot and replay: a restart replays only what came after the snapshot.
# ---------------------------------------------------------------------------------------


def rlmm_view(rlmm: TopicBasedRemoteLogMetadataManager) -> dict[str, object]:
    """Everything the RLMM answers, for every partition it knows."""
    view: dict[str, object] = {}
    for tip in sorted(rlmm.partitions()):
        segments = list(rlmm.list_remote_log_segments(tip))
        ends = [m.end_offset for m in segments] or [0]
        view[str(tip)] = {
            "readable": [m.to_json() for m in rlmm.readable_segments(tip)],
            "all": sorted((str(m.segment_id.id), m.state.name) for m in segments),
            "superseded": sorted(str(m.segment_id.id) for m in rlmm.superseded_segments(tip)),
            "size": [rlmm.remote_log_size(tip, e) for e in range(4)],
            "highest": [rlmm.highest_offset_for_epoch(tip, e) for e in range(4)],
            "by_offset": [
                str(m.segment_id.id) if (m := rlmm.remote_log_segment_metadata(tip, e, o)) else None
                for e in range(4)
                for o in range(0, max(ends) + 1, 5)
            ],
            "delete_state": rlmm.remote_partition_delete_state(tip),
        }
    return view


TIP_B = TopicIdPartition(uuid.uuid4(), TopicPartition("b", 3))
TIP_C = TopicIdPartition(uuid.uuid4(), TopicPartition("c", 0))


class Recorder:
    """Drives an RLMM the way the RLM does and counts the events it publishes."""

    def __init__(self, rlmm: TopicBasedRemoteLogMetadataManager) -> None:
        self.rlmm = rlmm
        self.events = 0
        self.clock = 0

    def _t(self) -> int:
        self.clock += 1
        return self.clock

    async def start(self, m: RemoteLogSegmentMetadata) -> RemoteLogSegmentMetadata:
        await self.rlmm.add_remote_log_segment_metadata(m)
        self.events += 1
        return m

    async def move(
        self, m: RemoteLogSegmentMetadata, state: RemoteLogSegmentState
    ) -> RemoteLogSegmentMetadata:
        moved = m.with_state(state, self._t())
        await self.rlmm.update_remote_log_segment_metadata(moved)
        self.events += 1
        return moved

    async def copy(self, m: RemoteLogSegmentMetadata) -> RemoteLogSegmentMetadata:
        return await self.move(await self.start(m), FINISHED)

    async def delete(self, m: RemoteLogSegmentMetadata) -> None:
        await self.move(await self.move(m, DELETE_STARTED), DELETE_FINISHED)

    async def partition_delete(
        self, tip: TopicIdPartition, state: RemotePartitionDeleteState
    ) -> None:
        await self.rlmm.put_remote_partition_delete_metadata(tip, state)
        self.events += 1


async def build_history(r: Recorder) -> dict[str, RemoteLogSegmentMetadata]:
    """A realistic mix: copies, retention, a retried copy, a contained copy, epochs, a copy in
    flight, a half-done delete, a deleted partition and one being deleted."""
    kept: dict[str, RemoteLogSegmentMetadata] = {}
    segs = [
        await r.copy(segment(i * 100, i * 100 + 99, epoch=i // 4, state=STARTED)) for i in range(10)
    ]
    await r.delete(segs[0])  # retention
    await r.copy(segment(300, 399, epoch=0, state=STARTED))  # a retried copy of a range: superseded
    await r.copy(segment(510, 540, epoch=1, state=STARTED))  # contained in segs[5]: superseded
    kept["in_flight"] = await r.start(segment(1000, 1099, epoch=2, state=STARTED))
    kept["half_deleted"] = await r.move(segs[1], DELETE_STARTED)
    kept["oldest"] = segs[2]
    for i in range(3):
        await r.copy(segment(i * 50, i * 50 + 49, state=STARTED, tip=TIP_B))
    await r.partition_delete(TIP_B, RemotePartitionDeleteState.DELETE_PARTITION_MARKED)
    c = await r.copy(segment(0, 9, state=STARTED, tip=TIP_C))
    await r.partition_delete(TIP_C, RemotePartitionDeleteState.DELETE_PARTITION_MARKED)
    await r.partition_delete(TIP_C, RemotePartitionDeleteState.DELETE_PARTITION_STARTED)
    await r.delete(c)
    await r.partition_delete(TIP_C, RemotePartitionDeleteState.DELETE_PARTITION_FINISHED)
    return kept


async def more_history(r: Recorder, kept: dict[str, RemoteLogSegmentMetadata]) -> None:
    """Events after the snapshot, some moving segments the snapshot holds."""
    await r.move(kept["in_flight"], FINISHED)
    await r.move(kept["half_deleted"], DELETE_FINISHED)
    await r.delete(kept["oldest"])  # retention goes on
    await r.copy(segment(1100, 1199, epoch=3, state=STARTED))
    await r.copy(segment(1100, 1199, epoch=3, state=STARTED))  # a retried copy after the snapshot
    await r.partition_delete(TIP_B, RemotePartitionDeleteState.DELETE_PARTITION_STARTED)


async def test_a_restart_after_a_snapshot_replays_only_newer_events_and_rebuilds_the_same_state(
    tmp_path: Path,
) -> None:
    topic = MemoryTopic()
    rlmm = TopicBasedRemoteLogMetadataManager(topic, tmp_path)
    await rlmm.start()
    r = Recorder(rlmm)
    kept = await build_history(r)
    await rlmm.snapshot()
    at_snapshot = rlmm_view(rlmm)
    before_snapshot = r.events
    await more_history(r, kept)
    after = r.events - before_snapshot
    live = rlmm_view(rlmm)
    assert live != at_snapshot

    # A crash (no close): the snapshot, then only the events after it.
    restarted = TopicBasedRemoteLogMetadataManager(topic, tmp_path)
    await restarted.start()
    assert restarted.replayed_events == after
    assert rlmm_view(restarted) == live

    # Without the snapshot every event is replayed, to the same state.
    (tmp_path / "remote-log-metadata.snapshot").unlink()
    from_zero = TopicBasedRemoteLogMetadataManager(topic, tmp_path)
    await from_zero.start()
    assert from_zero.replayed_events == r.events
    assert rlmm_view(from_zero) == live

    # A clean close snapshots everything: nothing to replay, same state again.
    await from_zero.close()
    clean = TopicBasedRemoteLogMetadataManager(topic, tmp_path)
    await clean.start()
    assert clean.replayed_events == 0
    assert rlmm_view(clean) == live


async def test_a_snapshot_of_a_superseded_copy_whose_original_is_being_deleted(
    tmp_path: Path,
) -> None:
    """Original A and retry B of one range; retention starts deleting A (its remote delete then
    fails, leaving DELETE_SEGMENT_STARTED). The snapshot must restore what the live manager
    answers, and what a replay of the same events from the start gives."""
    topic = MemoryTopic()
    rlmm = TopicBasedRemoteLogMetadataManager(topic, tmp_path)
    await rlmm.start()
    r = Recorder(rlmm)
    a = await r.copy(segment(0, 99, size=100, state=STARTED))
    await r.copy(segment(0, 99, size=100, state=STARTED))  # B: superseded by A
    await r.copy(segment(100, 199, size=100, state=STARTED))
    await r.move(a, DELETE_STARTED)
    live = rlmm_view(rlmm)
    await rlmm.snapshot()
    restarted = TopicBasedRemoteLogMetadataManager(topic, tmp_path)
    await restarted.start()
    assert restarted.replayed_events == 0
    (tmp_path / "remote-log-metadata.snapshot").unlink()
    replayed = TopicBasedRemoteLogMetadataManager(topic, tmp_path)
    await replayed.start()
    assert rlmm_view(replayed) == live, "a full replay differs from the live state"
    assert rlmm_view(restarted) == live, "the snapshot restored a different state"


async def test_an_unreadable_snapshot_falls_back_to_a_full_replay(tmp_path: Path) -> None:
    topic = MemoryTopic()
    rlmm = TopicBasedRemoteLogMetadataManager(topic, tmp_path)
    await rlmm.start()
    r = Recorder(rlmm)
    kept = await build_history(r)
    await more_history(r, kept)
    live = rlmm_view(rlmm)
    (tmp_path / "remote-log-metadata.snapshot").write_text("{not json")
    restarted = TopicBasedRemoteLogMetadataManager(topic, tmp_path)
    await restarted.start()
    assert restarted.replayed_events == r.events
    assert rlmm_view(restarted) == live
