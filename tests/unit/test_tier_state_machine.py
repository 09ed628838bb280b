"""A follower below its leader's local log: the leader's OFFSET_MOVED_TO_TIERED_STORAGE
window, and the follower's rebuild from the remote tier (`TierStateMachine`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tests.unit.replicas import replica_manager
from tests.unit.test_remote_metadata import MemoryTopic
from tests.unit.test_rlm_components import TIP, build_log, local_fs
from tierbroker.broker.metadata.zk_data import PartitionState
from tierbroker.broker.replication.fetch_start import fetch_start
from tierbroker.broker.replication.partition import Partition
from tierbroker.broker.replication.replica_manager import FetchParams, FetchRequestPartition
from tierbroker.broker.replication.tier_state_machine import TierStateMachine
from tierbroker.protocol.errors import ErrorCode
from tierbroker.protocol.records import build_batch, iter_batches
from tierbroker.rlm.metrics import RemoteStorageMetrics
from tierbroker.storage.log import (
    EARLIEST_LOCAL_TIMESTAMP,
    EARLIEST_PENDING_UPLOAD_TIMESTAMP,
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    Log,
    LogStartOffsetIncrementReason,
)
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.log_manager import LogManager
from tierbroker.storage.producer_state import ProducerStateManager
from tierbroker.storage.remote.request_meter import ObjectStoreMeter
from tierbroker.storage.remote.segment_metadata import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
)
from tierbroker.storage.remote.storage_manager import LogSegmentData, RemoteStorageError
from tierbroker.storage.remote.topic_based_rlmm import TopicBasedRemoteLogMetadataManager

TP = TIP.topic_partition
FOLLOWER = 1


# The leader's window ----------------------------------------------------------------------


def leader_of(tmp_path: Path, lg: Log) -> tuple[object, Partition]:
    replicas = replica_manager(LogManager([tmp_path]))
    partition = Partition(lg, 0)
    partition.make_leader(PartitionState(0, 0, (0, FOLLOWER), 1, 0), (0, FOLLOWER))
    replicas.partitions[TP] = partition
    return replicas, partition


async def follower_fetch(replicas: object, offset: int) -> ErrorCode:
    params = FetchParams(max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, replica_id=FOLLOWER)
    [answer] = await replicas.fetch_messages(  # type: ignore[attr-defined]
        params, [FetchRequestPartition(TP, offset, 1 << 20)]
    )
    return ErrorCode(answer.error)


async def test_the_leader_answers_offset_moved_to_tiered_storage_only_between_both_log_starts(
    tmp_path: Path,
) -> None:
    lg = build_log(tmp_path / "t-0")
    lg.update_highest_offset_in_remote_storage(lg.segments[-2].next_offset - 1)
    lg.config = dataclasses.replace(lg.config, local_retention_bytes=0)
    assert lg.delete_old_segments()
    lg.maybe_increment_log_start_offset(5, LogStartOffsetIncrementReason.CLIENT_RECORD_DELETION)
    local_start = lg.local_log_start_offset
    assert 5 < local_start < lg.log_end_offset
    replicas, _ = leader_of(tmp_path, lg)

    assert await follower_fetch(replicas, 4) == ErrorCode.offset_out_of_range
    assert await follower_fetch(replicas, 5) == ErrorCode.offset_moved_to_tiered_storage
    assert await follower_fetch(replicas, local_start - 1) == (
        ErrorCode.offset_moved_to_tiered_storage
    )
    assert await follower_fetch(replicas, local_start) == ErrorCode.none
    assert await follower_fetch(replicas, lg.log_end_offset) == ErrorCode.none
    assert await follower_fetch(replicas, lg.log_end_offset + 1) == ErrorCode.offset_out_of_range
    lg.close()


async def test_a_partition_that_is_not_tiered_never_answers_offset_moved_to_tiered_storage(
    tmp_path: Path,
) -> None:
    lg = build_log(tmp_path / "t-0")
    lg.config = dataclasses.replace(lg.config, remote_storage_enable=False, retention_bytes=0)
    assert lg.delete_old_segments()
    assert lg.log_start_offset == lg.local_log_start_offset > 0
    replicas, _ = leader_of(tmp_path, lg)

    assert await follower_fetch(replicas, 0) == ErrorCode.offset_out_of_range
    assert await follower_fetch(replicas, lg.log_start_offset - 1) == ErrorCode.offset_out_of_range
    assert await follower_fetch(replicas, lg.log_start_offset) == ErrorCode.none
    lg.close()


# The follower's rebuild ---------------------------------------------------------------------


class Leader:
    """What the leader answers: its log start, local log start, log end and earliest offset
    pending upload (ListOffsets, each timestamp asked noted in `listed`), and its epochs'
    end offsets (those asked in `asked`)."""

    def __init__(
        self,
        local_start: int,
        epochs: list[tuple[int, int]],
        end: int,
        log_start: int = 0,
        pending_upload: int = -1,
    ) -> None:
        self.local_start = local_start
        self.epochs = epochs  # (epoch, start offset)
        self.end = end
        self.offsets = {
            EARLIEST_TIMESTAMP: log_start,
            EARLIEST_LOCAL_TIMESTAMP: local_start,
            LATEST_TIMESTAMP: end,
            EARLIEST_PENDING_UPLOAD_TIMESTAMP: pending_upload,
        }
        self.asked: list[int] = []
        self.listed: list[int] = []

    async def list_offset(self, _partition: Partition, timestamp: int) -> tuple[int, int]:
        self.listed.append(timestamp)
        offset = self.offsets[timestamp]
        epochs = [e for e, start in self.epochs if start <= offset]
        return offset, max(epochs) if offset >= 0 and epochs else -1

    async def epoch_end_offset(self, _partition: Partition, epoch: int) -> tuple[int, int]:
        self.asked.append(epoch)
        below = [(e, i) for i, (e, _) in enumerate(self.epochs) if e <= epoch]
        e, i = below[-1]
        return e, self.epochs[i + 1][1] if i + 1 < len(self.epochs) else self.end


def checkpoint(epochs: list[tuple[int, int]]) -> bytes:
    lines = ["0", str(len(epochs)), *(f"{e} {start}" for e, start in epochs)]
    return ("\n".join(lines) + "\n").encode()


class Remote:
    """A remote tier holding segments of a leader's lineage: metadata and indexes."""

    def __init__(self, tmp_path: Path, lineage: list[tuple[int, int]]) -> None:
        self.dir = tmp_path
        self.lineage = lineage
        self.rsm = local_fs(tmp_path / "remote")
        self.rlmm = TopicBasedRemoteLogMetadataManager(MemoryTopic(), tmp_path)
        self.metrics = RemoteStorageMetrics(CollectorRegistry(), ObjectStoreMeter())
        self.machine = TierStateMachine(self.rlmm, self.rsm, self.metrics, 5_000)

    async def add(
        self,
        start: int,
        end: int,
        epochs: tuple[tuple[int, int], ...],
        snapshot: Path | None = None,
        event_ms: int = 0,
    ) -> RemoteLogSegmentMetadata:
        files = self.dir / f"files-{start}-{end}-{event_ms}"
        files.mkdir()
        for name in ("log", "index", "timeindex"):
            (files / name).write_bytes(b"")
        metadata = RemoteLogSegmentMetadata(
            segment_id=RemoteLogSegmentId.generate(TIP),
            start_offset=start,
            end_offset=end,
            max_timestamp_ms=0,
            broker_id=0,
            event_timestamp_ms=event_ms,
            segment_size_bytes=end - start + 1,
            segment_leader_epochs=epochs,
        )
        await self.rlmm.add_remote_log_segment_metadata(metadata)
        await self.rsm.copy_log_segment_data(
            metadata,
            LogSegmentData(
                log_segment=files / "log",
                offset_index=files / "index",
                time_index=files / "timeindex",
                transaction_index=None,
                producer_snapshot_index=snapshot,
                leader_epoch_index=checkpoint([(e, s) for e, s in self.lineage if s <= end]),
            ),
        )
        finished = metadata.with_state(RemoteLogSegmentState.COPY_SEGMENT_FINISHED, event_ms)
        await self.rlmm.update_remote_log_segment_metadata(finished)
        return finished

    async def follow(self) -> None:
        """This broker follows the partition and has read its metadata partition."""
        self.rlmm.on_partition_leadership_changes([], [TIP])
        await self.rlmm.consumer.consume(self.rlmm.consumer.assigned[TIP])

    def errors(self) -> float:
        value = self.metrics.build_aux_state_errors.labels(TP.topic)._value.get()
        return float(value)


