"""Snapshots and checkpoints are written off the event loop, one at a time, and read back whole:
the remote-metadata snapshot and the log dirs' offset checkpoints."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import tierbroker.storage.remote.topic_based_rlmm as topic_based_rlmm
from tests.unit.test_remote_metadata import (
    STARTED,
    MemoryTopic,
    Recorder,
    build_history,
    more_history,
    rlmm_view,
    segment,
)
from tierbroker.broker.server.broker_server import BrokerServer
from tierbroker.storage.checkpoints import OffsetCheckpointFile
from tierbroker.storage.log_manager import (
    HIGH_WATERMARK_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    LogManager,
)
from tierbroker.storage.remote.topic_based_rlmm import TopicBasedRemoteLogMetadataManager
from tierbroker.storage.topic_partition import TopicPartition


class GatedWrites:
    """Wraps `write_snapshot`: records each write's thread, holds writes while `gate` is
    clear, and counts writes running at once."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.real = topic_based_rlmm.write_snapshot
        self.gate = threading.Event()
        self.gate.set()
        self.threads: list[int] = []
        self.running = 0
        self.most_at_once = 0
        self.fail_next = False
        self._lock = threading.Lock()
        monkeypatch.setattr(topic_based_rlmm, "write_snapshot", self)

    def __call__(self, path: Path, state: Any) -> None:
        with self._lock:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
            self.threads.append(threading.get_ident())
        try:
            assert self.gate.wait(10), "the test never opened the gate"
            if self.fail_next:
                self.fail_next = False
                raise OSError("disk full")
            self.real(path, state)
        finally:
            with self._lock:
                self.running -= 1


async def test_a_snapshot_written_in_an_executor_round_trips(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes = GatedWrites(monkeypatch)
    topic = MemoryTopic()
    rlmm = TopicBasedRemoteLogMetadataManager(topic, tmp_path)
    rlmm.configure({"snapshot.interval.ms": "0"})
    await rlmm.start()
    r = Recorder(rlmm)
    kept = await build_history(r)
    rlmm.maybe_snapshot()
    assert rlmm._writing is not None
    await rlmm._writing
    assert writes.threads and threading.get_ident() not in writes.threads
    at_snapshot = rlmm_view(rlmm)
    await more_history(r, kept)  # after the snapshot: replayed from the topic

    restarted = TopicBasedRemoteLogMetadataManager(topic, tmp_path)  # a crash: no close
    await restarted.start()
    assert restarted.replayed_events > 0
    assert rlmm_view(restarted) == rlmm_view(rlmm) != at_snapshot


async def test_one_write_at_a_time_and_close_waits_for_it_then_writes_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes = GatedWrites(monkeypatch)
    topic = MemoryTopic()
    rlmm = TopicBasedRemoteLogMetadataManager(topic, tmp_path)
    rlmm.configure({"snapshot.interval.ms": "0"})
    await rlmm.start()
    r = Recorder(rlmm)
    await build_history(r)
    writes.gate.clear()
    rlmm.maybe_snapshot()
    await asyncio.sleep(0.05)  # the write starts in its thread and waits at the gate
    later = await r.copy(segment(5000, 5099, epoch=9, state=STARTED))  # after the state copy
    for _ in range(3):
        rlmm.maybe_snapshot()  # a write is in flight: none starts
    closing = asyncio.ensure_future(rlmm.close())
    await asyncio.sleep(0.05)
    assert not closing.done(), "close() returned while a snapshot was being written"
    assert len(writes.threads) == 1
    writes.gate.set()
    await asyncio.wait_for(closing, 10)
    assert len(writes.threads) == 2 and writes.most_at_once == 1

    restarted = TopicBasedRemoteLogMetadataManager(topic, tmp_path)
    await restarted.start()
    assert restarted.replayed_events == 0  # the write at close held the later copy
    assert rlmm_view(restarted) == rlmm_view(rlmm)
    assert later.segment_id.id in {
        m.segment_id.id for m in restarted.readable_segments(later.topic_id_partition)
    }


async def test_a_failed_write_is_retried_by_the_next_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes = GatedWrites(monkeypatch)
    topic = MemoryTopic()
    rlmm = TopicBasedRemoteLogMetadataManager(topic, tmp_path)
    rlmm.configure({"snapshot.interval.ms": "0"})
    await rlmm.start()
    await build_history(Recorder(rlmm))
    writes.fail_next = True
    rlmm.maybe_snapshot()
    assert rlmm._writing is not None
    await asyncio.wait([rlmm._writing])
    assert not rlmm.snapshot_path.exists()
    rlmm.maybe_snapshot()  # nothing changed since, but nothing was written either
    await rlmm._writing
    restarted = TopicBasedRemoteLogMetadataManager(topic, tmp_path)
    await restarted.start()
    assert restarted.replayed_events == 0 and rlmm_view(restarted) == rlmm_view(rlmm)


# Offset checkpoints -------------------------------------------------------------------------


def log_manager_with_offsets(tmp_path: Path) -> LogManager:
    manager = LogManager([tmp_path])
    # an empty dir, loaded whole: its checkpoints count
    manager.load_logs(lambda tp, topic_id: None)
    for partition, (start, recovery, hw) in enumerate([(0, 5, 7), (3, 4, 9)]):
        tp = TopicPartition("t", partition)
        manager.logs[tp] = SimpleNamespace(  # type: ignore[assignment]
            dir=tmp_path / f"t-{partition}",
            log_start_offset=start,
            recovery_point=recovery,
            high_watermark=hw,
        )
    return manager


def read_checkpoints(log_dir: Path) -> list[dict[TopicPartition, int]]:
    return [
        OffsetCheckpointFile(log_dir / name).read()
        for name in (
            LOG_START_OFFSET_CHECKPOINT,
            RECOVERY_POINT_CHECKPOINT,
            HIGH_WATERMARK_CHECKPOINT,
        )
    ]


async def test_the_periodic_checkpoint_is_written_off_the_loop_and_waited_for_on_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = log_manager_with_offsets(tmp_path)
    gate = threading.Event()
    threads: list[int] = []
    real = manager.write_checkpoints

    def gated(offsets: Any) -> None:
        threads.append(threading.get_ident())
        assert gate.wait(10), "the test never opened the gate"
        real(offsets)

    monkeypatch.setattr(manager, "write_checkpoints", gated)
    server: Any = SimpleNamespace(log_manager=manager)
    job = asyncio.ensure_future(BrokerServer._checkpoint(server))
    await asyncio.sleep(0.05)
    # The offsets were copied when the job ran: a later move is not in this write.
    manager.logs[TopicPartition("t", 0)].high_watermark = 8  # type: ignore[misc]
    job.cancel()  # the scheduler stops
    await asyncio.sleep(0.05)
    assert not job.done(), "the job ended while its write was still running"
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(job, 10)
    assert threads and threading.get_ident() not in threads
    t0, t1 = TopicPartition("t", 0), TopicPartition("t", 1)
    assert read_checkpoints(tmp_path) == [{t0: 0, t1: 3}, {t0: 5, t1: 4}, {t0: 7, t1: 9}]
    manager.checkpoint()  # the shutdown's checkpoint comes after, and wins
    assert read_checkpoints(tmp_path)[2] == {t0: 8, t1: 9}
