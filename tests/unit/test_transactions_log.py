"""The partition side of transactions, against Kafka's rules (ProducerStateManager,
ProducerAppendInfo, TransactionIndex, UnifiedLog.lastStableOffset, LogCleaner):

- a transactional batch opens its producer's transaction; the end-transaction marker
  closes it; the last stable offset (LSO) stays at the first offset of the oldest
  transaction not decided, or decided above the high watermark;
- an ABORT marker indexes the transaction in its segment's `.txnindex` (34-byte
  entries), which read_committed reads list; a COMMIT marker does not;
- a marker of an older producer or coordinator epoch is refused, as is a
  non-transactional batch while the producer's transaction is open;
- producer snapshots use Kafka's layout, keep open transactions, and this broker's
  older layout still loads; after a crash the transaction index is rebuilt;
- the cleaner stops at the LSO, drops aborted records, keeps markers and carries the
  transaction index to the cleaned segment.
"""

from __future__ import annotations

import errno
import struct
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from crc32c import crc32c

from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.protocol.records import BatchView, build_batch, decode_batch, iter_batches
from tierbroker.protocol.records.control import (
    ControlRecordType,
    EndTxnMarker,
    build_end_txn_marker,
    read_end_txn_marker,
)
from tierbroker.storage import transaction_index
from tierbroker.storage.log import AppendOptions, Log, now_ms
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.producer_state import ProducerStateManager
from tierbroker.storage.topic_partition import TopicPartition
from tierbroker.storage.transaction_index import (
    ENTRY_BYTES,
    AbortedTxn,
    TransactionIndex,
    collect_aborted,
)

TP = TopicPartition("txn", 0)
A, B = 1000, 2000
COMMIT = EndTxnMarker(ControlRecordType.COMMIT, 0)
ABORT = EndTxnMarker(ControlRecordType.ABORT, 0)
TRANSACTIONAL = AppendOptions(transactional_id="t")
NOW = now_ms()  # markers are stamped now: older batches would roll the segment


def txn_batch(
    pid: int, seq: int, count: int = 2, *, epoch: int = 0, key: bytes = b"k"
) -> bytearray:
    return bytearray(
        build_batch(
            [(key, b"%d-%d" % (pid, seq + i), [], NOW + i) for i in range(count)],
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=seq,
            is_transactional=True,
        )
    )


def open_log(directory: Path, topic_id: uuid.UUID, *, clean: bool = False, **config: object) -> Log:
    return Log(directory, TP, LogConfig(**config), topic_id, had_clean_shutdown=clean)  # type: ignore[arg-type]


@pytest.fixture
def log_(tmp_path: Path) -> Iterator[Log]:
    lg = open_log(tmp_path / "txn-0", uuid.uuid4())
    yield lg
    lg.close()


def values(lg: Log, max_offset: int) -> list[bytes | None]:
    """The data records' values (not the markers') of one read from the log start."""
    data = lg.read(lg.log_start_offset, 10_000_000, max_offset, True).records
    raw = b"" if data is None else data.read()
    return [r.value for b in iter_batches(raw) if not b.is_control for r in decode_batch(b).records]


# The marker's bytes ------------------------------------------------------------------


def test_an_end_transaction_marker_is_kafkas_78_byte_control_batch() -> None:
    data = build_end_txn_marker(A, 3, EndTxnMarker(ControlRecordType.ABORT, 7), 5_000)
    assert len(data) == 78
    batch = BatchView(data)
    batch.validate()
    assert (batch.attributes, batch.base_sequence, batch.record_count) == (0x30, -1, 1)
    assert (batch.producer_id, batch.producer_epoch) == (A, 3)
    assert read_end_txn_marker(batch) == EndTxnMarker(ControlRecordType.ABORT, 7)
    # key: version 0, type 0 (ABORT); value: version 0, coordinator epoch 7
    assert (
        data[-17:]
        == bytes([0x20, 0, 0, 0, 8])
        + struct.pack(">hh", 0, 0)
        + bytes([12])
        + struct.pack(">hi", 0, 7)
        + b"\x00"
    )


# The transaction index ---------------------------------------------------------------


def test_the_transaction_index_holds_34_byte_entries_and_stops_at_a_proving_entry(
    tmp_path: Path,
) -> None:
    index = TransactionIndex(tmp_path / "00000000000000000000.txnindex")
    entries = [AbortedTxn(A, 0, 10, 11), AbortedTxn(B, 5, 20, 21), AbortedTxn(A, 30, 40, 50)]
    for entry in entries:
        index.append(entry)
    assert (tmp_path / "00000000000000000000.txnindex").stat().st_size == 3 * ENTRY_BYTES == 102
    assert TransactionIndex(index.path).entries == entries
    # [12, 21): B's transaction; A's first ended before, its second starts after.
    found = index.collect(12, 21)
    assert (found.aborted, found.complete) == ([entries[1]], True)
    # Up to 60: no entry's LSO reaches it, so later segments may hold more.
    assert collect_aborted(entries, 0, 60).complete is False
    with pytest.raises(ValueError):
        index.append(AbortedTxn(B, 41, 40, 41))  # markers only move forward
    index.truncate_to(20)
    assert TransactionIndex(index.path).entries == entries[:1]


