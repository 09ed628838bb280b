"""`__remote_log_metadata` is created with its whole replication factor: at start when
enough brokers are live or no broker may join (one process holds the cluster), else once
they are; until then appends are refused, so copies wait and retry."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.broker import running_broker
from tierbroker.broker.coordinator.internal_topic import RemoteLogMetadataTopic
from tierbroker.protocol.errors import ErrorCode, KafkaError

# No remote log manager of the broker's own: it would create and replay the topic too.
UNTIERED = "remote.log.storage.system.enable=false"


async def test_while_too_few_brokers_are_live_appends_wait_for_more(tmp_path: Path) -> None:
    async with running_broker(tmp_path, UNTIERED) as broker:
        topic = RemoteLogMetadataTopic(4, 3, broker.replicas, broker.admin, brokers_may_join=True)
        await topic.ensure_created()
        assert RemoteLogMetadataTopic.NAME not in broker.cache.topics  # 1 live broker of 3
        with pytest.raises(KafkaError) as refused:
            await topic.append(2, b"key", b"value")
        assert refused.value.code == ErrorCode.not_enough_replicas
        assert "remote.log.metadata.topic.replication.factor" in str(refused.value)
        assert RemoteLogMetadataTopic.NAME not in broker.cache.topics  # not on one broker


async def test_the_first_append_creates_the_topic_once_enough_brokers_are_live(
    tmp_path: Path,
) -> None:
    async with running_broker(tmp_path, UNTIERED) as broker:
        topic = RemoteLogMetadataTopic(4, 1, broker.replicas, broker.admin, brokers_may_join=True)
        assert await topic.append(2, b"key", b"value") == 0
        assert RemoteLogMetadataTopic.NAME in broker.cache.topics


async def test_the_topic_is_created_at_start_when_enough_brokers_are_live(
    tmp_path: Path,
) -> None:
    async with running_broker(tmp_path, UNTIERED) as broker:
        topic = RemoteLogMetadataTopic(4, 1, broker.replicas, broker.admin, brokers_may_join=True)
        await topic.ensure_created()
        assert RemoteLogMetadataTopic.NAME in broker.cache.topics


async def test_a_cluster_in_one_process_creates_the_topic_at_start(tmp_path: Path) -> None:
    async with running_broker(tmp_path, UNTIERED) as broker:
        topic = RemoteLogMetadataTopic(4, 3, broker.replicas, broker.admin)
        await topic.ensure_created()
        assignment = broker.cache.topics[RemoteLogMetadataTopic.NAME]
        assert [len(replicas) for replicas in assignment.partitions.values()] == [1] * 4
