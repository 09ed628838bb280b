"""On leadership a tiered partition's log start offset comes back from the remote tier, however
its checkpoint was lost: never below what remote retention already deleted."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tests.unit.test_remote_metadata import MemoryTopic
from tests.unit.test_rlm_components import TIP, build_log, local_fs, tier_rolled_segments
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.rlm.config import RemoteLogManagerConfig
from tierbroker.rlm.remote_log_manager import RemoteLogManager
from tierbroker.storage.log import Log, LogStartOffsetIncrementReason
from tierbroker.storage.remote.segment_metadata import (
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
)
from tierbroker.storage.remote.topic_based_rlmm import TopicBasedRemoteLogMetadataManager


async def tiered(tmp_path: Path) -> tuple[Log, RemoteLogManager, list[RemoteLogSegmentMetadata]]:
    lg = build_log(tmp_path / "t-0")
    rsm = local_fs(tmp_path / "remote")
    rlmm = TopicBasedRemoteLogMetadataManager(MemoryTopic(), tmp_path)
    await rlmm.start()
    copied = await tier_rolled_segments(lg, rsm, rlmm)
    rlm = RemoteLogManager(
        RemoteLogManagerConfig(), 0, rsm, rlmm, tmp_path / "logdir", CollectorRegistry()
    )
    return lg, rlm, copied


async def lead(rlm: RemoteLogManager, lg: Log) -> None:
    """Lead the partition, then run its copy task once its metadata is caught up: the copy
    task restores the log's remote offsets."""
    rlm.on_leadership(TIP, lg)
    assert isinstance(rlm.rlmm, TopicBasedRemoteLogMetadataManager)
    await rlm.rlmm.consumer.consume(rlm.rlmm.consumer.assigned[TIP])
    await rlm.copier._tasks[TIP].run_once()


async def delete_remote(rlm: RemoteLogManager, segments: list[RemoteLogSegmentMetadata]) -> None:
    """What remote retention does to the metadata, the log start offset left behind."""
    for m in segments:
        for state in (
            RemoteLogSegmentState.DELETE_SEGMENT_STARTED,
            RemoteLogSegmentState.DELETE_SEGMENT_FINISHED,
        ):
            m = m.with_state(state, 1)
            await rlm.rlmm.update_remote_log_segment_metadata(m)


async def test_the_log_starts_at_the_earliest_remote_segment(tmp_path: Path) -> None:
    lg, rlm, copied = await tiered(tmp_path)
    await delete_remote(rlm, copied[:2])
    assert lg.log_start_offset == 0  # as after a lost log-start-offset-checkpoint
    await lead(rlm, lg)
    assert lg.log_start_offset == copied[2].start_offset
    assert lg.highest_offset_in_remote_storage == copied[-1].end_offset
    with pytest.raises(KafkaError) as gone:
        lg.read(0, 1000, lg.high_watermark, min_one_batch=True)
    assert gone.value.code == ErrorCode.offset_out_of_range
    lg.close()


async def test_with_an_empty_remote_tier_the_log_starts_at_the_local_log(tmp_path: Path) -> None:
    lg, rlm, copied = await tiered(tmp_path)
    lg.config = dataclasses.replace(lg.config, local_retention_bytes=0)
    assert lg.delete_old_segments()  # local retention: only the active segment is left
    await delete_remote(rlm, copied)
    assert lg.log_start_offset == 0 < lg.local_log_start_offset
    await lead(rlm, lg)
    assert lg.log_start_offset == lg.local_log_start_offset == copied[-1].end_offset + 1
    lg.close()


async def test_a_log_start_offset_above_the_remote_tier_stays(tmp_path: Path) -> None:
    lg, rlm, copied = await tiered(tmp_path)
    deleted_records_to = copied[1].start_offset + 3  # DeleteRecords inside a remote segment
    lg.maybe_increment_log_start_offset(
        deleted_records_to, LogStartOffsetIncrementReason.CLIENT_RECORD_DELETION
    )
    await lead(rlm, lg)
    assert lg.log_start_offset == deleted_records_to
    lg.close()


async def test_status_leaves_out_segments_below_the_log_start_offset(tmp_path: Path) -> None:
    """Expiration moves the log start offset before it deletes: status shows the log as a
    reader sees it meanwhile, whatever moment it is read at."""
    lg, rlm, copied = await tiered(tmp_path)
    await lead(rlm, lg)
    lg.maybe_increment_log_start_offset(
        copied[2].start_offset, LogStartOffsetIncrementReason.SEGMENT_DELETION
    )
    [row] = rlm.status()
    assert row["log_start_offset"] == row["remote_log_start_offset"] == copied[2].start_offset
    assert row["remote_segments"] == len(copied) - 2
    assert row["remote_bytes"] == sum(m.segment_size_bytes for m in copied[2:])
    lg.close()
