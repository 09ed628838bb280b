"""The transaction coordinator's state machine and its `__transaction_state` records, against
Kafka's rules (TransactionMetadata, TransactionLog):

- a change is prepared, then applied once written; while one is pending no other may be
  prepared; only Kafka's transitions are allowed;
- InitProducerId bumps the epoch; a resuming producer (KIP-360) whose epoch is the one
  before keeps the current epoch (a retry), any other epoch is fenced; an exhausted epoch
  rotates the producer id;
- fencing an open transaction aborts it at the next epoch;
- transactions v2 end at the next epoch, may abort with none open, and at the last epoch
  of a producer id move to the next id;
- records round-trip in Kafka's v0 and v1 layouts; states are named as Kafka names them.
"""

from __future__ import annotations

import struct

import pytest

from tierbroker.broker.coordinator.transaction.metadata import (
    MAX_PRODUCER_EPOCH,
    TV_2,
    TransactionMetadata,
    TransactionState,
)
from tierbroker.broker.coordinator.transaction.records import (
    TransactionLogValue,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)
from tierbroker.storage.topic_partition import TopicPartition

S = TransactionState
A, B = TopicPartition("a", 0), TopicPartition("b", 3)


def fresh() -> TransactionMetadata:
    return TransactionMetadata(
        transactional_id="t", producer_id=7, timeout_ms=60_000, last_update_ms=0
    )


def applied(metadata: TransactionMetadata, transit: object) -> TransactionMetadata:
    metadata.complete_transition(transit)  # type: ignore[arg-type]
    return metadata


def test_a_transaction_goes_from_empty_through_ongoing_and_prepare_to_complete() -> None:
    m = fresh()
    applied(m, m.prepare_increment_producer_epoch(60_000, None, 1))
    assert (m.state, m.producer_epoch, m.last_producer_epoch) == (S.EMPTY, 0, -1)
    applied(m, m.prepare_add_partitions({A}, 2, 0))
    assert (m.state, m.partitions, m.start_ms) == (S.ONGOING, {A}, 2)
    applied(m, m.prepare_add_partitions({B}, 3, 0))
    assert (m.partitions, m.start_ms) == ({A, B}, 2)  # the start stays the first add's
    applied(m, m.prepare_abort_or_commit(S.PREPARE_COMMIT, 4, 0))
    applied(m, m.prepare_complete(5))
    assert (m.state, m.partitions, m.last_update_ms) == (S.COMPLETE_COMMIT, set(), 5)


def test_one_change_at_a_time_and_only_kafkas_transitions() -> None:
    m = fresh()
    transit = m.prepare_add_partitions({A}, 1, 0)
    with pytest.raises(ValueError, match="pending"):
        m.prepare_add_partitions({B}, 1, 0)
    m.complete_transition(transit)
    with pytest.raises(ValueError, match="ONGOING -> COMPLETE_ABORT"):
        m.prepare_complete(2)  # an open transaction is prepared first
    with pytest.raises(ValueError, match="EMPTY"):
        fresh().prepare_abort_or_commit(S.PREPARE_COMMIT, 1, 0)


def test_a_resuming_producer_keeps_its_bump_and_an_unknown_epoch_is_fenced() -> None:
    m = fresh()
    applied(m, m.prepare_increment_producer_epoch(60_000, None, 1))  # epoch 0
    applied(m, m.prepare_increment_producer_epoch(60_000, 0, 2))  # epoch 1, last 0
    assert (m.producer_epoch, m.last_producer_epoch) == (1, 0)
    retry = m.prepare_increment_producer_epoch(60_000, 0, 3)  # its answer was lost
    assert retry is not None and retry.producer_epoch == 1
    m.pending_state = None
    assert m.prepare_increment_producer_epoch(60_000, 5, 4) is None


def test_an_exhausted_epoch_rotates_the_producer_id() -> None:
    m = fresh()
    m.producer_epoch = MAX_PRODUCER_EPOCH - 1
    assert m.epoch_exhausted
    applied(m, m.prepare_producer_id_rotation(8, 60_000, 1, record_last_epoch=True))
    assert (m.producer_id, m.last_producer_id, m.producer_epoch) == (8, 7, 0)
    assert m.last_producer_epoch == MAX_PRODUCER_EPOCH - 1