# Producer state and the LSO ----------------------------------------------------------


def test_the_lso_waits_for_the_oldest_open_transaction_and_its_replication(log_: Log) -> None:
    log_.append_as_leader(txn_batch(A, 0), 0, None, TRANSACTIONAL)  # 0-1
    log_.append_as_leader(txn_batch(B, 0), 0, None, TRANSACTIONAL)  # 2-3
    log_.update_high_watermark(log_.log_end_offset)
    assert log_.last_stable_offset == 0
    log_.append_end_txn_marker(A, 0, COMMIT, 0)  # 4
    assert log_.last_stable_offset == 0  # A's marker is above the high watermark
    log_.update_high_watermark(log_.log_end_offset)
    assert log_.last_stable_offset == 2  # B is still open
    log_.append_end_txn_marker(B, 0, ABORT, 0)  # 5
    log_.update_high_watermark(log_.log_end_offset)
    assert log_.last_stable_offset == log_.high_watermark == 6
    assert log_.collect_aborted_txns(0, 6) == [AbortedTxn(B, 2, 5, 6)]
    assert values(log_, log_.last_stable_offset) == [
        b"1000-0",
        b"1000-1",
        b"2000-0",
        b"2000-1",
    ]


def test_read_committed_reads_list_the_aborted_transactions_they_touch(log_: Log) -> None:
    log_.append_as_leader(txn_batch(A, 0), 0, None, TRANSACTIONAL)  # 0-1
    log_.append_end_txn_marker(A, 0, ABORT, 0)  # 2
    log_.append_as_leader(txn_batch(A, 2), 0, None, TRANSACTIONAL)  # 3-4
    log_.append_end_txn_marker(A, 0, COMMIT, 0)  # 5
    log_.update_high_watermark(log_.log_end_offset)
    read = log_.read(3, 1_000_000, log_.last_stable_offset, True, include_aborted_txns=True)
    assert read.aborted_txns == []  # from 3 on, only the committed one
    read = log_.read(0, 1_000_000, log_.last_stable_offset, True, include_aborted_txns=True)
    assert read.aborted_txns == [AbortedTxn(A, 0, 2, 3)]
    assert log_.read(0, 1_000_000, log_.high_watermark, True).aborted_txns is None


def test_markers_of_older_epochs_and_writes_outside_a_transaction_are_refused(log_: Log) -> None:
    log_.append_as_leader(txn_batch(A, 0, epoch=2), 0, None, TRANSACTIONAL)
    with pytest.raises(KafkaError) as e:
        log_.append_end_txn_marker(A, 1, ABORT, 0)
    assert e.value.code == ErrorCode.invalid_producer_epoch
    plain = bytearray(
        build_batch([(b"k", b"v", [], 1)], producer_id=A, producer_epoch=2, base_sequence=2)
    )
    with pytest.raises(KafkaError) as e:
        log_.append_as_leader(plain, 0, None, TRANSACTIONAL)
    assert e.value.code == ErrorCode.invalid_txn_state
    log_.append_end_txn_marker(A, 2, EndTxnMarker(ControlRecordType.COMMIT, 5), 0)
    with pytest.raises(KafkaError) as e:
        log_.append_end_txn_marker(A, 2, EndTxnMarker(ControlRecordType.ABORT, 4), 0)
    assert e.value.code == ErrorCode.transaction_coordinator_fenced
    with pytest.raises(KafkaError) as e:  # no transactional id on the request
        log_.append_as_leader(txn_batch(B, 0), 0)
    assert e.value.code == ErrorCode.transactional_id_authorization_failed
    assert log_.log_end_offset == 3  # nothing refused was written


