"""Deleting a log (a replica moved away, a topic deleted): its path is free at once, its
files are unlinked in a worker thread when the broker's event loop calls, and a deleted
log's directory left by a stop or crash is removed at the next start."""

from __future__ import annotations

import asyncio
import shutil
import threading
import uuid
from pathlib import Path

import pytest

from tierbroker.protocol.records import build_batch
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.log_manager import DELETED_DIR_SUFFIX, LogManager
from tierbroker.storage.topic_partition import TopicPartition

TP = TopicPartition("moved", 0)
TOPIC_ID = uuid.uuid4()
CONFIG = LogConfig(segment_bytes=4096)


async def filled(log_dir: Path) -> LogManager:
    manager = LogManager([log_dir])
    manager.load_logs(lambda _tp, _id: CONFIG)
    await manager.create_logs([TP], TOPIC_ID, CONFIG, leader_epoch=0)
    for i in range(20):  # several segments
        batch = build_batch([(None, b"%d" % i * 500, [], 1_000)], base_offset=0)
        manager.logs[TP].append_as_leader(bytearray(batch), 0)
    return manager


def test_a_deleted_log_is_unlinked_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    removed_by: list[int] = []
    rmtree = shutil.rmtree

    async def delete() -> tuple[bool, bool]:
        manager = await filled(tmp_path)
        path = manager.logs[TP].dir
        loop = asyncio.get_running_loop()
        removed = asyncio.Event()

        def recording(target: Path) -> None:
            removed_by.append(threading.get_ident())
            rmtree(target)
            loop.call_soon_threadsafe(removed.set)

        monkeypatch.setattr(shutil, "rmtree", recording)
        manager.delete_log(TP)
        freed_at_once = TP not in manager.logs and not path.exists()
        async with asyncio.timeout(60):  # a guard: the old way never calls rmtree
            await removed.wait()
        return freed_at_once, threading.get_ident() not in removed_by

    freed_at_once, off_the_loop = asyncio.run(delete())
    assert freed_at_once and removed_by and off_the_loop
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == []


def test_without_an_event_loop_a_deleted_log_is_removed_at_once(tmp_path: Path) -> None:
    manager = asyncio.run(filled(tmp_path))
    manager.delete_log(TP)
    assert [p for p in tmp_path.iterdir() if p.is_dir()] == []


def test_a_deleted_log_left_behind_is_removed_at_the_next_start(tmp_path: Path) -> None:
    manager = asyncio.run(filled(tmp_path))
    manager.shutdown()
    left = tmp_path / f"{TP}.{uuid.uuid4().hex}{DELETED_DIR_SUFFIX}"
    manager.logs[TP].dir.rename(left)  # a crash between the rename and the removal

    restarted = LogManager([tmp_path])
    restarted.load_logs(lambda _tp, _id: CONFIG)
    assert restarted.logs == {} and not left.exists()