def test_fencing_aborts_the_open_transaction_at_the_next_epoch() -> None:
    m = fresh()
    applied(m, m.prepare_increment_producer_epoch(60_000, None, 1))
    applied(m, m.prepare_add_partitions({A}, 2, 0))
    applied(m, m.prepare_fence_and_abort(3))
    assert (m.state, m.producer_epoch, m.partitions) == (S.PREPARE_ABORT, 1, {A})


def test_transactions_v2_end_at_the_next_epoch() -> None:
    m = fresh()
    applied(m, m.prepare_increment_producer_epoch(60_000, None, 1))  # epoch 0
    applied(m, m.prepare_add_partitions({A}, 2, TV_2))
    applied(m, m.prepare_abort_or_commit(S.PREPARE_COMMIT, 3, TV_2))
    assert (m.producer_epoch, m.last_producer_epoch, m.start_ms) == (1, 0, 2)
    applied(m, m.prepare_complete(4))
    assert (m.state, m.producer_id, m.producer_epoch) == (S.COMPLETE_COMMIT, 7, 1)
    # An abort with nothing sent: no transaction open, it starts and ends now.
    applied(m, m.prepare_abort_or_commit(S.PREPARE_ABORT, 5, TV_2))
    assert (m.state, m.producer_epoch, m.start_ms, m.partitions) == (S.PREPARE_ABORT, 2, 5, set())


def test_transactions_v2_move_to_the_next_producer_id_after_its_last_epoch() -> None:
    m = fresh()
    m.producer_epoch = MAX_PRODUCER_EPOCH - 2
    applied(m, m.prepare_add_partitions({A}, 1, TV_2))
    applied(m, m.prepare_abort_or_commit(S.PREPARE_COMMIT, 2, TV_2))
    applied(m, m.prepare_complete(3))
    assert m.epoch_exhausted and m.producer_epoch == MAX_PRODUCER_EPOCH - 1
    applied(m, m.prepare_add_partitions({A}, 4, TV_2))
    applied(m, m.prepare_abort_or_commit(S.PREPARE_COMMIT, 5, TV_2, next_producer_id=8))
    assert (m.producer_id, m.producer_epoch, m.next_producer_id) == (7, MAX_PRODUCER_EPOCH, 8)
    applied(m, m.prepare_complete(6))
    assert (m.producer_id, m.last_producer_id, m.producer_epoch) == (8, 7, 0)
    assert m.next_producer_id == -1


def test_records_are_kafkas_v0_and_v1_layouts() -> None:
    key = encode_key("txn-1")
    assert key == struct.pack(">hh", 0, 5) + b"txn-1"
    assert decode_key(key) == "txn-1"
    value = TransactionLogValue(7, 3, 60_000, S.ONGOING, frozenset({A, B}), 20, 10)
    data = encode_value(value, 0)
    assert data[:17] == struct.pack(">hqhib", 0, 7, 3, 60_000, 1)
    assert decode_value(data) == value
    empty = TransactionLogValue(7, 3, 60_000, S.COMPLETE_ABORT, frozenset(), 20, -1)
    assert decode_value(encode_value(empty, 0)) == empty
    # v1: compact arrays and strings, tagged fields only where not the default.
    v2 = TransactionLogValue(7, 3, 60_000, S.PREPARE_COMMIT, frozenset({B}), 20, 10, -1, 8, 2)
    assert encode_value(v2, 1) == (
        struct.pack(">hqhib", 1, 7, 3, 60_000, 2)
        + bytes([2, 2]) + b"b" + bytes([2]) + struct.pack(">i", 3) + bytes([0])
        + struct.pack(">qq", 20, 10)
        + bytes([2, 1, 8]) + struct.pack(">q", 8) + bytes([2, 2]) + struct.pack(">h", 2)
    )  # fmt: skip
    assert decode_value(encode_value(v2, 1)) == v2
    assert decode_value(encode_value(value, 1)) == value


def test_states_carry_kafkas_names() -> None:
    assert [s.kafka_name for s in (S.PREPARE_COMMIT, S.COMPLETE_ABORT, S.EMPTY)] == [
        "PrepareCommit",
        "CompleteAbort",
        "Empty",
    ]
