"""`ProducerStateManager` and the idempotent append path of `Log`, against Kafka's rules.

Kafka (ProducerAppendInfo, ProducerStateEntry, UnifiedLog.analyzeAndValidateProducerState):
a batch equal to one of the producer's last five (same first and last sequence, same
epoch) is a duplicate and is answered with its original offsets; otherwise a batch of
the current epoch must continue the sequence (last + 1, wrapping after INT32_MAX to 0),
a batch of a newer epoch must start at sequence 0, and a batch of an older epoch is
fenced. Since Kafka 2.5 (KIP-360) a producer the partition has no state for may write
at any sequence.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.protocol.records import BatchView, build_batch, decode_records
from tierbroker.storage.log import Log, LogStartOffsetIncrementReason
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.producer_state import INT32_MAX, ProducerStateManager
from tierbroker.storage.topic_partition import TopicPartition

CLIENT_RECORD_DELETION = LogStartOffsetIncrementReason.CLIENT_RECORD_DELETION

TP = TopicPartition("idem", 0)
PID = 4242


def batch_bytes(
    seq: int,
    count: int = 2,
    *,
    pid: int = PID,
    epoch: int = 0,
    base_offset: int = 0,
    ts: int = 1_000,
) -> bytes:
    return build_batch(
        [(None, b"seq-%d" % (seq + i), [], ts + i) for i in range(count)],
        base_offset=base_offset,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
    )


def view(
    seq: int,
    count: int = 2,
    *,
    pid: int = PID,
    epoch: int = 0,
    base_offset: int = 0,
    ts: int = 1_000,
) -> BatchView:
    return BatchView(
        bytearray(batch_bytes(seq, count, pid=pid, epoch=epoch, base_offset=base_offset, ts=ts))
    )


def code_of(manager: ProducerStateManager, batch: BatchView) -> ErrorCode:
    with pytest.raises(KafkaError) as raised:
        manager.check(batch)
    return raised.value.code


class Appender:
    """Drives a manager the way the log does: check, then assign offsets and update."""

    def __init__(self, manager: ProducerStateManager) -> None:
        self.manager = manager
        self.next_offset = 0

    def append(self, seq: int, count: int = 2, *, pid: int = PID, epoch: int = 0) -> BatchView:
        batch = view(seq, count, pid=pid, epoch=epoch, base_offset=self.next_offset)
        assert self.manager.check(batch) is None, "a new batch is not a duplicate"
        self.manager.update(batch)
        self.next_offset += count
        return batch


@pytest.fixture
def manager(tmp_path: Path) -> ProducerStateManager:
    return ProducerStateManager(tmp_path, TP)


# Sequences ---------------------------------------------------------------------------


def test_first_batch_at_sequence_zero_then_consecutive_batches(
    manager: ProducerStateManager,
) -> None:
    appender = Appender(manager)
    appender.append(0, 3)
    appender.append(3, 1)
    appender.append(4, 5)
    assert manager.producers[PID].last_seq == 8
    assert manager.producers[PID].epoch == 0


def test_gap_and_rewind_are_out_of_order(manager: ProducerStateManager) -> None:
    appender = Appender(manager)
    appender.append(0, 2)
    appender.append(2, 2)
    assert code_of(manager, view(5)) == ErrorCode.out_of_order_sequence_number  # gap (4 missing)
    assert code_of(manager, view(1)) == ErrorCode.out_of_order_sequence_number  # overlaps 0-1
    assert code_of(manager, view(3)) == ErrorCode.out_of_order_sequence_number  # overlaps 2-3
    appender.append(4, 1)  # the refusals changed nothing


def test_last_five_batches_are_duplicates_with_their_offsets(
    manager: ProducerStateManager,
) -> None:
    appender = Appender(manager)
    appended = [appender.append(2 * i, 2) for i in range(6)]  # offsets 0-11, sequences 0-11
    for original in appended[1:]:
        replay = view(original.base_sequence, 2, base_offset=999)
        duplicate = manager.check(replay)
        assert duplicate is not None
        assert (duplicate.base_offset, duplicate.last_offset) == (
            original.base_offset,
            original.last_offset,
        )
    # The sixth batch back is no longer cached: Kafka answers OUT_OF_ORDER_SEQUENCE_NUMBER.
    assert code_of(manager, view(0, 2)) == ErrorCode.out_of_order_sequence_number


def test_same_first_sequence_but_different_length_is_not_a_duplicate(
    manager: ProducerStateManager,
) -> None:
    appender = Appender(manager)
    appender.append(0, 2)
    appender.append(2, 2)
    assert code_of(manager, view(2, 3)) == ErrorCode.out_of_order_sequence_number


def test_unknown_producer_may_start_at_any_sequence(manager: ProducerStateManager) -> None:
    """KIP-360 (Kafka 2.5+): ProducerAppendInfo.checkSequence accepts a producer with no state
    at any first sequence (the state may have gone with retention or DeleteRecords)."""
    assert manager.check(view(17, pid=999)) is None


def test_unknown_producer_at_sequence_zero_is_accepted(manager: ProducerStateManager) -> None:
    assert manager.check(view(0, pid=999)) is None


# Epochs ------------------------------------------------------------------------------


def test_newer_epoch_must_start_at_sequence_zero(manager: ProducerStateManager) -> None:
    appender = Appender(manager)
    appender.append(0, 4)
    assert code_of(manager, view(4, epoch=1)) == ErrorCode.out_of_order_sequence_number
    assert code_of(manager, view(7, epoch=1)) == ErrorCode.out_of_order_sequence_number
    appender.append(0, 2, epoch=1)
    assert manager.producers[PID].epoch == 1 and manager.producers[PID].last_seq == 1


def test_older_epoch_is_fenced_even_for_a_former_duplicate(
    manager: ProducerStateManager,
) -> None:
    appender = Appender(manager)
    appender.append(0, 2, epoch=3)
    appender.append(0, 2, epoch=4)
    assert code_of(manager, view(0, 2, epoch=3)) == ErrorCode.invalid_producer_epoch
    assert code_of(manager, view(2, 2, epoch=3)) == ErrorCode.invalid_producer_epoch
    # The current epoch's replay is still a duplicate.
    assert manager.check(view(0, 2, epoch=4)) is not None


def test_batches_of_a_new_epoch_replace_the_old_epochs_batches(
    manager: ProducerStateManager,
) -> None:
    appender = Appender(manager)
    appender.append(0, 2, epoch=0)
    appender.append(0, 2, epoch=1)
    # Sequence 0-1 of epoch 1 is the cached batch; next is 2, not the old epoch's 2.
    assert manager.check(view(0, 2, epoch=1)) is not None
    appender.append(2, 2, epoch=1)


# Wrapping at INT32_MAX -----------------------------------------------------------------


def test_sequence_wraps_to_zero_after_int32_max(manager: ProducerStateManager) -> None:
    # The producer's state as if it had written up to INT32_MAX - 2 (update records as-is).
    manager.update(view(INT32_MAX - 3, 2, base_offset=0))
    assert manager.producers[PID].last_seq == INT32_MAX - 2
    appender = Appender(manager)
    appender.next_offset = 2
    appender.append(INT32_MAX - 1, 2)  # INT32_MAX - 1, INT32_MAX
    assert manager.producers[PID].last_seq == INT32_MAX
    # After INT32_MAX comes 0: sequence 1 skips it.
    assert code_of(manager, view(1)) == ErrorCode.out_of_order_sequence_number
    appender.append(0, 2)  # wraps to 0
    assert manager.producers[PID].last_seq == 1


def test_a_batch_spanning_the_wrap_ends_at_the_wrapped_sequence(
    manager: ProducerStateManager,
) -> None:
    manager.update(view(INT32_MAX - 5, 4, base_offset=0))  # last sequence INT32_MAX - 2
    appender = Appender(manager)
    appender.next_offset = 4
    spanning = appender.append(INT32_MAX - 1, 3)  # INT32_MAX - 1, INT32_MAX, 0
    assert manager.producers[PID].last_seq == 0
    duplicate = manager.check(view(INT32_MAX - 1, 3, base_offset=77))
    assert duplicate is not None and duplicate.base_offset == spanning.base_offset
    assert code_of(manager, view(2)) == ErrorCode.out_of_order_sequence_number
    appender.append(1, 1)


# Snapshots ---------------------------------------------------------------------------


def test_snapshot_round_trip_keeps_each_producers_epoch_and_last_batch(tmp_path: Path) -> None:
    manager = ProducerStateManager(tmp_path, TP)
    appender = Appender(manager)
    appender.append(0, 2, pid=1)
    appender.append(0, 3, pid=2, epoch=7)
    last_of_1 = appender.append(2, 2, pid=1)
    last_of_2 = appender.append(3, 1, pid=2, epoch=7)
    manager.take_snapshot(appender.next_offset)
    assert manager.snapshot_offsets() == [appender.next_offset]

    loaded = ProducerStateManager(tmp_path, TP)
    assert loaded.load(0, appender.next_offset) == appender.next_offset
    assert {pid: (e.epoch, e.last_seq) for pid, e in loaded.producers.items()} == {
        1: (0, 3),
        2: (7, 3),
    }
    for pid, epoch, last in ((1, 0, last_of_1), (2, 7, last_of_2)):
        duplicate = loaded.check(view(last.base_sequence, last.record_count, pid=pid, epoch=epoch))
        assert duplicate is not None
        assert (duplicate.base_offset, duplicate.last_offset) == (
            last.base_offset,
            last.last_offset,
        )
        assert duplicate.timestamp == last.max_timestamp
    assert loaded.check(view(4, pid=1)) is None  # the sequence goes on
    assert code_of(loaded, view(6, pid=1)) == ErrorCode.out_of_order_sequence_number
    assert code_of(loaded, view(0, pid=2, epoch=6)) == ErrorCode.invalid_producer_epoch


def test_load_takes_the_newest_snapshot_at_or_below_the_log_end(tmp_path: Path) -> None:
    manager = ProducerStateManager(tmp_path, TP)
    appender = Appender(manager)
    appender.append(0, 2)
    manager.take_snapshot(2)
    appender.append(2, 2)
    manager.take_snapshot(4)
    loaded = ProducerStateManager(tmp_path, TP)
    assert loaded.load(0, 3) == 2  # the log ends at 3: the snapshot at 4 is from a lost future
    assert loaded.producers[PID].last_seq == 1
    assert loaded.snapshot_offsets() == [2]


def test_load_deletes_a_snapshot_below_the_first_local_offset(tmp_path: Path) -> None:
    manager = ProducerStateManager(tmp_path, TP)
    Appender(manager).append(0, 2)
    manager.take_snapshot(2)
    loaded = ProducerStateManager(tmp_path, TP)
    # Segments up to 4 are gone: the batches between 2 and 4 cannot be replayed.
    assert loaded.load(4, 6) == -1
    assert loaded.producers == {}
    assert loaded.snapshot_offsets() == []


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """The paths of the files under `tmp_path` fsynced during the test, in order (a
    cluster other tests share in this process may fsync its own meanwhile)."""
    paths: list[str] = []
    fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if path.startswith(str(tmp_path)):
            paths.append(path)
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    return paths


def test_an_unsynced_snapshot_is_fsynced_by_flush_snapshot(
    tmp_path: Path, synced: list[str]
) -> None:
    manager = ProducerStateManager(tmp_path, TP)
    Appender(manager).append(0, 2)
    manager.take_snapshot(2, sync=False)  # a roll: not on the produce path
    assert synced == []
    manager.flush_snapshot(2)  # the flush of the rolled segment
    assert synced == [str(manager.snapshot_path(2))]
    manager.flush_snapshot(3)  # no snapshot there: nothing to do
    assert len(synced) == 1
    assert ProducerStateManager(tmp_path, TP).load(0, 2) == 2


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[:-3],  # torn write
        lambda data: data[:2],  # shorter than the header
        lambda data: b"",
        lambda data: data[:8] + bytes([data[8] ^ 0xFF]) + data[9:],  # a flipped byte
        lambda data: b"\x00\x09" + data[2:],  # an unknown version
    ],
    ids=["truncated", "header-only", "empty", "bit-flip", "version"],
)
def test_corrupt_snapshot_is_ignored_for_an_older_valid_one(tmp_path: Path, damage: object) -> None:
    manager = ProducerStateManager(tmp_path, TP)
    appender = Appender(manager)
    appender.append(0, 2)
    manager.take_snapshot(2)
    appender.append(2, 2)
    manager.take_snapshot(4)
    newest = manager.snapshot_path(4)
    newest.write_bytes(damage(newest.read_bytes()))  # type: ignore[operator]
    loaded = ProducerStateManager(tmp_path, TP)
    assert loaded.load(0, 4) == 2
    assert loaded.producers[PID].last_seq == 1
    assert not newest.exists()


def test_only_snapshot_corrupt_means_no_state(tmp_path: Path) -> None:
    manager = ProducerStateManager(tmp_path, TP)
    Appender(manager).append(0, 2)
    manager.take_snapshot(2)
    manager.snapshot_path(2).write_bytes(b"\x00\x01garbage")
    loaded = ProducerStateManager(tmp_path, TP)
    assert loaded.load(0, 2) == -1
    assert loaded.producers == {}


def test_expired_producers_are_forgotten(manager: ProducerStateManager) -> None:
    manager.update(view(0, pid=1, ts=1_000))
    manager.update(view(0, pid=2, ts=5_000))
    assert manager.remove_expired(older_than_ms=2_000) == 1
    assert set(manager.producers) == {2}


# Through Log ---------------------------------------------------------------------------


def open_log(directory: Path, topic_id: uuid.UUID, clean: bool = False) -> Log:
    return Log(directory, TP, LogConfig(), topic_id, had_clean_shutdown=clean)


def records_in(log_: Log) -> list[bytes | None]:
    log_.update_high_watermark(log_.log_end_offset)
    data = log_.read(log_.log_start_offset, 10_000_000, log_.log_end_offset, True).records
    return [] if data is None else [r.value for r in decode_records(data.read())]


def test_log_appends_a_replayed_batch_once(tmp_path: Path) -> None:
    directory, topic_id = tmp_path / "idem-0", uuid.uuid4()
    log_ = open_log(directory, topic_id)
    try:
        first = log_.append_as_leader(bytearray(batch_bytes(0, 3)), 0)
        second = log_.append_as_leader(bytearray(batch_bytes(3, 2)), 0)
        end = log_.log_end_offset
        assert (first.first_offset, first.last_offset) == (0, 2)
        replay = log_.append_as_leader(bytearray(batch_bytes(3, 2)), 0)
        assert (replay.first_offset, replay.last_offset) == (second.first_offset, 4)
        older = log_.append_as_leader(bytearray(batch_bytes(0, 3)), 0)
        assert (older.first_offset, older.last_offset) == (0, 2)
        assert log_.log_end_offset == end == 5
        assert records_in(log_) == [b"seq-%d" % i for i in range(5)]
        with pytest.raises(KafkaError) as gap:
            log_.append_as_leader(bytearray(batch_bytes(9, 1)), 0)
        assert gap.value.code == ErrorCode.out_of_order_sequence_number
        assert log_.log_end_offset == 5
    finally:
        log_.close()


@pytest.mark.parametrize("clean", [True, False], ids=["clean-shutdown", "crash"])
def test_reopened_log_still_deduplicates(tmp_path: Path, clean: bool) -> None:
    directory, topic_id = tmp_path / "idem-0", uuid.uuid4()
    log_ = open_log(directory, topic_id)
    log_.append_as_leader(bytearray(batch_bytes(0, 3)), 0)
    log_.append_as_leader(bytearray(batch_bytes(3, 2)), 0)
    log_.flush()
    if clean:
        log_.take_producer_snapshot()
    log_.close()

    log_ = open_log(directory, topic_id, clean=clean)
    try:
        assert log_.log_end_offset == 5
        replay = log_.append_as_leader(bytearray(batch_bytes(3, 2)), 0)
        assert (replay.first_offset, replay.last_offset) == (3, 4)
        assert log_.log_end_offset == 5
        with pytest.raises(KafkaError) as gap:
            log_.append_as_leader(bytearray(batch_bytes(6, 1)), 0)
        assert gap.value.code == ErrorCode.out_of_order_sequence_number
        following = log_.append_as_leader(bytearray(batch_bytes(5, 1)), 0)
        assert following.first_offset == 5
        assert records_in(log_) == [b"seq-%d" % i for i in range(6)]
    finally:
        log_.close()


def test_reopened_log_with_a_corrupt_snapshot_rebuilds_from_the_log(tmp_path: Path) -> None:
    directory, topic_id = tmp_path / "idem-0", uuid.uuid4()
    log_ = open_log(directory, topic_id)
    log_.append_as_leader(bytearray(batch_bytes(0, 3)), 0)
    log_.append_as_leader(bytearray(batch_bytes(3, 2, epoch=0)), 0)
    log_.flush()
    log_.take_producer_snapshot()
    log_.close()
    [snapshot] = list(directory.glob("*.snapshot"))
    snapshot.write_bytes(snapshot.read_bytes()[:-1] + b"\x00")

    log_ = open_log(directory, topic_id, clean=True)
    try:
        replay = log_.append_as_leader(bytearray(batch_bytes(3, 2)), 0)
        assert replay.first_offset == 3 and log_.log_end_offset == 5
    finally:
        log_.close()


def test_log_snapshot_at_roll_and_replay_of_later_batches(tmp_path: Path) -> None:
    directory, topic_id = tmp_path / "idem-0", uuid.uuid4()
    log_ = open_log(directory, topic_id)
    log_.append_as_leader(bytearray(batch_bytes(0, 2, pid=1)), 0)
    log_.append_as_leader(bytearray(batch_bytes(0, 2, pid=2)), 0)
    log_.roll()  # a snapshot at offset 4
    log_.append_as_leader(bytearray(batch_bytes(2, 2, pid=1)), 0)  # offsets 4-5, after it
    log_.flush()
    log_.close()  # a crash: no snapshot at the log end

    log_ = open_log(directory, topic_id)
    try:
        assert log_.append_as_leader(bytearray(batch_bytes(2, 2, pid=1)), 0).first_offset == 4
        assert log_.append_as_leader(bytearray(batch_bytes(0, 2, pid=2)), 0).first_offset == 2
        assert log_.log_end_offset == 6
    finally:
        log_.close()


def test_a_reopened_log_takes_again_the_roll_snapshots_a_crash_lost(tmp_path: Path) -> None:
    """Each rolled segment keeps the producer state at its end: the copy to the remote tier
    uploads it, and a replica rebuilt from there loads it."""
    directory, topic_id = tmp_path / "idem-0", uuid.uuid4()
    log_ = open_log(directory, topic_id)
    log_.append_as_leader(bytearray(batch_bytes(0, 2, pid=1)), 0)
    log_.roll()  # a snapshot at offset 2
    log_.append_as_leader(bytearray(batch_bytes(0, 3, pid=2)), 0)
    log_.roll()  # a snapshot at offset 5
    log_.append_as_leader(bytearray(batch_bytes(2, 1, pid=1)), 0)
    log_.flush()
    log_.close()
    for offset in (2, 5):  # lost in the crash
        log_.producer_state.snapshot_path(offset).unlink()

    log_ = open_log(directory, topic_id)
    try:
        assert log_.producer_state.snapshot_offsets() == [2, 5]

        def producers_at(offset: int) -> set[int]:
            elsewhere = ProducerStateManager(tmp_path / f"at-{offset}", TP)
            elsewhere.dir.mkdir()
            elsewhere.install_snapshot(
                offset, log_.producer_state.snapshot_path(offset).read_bytes()
            )
            assert elsewhere.load(0, offset) == offset
            return set(elsewhere.producers)

        assert producers_at(2) == {1}
        assert producers_at(5) == {1, 2}
    finally:
        log_.close()


def test_log_flush_fsyncs_the_snapshots_of_the_rolls_it_covers(
    tmp_path: Path, synced: list[str]
) -> None:
    log_ = open_log(tmp_path / "idem-0", uuid.uuid4())
    try:
        log_.append_as_leader(bytearray(batch_bytes(0, 2)), 0)
        log_.roll()  # an unsynced snapshot at offset 2
        log_.append_as_leader(bytearray(batch_bytes(2, 2)), 0)
        synced.clear()
        log_.flush()
        assert str(log_.producer_state.snapshot_path(2)) in synced
    finally:
        log_.close()


def crash(log_: Log, synced: list[str]) -> None:
    """Close without a clean shutdown, losing every snapshot that was never fsynced."""
    log_.close()
    for offset in log_.producer_state.snapshot_offsets():
        path = log_.producer_state.snapshot_path(offset)
        if str(path) not in synced:
            path.unlink()


def test_a_crash_after_retention_keeps_the_sequence_going(
    tmp_path: Path, synced: list[str]
) -> None:
    directory, topic_id = tmp_path / "idem-0", uuid.uuid4()
    log_ = open_log(directory, topic_id)
    log_.append_as_leader(bytearray(batch_bytes(0, 2)), 0)
    log_.roll()  # snapshot at 2
    log_.flush(up_to_offset=2)  # fsyncs it
    log_.append_as_leader(bytearray(batch_bytes(2, 2)), 0)
    log_.roll()  # snapshot at 4, not fsynced
    log_.append_as_leader(bytearray(batch_bytes(0, 2, pid=PID + 1)), 0)
    log_.roll()  # snapshot at 6, not fsynced
    log_.update_high_watermark(log_.log_end_offset)
    assert log_.maybe_increment_log_start_offset(6, CLIENT_RECORD_DELETION)
    log_.delete_old_segments()  # the kept log starts at 6: its snapshot is fsynced now
    assert log_.producer_state.snapshot_offsets() == [6]
    crash(log_, synced)

    log_ = open_log(directory, topic_id)
    try:
        # PID's last batch (sequence 3) comes from the snapshot at 6, never the stale
        # sequence 1 of the snapshot at 2.
        assert log_.producer_state.producers[PID].last_seq == 3
        assert log_.append_as_leader(bytearray(batch_bytes(4, 1)), 0).first_offset == 6
    finally:
        log_.close()


def log_start_inside_the_first_segment(directory: Path, topic_id: uuid.UUID) -> Log:
    """PID's sequences 0-1 before a roll (snapshot at 2), 2-3 after it; log start at 5."""
    log_ = open_log(directory, topic_id)
    log_.append_as_leader(bytearray(batch_bytes(0, 2)), 0)
    log_.roll()
    log_.append_as_leader(bytearray(batch_bytes(2, 2)), 0)  # offsets 2-3
    log_.append_as_leader(bytearray(batch_bytes(0, 4, pid=PID + 1)), 0)  # offsets 4-7
    log_.update_high_watermark(6)
    # DeleteRecords: segment 0 goes
    log_.maybe_increment_log_start_offset(5, CLIENT_RECORD_DELETION)
    log_.delete_old_segments()
    assert (log_.segments[0].base_offset, log_.log_start_offset) == (2, 5)
    return log_


@pytest.mark.parametrize("reload", ["truncation", "restart"])
def test_a_log_start_inside_the_first_segment_loses_no_sequence(
    tmp_path: Path, reload: str
) -> None:
    directory, topic_id = tmp_path / "idem-0", uuid.uuid4()
    log_ = log_start_inside_the_first_segment(directory, topic_id)
    if reload == "truncation":
        log_.truncate_to(6)  # a follower's divergence: reloads from the snapshot at 2
    else:
        log_.flush()
        log_.close()  # a crash: the checkpoints kept the log start and recovery point
        log_ = Log(directory, TP, LogConfig(), topic_id, log_start_offset=5, recovery_point=8)
    try:
        # The batch at 2-3 is below the log start but on disk: replayed after the snapshot.
        assert log_.producer_state.producers[PID].last_seq == 3
        end = log_.log_end_offset
        assert log_.append_as_leader(bytearray(batch_bytes(4, 1)), 0).first_offset == end
    finally:
        log_.close()
