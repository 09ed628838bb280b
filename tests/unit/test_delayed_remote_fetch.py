"""A delayed fetch whose offset moves into the remote tier while it waits is served from there."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from prometheus_client import CollectorRegistry

from tests.unit.replicas import lead_log, replica_manager
from tests.unit.test_remote_metadata import MemoryTopic
from tests.unit.test_rlm_components import (
    TIP,
    batches_of,
    build_log,
    expected_read,
    local_fs,
    tier_rolled_segments,
)
from tierbroker.broker.replication.replica_manager import FetchParams, FetchRequestPartition
from tierbroker.protocol.errors import ErrorCode
from tierbroker.protocol.records import build_batch
from tierbroker.rlm.config import RemoteLogManagerConfig
from tierbroker.rlm.remote_log_manager import RemoteLogManager
from tierbroker.storage.log_manager import LogManager
from tierbroker.storage.remote.topic_based_rlmm import TopicBasedRemoteLogMetadataManager

TP = TIP.topic_partition


async def test_a_waiting_fetch_whose_offset_went_remote_reads_the_remote_tier(
    tmp_path: Path,
) -> None:
    lg = build_log(tmp_path / "t-0")
    table = batches_of(lg)
    rsm = local_fs(tmp_path / "remote")
    rlmm = TopicBasedRemoteLogMetadataManager(MemoryTopic(), tmp_path)
    await rlmm.start()
    copied = await tier_rolled_segments(lg, rsm, rlmm)
    rlm = RemoteLogManager(
        RemoteLogManagerConfig(), 0, rsm, rlmm, tmp_path / "logdir", CollectorRegistry()
    )
    replicas = replica_manager(LogManager([tmp_path]))
    lead_log(replicas, lg)
    replicas.attach_remote_log_manager(rlm)

    offset = copied[0].start_offset + 3  # still in the local log when the fetch starts
    params = FetchParams(max_wait_ms=30_000, min_bytes=10 * lg.size_in_bytes, max_bytes=5000)
    fetch = asyncio.create_task(
        replicas.fetch_messages(params, [FetchRequestPartition(TP, offset, 5000)])
    )
    await asyncio.sleep(0)  # the fetch reads locally, falls short of min_bytes and waits
    assert not fetch.done()

    # Local retention deletes every copied segment; the next append wakes the fetch.
    lg.config = dataclasses.replace(lg.config, local_retention_bytes=0)
    assert lg.delete_old_segments()
    assert lg.local_log_start_offset > offset
    end = lg.log_end_offset
    await replicas.append_records({TP: bytes(build_batch([(None, b"wake up", [], 0)]))})

    [answer] = await asyncio.wait_for(fetch, 10)  # the test's guard, far below max_wait_ms
    assert answer.error == ErrorCode.none
    assert answer.high_watermark == lg.high_watermark == end + 1
    assert answer.log_start_offset == lg.log_start_offset
    assert answer.records is not None
    assert bytes(answer.records) == expected_read(table[:-1], offset, 5000)
    await rlm.reader.close()
    lg.close()
