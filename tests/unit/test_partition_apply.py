"""A metadata change is applied partition by partition: a log that cannot be created takes
only its partition offline (KAFKA_STORAGE_ERROR); the others change role, and the failed
one is tried again at the next change."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.unit.broker import running_broker
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.storage.topic_partition import TopicPartition

BROKEN = TopicPartition("t", 1)


async def test_one_failing_log_creation_leaves_the_other_partitions_leading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_broker(tmp_path) as broker:
        replicas = broker.replicas
        real = replicas.log_manager.create_logs

        async def create_logs(tps: list[TopicPartition], *args: Any) -> None:
            if BROKEN in tps:
                raise KafkaError(ErrorCode.kafka_storage_error, "injected")
            await real(tps, *args)

        monkeypatch.setattr(replicas.log_manager, "create_logs", create_logs)
        await broker.admin.create_topic("t", 3, 1, {})
        await replicas.applied.wait()
        for p in (0, 2):
            assert replicas.partition_or_error(TopicPartition("t", p)).is_leader
        with pytest.raises(KafkaError) as offline:
            replicas.partition_or_error(BROKEN)
        assert offline.value.code == ErrorCode.kafka_storage_error

        monkeypatch.setattr(replicas.log_manager, "create_logs", real)
        await broker.admin.create_topic("u", 1, 1, {})  # the next metadata change
        await replicas.applied.wait()
        assert replicas.partition_or_error(BROKEN).is_leader
