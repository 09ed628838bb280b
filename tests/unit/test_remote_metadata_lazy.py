"""Remote metadata loaded lazily after a restart: a partition's segments stay in the snapshot
until needed, and a partition loaded late answers as one restored eagerly would."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

import tierbroker.storage.remote.topic_based_rlmm as topic_based_rlmm
from tests.unit.test_remote_metadata import (
    STARTED,
    TIP,
    TIP_B,
    MemoryTopic,
    Recorder,
    build_history,
    more_history,
    rlmm_view,
    segment,
)
from tierbroker.storage.remote.metadata_snapshot import SnapshotFile
from tierbroker.storage.remote.segment_metadata import TopicIdPartition
from tierbroker.storage.remote.topic_based_rlmm import TopicBasedRemoteLogMetadataManager
from tierbroker.storage.topic_partition import TopicPartition

QUIET = TopicIdPartition(uuid.uuid4(), TopicPartition("quiet", 0))


async def turns_until(condition: Callable[[], bool], what: str) -> None:
    """Give the loop turns, one at a time, until `condition` holds."""
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"no turn brought {what}")


async def history_after_a_snapshot(
    tmp_path: Path,
) -> tuple[MemoryTopic, TopicBasedRemoteLogMetadataManager]:
    """A live RLMM whose snapshot misses its last events (a crash after them), as a broker
    that restarts finds it: some of its partitions' events wait for their sections."""
    topic = MemoryTopic()
    rlmm = TopicBasedRemoteLogMetadataManager(topic, tmp_path)
    await rlmm.start()
    r = Recorder(rlmm)
    kept = await build_history(r)
    for i in range(20, 40):  # enough segments for several chunks
        await r.copy(segment(i * 100, i * 100 + 99, epoch=4, state=STARTED))
    for i in range(10):  # no event after the snapshot
        await r.copy(segment(i * 100, i * 100 + 99, state=STARTED, tip=QUIET))
    await rlmm.snapshot()
    await more_history(r, kept)
    return topic, rlmm


async def restart(topic: MemoryTopic, tmp_path: Path) -> TopicBasedRemoteLogMetadataManager:
    restarted = TopicBasedRemoteLogMetadataManager(topic, tmp_path)
    await restarted.start()
    return restarted


async def test_a_partition_is_loaded_by_the_first_question_about_it(tmp_path: Path) -> None:
    topic, rlmm = await history_after_a_snapshot(tmp_path)
    restarted = await restart(topic, tmp_path)
    assert restarted.cache.partitions() == []  # nothing decoded at start
    assert sorted(restarted.partitions()) == sorted(rlmm.partitions())

    assert restarted.readable_segments(TIP) == rlmm.readable_segments(TIP)
    assert restarted.cache.partitions() == [TIP]  # that partition alone
    assert rlmm_view(restarted) == rlmm_view(rlmm)
    await restarted.close()


async def test_the_loader_and_a_question_share_one_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(topic_based_rlmm, "_SEGMENTS_PER_CHUNK", 3)
    monkeypatch.setattr(topic_based_rlmm, "_SEGMENTS_LOADED_WHEN_ASKED", 0)  # the loader alone
    topic, rlmm = await history_after_a_snapshot(tmp_path)
    restarted = await restart(topic, tmp_path)
    restarted.on_partition_leadership_changes([TIP], [TIP_B])
    await turns_until(lambda: restarted.cache.segment_count(TIP) > 0, "the loader's first chunk")
    assert not restarted.is_ready(TIP)
    # A fetch asks in the middle of the load: it finishes the load, no segment twice.
    assert restarted.remote_log_size(TIP, 4) == rlmm.remote_log_size(TIP, 4)
    await turns_until(lambda: restarted.is_ready(TIP_B), "the loader to load the other")
    assert restarted.is_ready(TIP)
    assert rlmm_view(restarted) == rlmm_view(rlmm)
    await restarted.close()


async def test_a_snapshot_copies_the_sections_of_partitions_never_loaded(tmp_path: Path) -> None:
    topic, rlmm = await history_after_a_snapshot(tmp_path)
    restarted = await restart(topic, tmp_path)
    restarted.readable_segments(TIP)
    # TIP_B's waiting event is applied (the snapshot's offsets pass it); the others are
    # their sections copied from the file read at start, which the new one replaces.
    await restarted.snapshot()
    assert sorted(restarted.cache.partitions()) == sorted([TIP, TIP_B])
    again = await restart(topic, tmp_path)
    assert again.replayed_events == 0
    assert rlmm_view(again) == rlmm_view(restarted) == rlmm_view(rlmm)
    await restarted.close()
    await again.close()


def held(path: Path) -> int:
    """Descriptors of this process open on `path`, or on what it was before a rename."""
    links = (os.readlink(fd) for fd in Path("/proc/self/fd").iterdir() if fd.is_symlink())
    return sum(1 for link in links if link.removesuffix(" (deleted)") == str(path))


async def test_the_snapshot_read_at_start_is_closed_once_every_partition_is_loaded(
    tmp_path: Path,
) -> None:
    topic, rlmm = await history_after_a_snapshot(tmp_path)
    restarted = await restart(topic, tmp_path)
    assert held(restarted.snapshot_path) == 1
    await restarted.snapshot()  # replaces it: QUIET, not loaded, is still read from it
    assert held(restarted.snapshot_path) == 1
    assert rlmm_view(restarted) == rlmm_view(rlmm)  # loads the rest
    assert held(restarted.snapshot_path) == 0
    await restarted.close()


async def test_a_snapshot_taken_during_a_load_holds_the_partition_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(topic_based_rlmm, "_SEGMENTS_PER_CHUNK", 3)
    monkeypatch.setattr(topic_based_rlmm, "_SEGMENTS_LOADED_WHEN_ASKED", 0)  # the loader alone
    topic, rlmm = await history_after_a_snapshot(tmp_path)
    restarted = await restart(topic, tmp_path)
    restarted.on_partition_leadership_changes([QUIET], [])
    await turns_until(lambda: restarted.cache.segment_count(QUIET) > 0, "the first chunk")
    assert not restarted.is_ready(QUIET)
    assert sorted(restarted.partitions()) == sorted(rlmm.partitions())  # each once
    await restarted.snapshot()
    written = SnapshotFile.open(restarted.snapshot_path)
    try:
        tips = [section.tip for section in written.sections]
    finally:
        written.close()
    assert sorted(tips) == sorted(rlmm.partitions())
    again = await restart(topic, tmp_path)
    assert rlmm_view(again) == rlmm_view(rlmm)
    await restarted.close()
    await again.close()


async def test_a_small_partition_is_loaded_when_asked_if_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its tiering asks before it copies: a small load costs less than the failed attempt
    and the retry that waiting for the loader would."""
    monkeypatch.setattr(topic_based_rlmm, "_SEGMENTS_LOADED_WHEN_ASKED", 10)
    topic, rlmm = await history_after_a_snapshot(tmp_path)
    restarted = await restart(topic, tmp_path)
    restarted.consumer.assign([QUIET, TIP])  # their metadata read, without the loader
    await turns_until(
        lambda: restarted.consumer.is_ready(QUIET) and restarted.consumer.is_ready(TIP),
        "the metadata partitions read",
    )
    assert restarted.cache.partitions() == []
    assert restarted.is_ready(QUIET)  # 10 segments: loaded at once
    assert not restarted.is_ready(TIP)  # more: left to the loader
    assert restarted.cache.partitions() == [QUIET]
    assert rlmm_view(restarted) == rlmm_view(rlmm)
    await restarted.close()
