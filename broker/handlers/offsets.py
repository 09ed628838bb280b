"""ListOffsets and OffsetForLeaderEpoch: offsets by timestamp, and where epochs end.

With an authorizer both need DESCRIBE on the topic (TOPIC_AUTHORIZATION_FAILED); a
follower's OffsetForLeaderEpoch needs CLUSTER_ACTION (CLUSTER_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

import asyncio
from typing import Any

from tierbroker.broker.handlers.authorize import Op, require, unauthorized_cluster
from tierbroker.broker.handlers.common import (
    NO_THROTTLE,
    BrokerContext,
    field,
    make,
    response_module,
)
from tierbroker.broker.security.authorizer.acl import ResourceType
from tierbroker.protocol.codec import Request
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.storage.topic_partition import TopicPartition

# The special timestamps and the ListOffsets version that brought each (max timestamp,
# earliest local, latest tiered, earliest pending upload); older versions get
# UNSUPPORTED_VERSION, as from Kafka.
_SPECIAL_TIMESTAMP_SINCE = {-3: 7, -4: 8, -5: 9, -6: 11}


async def handle_list_offsets(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    m = response_module(request.api_key, request.api_version)
    # v10+ carries the client's timeout for lookups in the remote tier (KIP-1075).
    timeout = field(request.body, "timeout", None)
    timeout_s = timeout.total_seconds() if timeout and timeout.total_seconds() > 0 else None
    replica_id = request.body.replica_id
    read_committed = field(request.body, "isolation_level", 0) == 1  # v2+

    async def partition_response(topic: str, p: Any) -> Any:
        values: dict[str, Any] = {
            "error_code": ErrorCode.none,
            "timestamp": -1,
            "offset": -1,
            "leader_epoch": -1,
        }
        try:
            require(ctx, Op.DESCRIBE, ResourceType.TOPIC, topic)
            if request.api_version < _SPECIAL_TIMESTAMP_SINCE.get(p.timestamp, 0):
                raise KafkaError(
                    ErrorCode.unsupported_version,
                    f"timestamp {p.timestamp} needs ListOffsets v"
                    f"{_SPECIAL_TIMESTAMP_SINCE[p.timestamp]}",
                )
            found = await ctx.replicas.fetch_offset_for_timestamp(
                TopicPartition(topic, p.partition_index),
                p.timestamp,
                field(p, "current_leader_epoch", -1),
                timeout_s,
                replica_id=replica_id,
                read_committed=read_committed,
            )
            if found is not None:
                values.update(
                    timestamp=found.timestamp, offset=found.offset, leader_epoch=found.leader_epoch
                )
        except KafkaError as e:
            values["error_code"] = e.code
            # Only v5+ knows OFFSET_NOT_AVAILABLE: Kafka answers older versions this way.
            if e.code == ErrorCode.offset_not_available and request.api_version < 5:
                values["error_code"] = ErrorCode.leader_not_available
        return make(m.ListOffsetsPartitionResponse, partition_index=p.partition_index, **values)

    topics = []
    for topic in request.body.topics:
        # Partitions are looked up together, so one slow remote lookup delays none of the others.
        partitions = await asyncio.gather(
            *(partition_response(topic.name, p) for p in topic.partitions)
        )
        topics.append(
            make(m.ListOffsetsTopicResponse, name=topic.name, partitions=tuple(partitions))
        )
    return make(m.ListOffsetsResponse, throttle_time=NO_THROTTLE, topics=tuple(topics))


async def handle_offset_for_leader_epoch(
    ctx: BrokerContext, request: Request, _splicer: object
) -> Any:
    m = response_module(request.api_key, request.api_version)
    from_follower = field(request.body, "replica_id", -1) >= 0
    follower_denied = from_follower and unauthorized_cluster(ctx, Op.CLUSTER_ACTION)
    topics = []
    for topic in request.body.topics:
        partitions = []
        for p in topic.partitions:
            try:
                if follower_denied:
                    raise KafkaError(follower_denied, "CLUSTER_ACTION is needed")
                if not from_follower:
                    require(ctx, Op.DESCRIBE, ResourceType.TOPIC, topic.topic)
                epoch, end_offset = ctx.replicas.last_offset_for_leader_epoch(
                    TopicPartition(topic.topic, p.partition),
                    field(p, "current_leader_epoch", -1),
                    p.leader_epoch,
                )
                error = ErrorCode.none
            except KafkaError as e:
                epoch, end_offset, error = -1, -1, e.code
            partitions.append(
                make(
                    m.EpochEndOffset,
                    error_code=error,
                    partition=p.partition,
                    leader_epoch=epoch,
                    end_offset=end_offset,
                )
            )
        topics.append(
            make(m.OffsetForLeaderTopicResult, topic=topic.topic, partitions=tuple(partitions))
        )
    return make(m.OffsetForLeaderEpochResponse, throttle_time=NO_THROTTLE, topics=tuple(topics))
