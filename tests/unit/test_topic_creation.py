"""Creating many partitions: the loop serves while their logs are made, a topic deleted
meanwhile leaves no logs behind, and a request's size is bounded as Kafka bounds it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.unit.broker import running_broker
from tierbroker.broker.metadata.topic_admin import MAX_PARTITIONS_PER_REQUEST, check_request_size
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.storage.log_manager import DELETED_DIR_SUFFIX
from tierbroker.storage.topic_partition import TopicPartition

PARTITIONS = 768


async def test_the_loop_serves_while_partitions_are_created(tmp_path: Path) -> None:
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    async with running_broker(tmp_path) as broker:
        ticker = asyncio.create_task(tick())
        try:
            await broker.admin.create_topic("t", PARTITIONS, 1, {})
            await broker.replicas.applied.wait()
        finally:
            ticker.cancel()
            await asyncio.gather(ticker, return_exceptions=True)
        assert ticks > 10
        partitions = broker.replicas.partitions
        assert len([tp for tp in partitions if tp.topic == "t"]) == PARTITIONS
        assert partitions[TopicPartition("t", 5)].log.leader_epoch_cache.entries == [(0, 0)]


async def test_a_topic_deleted_while_created_leaves_no_logs(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as broker:
        create_logs = broker.log_manager.create_logs

        async def delete_first(*args: Any) -> None:
            # Asked before this broker made any of its logs; not awaited, since the deletion
            # is seen only after this creation returns.
            with pytest.raises(KafkaError) as waited:
                await broker.admin.delete_topic("t", timeout_s=0.1)
            assert waited.value.code == ErrorCode.request_timed_out
            await create_logs(*args)

        broker.log_manager.create_logs = delete_first  # type: ignore[method-assign]
        try:
            await broker.admin.create_topic("t", PARTITIONS, 1, {}, timeout_s=1)
        except KafkaError as e:
            assert e.code == ErrorCode.request_timed_out  # deleted before it was seen whole
        await broker.replicas.applied.wait()
        assert not [tp for tp in broker.replicas.partitions if tp.topic == "t"]
        assert not [tp for tp in broker.log_manager.logs if tp.topic == "t"]
        # Only deleted logs' directories, being removed in a worker thread, may remain.
        left = (tmp_path / "logs").glob("t-*")
        assert not [p for p in left if not p.name.endswith(DELETED_DIR_SUFFIX)]


def test_a_request_of_too_many_partitions_is_a_policy_violation() -> None:
    check_request_size([MAX_PARTITIONS_PER_REQUEST - 1, 1, -1])
    with pytest.raises(KafkaError) as refused:
        check_request_size([MAX_PARTITIONS_PER_REQUEST, 1])
    assert refused.value.code == ErrorCode.policy_violation
    assert str(refused.value.args[0]) == "Unable to perform excessively large batch operation."
