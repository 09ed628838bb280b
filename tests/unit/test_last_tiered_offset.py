"""KIP-1023: an empty follower of a tiered partition starts at its leader's earliest offset
pending upload (the last tiered offset + 1), with the state below it from the remote tier.

The decision (`fetch_start`) in the KIP's cases, the rebuild it leads to (`TierStateMachine`,
the epochs and producers of the offsets skipped), and the fetcher taking that path on
OFFSET_OUT_OF_RANGE as on OFFSET_MOVED_TO_TIERED_STORAGE, or not when it is turned off.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.unit.test_replica_fetcher_faults import (
    CONFIG,
    END,
    FakeLeader,
    HangingTierStateMachine,
    following,
    replicated,
)
from tests.unit.test_rlm_components import build_log, wait_until
from tests.unit.test_tier_state_machine import LINEAGE, Leader, Remote, follower, rebuild
from tierbroker.broker.replication.fetch_start import (
    FetchStart,
    fetch_start,
    should_fetch_from_last_tiered_offset,
    start_after_last_tiered_offset,
)
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.protocol.records import build_batch, iter_batches
from tierbroker.storage.log import (
    EARLIEST_LOCAL_TIMESTAMP,
    EARLIEST_PENDING_UPLOAD_TIMESTAMP,
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    LogStartOffsetIncrementReason,
)
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.log_manager import LogManager
from tierbroker.storage.producer_state import ProducerStateManager
from tierbroker.storage.topic_partition import TopicPartition

# The leader's answer ---------------------------------------------------------------------------


def test_the_leader_answers_its_earliest_pending_upload_as_kafkas_unified_log(
    tmp_path: Path,
) -> None:
    lg = build_log(tmp_path / "t-0")

    def pending() -> tuple[int, int, int] | None:
        return lg.fetch_offset_by_timestamp(EARLIEST_PENDING_UPLOAD_TIMESTAMP)

    epoch = lg.leader_epoch_cache.latest_epoch
    assert pending() == (0, -1, epoch)  # nothing uploaded: the log start
    tiered_end = lg.segments[-2].next_offset - 1
    lg.update_highest_offset_in_remote_storage(tiered_end)
    assert pending() == (tiered_end + 1, -1, epoch)
    lg.config = dataclasses.replace(lg.config, local_retention_bytes=0)
    assert lg.delete_old_segments()
    assert 0 < lg.local_log_start_offset <= tiered_end + 1
    assert pending() == (tiered_end + 1, -1, epoch)
    # A new leader before it restores its remote offsets: not known, while 0.. may be tiered.
    lg.highest_offset_in_remote_storage = -1
    assert pending() == (-1, -1, -1)
    lg.highest_offset_in_remote_storage = tiered_end
    # Records deleted past the tiered end (DeleteRecords): the log start.
    lg.maybe_increment_log_start_offset(
        tiered_end + 2, LogStartOffsetIncrementReason.CLIENT_RECORD_DELETION
    )
    assert pending() == (tiered_end + 2, -1, epoch)
    lg.config = dataclasses.replace(lg.config, remote_storage_enable=False)
    assert pending() == (-1, -1, -1)
    lg.close()


# The decision ------------------------------------------------------------------------------


def test_an_empty_follower_starts_at_the_leaders_earliest_offset_pending_upload() -> None:
    # The leader keeps 10..199 locally; 10..149 is tiered already, or all of it.
    assert start_after_last_tiered_offset((150, 2), 0, (10, 0)) == (150, 2)
    assert start_after_last_tiered_offset((200, 2), 0, (10, 0)) == (200, 2)
    # Nothing tiered beyond the local log start yet: the whole local log.
    assert start_after_last_tiered_offset((10, 0), 0, (10, 0)) == (10, 0)


def test_a_leader_that_does_not_know_its_remote_offsets_is_trusted_only_without_a_gap() -> None:
    # -1, and the log starts where the local log does: nothing can be in the remote tier.
    assert start_after_last_tiered_offset((-1, -1), 10, (10, 1)) == (10, 1)
    assert start_after_last_tiered_offset((-1, -1), 0, (0, 0)) == (0, 0)
    # -1 with offsets 0..9 only in the remote tier: asked again after the back-off.
    with pytest.raises(KafkaError) as raised:
        start_after_last_tiered_offset((-1, -1), 0, (10, 1))
    assert raised.value.code == ErrorCode.offset_not_available
    assert "log start 0, local log start 10" in str(raised.value)


def test_an_answer_below_the_leaders_log_start_replicates_everything_it_has_locally() -> None:
    assert start_after_last_tiered_offset((5, 0), 10, (10, 1)) == (10, 1)
    # Below its local log, which the leader cannot serve a follower from, the same.
    assert start_after_last_tiered_offset((7, 0), 0, (10, 1)) == (10, 1)


def log_config(tiered: bool = True, cleanup_policy: str = "delete") -> LogConfig:
    return LogConfig(remote_storage_enable=tiered, cleanup_policy=cleanup_policy)


@pytest.mark.parametrize(
    ("config", "appended", "leader_end", "expected"),
    [
        (log_config(), False, 200, True),
        (log_config(), True, 200, False),  # not empty: it fetches from its log end
        (log_config(), False, 0, False),  # nothing to skip
        (log_config(tiered=False), False, 200, False),
        (log_config(cleanup_policy="compact,delete"), False, 200, False),
    ],
)
def test_kip_1023_applies_to_an_empty_replica_of_a_tiered_partition_not_compacted(
    tmp_path: Path, config: LogConfig, appended: bool, leader_end: int, expected: bool
) -> None:
    partition = follower(tmp_path)
    lg = partition.log
    lg.config = config
    if appended:
        lg.append_as_follower(build_batch([(None, b"v", [], 0)], partition_leader_epoch=0))
    assert should_fetch_from_last_tiered_offset(lg, leader_end) is expected
    lg.close()


async def test_the_leader_is_asked_its_earliest_pending_upload_only_when_kip_1023_applies(
    tmp_path: Path,
) -> None:
    partition = follower(tmp_path)
    leader = Leader(10, LINEAGE, 50, pending_upload=40)
    start = await fetch_start(partition, leader, True)  # type: ignore[arg-type]
    assert start == FetchStart(offset=40, epoch=3, leader_log_start_offset=0)
    assert leader.listed == [
        EARLIEST_TIMESTAMP,
        EARLIEST_LOCAL_TIMESTAMP,
        LATEST_TIMESTAMP,
        EARLIEST_PENDING_UPLOAD_TIMESTAMP,
    ]

    leader.listed.clear()
    start = await fetch_start(partition, leader, False)  # type: ignore[arg-type]
    assert start == FetchStart(offset=10, epoch=0, leader_log_start_offset=0)
    assert leader.listed == [EARLIEST_TIMESTAMP, EARLIEST_LOCAL_TIMESTAMP]

    # Not empty (a follower that fell behind a leader's local log): KIP-405's start.
    partition.log.append_as_follower(build_batch([(None, b"v", [], 0)], partition_leader_epoch=0))
    leader.listed.clear()
    start = await fetch_start(partition, leader, True)  # type: ignore[arg-type]
    assert start.offset == 10
    assert EARLIEST_PENDING_UPLOAD_TIMESTAMP not in leader.listed
    partition.log.close()


# The rebuild from the remote tier ------------------------------------------------------------


@pytest.fixture
async def remote(tmp_path: Path) -> Remote:
    """Segments 0..9, 10..24 and 25..39 of LINEAGE, and 40..44 with a producer's snapshot:
    producer 7 wrote offset 42."""
    remote = Remote(tmp_path, LINEAGE)
    await remote.rlmm.start()
    await remote.add(0, 9, ((0, 0),))
    await remote.add(10, 24, ((0, 10),))
    await remote.add(25, 39, ((2, 25),))
    (tmp_path / "leader").mkdir()
    producers = ProducerStateManager(tmp_path / "leader", TopicPartition("t", 0))
    batch = build_batch(
        [(None, b"v", [], 0)], base_offset=42, producer_id=7, producer_epoch=1, base_sequence=0
    )
    producers.update(next(iter_batches(batch)))
    producers.take_snapshot(45)
    await remote.add(40, 44, ((3, 40),), snapshot=producers.snapshot_path(45))
    await remote.follow()
    return remote


async def test_the_skipped_offsets_epochs_and_producers_come_from_the_last_tiered_segment(
    tmp_path: Path, remote: Remote
) -> None:
    partition = follower(tmp_path)
    # The leader keeps 10..49 locally; 10..44 is tiered too.
    leader = Leader(10, LINEAGE, 50, pending_upload=45)
    assert await rebuild(remote, partition, leader, last_tiered_offset=True) == 45
    lg = partition.log
    assert lg.log_start_offset == 0  # offsets 0..44 are read from the remote tier
    assert lg.local_log_start_offset == lg.log_end_offset == 45
    assert lg.leader_epoch_cache.entries == LINEAGE
    assert set(lg.producer_state.producers) == {7}
    retry = build_batch(
        [(None, b"v", [], 0)], base_offset=42, producer_id=7, producer_epoch=1, base_sequence=0
    )
    assert lg.producer_state.check(next(iter_batches(retry))) is not None  # a duplicate
    # Turned off, the same leader has it start at its local log start, as KIP-405.
    other = follower(tmp_path / "off")
    assert await rebuild(remote, other, leader, last_tiered_offset=False) == 10
    assert other.log.leader_epoch_cache.entries == [(0, 0)]


async def test_a_start_at_the_leaders_log_start_needs_nothing_from_the_remote_tier(
    tmp_path: Path, remote: Remote
) -> None:
    partition = follower(tmp_path)
    # Records deleted up to 60 before any upload; the leader answers -6 with its log start,
    # and no remote segment holds offset 59.
    leader = Leader(60, LINEAGE, 70, log_start=60, pending_upload=60)
    assert await rebuild(remote, partition, leader, last_tiered_offset=True) == 60
    lg = partition.log
    assert (lg.log_start_offset, lg.local_log_start_offset, lg.log_end_offset) == (60, 60, 60)
    assert lg.leader_epoch_cache.entries == []
    assert remote.errors() == 0


async def test_a_leader_without_its_remote_offsets_leaves_the_follower_as_it_was(
    tmp_path: Path, remote: Remote
) -> None:
    partition = follower(tmp_path)
    leader = Leader(10, LINEAGE, 50, pending_upload=-1)
    with pytest.raises(KafkaError, match="earliest offset pending upload"):
        await rebuild(remote, partition, leader, last_tiered_offset=True)
    lg = partition.log
    assert (lg.log_start_offset, lg.log_end_offset) == (0, 0)


# The fetcher ----------------------------------------------------------------------------------

TIERED = TopicPartition("t", 0)


@pytest.mark.parametrize(
    "error", [ErrorCode.offset_out_of_range, ErrorCode.offset_moved_to_tiered_storage]
)
async def test_an_empty_follower_starts_after_the_last_tiered_offset_on_either_error(
    tmp_path: Path, error: ErrorCode
) -> None:
    tsm = HangingTierStateMachine()
    tsm.release.set()
    async with following(LogManager([tmp_path]), {TIERED: tmp_path}, log_config()) as (
        manager,
        leader,
        partitions,
    ):
        log_start = 3 if error == ErrorCode.offset_out_of_range else 0
        leader.offsets[EARLIEST_TIMESTAMP] = log_start
        leader.offsets[EARLIEST_LOCAL_TIMESTAMP] = 3
        leader.offsets[EARLIEST_PENDING_UPLOAD_TIMESTAMP] = 4
        manager.start_tiering(tsm)  # type: ignore[arg-type]
        leader.fault = lambda tp, offset: (
            FakeLeader.answer(0, offset, error) if offset < 3 else None
        )
        await wait_until(replicated([partitions[TIERED]]), "the log from the last tiered offset")
        assert tsm.started == [
            (TIERED, FetchStart(offset=4, epoch=0, leader_log_start_offset=log_start))
        ]
        lg = partitions[TIERED].log
        assert (lg.log_start_offset, lg.local_log_start_offset, lg.log_end_offset) == (
            log_start,
            4,
            END,
        )


async def test_turned_off_an_empty_follower_out_of_range_starts_at_the_leaders_log_start(
    tmp_path: Path,
) -> None:
    tsm = HangingTierStateMachine()
    off = dataclasses.replace(CONFIG, last_tiered_offset_enable=False)
    async with following(LogManager([tmp_path]), {TIERED: tmp_path}, log_config(), off) as (
        manager,
        leader,
        partitions,
    ):
        leader.offsets[EARLIEST_TIMESTAMP] = 3
        manager.start_tiering(tsm)  # type: ignore[arg-type]
        leader.fault = lambda tp, offset: (
            FakeLeader.answer(0, offset, ErrorCode.offset_out_of_range) if offset < 3 else None
        )
        await wait_until(replicated([partitions[TIERED]]), "the log from the leader's log start")
        assert tsm.started == []
        assert EARLIEST_PENDING_UPLOAD_TIMESTAMP not in leader.listed
        assert partitions[TIERED].log.local_log_start_offset == 3
