"""CreateTopics' batched creation: the loop serves between batches, a topic deleted
meanwhile leaves no logs behind, and a request's size is bounded as Kafka bounds it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tierbroker.broker.cluster.controller import (
    LEAD_BATCH_PARTITIONS,
    MAX_PARTITIONS_PER_REQUEST,
    Controller,
    check_request_size,
)
from tierbroker.broker.cluster.metadata_store import LocalMetadataStore
from tierbroker.broker.replica_manager import ReplicaManager
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.storage.log_manager import LogManager
from tierbroker.storage.topic_partition import TopicPartition

PARTITIONS = 3 * LEAD_BATCH_PARTITIONS


def controller(tmp_path: Path) -> Controller:
    log_manager = LogManager([tmp_path / "logs"])
    replicas = ReplicaManager(0, log_manager)
    return Controller(0, LocalMetadataStore(tmp_path / "logs"), replicas, {}, 1, 1)


async def test_the_loop_serves_while_partitions_are_created(tmp_path: Path) -> None:
    c = controller(tmp_path)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(tick())
    try:
        topic = await c.create_topic_batched("t", PARTITIONS, 1, {})
    finally:
        ticker.cancel()
        await asyncio.gather(ticker, return_exceptions=True)
    assert ticks > PARTITIONS // LEAD_BATCH_PARTITIONS
    assert len(c.replicas.partitions) == topic.partitions == PARTITIONS
    assert c.replicas.partitions[TopicPartition("t", 5)].log.leader_epoch_cache.entries == [(0, 0)]


async def test_a_topic_deleted_while_created_leaves_no_logs(tmp_path: Path) -> None:
    c = controller(tmp_path)
    log_manager = c.replicas.log_manager
    create_logs = log_manager.create_logs
    batches = 0

    async def delete_before_the_second_batch(*args: Any) -> None:
        nonlocal batches
        batches += 1
        if batches == 2:
            assert c.replicas.partitions  # the first batch is led
            c.delete_topic("t")
        await create_logs(*args)

    log_manager.create_logs = delete_before_the_second_batch  # type: ignore[method-assign]
    await c.create_topic_batched("t", PARTITIONS, 1, {})
    assert batches == 2
    assert not c.replicas.partitions
    assert not c.replicas.log_manager.logs
    assert not [p for p in (tmp_path / "logs").iterdir() if p.is_dir()]


def test_a_request_of_too_many_partitions_is_a_policy_violation() -> None:
    check_request_size([MAX_PARTITIONS_PER_REQUEST - 1, 1, -1])
    with pytest.raises(KafkaError) as refused:
        check_request_size([MAX_PARTITIONS_PER_REQUEST, 1])
    assert refused.value.code == ErrorCode.policy_violation
    assert str(refused.value.args[0]) == "Unable to perform excessively large batch operation."
