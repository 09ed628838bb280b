"""Partition state once led, and remote segment metadata once stored, are moved out of the
collector's walks, which is only safe because a deleted topic's state and a deleted
segment are freed by reference counting alone: no cycles."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.broker import running_broker
from tests.unit.test_remote_metadata import (
    DELETE_FINISHED,
    DELETE_STARTED,
    FINISHED,
    STARTED,
    TIP,
    in_state,
    segment,
)
from tierbroker.broker.replication.replica_manager import FREEZE_EVERY_PARTITIONS
from tierbroker.protocol.codec import RecordsSplicer
from tierbroker.storage.long_lived import freeze_heap_in_this_process
from tierbroker.storage.remote.metadata_cache import FREEZE_EVERY_SEGMENTS, RemoteLogMetadataCache
from tierbroker.storage.remote.segment_metadata import RemoteLogSegmentMetadata
from tierbroker.storage.topic_partition import TopicPartition

TIERED = {"remote.storage.enable": "true", "segment.bytes": str(1 << 20)}


@pytest.fixture
def freezing() -> Iterator[None]:
    """The heap may be frozen, as in `tierbroker serve`'s process."""
    freeze_heap_in_this_process()
    yield
    freeze_heap_in_this_process(enabled=False)


def tierbroker_objects() -> dict[int, object]:
    return {
        id(o): o
        for o in gc.get_objects()
        # a metaclass's `__module__` seen on its class can be a descriptor, not a str
        if isinstance(module := type(o).__module__, str) and module.startswith("tierbroker.")
    }


async def test_a_deleted_topic_is_freed_without_the_cyclic_collector(tmp_path: Path) -> None:
    async with running_broker(
        tmp_path,
        "remote.log.storage.system.enable=true",
        f"rsm.config.dir={tmp_path / 'remote'}",
    ) as server:
        gc.collect()
        before = tierbroker_objects()
        await server.admin.create_topic("t", 3, 1, TIERED)
        await server.replicas.applied.wait()
        # A request's splicer is not the topic's: a session's shared cluster may run in this
        # process too, its replica fetchers' requests each holding one while they wait.
        created = [
            o
            for key, o in tierbroker_objects().items()
            if key not in before and not isinstance(o, RecordsSplicer)
        ]
        del before
        kinds = {type(o).__name__ for o in created}
        assert {"Partition", "Log", "LogSegment", "CopyTask", "ExpirationTask"} <= kinds
        refs = []
        for o in created:
            try:
                refs.append(weakref.ref(o))
            except TypeError:
                pass  # slotted, without weak references: not checked
        del created, o
        assert TopicPartition("t", 0) in server.replicas.partitions
        gc.disable()
        try:
            await server.admin.delete_topic("t")
            await server.replicas.applied.wait()
            for _ in range(3):  # the loop drops its references to finished futures
                await asyncio.sleep(0)
            alive = [type(o).__name__ for r in refs if (o := r()) is not None]
            assert alive == []
        finally:
            gc.enable()


async def test_leading_partitions_freezes_them(tmp_path: Path, freezing: None) -> None:
    # Without tiering no internal topic is led after the freeze at start: the count of
    # partitions led starts from 0 here.
    async with running_broker(tmp_path, "remote.log.storage.system.enable=false") as server:
        gc.unfreeze()
        await server.admin.create_topic("t", FREEZE_EVERY_PARTITIONS, 1, {})
        await server.replicas.applied.wait()
        frozen = gc.get_freeze_count()
        led = server.replicas.partitions[TopicPartition("t", FREEZE_EVERY_PARTITIONS - 1)]
        assert frozen > 0
        # the permanent generation is not in gc.get_objects(): a led partition is there
        assert not any(o is led for o in gc.get_objects())


def segment_metadata_objects() -> int:
    return sum(1 for o in gc.get_objects() if isinstance(o, RemoteLogSegmentMetadata))


def test_a_deleted_remote_segment_is_freed_without_the_cyclic_collector() -> None:
    cache = RemoteLogMetadataCache()
    gc.collect()
    before = segment_metadata_objects()
    gc.disable()
    try:
        for start in range(0, 1000, 100):
            started = segment(start, start + 99, state=STARTED)
            cache.put(started)
            cache.put(in_state(started, FINISHED))
        assert segment_metadata_objects() >= before + 10
        for s in cache.readable_segments(TIP):
            cache.put(in_state(s, DELETE_STARTED))
            cache.put(in_state(s, DELETE_FINISHED))
        del started, s
        assert segment_metadata_objects() == before
    finally:
        gc.enable()


def test_storing_segment_states_freezes_them(freezing: None) -> None:
    gc.unfreeze()
    cache = RemoteLogMetadataCache()
    for start in range(0, FREEZE_EVERY_SEGMENTS * 100, 100):  # a freeze's worth
        cache.put(segment(start, start + 99, state=STARTED))
    assert gc.get_freeze_count() > 0
    first = next(cache.all_segments(TIP))
    assert not any(o is first for o in gc.get_objects())  # in the permanent generation


async def test_a_broker_in_a_process_it_does_not_own_never_freezes_the_heap(
    tmp_path: Path,
) -> None:
    gc.unfreeze()
    async with running_broker(
        tmp_path,
        "remote.log.storage.system.enable=true",
        f"rsm.config.dir={tmp_path / 'remote'}",
    ) as server:
        await server.admin.create_topic("t", FREEZE_EVERY_PARTITIONS, 1, {})
        await server.replicas.applied.wait()
        assert gc.get_freeze_count() == 0
