"""Index memory: an index costs about its file size, and is read only when a lookup needs it."""

from __future__ import annotations

import tracemalloc
import uuid
from pathlib import Path

from tierbroker.protocol.records import build_batch
from tierbroker.storage.indexes import OffsetEntries, OffsetIndex, TimeEntries, TimeIndex
from tierbroker.storage.log import Log
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.topic_partition import TopicPartition

BASE = 1_000_000
ENTRIES = 100_000  # a 1 GiB segment at the default index.interval.bytes has ~260,000


def write_indexes(directory: Path) -> tuple[Path, Path]:
    offsets = OffsetEntries(b"", BASE)
    times = TimeEntries(b"", BASE)
    offset_path = directory / f"{BASE:020d}.index"
    time_path = directory / f"{BASE:020d}.timeindex"
    offset_path.write_bytes(
        b"".join(offsets.encode(BASE + 3 * i, 4096 * i) for i in range(ENTRIES))
    )
    time_path.write_bytes(b"".join(times.encode(10_000 + i, BASE + 3 * i) for i in range(ENTRIES)))
    return offset_path, time_path


def heap_bytes_of(action: object) -> int:
    """Bytes `action()` leaves allocated (what it keeps), measured with tracemalloc: only
    what was allocated under a frame of this file, so that other threads of the process
    (a session's shared cluster) do not count."""
    assert callable(action)
    tracemalloc.start(64)  # frames deep enough to reach this file's
    try:
        kept = action()
        snapshot = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    del kept
    ours = snapshot.filter_traces([tracemalloc.Filter(True, __file__, all_frames=True)])
    return sum(stat.size for stat in ours.statistics("filename"))


def test_a_loaded_index_costs_about_its_file_size(tmp_path: Path) -> None:
    offset_path, time_path = write_indexes(tmp_path)
    file_bytes = offset_path.stat().st_size + time_path.stat().st_size

    def load_both() -> tuple[OffsetIndex, TimeIndex]:
        offsets = OffsetIndex(offset_path, BASE, 10 << 20)
        times = TimeIndex(time_path, BASE, 10 << 20)
        assert offsets.lookup(BASE + 3 * 5000 + 1) == (BASE + 3 * 5000, 4096 * 5000)
        assert times.lookup(10_000 + 777) == (10_000 + 777, BASE + 3 * 777)
        return offsets, times

    assert heap_bytes_of(load_both) < 1.5 * file_bytes


def test_opening_an_index_reads_nothing_until_a_lookup(tmp_path: Path) -> None:
    offset_path, time_path = write_indexes(tmp_path)
    file_bytes = offset_path.stat().st_size + time_path.stat().st_size

    def open_both() -> tuple[OffsetIndex, TimeIndex, tuple[int, int], tuple[int, int]]:
        offsets = OffsetIndex(offset_path, BASE, 10 << 20)
        times = TimeIndex(time_path, BASE, 10 << 20)
        return offsets, times, offsets.last_entry, times.last_entry

    assert heap_bytes_of(open_both) < file_bytes // 100
    offsets, times, last_offset_entry, last_time_entry = open_both()
    assert last_offset_entry == (BASE + 3 * (ENTRIES - 1), 4096 * (ENTRIES - 1))
    assert last_time_entry == (10_000 + ENTRIES - 1, BASE + 3 * (ENTRIES - 1))
    assert offsets.entries == times.entries == ENTRIES


def test_a_cleanly_shut_down_log_loads_without_reading_its_indexes(tmp_path: Path) -> None:
    tp = TopicPartition("lazy", 0)
    topic_id = uuid.uuid4()
    config = LogConfig(segment_bytes=400_000, index_interval_bytes=1, segment_ms=10**12)
    log = Log(tmp_path / str(tp), tp, config, topic_id)
    for i in range(6000):
        log.append_as_leader(bytearray(build_batch([(None, b"v" * 20, [], 1_000 + i)])), 0)
    log.update_high_watermark(log.log_end_offset)
    assert len(log.segments) > 1
    end = log.log_end_offset
    log.flush()
    log.take_producer_snapshot()
    log.close()
    index_bytes = sum(p.stat().st_size for p in log.dir.glob("*index"))

    def reopen() -> Log:
        return Log(tmp_path / str(tp), tp, config, topic_id, had_clean_shutdown=True)

    assert heap_bytes_of(reopen) < index_bytes // 4
    reopened = reopen()
    try:
        assert reopened.log_end_offset == end
        records = reopened.read(1234, 1 << 20, end, True).records
        assert records is not None and records.length > 0
    finally:
        reopened.close()
