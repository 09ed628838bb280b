"""Short writes, ENOSPC and EIO injected at os.write: segment and index appends, checkpoint
and producer-snapshot writes. An append reaches the file whole or not at all, a failed one
leaves files and in-memory state as before, and the log goes on once space returns."""

from __future__ import annotations

import asyncio
import errno
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.replicas import create_log, lead, replica_manager
from tierbroker.broker.replication.replica_manager import FetchParams, FetchRequestPartition
from tierbroker.protocol.errors import ErrorCode
from tierbroker.protocol.records import build_batch, decode_records
from tierbroker.storage.checkpoints import OffsetCheckpointFile
from tierbroker.storage.log import Log
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.log_manager import CLEAN_SHUTDOWN_FILE, LogManager
from tierbroker.storage.producer_state import ProducerStateManager
from tierbroker.storage.topic_partition import TopicPartition

TP = TopicPartition("w", 0)
TOPIC_ID = uuid.uuid4()
# An index entry for every batch, so index appends happen on every log append.
CONFIG = LogConfig(segment_bytes=1 << 20, index_interval_bytes=1, segment_ms=10**12)


class DiskFaults:
    """Wraps os.write: writes to files whose name ends with `suffix` are cut short or fail.

    `max_bytes_per_write` caps each write (a short count, not an error); after
    `bytes_left` bytes the next write raises `error` (ENOSPC: the disk filled up).
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.real_write = os.write
        self.suffix = ""
        self.max_bytes_per_write: int | None = None
        self.bytes_left: int | None = None
        self.error = errno.ENOSPC
        self.failures = 0
        monkeypatch.setattr(os, "write", self._write)

    def _write(self, fd: int, data: bytes | memoryview) -> int:
        if not self.suffix or not os.readlink(f"/proc/self/fd/{fd}").endswith(self.suffix):
            return self.real_write(fd, data)
        view = memoryview(data)
        if self.max_bytes_per_write is not None:
            view = view[: self.max_bytes_per_write]
        if self.bytes_left is not None:
            if self.bytes_left == 0:
                self.failures += 1
                raise OSError(self.error, os.strerror(self.error))
            view = view[: self.bytes_left]
            self.bytes_left -= len(view)
        return self.real_write(fd, view)

    def heal(self) -> None:
        self.suffix = ""


@pytest.fixture
def faults(monkeypatch: pytest.MonkeyPatch) -> Iterator[DiskFaults]:
    yield DiskFaults(monkeypatch)


def batch(i: int, count: int = 3, producer_id: int = -1, sequence: int = -1) -> bytearray:
    records = [(None, b"value-%d-%d" % (i, n) * 20, [], 1_000 + i) for n in range(count)]
    return bytearray(
        build_batch(
            records,
            producer_id=producer_id,
            producer_epoch=0 if producer_id >= 0 else -1,
            base_sequence=sequence,
        )
    )


def values(log: Log) -> list[bytes]:
    """Every record value of the log, read segment by segment."""
    found: list[bytes] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        data = log.read(offset, 1 << 30, log.log_end_offset, True).records
        assert data is not None
        records = list(decode_records(data.read()))
        found += [r.value or b"" for r in records]
        offset = records[-1].offset + 1
    return found


def values_after_restart(log: Log, clean: bool) -> list[bytes]:
    """The log's records after closing and loading it again (recovering it unless `clean`)."""
    log.close()
    reopened = Log(log.dir, TP, CONFIG, TOPIC_ID, had_clean_shutdown=clean)
    try:
        return values(reopened)
    finally:
        reopened.close()


def test_short_writes_are_completed(tmp_path: Path, faults: DiskFaults) -> None:
    log = Log(tmp_path / str(TP), TP, CONFIG, TOPIC_ID)
    faults.suffix, faults.max_bytes_per_write = ".log", 7
    for i in range(3):
        log.append_as_leader(batch(i), 0)
    segment = log.active_segment
    assert os.path.getsize(segment.log_path) == segment.size
    assert len(values(log)) == 9
    assert len(values_after_restart(log, clean=False)) == 9


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EIO])
@pytest.mark.parametrize("written", [0, 30, 100])
def test_failed_segment_append_leaves_nothing(
    tmp_path: Path, faults: DiskFaults, error: int, written: int
) -> None:
    log = Log(tmp_path / str(TP), TP, CONFIG, TOPIC_ID)
    log.append_as_leader(batch(0), 0)
    segment = log.active_segment
    before = (segment.size, log.log_end_offset, segment.offset_index.entries, segment.max_timestamp)
    epochs = log.leader_epoch_cache.entries
    faults.suffix, faults.bytes_left, faults.error = ".log", written, error
    with pytest.raises(OSError) as raised:
        log.append_as_leader(batch(1), 1)
    assert raised.value.errno == error
    after = (segment.size, log.log_end_offset, segment.offset_index.entries, segment.max_timestamp)
    assert after == before
    assert os.path.getsize(segment.log_path) == segment.size
    assert log.leader_epoch_cache.entries in (epochs, [*epochs, (1, 3)])
    faults.heal()
    assert log.append_as_leader(batch(2), 1).first_offset == 3
    assert len(values(log)) == 6
    assert len(values_after_restart(log, clean=False)) == 6


