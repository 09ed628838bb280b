"""`LeaderEndpoint`: what a follower asks its leader besides Fetch, over the wire.

As Kafka's `RemoteLeaderEndPoint`: ListOffsets v11 (the version that knows every special
offset, EARLIEST_PENDING_UPLOAD_TIMESTAMP of KIP-1023 the last) with this broker's id as
`ReplicaId`, so the leader answers up to its log end; and OffsetsForLeaderEpoch. Each call
names the partition's current leader epoch, so a leader that moved on answers
FENCED_LEADER_EPOCH; an error in the answer, or a leader that cannot be reached
(LEADER_NOT_AVAILABLE), is raised as `KafkaError`. Shares its `BrokerClient` with the
fetcher that owns it.
"""

from __future__ import annotations

import datetime
from typing import Any

from kio.schema.list_offsets.v11 import request as list_offsets_request
from kio.schema.offset_for_leader_epoch.v4 import request as epoch_request
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i8, i32, i32Timedelta, i64

from tierbroker.broker.network.broker_client import BrokerClient, BrokerUnavailable
from tierbroker.broker.replication.partition import Partition
from tierbroker.protocol.errors import ErrorCode, KafkaError


class LeaderEndpoint:
    def __init__(self, broker_id: int, leader_id: int, client: BrokerClient) -> None:
        self.broker_id = broker_id
        self.leader_id = leader_id
        self.client = client

    async def list_offset(self, partition: Partition, timestamp: int) -> tuple[int, int]:
        """(offset, leader epoch) the leader answers ListOffsets `timestamp` with."""
        tp = partition.topic_partition
        request = list_offsets_request.ListOffsetsRequest(
            replica_id=BrokerId(self.broker_id),
            isolation_level=i8(0),
            topics=(
                list_offsets_request.ListOffsetsTopic(
                    name=TopicName(tp.topic),
                    partitions=(
                        list_offsets_request.ListOffsetsPartition(
                            partition_index=i32(tp.partition),
                            current_leader_epoch=i32(partition.leader_epoch),
                            timestamp=i64(timestamp),
                        ),
                    ),
                ),
            ),
            timeout=i32Timedelta.parse(
                datetime.timedelta(milliseconds=self.client.request_timeout_ms)
            ),
        )
        answer = (await self._send(request)).topics[0].partitions[0]
        self._check(answer.error_code, f"ListOffsets({timestamp}) of {tp}")
        return int(answer.offset), int(answer.leader_epoch)

    async def epoch_end_offset(self, partition: Partition, epoch: int) -> tuple[int, int]:
        """(largest epoch <= `epoch`, its end offset) in the leader's log."""
        tp = partition.topic_partition
        request = epoch_request.OffsetForLeaderEpochRequest(
            replica_id=BrokerId(self.broker_id),
            topics=(
                epoch_request.OffsetForLeaderTopic(
                    topic=TopicName(tp.topic),
                    partitions=(
                        epoch_request.OffsetForLeaderPartition(
                            partition=i32(tp.partition),
                            current_leader_epoch=i32(partition.leader_epoch),
                            leader_epoch=i32(epoch),
                        ),
                    ),
                ),
            ),
        )
        answer = (await self._send(request)).topics[0].partitions[0]
        self._check(answer.error_code, f"OffsetsForLeaderEpoch({epoch}) of {tp}")
        return int(answer.leader_epoch), int(answer.end_offset)

    async def _send(self, request: Any) -> Any:
        try:
            return await self.client.send(request)
        except BrokerUnavailable as e:
            raise KafkaError(ErrorCode.leader_not_available, str(e)) from e

    def _check(self, error_code: int, what: str) -> None:
        if error_code != ErrorCode.none:
            raise KafkaError(ErrorCode(error_code), f"{what} to broker {self.leader_id}")
