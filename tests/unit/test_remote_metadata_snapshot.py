"""The remote-metadata snapshot file and the restart: a binary file read a chunk at a time,
events replayed a batch at a time, the event loop free between them."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

import tierbroker.storage.remote.topic_based_rlmm as topic_based_rlmm
from tests.unit.test_remote_metadata import (
    DELETE_STARTED,
    STARTED,
    TIP,
    MemoryTopic,
    Recorder,
    build_history,
    more_history,
    rlmm_view,
    segment,
)
from tests.unit.test_remote_metadata_lazy import turns_until
from tierbroker.storage.remote.metadata_cache import RemoteLogMetadataCache
from tierbroker.storage.remote.segment_metadata import (
    RemoteLogSegmentMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)
from tierbroker.storage.remote.topic_based_rlmm import TopicBasedRemoteLogMetadataManager
from tierbroker.storage.topic_partition import TopicPartition

TIPS = [TopicIdPartition(uuid.uuid4(), TopicPartition("many", p)) for p in range(4)]


def every_segment(rlmm: TopicBasedRemoteLogMetadataManager) -> list[dict[str, object]]:
    return [
        m.to_json() for tip in sorted(rlmm.partitions()) for m in rlmm.list_remote_log_segments(tip)
    ]


async def test_a_snapshot_restores_every_field_of_every_segment(tmp_path: Path) -> None:
    topic = MemoryTopic()
    rlmm = TopicBasedRemoteLogMetadataManager(topic, tmp_path)
    await rlmm.start()
    r = Recorder(rlmm)
    kept = await build_history(r)
    three_epochs = dataclasses.replace(
        segment(2000, 2999, state=STARTED), segment_leader_epochs=((4, 2000), (5, 2400), (7, 2999))
    )
    await r.copy(three_epochs)
    # KIP-917: what a plugin's copy returned, any bytes, kept with the segment.
    tagged = dataclasses.replace(segment(4000, 4999, state=STARTED), custom_metadata=b"\x00\xff")
    await r.copy(tagged)
    assert RemoteLogSegmentMetadata.from_json(tagged.to_json()) == tagged
    await r.start(
        segment(
            3000,
            3099,
            epoch=7,
            state=STARTED,
            tip=TopicIdPartition(uuid.uuid4(), TopicPartition("ünïcode.topic_name", 2**31 - 1)),
        )
    )
    await more_history(r, kept)
    await rlmm.snapshot()
    restarted = TopicBasedRemoteLogMetadataManager(topic, tmp_path)
    await restarted.start()
    assert restarted.replayed_events == 0
    assert every_segment(restarted) == every_segment(rlmm)
    assert rlmm_view(restarted) == rlmm_view(rlmm)


def truncated(data: bytes) -> bytes:
    return data[:-7]


def flipped(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0x10]) + data[middle + 1 :]


def extended(data: bytes) -> bytes:
    return data + b"\0"


def json_version_2(data: bytes) -> bytes:
    return json.dumps({"version": 2, "next_offsets": {}, "segments": []}).encode()


@pytest.mark.parametrize("damage", [truncated, flipped, extended, json_version_2])
async def test_a_damaged_snapshot_is_ignored_whole_and_the_topic_replayed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: Callable[[bytes], bytes]
) -> None:
    topic = MemoryTopic()
    rlmm = TopicBasedRemoteLogMetadataManager(topic, tmp_path)
    await rlmm.start()
    r = Recorder(rlmm)
    await more_history(r, await build_history(r))
    await rlmm.snapshot()
    rlmm.snapshot_path.write_bytes(damage(rlmm.snapshot_path.read_bytes()))
    caplog.set_level(logging.WARNING)
    restarted = TopicBasedRemoteLogMetadataManager(topic, tmp_path)
    await restarted.start()
    assert restarted.replayed_events == r.events
    assert rlmm_view(restarted) == rlmm_view(rlmm)
    warnings = [rec.getMessage() for rec in caplog.records]
    assert any(str(rlmm.snapshot_path) in w for w in warnings)
    # Nothing half-restored was left for the replay to trip over.
    assert not [w for w in warnings if "skipping" in w]


async def test_segments_share_their_partitions_topic_id_partition(tmp_path: Path) -> None:
    topic = MemoryTopic()
    rlmm = TopicBasedRemoteLogMetadataManager(topic, tmp_path)
    await rlmm.start()
    r = Recorder(rlmm)
    for i in range(12):
        tip = TIPS[i % 4]
        await r.copy(segment(i * 10, i * 10 + 9, state=STARTED, tip=dataclasses.replace(tip)))
    await rlmm.snapshot()
    await r.copy(segment(500, 509, state=STARTED, tip=dataclasses.replace(TIPS[0])))

    restarted = TopicBasedRemoteLogMetadataManager(topic, tmp_path)  # the snapshot, then replay
    await restarted.start()
    rlmm.snapshot_path.unlink()
    replayed = TopicBasedRemoteLogMetadataManager(topic, tmp_path)  # replay only
    await replayed.start()
    for manager in (rlmm, restarted, replayed):
        for tip in manager.partitions():
            segments = list(manager.list_remote_log_segments(tip))
            assert len(segments) >= 3
            assert len({id(m.topic_id_partition) for m in segments}) == 1, tip


def test_the_cache_keeps_one_topic_id_partition_per_partition() -> None:
    cache = RemoteLogMetadataCache()
    first = segment(0, 9, tip=dataclasses.replace(TIP))
    second = segment(10, 19, tip=dataclasses.replace(TIP))
    cache.put(first)
    cache.put(second)
    cache.put(second.with_state(DELETE_STARTED, 5))
    [a] = cache.readable_segments(TIP)
    [b] = [m for m in cache.all_segments(TIP) if m.state == DELETE_STARTED]
    assert a == first and b == second.with_state(DELETE_STARTED, 5)
    assert a.topic_id_partition is b.topic_id_partition


async def test_start_restores_nothing_and_the_loader_loads_assigned_partitions_in_turns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(topic_based_rlmm, "_SEGMENTS_PER_CHUNK", 2)
    monkeypatch.setattr(topic_based_rlmm, "_SEGMENTS_LOADED_WHEN_ASKED", 0)  # the loader alone
    monkeypatch.setattr(topic_based_rlmm, "_EVENTS_PER_BATCH", 3)
    topic = MemoryTopic()
    rlmm = TopicBasedRemoteLogMetadataManager(topic, tmp_path)
    await rlmm.start()
    r = Recorder(rlmm)
    for i in range(20):
        await r.copy(segment(i * 10, i * 10 + 9, state=STARTED, tip=TIPS[i % 4]))
    await rlmm.snapshot()
    for i in range(20, 30):
        await r.copy(segment(i * 10, i * 10 + 9, state=STARTED, tip=TIPS[i % 4]))
    after_snapshot = 20

    restarted = TopicBasedRemoteLogMetadataManager(topic, tmp_path)
    seen: list[tuple[int, int]] = []
    late: list[str] = []

    async def watch() -> None:
        while True:
            restored = sum(restarted.cache.segment_count(t) for t in restarted.cache.partitions())
            seen.append((restored, restarted.replayed_events))
            if restarted.replayed_events and not late:
                # Another broker's copy lands while the replay is under way.
                late.append("copied")
                await r.copy(segment(900, 909, state=STARTED, tip=TIPS[1]))
            await asyncio.sleep(0)

    watcher = asyncio.create_task(watch())
    await restarted.start()
    assert {restored for restored, _ in seen} == {0}  # the segments wait in the snapshot
    assert any(0 < replayed < after_snapshot for _, replayed in seen), seen  # in batches
    assert late and restarted.replayed_events == after_snapshot + 2
    assert sorted(restarted.partitions()) == sorted(TIPS)

    # Led and followed partitions are loaded by the loader, a chunk per turn; until then
    # they are not ready, and the others stay in the snapshot file.
    seen.clear()
    restarted.on_partition_leadership_changes([TIPS[0]], [TIPS[1]])
    assert not restarted.is_ready(TIPS[0]) and not restarted.is_ready(TIPS[1])
    await turns_until(
        lambda: restarted.is_ready(TIPS[0]) and restarted.is_ready(TIPS[1]), "both loaded"
    )
    watcher.cancel()
    with pytest.raises(asyncio.CancelledError):
        await watcher
    assert any(0 < restored < 10 for restored, _ in seen), seen  # loaded in chunks
    assert sorted(restarted.cache.partitions()) == sorted(TIPS[:2])
    assert rlmm_view(restarted) == rlmm_view(rlmm)  # the others loaded as they are asked about
    await restarted.close()


async def test_a_snapshot_copied_over_several_turns_is_the_state_of_one_instant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(topic_based_rlmm, "_SEGMENTS_PER_CAPTURE", 1)  # a turn per partition
    topic = MemoryTopic()
    rlmm = TopicBasedRemoteLogMetadataManager(topic, tmp_path)
    await rlmm.start()
    r = Recorder(rlmm)
    copies = [
        await r.copy(segment(i * 10, i * 10 + 9, state=STARTED, tip=TIPS[i % 4])) for i in range(8)
    ]
    at_start = rlmm_view(rlmm)
    records_at_start = {p: list(records) for p, records in topic.records.items()}

    writing = asyncio.create_task(rlmm.snapshot())
    await asyncio.sleep(0)  # the first partition is copied; the others wait their turn
    assert not writing.done()
    await r.copy(segment(100, 109, state=STARTED, tip=TIPS[0]))  # copied already
    await r.delete(copies[2])  # TIPS[2]: not copied yet
    await r.partition_delete(TIPS[3], RemotePartitionDeleteState.DELETE_PARTITION_MARKED)
    new = TopicIdPartition(uuid.uuid4(), TopicPartition("new", 0))
    await r.copy(segment(0, 9, state=STARTED, tip=new))
    await writing

    caplog.set_level(logging.WARNING)
    as_of_start = MemoryTopic()
    as_of_start.records = records_at_start
    from_snapshot = TopicBasedRemoteLogMetadataManager(as_of_start, tmp_path)
    await from_snapshot.start()
    assert from_snapshot.replayed_events == 0
    assert rlmm_view(from_snapshot) == at_start
    restarted = TopicBasedRemoteLogMetadataManager(topic, tmp_path)
    await restarted.start()
    assert rlmm_view(restarted) == rlmm_view(rlmm) != at_start
    assert not caplog.records  # no event was both in the snapshot and replayed