def test_failed_index_append_cuts_the_log_back(tmp_path: Path, faults: DiskFaults) -> None:
    log = Log(tmp_path / str(TP), TP, CONFIG, TOPIC_ID)
    log.append_as_leader(batch(0), 0)
    segment = log.active_segment
    size, entries = segment.size, segment.offset_index.entries
    index_bytes = os.path.getsize(segment.offset_index.path)
    faults.suffix, faults.bytes_left = ".index", 3  # a torn entry, then ENOSPC
    with pytest.raises(OSError):
        log.append_as_leader(batch(1), 0)
    assert (segment.size, segment.offset_index.entries) == (size, entries)
    assert os.path.getsize(segment.log_path) == size
    assert os.path.getsize(segment.offset_index.path) == index_bytes
    faults.heal()
    log.append_as_leader(batch(2), 0)
    assert segment.offset_index.lookup(3) == (3, size)
    assert len(values_after_restart(log, clean=True)) == 6


def test_failed_append_leaves_producer_state(tmp_path: Path, faults: DiskFaults) -> None:
    """The retry of a batch that failed is appended, not taken for a duplicate."""
    log = Log(tmp_path / str(TP), TP, CONFIG, TOPIC_ID)
    log.append_as_leader(batch(0, producer_id=7, sequence=0), 0)
    faults.suffix, faults.bytes_left = ".log", 10
    with pytest.raises(OSError):
        log.append_as_leader(batch(1, producer_id=7, sequence=3), 0)
    faults.heal()
    info = log.append_as_leader(batch(1, producer_id=7, sequence=3), 0)
    assert (info.first_offset, info.record_count) == (3, 3)
    assert len(values(log)) == 6
    log.close()


def test_failed_roll_leaves_no_segment(tmp_path: Path, faults: DiskFaults) -> None:
    log = Log(tmp_path / str(TP), TP, CONFIG, TOPIC_ID)
    log.append_as_leader(batch(0, producer_id=7, sequence=0), 0)
    faults.suffix, faults.bytes_left = ".tmp", 0  # the producer snapshot of the roll
    with pytest.raises(OSError):
        log.roll()
    assert len(log.segments) == 1
    assert not list(log.dir.glob("*.tmp"))
    faults.heal()
    log.roll()
    log.append_as_leader(batch(1, producer_id=7, sequence=3), 0)
    assert [s.base_offset for s in log.segments] == [0, 3]
    assert len(values_after_restart(log, clean=False)) == 6


