"""The partition index: its format, and the leader's writer that keeps it true at the cost
of no request per copy."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tests.unit.test_remote_metadata import MemoryTopic
from tests.unit.test_rlm_components import TIP, build_log
from tierbroker.rlm.config import UNLIMITED, RemoteLogManagerConfig
from tierbroker.rlm.copy_task import CopyTask
from tierbroker.rlm.metrics import RemoteStorageMetrics
from tierbroker.rlm.partition_index_writer import PartitionIndexWriter
from tierbroker.rlm.quota import ByteRateLimiter
from tierbroker.rlm.tiered_partition import TieredPartition
from tierbroker.storage.log import LogStartOffsetIncrementReason
from tierbroker.storage.remote.local_fs import LocalFsRemoteStorageManager
from tierbroker.storage.remote.partition_index import PartitionIndex, TopicDescription
from tierbroker.storage.remote.request_meter import ObjectStoreMeter, RequestKind
from tierbroker.storage.remote.segment_metadata import TopicIdPartition
from tierbroker.storage.remote.topic_based_rlmm import TopicBasedRemoteLogMetadataManager
from tierbroker.storage.topic_partition import TopicPartition

INDEX = PartitionIndex(
    tip=TopicIdPartition(uuid.uuid4(), TopicPartition("orders", 2)),
    topic=TopicDescription(partition_count=3, configs={"retention.ms": "-1", "a": "b"}),
    log_start_offset=120,
    leader_epoch=4,
    broker_id=1,
)


def test_an_index_reads_back_as_written() -> None:
    assert PartitionIndex.from_json(INDEX.to_json(), "k") == INDEX


@pytest.mark.parametrize(
    "document",
    [b"not json", b"[]", b'{"version": 9}', INDEX.to_json().replace(b'"configs": {', b'"x": {')],
)
def test_a_document_that_is_not_an_index_is_refused_naming_its_key(document: bytes) -> None:
    with pytest.raises(ValueError, match=r"^prefix/partition\.json: not a partition index"):
        PartitionIndex.from_json(document, "prefix/partition.json")


def puts(rsm: LocalFsRemoteStorageManager) -> int:
    usage = rsm.meter.usage().get("t")
    return usage.requests.get(RequestKind.PUT, 0) if usage else 0


async def test_the_leader_writes_the_index_after_copies_and_again_only_when_it_changes(
    tmp_path: Path,
) -> None:
    lg = build_log(tmp_path / "t-0")
    rlmm = TopicBasedRemoteLogMetadataManager(MemoryTopic(), tmp_path)
    await rlmm.start()
    rsm = LocalFsRemoteStorageManager()
    rsm.configure({"dir": str(tmp_path / "remote")})
    description = TopicDescription(partition_count=1, configs={"retention.ms": "-1"})
    topics = {"t": description}
    partition = TieredPartition(TIP, lg)
    task = CopyTask(
        partition,
        7,
        RemoteLogManagerConfig(),
        rsm,
        rlmm,
        ByteRateLimiter(UNLIMITED),
        RemoteStorageMetrics(CollectorRegistry(), ObjectStoreMeter()),
        PartitionIndexWriter(rsm, topics.get, 7, 60.0),
    )
    index_path = tmp_path / "remote" / rsm.layout.partition_index_key(TIP)

    await task.run_once()
    assert rlmm.readable_segments(TIP), "nothing was copied"
    written = PartitionIndex.from_json(index_path.read_bytes(), str(index_path))
    assert written == PartitionIndex(
        tip=TIP, topic=description, log_start_offset=0, leader_epoch=0, broker_id=7
    )

    before = puts(rsm)
    await task.run_once()
    assert puts(rsm) == before, "an unchanged index was written again"

    lg.maybe_increment_log_start_offset(5, LogStartOffsetIncrementReason.CLIENT_RECORD_DELETION)
    topics["t"] = TopicDescription(partition_count=4, configs={})
    await task.run_once()
    assert puts(rsm) == before + 1
    again = PartitionIndex.from_json(index_path.read_bytes(), str(index_path))
    assert (again.log_start_offset, again.topic.partition_count) == (5, 4)

    await rsm.delete_partition_index(TIP)
    assert not index_path.exists()
