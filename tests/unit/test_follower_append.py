"""A follower's append keeps what its leader stamped: offsets, leader epochs, producer state;
a batch cut at the end of a fetch waits for the next fetch; a batch behind the log end is
refused, one after a gap (its leader's cleaner removed the batches between) taken; a
former leader's epoch without records goes when the new leader's log diverges at its log
end."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.protocol.records import build_batch, iter_batches
from tierbroker.storage.log import Log
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.topic_partition import TopicPartition

TP = TopicPartition("f", 0)


def leader_batches(tmp_path: Path) -> bytes:
    """Three batches as a leader stored them: epochs 0, 0, 2; the last one idempotent."""
    leader = Log(tmp_path / "leader" / "f-0", TP, LogConfig(), uuid.uuid4())
    leader.append_as_leader(bytearray(build_batch([(b"k", b"a" * 100, [], 1)] * 3)), 0)
    leader.append_as_leader(bytearray(build_batch([(b"k", b"b" * 100, [], 2)] * 2)), 0)
    idempotent = build_batch(
        [(b"k", b"c", [], 3)] * 4, producer_id=7, producer_epoch=0, base_sequence=0
    )
    leader.append_as_leader(bytearray(idempotent), 2)
    data = leader.segments[0].log_path.read_bytes()
    leader.close()
    return data


def test_a_follower_keeps_offsets_epochs_and_producer_state(tmp_path: Path) -> None:
    data = leader_batches(tmp_path)
    follower = Log(tmp_path / "follower" / "f-0", TP, LogConfig(), uuid.uuid4())
    info = follower.append_as_follower(data)
    assert info is not None and (info.first_offset, info.last_offset) == (0, 8)
    assert follower.log_end_offset == 9
    assert follower.leader_epoch_cache.entries == [(0, 0), (2, 5)]
    assert follower.producer_state.producers[7].last_seq == 3
    assert follower.segments[0].log_path.read_bytes() == data


def test_a_batch_cut_by_the_fetch_limit_waits_for_the_next_fetch(tmp_path: Path) -> None:
    data = leader_batches(tmp_path)
    follower = Log(tmp_path / "follower" / "f-0", TP, LogConfig(), uuid.uuid4())
    cut = len(data) - 10
    first = follower.append_as_follower(data[:cut])
    assert first is not None and first.last_offset == 4
    assert follower.append_as_follower(data[cut - 5 : cut]) is None
    rest = follower.append_as_follower(data[follower.segments[0].size :])
    assert rest is not None and follower.log_end_offset == 9


def test_batches_that_do_not_follow_the_log_end_are_refused(tmp_path: Path) -> None:
    data = leader_batches(tmp_path)
    follower = Log(tmp_path / "follower" / "f-0", TP, LogConfig(), uuid.uuid4())
    follower.append_as_follower(data)
    with pytest.raises(KafkaError) as refused:
        follower.append_as_follower(data)
    assert refused.value.code == ErrorCode.offset_out_of_range
    assert follower.log_end_offset == 9


def test_batches_after_a_gap_a_cleaner_left_are_taken(tmp_path: Path) -> None:
    data = leader_batches(tmp_path)
    second = next(b for b in iter_batches(data) if b.base_offset == 3)
    follower = Log(tmp_path / "follower" / "f-0", TP, LogConfig(), uuid.uuid4())
    info = follower.append_as_follower(data[second.position :])  # offsets 0-2 cleaned away
    assert info is not None and (info.first_offset, info.last_offset) == (3, 8)
    assert follower.log_end_offset == 9
    assert follower.log_start_offset == 0  # the log still starts where it started


def test_a_former_leaders_epoch_without_records_goes_at_a_truncation_to_its_log_end(
    tmp_path: Path,
) -> None:
    data = leader_batches(tmp_path)
    topic_id = uuid.uuid4()
    follower = Log(tmp_path / "follower" / "f-0", TP, LogConfig(), topic_id)
    follower.append_as_follower(data)
    # It led in epoch 3 from its log end and appended nothing before another leader took over.
    follower.leader_epoch_cache.assign(3, follower.log_end_offset)
    follower.truncate_to(follower.log_end_offset)  # the new leader: epoch 2 ends at 9
    assert follower.log_end_offset == 9
    assert follower.leader_epoch_cache.entries == [(0, 0), (2, 5)]
    follower.close()
    reopened = Log(tmp_path / "follower" / "f-0", TP, LogConfig(), topic_id)
    assert reopened.leader_epoch_cache.entries == [(0, 0), (2, 5)]
    reopened.close()