def follower(tmp_path: Path) -> Partition:
    lg = Log(tmp_path / "follower" / "t-0", TP, LogConfig(remote_storage_enable=True), TIP.topic_id)
    partition = Partition(lg, FOLLOWER)
    partition.make_follower(PartitionState(0, 3, (0,), 1, 0), (0, FOLLOWER))
    return partition


async def rebuild(
    remote: Remote, partition: Partition, leader: Leader, last_tiered_offset: bool = False
) -> int:
    """Rebuild `partition`'s log where `fetch_start` says; where it starts."""
    start = await fetch_start(partition, leader, last_tiered_offset)  # type: ignore[arg-type]
    state = await remote.machine.build_remote_log_aux_state(
        partition,
        leader,  # type: ignore[arg-type]
        start,
    )
    state.apply(partition.log)
    return state.next_offset


LINEAGE = [(0, 0), (2, 25), (3, 40)]  # epoch 1 wrote nothing


@pytest.fixture
async def remote(tmp_path: Path) -> Remote:
    remote = Remote(tmp_path, LINEAGE)
    await remote.rlmm.start()
    await remote.add(0, 9, ((0, 0),))
    await remote.add(10, 24, ((0, 10),))
    await remote.add(25, 39, ((2, 25),))
    await remote.follow()
    return remote


