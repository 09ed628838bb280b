"""DescribeTopicPartitions answers empty ELR lists where Kafka does: its Admin client (and
so kafka-topics --describe and kafka-get-offsets) fails on a null one."""

from __future__ import annotations

from pathlib import Path

from kio.schema.describe_topic_partitions.v0.request import (
    DescribeTopicPartitionsRequest,
    TopicRequest,
)
from kio.schema.types import TopicName

from tests.unit.broker import running_broker
from tierbroker.broker.network.broker_client import BrokerClient


async def test_every_partition_has_empty_elr_lists_not_null(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as broker:
        await broker.admin.create_topic("t", 2, 1, {})
        await broker.replicas.applied.wait()
        client = BrokerClient(broker.endpoints.host, broker.endpoints.port, "test")
        try:
            response = await client.send(
                DescribeTopicPartitionsRequest(
                    topics=(TopicRequest(name=TopicName("t")),),
                    response_partition_limit=2000,
                    cursor=None,
                )
            )
        finally:
            await client.close()
    (topic,) = response.topics
    assert [p.partition_index for p in topic.partitions] == [0, 1]
    for partition in topic.partitions:
        assert partition.eligible_leader_replicas == ()
        assert partition.last_known_elr == ()