# LogSegment.__init__ does not close the files it opened when a later one fails; the
# garbage collector does. Only this failure path opens files that way.
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_failed_segment_creation_leaves_no_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = Log(tmp_path / str(TP), TP, CONFIG, TOPIC_ID)
    log.append_as_leader(batch(0), 0)

    def no_space(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        # The .log and .index files are created before the time index fails.
        m.setattr("tierbroker.storage.segment.TimeIndex", no_space)
        with pytest.raises(OSError):
            log.roll()
    assert len(log.segments) == 1
    assert sorted(p.suffix for p in log.dir.glob(f"{3:020d}.*")) == [".snapshot"]
    log.append_as_leader(batch(1), 0)
    assert len(values_after_restart(log, clean=False)) == 6


def test_failed_checkpoint_keeps_the_old_file(tmp_path: Path, faults: DiskFaults) -> None:
    checkpoint = OffsetCheckpointFile(tmp_path / "recovery-point-offset-checkpoint")
    checkpoint.write({TP: 5})
    faults.suffix, faults.bytes_left = ".tmp", 4
    with pytest.raises(OSError):
        checkpoint.write({TP: 9, TopicPartition("x", 1): 2})
    assert checkpoint.read() == {TP: 5}
    assert [p.name for p in tmp_path.iterdir()] == ["recovery-point-offset-checkpoint"]
    faults.max_bytes_per_write, faults.bytes_left = 1, None  # short writes only
    checkpoint.write({TP: 9})
    assert checkpoint.read() == {TP: 9}


def test_failed_producer_snapshot_leaves_no_file(tmp_path: Path, faults: DiskFaults) -> None:
    state = ProducerStateManager(tmp_path, TP)
    faults.suffix, faults.bytes_left = ".tmp", 2
    with pytest.raises(OSError):
        state.take_snapshot(10)
    assert list(tmp_path.iterdir()) == []
    faults.heal()
    state.take_snapshot(10)
    assert state.load(0, 10) == 10


def test_storage_error_takes_the_log_dir_offline(tmp_path: Path, faults: DiskFaults) -> None:
    manager = LogManager([tmp_path / "a", tmp_path / "b"])
    manager.load_logs(lambda tp, topic_id: CONFIG)
    replicas = replica_manager(manager)
    lead(replicas, TP, TOPIC_ID, CONFIG)
    other = TopicPartition("w", 1)
    lead(replicas, other, TOPIC_ID, CONFIG)
    faults.suffix, faults.bytes_left = ".log", 0
    results = asyncio.run(replicas.append_records({TP: bytes(batch(0)), other: bytes(batch(0))}))
    assert [r.error for r in results.values()] == [ErrorCode.kafka_storage_error] * 2
    assert manager.online_log_dirs == []
    faults.heal()
    again = asyncio.run(replicas.append_records({TP: bytes(batch(1))}))[TP]
    assert again.error == ErrorCode.kafka_storage_error  # offline until a restart
    fetched = asyncio.run(
        replicas.fetch_messages(FetchParams(0, 1, 1 << 20), [FetchRequestPartition(TP, 0, 1 << 20)])
    )
    assert [r.error for r in fetched] == [ErrorCode.kafka_storage_error]
    manager.shutdown()
    assert not list(tmp_path.glob("*/" + CLEAN_SHUTDOWN_FILE))


def test_one_failed_log_dir_leaves_the_other_serving(tmp_path: Path, faults: DiskFaults) -> None:
    manager = LogManager([tmp_path / "a", tmp_path / "b"])
    manager.load_logs(lambda tp, topic_id: CONFIG)
    replicas = replica_manager(manager)
    first = lead(replicas, TP, TOPIC_ID, CONFIG)
    other = TopicPartition("w", 1)
    lead(replicas, other, TOPIC_ID, CONFIG)
    faults.suffix, faults.bytes_left = ".log", 0
    assert asyncio.run(replicas.append_records({TP: bytes(batch(0))}))[TP].error == (
        ErrorCode.kafka_storage_error
    )
    faults.heal()
    assert manager.online_log_dirs == [tmp_path / "b"]
    appended = asyncio.run(replicas.append_records({other: bytes(batch(1))}))
    assert appended[other].error == ErrorCode.none
    manager.checkpoint()
    manager.shutdown()
    assert (tmp_path / "b" / CLEAN_SHUTDOWN_FILE).exists()
    assert not (tmp_path / "a" / CLEAN_SHUTDOWN_FILE).exists()
    assert first.log.dir.parent == tmp_path / "a"


def test_failed_load_writes_no_clean_shutdown_marker(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    manager = LogManager([log_dir])
    manager.load_logs(lambda tp, topic_id: CONFIG)
    create_log(manager, TP, TOPIC_ID, CONFIG).append_as_leader(batch(0), 0)
    manager.checkpoint()
    for lg in manager.logs.values():  # a crash: no shutdown
        lg.close()
    (log_dir / "log-start-offset-checkpoint").write_text("garbage\n")
    restarted = LogManager([log_dir])
    with pytest.raises(ValueError):
        restarted.load_logs(lambda tp, topic_id: CONFIG)
    restarted.shutdown()
    assert not (log_dir / CLEAN_SHUTDOWN_FILE).exists()
    assert (log_dir / "log-start-offset-checkpoint").read_text() == "garbage\n"


def test_failed_flush_takes_only_its_dir_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A background fsync that fails raises nothing: its dir goes offline and keeps its
    recovery point; the other dir's rolled segments are flushed."""
    manager = LogManager([tmp_path / "a", tmp_path / "b"])
    manager.load_logs(lambda tp, topic_id: CONFIG)
    first = create_log(manager, TP, TOPIC_ID, CONFIG)
    second = create_log(manager, TopicPartition("w", 1), TOPIC_ID, CONFIG)
    for lg in (first, second):
        lg.append_as_leader(batch(0), 0)
        lg.roll()
    real_fsync = os.fsync

    def failing_fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path / "a")):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing_fsync)
    asyncio.run(manager.flush_rolled_segments())
    assert (first.recovery_point, second.recovery_point) == (0, 3)
    assert manager.online_log_dirs == [tmp_path / "b"]
    manager.shutdown()


def test_failed_checkpoint_takes_only_its_dir_offline(tmp_path: Path, faults: DiskFaults) -> None:
    manager = LogManager([tmp_path / "a", tmp_path / "b"])
    manager.load_logs(lambda tp, topic_id: CONFIG)
    create_log(manager, TP, TOPIC_ID, CONFIG)
    second = create_log(manager, TopicPartition("w", 1), TOPIC_ID, CONFIG)
    second.append_as_leader(batch(0), 0)
    second.flush()
    faults.suffix, faults.bytes_left = "a/recovery-point-offset-checkpoint.tmp", 0
    manager.checkpoint()
    assert manager.online_log_dirs == [tmp_path / "b"]
    assert not list((tmp_path / "a").glob("*checkpoint*"))
    written = OffsetCheckpointFile(tmp_path / "b" / "recovery-point-offset-checkpoint").read()
    assert written == {TopicPartition("w", 1): 3}
    manager.shutdown()