async def test_the_segment_before_the_leaders_local_log_in_its_epoch_is_the_one_rebuilt_from(
    tmp_path: Path, remote: Remote
) -> None:
    partition = follower(tmp_path)
    leader = Leader(35, LINEAGE, 50)  # local log from the middle of epoch 2's segment
    assert await rebuild(remote, partition, leader) == 40
    lg = partition.log
    assert leader.asked == [1]  # epoch 1 ends at 25, before 34: offset 34 is epoch 2's
    assert lg.log_start_offset == 0
    assert lg.local_log_start_offset == lg.log_end_offset == lg.high_watermark == 40
    assert lg.leader_epoch_cache.entries == [(0, 0), (2, 25)]


async def test_an_epoch_without_records_before_the_local_log_is_skipped(
    tmp_path: Path, remote: Remote
) -> None:
    partition = follower(tmp_path)
    # The local log starts with epoch 2; offset 24, just before, was written in epoch 0:
    # asking for epoch 1 (which wrote nothing) answers epoch 0, ending at 25.
    assert await rebuild(remote, partition, Leader(25, LINEAGE, 50)) == 25
    assert partition.log.leader_epoch_cache.entries == [(0, 0)]


async def test_a_new_leaders_wider_upload_is_preferred_over_the_one_it_covers(
    tmp_path: Path, remote: Remote
) -> None:
    wider = await remote.add(25, 44, ((2, 25), (3, 40)), event_ms=1)
    partition = follower(tmp_path)
    assert await rebuild(remote, partition, Leader(45, LINEAGE, 50)) == wider.end_offset + 1
    assert partition.log.leader_epoch_cache.entries == LINEAGE


async def test_a_remote_segment_of_another_lineage_is_refused_and_the_log_left_alone(
    tmp_path: Path, remote: Remote
) -> None:
    partition = follower(tmp_path)
    lg = partition.log
    lg.append_as_follower(build_batch([(None, b"kept", [], 0)], partition_leader_epoch=0))
    # The leader says offset 34 is in epoch 4; the remote tier has it in epoch 2.
    with pytest.raises(RemoteStorageError, match="offset 34 in leader epoch 4"):
        await rebuild(remote, partition, Leader(35, [(0, 0), (4, 25)], 50))
    # Not caught up yet with the metadata of the segment before offset 60.
    with pytest.raises(RemoteStorageError, match="offset 59"):
        await rebuild(remote, partition, Leader(60, LINEAGE, 70))
    assert remote.errors() == 2
    assert (lg.log_start_offset, lg.log_end_offset) == (0, 1)
    assert lg.leader_epoch_cache.entries == [(0, 0)]


async def test_producer_state_comes_from_the_remote_segments_snapshot(
    tmp_path: Path, remote: Remote
) -> None:
    (tmp_path / "leader").mkdir()
    producers = ProducerStateManager(tmp_path / "leader", TP)
    batch = build_batch(
        [(None, b"v", [], 0)], base_offset=42, producer_id=7, producer_epoch=1, base_sequence=0
    )
    producers.update(next(iter_batches(batch)))
    producers.take_snapshot(45)
    await remote.add(40, 44, ((3, 40),), snapshot=producers.snapshot_path(45))
    partition = follower(tmp_path)
    assert await rebuild(remote, partition, Leader(45, LINEAGE, 50)) == 45
    lg = partition.log
    assert set(lg.producer_state.producers) == {7}
    # The next batch of that producer is in sequence; a retry of the last one is a duplicate.
    retry = build_batch(
        [(None, b"v", [], 0)], base_offset=42, producer_id=7, producer_epoch=1, base_sequence=0
    )
    assert lg.producer_state.check(next(iter_batches(retry))) is not None


async def test_a_rebuilt_log_truncated_below_its_local_log_starts_over_there(
    tmp_path: Path, remote: Remote
) -> None:
    partition = follower(tmp_path)
    assert await rebuild(remote, partition, Leader(35, LINEAGE, 50)) == 40
    lg = partition.log
    lg.append_as_follower(
        build_batch([(None, b"v", [], 0)], base_offset=40, partition_leader_epoch=3)
    )
    lg.truncate_to(30)  # a new leader's log left this one at offset 30
    assert (lg.log_start_offset, lg.local_log_start_offset, lg.log_end_offset) == (30, 30, 30)
    assert lg.leader_epoch_cache.entries == []
