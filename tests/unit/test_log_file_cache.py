"""Open log files are bounded by the cache, yet a fetch in flight or a deleted segment
keeps its file readable."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import pytest

from tierbroker.protocol.records import build_batch
from tierbroker.storage.file_cache import LogFileCache
from tierbroker.storage.local_log import delete_segment_files
from tierbroker.storage.log import Log
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.log_manager import LogManager
from tierbroker.storage.topic_partition import TopicPartition

CAPACITY = 8
CONFIG = LogConfig(segment_bytes=1 << 20, segment_ms=10**12, retention_ms=-1)


CACHE = LogFileCache(CAPACITY)  # the logs of one test share it, as a log manager's do


@pytest.fixture(autouse=True)
def empty_cache() -> None:
    for path in list(CACHE._files):
        CACHE.forget(path)


def open_log_files(directory: Path) -> int:
    """Descriptors of this process open on `.log` files under `directory`."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        count += target.startswith(str(directory)) and ".log" in target
    return count


def make_logs(root: Path, count: int) -> list[Log]:
    logs = []
    for p in range(count):
        tp = TopicPartition("many", p)
        log = Log(root / str(tp), tp, CONFIG, uuid.uuid4(), file_cache=CACHE)
        log.append_as_leader(bytearray(build_batch([(None, f"v{p}".encode(), [], 1)])), 0)
        log.update_high_watermark(log.log_end_offset)
        logs.append(log)
    return logs


def test_logs_beyond_the_capacity_keep_only_that_many_files_open(tmp_path: Path) -> None:
    logs = make_logs(tmp_path, 5 * CAPACITY)
    for log in logs:
        assert log.read(0, 1 << 20, log.high_watermark, True).records is not None
    assert open_log_files(tmp_path) <= CAPACITY
    for log in logs:
        log.close()


def test_a_fetch_in_flight_keeps_its_file_when_evicted(tmp_path: Path) -> None:
    first, *others = make_logs(tmp_path, 3 * CAPACITY)
    records = first.read(0, 1 << 20, first.high_watermark, True).records
    assert records is not None
    expected = records.read()
    for log in others:  # every other log is read: the first one's file leaves the cache
        log.read(0, 1 << 20, log.high_watermark, True)
    assert records.read() == expected
    assert open_log_files(tmp_path) <= CAPACITY + 1
    del records
    assert open_log_files(tmp_path) <= CAPACITY


def test_a_deleted_segment_stays_readable_until_closed(tmp_path: Path) -> None:
    first, *others = make_logs(tmp_path, 2 * CAPACITY)
    segment = first.segments[0]
    first.roll()
    first.truncate_fully_and_start_at(first.log_end_offset)
    assert not (first.dir / "00000000000000000000.log").exists()
    for log in others:
        log.read(0, 1 << 20, log.high_watermark, True)
    assert segment.read(0, 1 << 20, segment.size, True) is not None
    delete_segment_files(first.take_deleted(older_than_ms=2**62))
    assert open_log_files(tmp_path) <= CAPACITY


def test_each_log_manager_has_its_own_cache(tmp_path: Path) -> None:
    """Brokers of two clusters in one process (on two threads) share no file cache."""
    first, second = LogManager([tmp_path / "a"]), LogManager([tmp_path / "b"])
    assert first.file_cache is not second.file_cache
    for manager in (first, second):
        manager.load_logs(lambda tp, topic_id: CONFIG)
        tp = TopicPartition("own", 0)
        asyncio.run(manager.create_logs([tp], uuid.uuid4(), CONFIG, 0))
        log = manager.logs[tp]
        log.append_as_leader(bytearray(build_batch([(None, b"v", [], 1)])), 0)
        assert log.segments[0].file_cache is manager.file_cache
    assert len(first.file_cache) == len(second.file_cache) == 1
    for manager in (first, second):
        manager.shutdown()