def test_a_transactions_v2_marker_must_bump_the_epoch_unless_it_repeats_one(log_: Log) -> None:
    """Transactions v2 end at the next epoch: a marker at the data's epoch would end the
    next transaction with the last one's verdict. Once written, the same marker again (a
    new coordinator resending it) is accepted, as Kafka does (KAFKA-19999)."""
    log_.append_as_leader(txn_batch(A, 0, epoch=3), 0, None, TRANSACTIONAL)  # 0-1
    with pytest.raises(KafkaError) as e:
        log_.append_end_txn_marker(A, 3, COMMIT, 0, transaction_version=2)
    assert e.value.code == ErrorCode.invalid_producer_epoch
    log_.append_end_txn_marker(A, 4, COMMIT, 0, transaction_version=2)  # 2
    log_.append_end_txn_marker(A, 4, COMMIT, 0, transaction_version=2)  # 3: the repeat
    log_.append_as_leader(txn_batch(A, 0, epoch=4), 0, None, TRANSACTIONAL)  # 4-5: seq 0
    with pytest.raises(KafkaError) as e:  # the next transaction is open at that epoch
        log_.append_end_txn_marker(A, 4, COMMIT, 0, transaction_version=2)
    assert e.value.code == ErrorCode.invalid_producer_epoch
    assert log_.log_end_offset == 6


def test_a_marker_without_an_open_transaction_indexes_nothing(log_: Log) -> None:
    log_.append_end_txn_marker(A, 0, ABORT, 0)  # a coordinator's retry, or a fencing abort
    log_.update_high_watermark(log_.log_end_offset)
    assert log_.collect_aborted_txns(0, 1) == []
    assert log_.last_stable_offset == 1


# Snapshots and recovery --------------------------------------------------------------


def test_snapshots_keep_open_transactions_in_kafkas_layout(tmp_path: Path) -> None:
    directory, topic_id = tmp_path / "txn-0", uuid.uuid4()
    lg = open_log(directory, topic_id)
    lg.append_as_leader(txn_batch(A, 0, 3), 0, None, TRANSACTIONAL)  # 0-2, open
    lg.append_as_leader(txn_batch(B, 0), 0, None, TRANSACTIONAL)  # 3-4
    lg.append_end_txn_marker(B, 0, EndTxnMarker(ControlRecordType.COMMIT, 9), 0)  # 5
    lg.roll()
    lg.close()
    data = lg.producer_state.snapshot_path(6).read_bytes()
    version, crc, count = struct.unpack_from(">hIi", data)
    assert (version, crc, count, len(data)) == (1, crc32c(data[6:]), 2, 10 + 2 * 46)
    entries = {e[0]: e for e in struct.iter_unpack(">qhiqiqiq", data[10:])}
    # pid, epoch, last seq, last offset, offset delta, timestamp, coordinator epoch, txn first
    assert entries[A] == (A, 0, 2, 2, 2, NOW + 2, -1, 0)
    assert entries[B] == (B, 0, 1, 4, 1, entries[B][5], 9, -1)

    state = ProducerStateManager(directory, TP)
    assert state.load(0, 6) == 6
    assert state.ongoing_txns == {0: A} and state.first_unstable_offset == 0
    assert state.producers[A].batches[-1].first_seq == 0


def test_the_older_snapshot_layout_still_loads(tmp_path: Path) -> None:
    body = struct.pack(">i", 1) + struct.pack(">qhiiqqq", A, 4, 10, 12, 100, 102, 5_000)
    data = struct.pack(">hI", 1, crc32c(body)) + body
    (tmp_path / f"{103:020d}.snapshot").write_bytes(data)
    state = ProducerStateManager(tmp_path, TP)
    assert state.load(0, 103) == 103
    entry = state.producers[A]
    assert (entry.epoch, entry.last_seq, entry.batches[-1].base_offset, entry.last_timestamp) == (
        4,
        12,
        100,
        5_000,
    )
    assert entry.current_txn_first_offset == -1 and not state.ongoing_txns


def test_a_crash_rebuilds_the_transaction_index_and_the_open_transactions(tmp_path: Path) -> None:
    directory, topic_id = tmp_path / "txn-0", uuid.uuid4()
    lg = open_log(directory, topic_id)
    lg.append_as_leader(txn_batch(A, 0), 0, None, TRANSACTIONAL)  # 0-1
    lg.roll()  # snapshot at 2: A open
    lg.append_end_txn_marker(A, 0, ABORT, 0)  # 2
    lg.append_as_leader(txn_batch(B, 0), 0, None, TRANSACTIONAL)  # 3-4, open
    lg.update_high_watermark(lg.log_end_offset)
    lg.close()
    index = directory / f"{2:020d}.txnindex"
    index.unlink()  # lost with the page cache: nothing fsynced it

    lg = open_log(directory, topic_id)  # unclean: replayed from the recovery point
    try:
        lg.update_high_watermark(lg.log_end_offset)
        assert lg.collect_aborted_txns(0, 5) == [AbortedTxn(A, 0, 2, 3)]
        assert index.stat().st_size == ENTRY_BYTES
        assert lg.last_stable_offset == 3  # B's transaction is still open
    finally:
        lg.close()


