"""fsync, unlink and close of large files stay off the event loop: leader-epoch checkpoints
are written in a worker (the latest state wins, and load rebuilds what a crash lost), and
retention renames segments to `.deleted` on the loop and unlinks them in a worker."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tierbroker.protocol.records import build_batch
from tierbroker.storage import checkpoints
from tierbroker.storage.checkpoints import read_epoch_entries
from tierbroker.storage.log import Log
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.log_manager import LogManager
from tierbroker.storage.segment import BatchLocation, LogSegment
from tierbroker.storage.topic_partition import TopicPartition

TP = TopicPartition("offload", 0)
TOPIC_ID = uuid.uuid4()


def new_log(directory: Path, *, clean: bool = True) -> Log:
    return Log(
        directory,
        TP,
        LogConfig(segment_bytes=4096),
        recovery_point=0,
        log_start_offset=0,
        high_watermark=0,
        had_clean_shutdown=clean,
        topic_id=TOPIC_ID,
    )


def append(log: Log, epoch: int, count: int = 1) -> None:
    for i in range(count):
        batch = build_batch([(None, b"%d" % i * 100, [], 1_000)], base_offset=0)
        log.append_as_leader(bytearray(batch), epoch)


def test_a_new_epoch_is_fsynced_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fsynced_by: list[int] = []
    fsync = os.fsync

    def recording(fd: int) -> None:
        fsynced_by.append(threading.get_ident())
        fsync(fd)

    async def become_leader() -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        log = new_log(tmp_path / "offload-0")
        monkeypatch.setattr(os, "fsync", recording)
        log.leader_epoch_cache.assign(7, log.log_end_offset)
        held = log.leader_epoch_cache.entries
        await log.leader_epoch_cache.writer.wait_written()
        return held, read_epoch_entries(log.leader_epoch_cache.path)

    loop_thread = threading.get_ident()
    held, written = asyncio.run(become_leader())
    assert held == written == [(7, 0)]
    assert fsynced_by and loop_thread not in fsynced_by


async def test_the_latest_epoch_entries_win_over_writes_queued_before(tmp_path: Path) -> None:
    log = new_log(tmp_path / "offload-0")
    for epoch in range(1, 30):  # each change submits a write while earlier ones run
        append(log, epoch)
    await log.leader_epoch_cache.writer.wait_written()
    assert read_epoch_entries(log.leader_epoch_cache.path) == log.leader_epoch_cache.entries
    assert log.leader_epoch_cache.latest_epoch == 29


def test_load_rebuilds_epochs_a_crash_kept_from_the_checkpoint(tmp_path: Path) -> None:
    directory = tmp_path / "offload-0"
    log = new_log(directory)
    append(log, 3, count=5)
    append(log, 4, count=5)
    log.leader_epoch_cache.path.write_text("0\n1\n3 0\n")  # the write of epoch 4 never happened
    end = log.log_end_offset
    # A crash: no close; the batches reached the disk, the checkpoint did not.
    reloaded = new_log(directory, clean=False)
    assert reloaded.log_end_offset == end
    assert reloaded.leader_epoch_cache.entries == [(3, 0), (4, 5)]
    assert reloaded.end_offset_for_epoch(3) == (3, 5)


async def test_the_flush_writes_the_epoch_checkpoint_before_the_recovery_point_moves(
    tmp_path: Path,
) -> None:
    log = new_log(tmp_path / "offload-0")
    gate = threading.Event()
    busy = ThreadPoolExecutor(max_workers=1)
    busy.submit(gate.wait)  # the executor is busy: the checkpoint write waits its turn
    asyncio.get_running_loop().set_default_executor(busy)
    try:
        append(log, 2, count=3)
        assert read_epoch_entries(log.leader_epoch_cache.path) == []
        log.flush()
        assert read_epoch_entries(log.leader_epoch_cache.path) == [(2, 0)]
        assert log.recovery_point == log.log_end_offset
    finally:
        gate.set()
    await log.leader_epoch_cache.writer.wait_written()
    assert read_epoch_entries(log.leader_epoch_cache.path) == [(2, 0)]


def test_retention_renames_on_the_loop_and_unlinks_in_a_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    renamed_by: dict[str, int] = {}
    unlinked_by: dict[str, int] = {}
    rename, unlink = os.rename, os.unlink

    def recording_rename(src: str | Path, dst: str | Path) -> None:
        renamed_by[Path(dst).name] = threading.get_ident()
        rename(src, dst)

    def recording_unlink(path: str | Path) -> None:
        unlinked_by[Path(path).name] = threading.get_ident()
        unlink(path)

    config = LogConfig(segment_bytes=4096, retention_bytes=4096, file_delete_delay_ms=0)

    async def retain() -> int:
        manager = LogManager([tmp_path])
        manager.load_logs(lambda _tp, _id: config)
        await manager.create_logs([TP], TOPIC_ID, config, leader_epoch=0)
        log = manager.logs[TP]
        append(log, 0, count=40)
        log.update_high_watermark(log.log_end_offset)
        monkeypatch.setattr(os, "rename", recording_rename)
        monkeypatch.setattr(os, "unlink", recording_unlink)
        removed = manager.cleanup_logs()
        await manager.wait_deletions(60)
        monkeypatch.undo()
        return removed

    loop_thread = threading.get_ident()
    removed = asyncio.run(retain())
    deleted_logs = [name for name in renamed_by if name.endswith(".log.deleted")]
    assert removed > 0 and len(deleted_logs) == removed
    assert all(renamed_by[name] == loop_thread for name in deleted_logs)
    assert set(deleted_logs) <= set(unlinked_by)
    assert all(unlinked_by[name] != loop_thread for name in deleted_logs)
    assert not list(tmp_path.glob("*/*.deleted"))


def test_reads_up_to_the_high_watermark_find_its_position_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = new_log(tmp_path / "offload-0")
    append(log, 0, count=60)  # several segments
    log.update_high_watermark(45)
    translated: list[int] = []
    translate = LogSegment.translate_offset

    def counting(segment: LogSegment, offset: int, start_position: int = 0) -> BatchLocation | None:
        translated.append(offset)
        return translate(segment, offset, start_position)

    monkeypatch.setattr(LogSegment, "translate_offset", counting)
    first = log.read(40, 1 << 20, log.high_watermark, True).records
    again = log.read(40, 1 << 20, log.high_watermark, True).records  # a delayed fetch's wake
    assert first is not None and again is not None and first.read() == again.read()
    assert translated.count(45) == 1
    assert log.high_watermark_metadata.message_offset == 45
    log.update_high_watermark(log.log_end_offset)
    assert log.high_watermark_metadata == log.log_end_offset_metadata
    log.read(40, 1 << 20, log.high_watermark, True)
    assert translated.count(log.log_end_offset) == 0


async def test_a_failed_checkpoint_write_is_logged_and_retried_by_the_next_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    log = new_log(tmp_path / "offload-0")
    replace_durably = checkpoints.replace_durably
    failures = [OSError(errno.ENOSPC, "No space left on device")]

    def failing_once(path: Path, write: Callable[[Path], None]) -> None:
        if failures:
            raise failures.pop()
        replace_durably(path, write)

    monkeypatch.setattr(checkpoints, "replace_durably", failing_once)
    log.leader_epoch_cache.assign(1, 0)
    await log.leader_epoch_cache.writer.wait_written()
    assert read_epoch_entries(log.leader_epoch_cache.path) == []
    assert [r.levelname for r in caplog.records if "checkpoint write failed" in r.message] == [
        "ERROR"
    ]
    log.leader_epoch_cache.assign(2, 0)
    await log.leader_epoch_cache.writer.wait_written()
    assert read_epoch_entries(log.leader_epoch_cache.path) == [(2, 0)]