def test_a_full_disk_under_the_index_entry_fails_the_marker_and_recovery_writes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The abort's index entry is written after its marker: a failed write (ENOSPC) fails
    the marker's append, so it is never acknowledged (the broker takes the log dir
    offline), leaves no part of an entry, and the replay after a restart writes it."""
    directory, topic_id = tmp_path / "txn-0", uuid.uuid4()
    lg = open_log(directory, topic_id)
    lg.append_as_leader(txn_batch(A, 0), 0, None, TRANSACTIONAL)  # 0-1

    def full(_fd: int, _data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(transaction_index, "write_fully", full)
        with pytest.raises(OSError):
            lg.append_end_txn_marker(A, 0, ABORT, 0)  # 2
    index = directory / f"{0:020d}.txnindex"
    assert not index.exists() or index.stat().st_size == 0
    lg.close()

    lg = open_log(directory, topic_id)
    try:
        lg.update_high_watermark(lg.log_end_offset)
        assert lg.collect_aborted_txns(0, 3) == [AbortedTxn(A, 0, 2, 3)]
        assert index.stat().st_size == ENTRY_BYTES
    finally:
        lg.close()


def test_a_truncation_reopens_a_transaction_whose_marker_it_removed(log_: Log) -> None:
    log_.append_as_leader(txn_batch(A, 0), 0, None, TRANSACTIONAL)  # 0-1
    log_.append_end_txn_marker(A, 0, ABORT, 0)  # 2
    log_.truncate_to(2)
    log_.update_high_watermark(log_.log_end_offset)
    assert log_.collect_aborted_txns(0, 2) == []
    assert log_.last_stable_offset == 0


def test_a_follower_tracks_transactions_from_the_batches_it_copies(
    tmp_path: Path, log_: Log
) -> None:
    log_.append_as_leader(txn_batch(A, 0), 0, None, TRANSACTIONAL)
    log_.append_end_txn_marker(A, 0, ABORT, 0)
    log_.update_high_watermark(log_.log_end_offset)
    copied = log_.read(0, 1_000_000, log_.log_end_offset, True).records
    assert copied is not None
    follower = open_log(tmp_path / "follower" / "txn-0", log_.topic_id)
    try:
        follower.append_as_follower(copied.read())
        follower.update_high_watermark(follower.log_end_offset)
        assert follower.collect_aborted_txns(0, 3) == [AbortedTxn(A, 0, 2, 3)]
        assert follower.last_stable_offset == 3
    finally:
        follower.close()


def test_batches_are_control_only_where_a_marker_is() -> None:
    marker = build_end_txn_marker(A, 0, COMMIT, 1)
    data = txn_batch(A, 0) + marker
    assert [b.is_control for b in iter_batches(data)] == [False, True]


def test_a_marker_between_the_coordinators_check_and_the_append_refuses_it(log_: Log) -> None:
    """KIP-890's verification guard: the check said the transaction has the partition, but
    the transaction ended (its marker written) before the append: nothing is written."""
    state = log_.producer_state
    guard = state.start_verification(A, 0, False)
    assert guard is not None
    log_.append_end_txn_marker(A, 0, ABORT, 0)
    checked = AppendOptions(transactional_id="t", verification_guard=guard)
    with pytest.raises(KafkaError) as e:
        log_.append_as_leader(txn_batch(A, 0), 0, None, checked)
    assert e.value.code == ErrorCode.invalid_txn_state
    assert log_.log_end_offset == 1
    guard = state.start_verification(A, 0, False)
    log_.append_as_leader(txn_batch(A, 0), 0, None, replace(checked, verification_guard=guard))
    assert state.start_verification(A, 0, False) is None  # open here now: no check needed


def test_a_v2_transaction_waits_for_the_marker_of_the_one_before(log_: Log) -> None:
    """Transactions v2: the next transaction's first batch, at the bumped epoch, may come
    while the previous one is open here, its marker not yet written. It is checked (the
    coordinator holds it until that marker is written), and that marker, at the same
    epoch, leaves the check standing: the batch then opens a transaction of its own."""
    state = log_.producer_state
    guard = state.start_verification(A, 0, True)
    checked = AppendOptions(transactional_id="t", verification_guard=guard)
    log_.append_as_leader(txn_batch(A, 0, epoch=0), 0, None, checked)  # 0-1
    next_guard = state.start_verification(A, 1, True)
    assert next_guard is not None  # open here, but at the epoch before
    log_.append_end_txn_marker(A, 1, COMMIT, 0, transaction_version=2)  # 2
    next_checked = replace(checked, verification_guard=next_guard)
    log_.append_as_leader(txn_batch(A, 0, epoch=1), 0, None, next_checked)  # 3-4
    log_.update_high_watermark(log_.log_end_offset)
    assert log_.last_stable_offset == 3  # the new transaction is open from 3
