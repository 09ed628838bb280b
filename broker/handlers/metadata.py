"""Metadata, DescribeCluster and DescribeTopicPartitions: what exists and who leads it.

Metadata creates unknown topics when the client allows it and
`auto.create.topics.enable` is on, as Kafka does.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from tierbroker.broker.cluster.controller import INTERNAL_TOPICS, validate_topic_name
from tierbroker.broker.cluster.metadata_store import TopicRecord
from tierbroker.broker.handlers.common import (
    NO_THROTTLE,
    BrokerContext,
    field,
    make,
    response_module,
)
from tierbroker.protocol.codec import Request
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.storage.topic_partition import TopicPartition

ZERO_UUID = uuid.UUID(int=0)
log = logging.getLogger(__name__)
NO_AUTHORIZED_OPERATIONS = -2147483648


def _partitions(
    ctx: BrokerContext, m: Any, cls: Any, topic: TopicRecord, **extra: Any
) -> tuple[Any, ...]:
    """The partitions of `topic` as `cls`; `extra`: fields of this entity only."""
    broker_id = ctx.config.broker_id
    result = []
    for p in range(topic.partitions):
        partition = ctx.replicas.partitions.get(TopicPartition(topic.name, p))
        epoch = partition.leader_epoch if partition else -1
        result.append(
            make(
                cls,
                error_code=ErrorCode.none if partition else ErrorCode.leader_not_available,
                partition_index=p,
                leader_id=broker_id if partition else -1,
                leader_epoch=epoch,
                replica_nodes=(broker_id,),
                isr_nodes=(broker_id,),
                offline_replicas=(),
                **extra,
            )
        )
    return tuple(result)


def _resolve(
    ctx: BrokerContext, name: str | None, topic_id: uuid.UUID | None, allow_create: bool
) -> tuple[ErrorCode, str | None, TopicRecord | None]:
    store = ctx.controller.store
    if not name:
        topic = store.by_id(topic_id) if topic_id else None
        return (
            (ErrorCode.none, topic.name, topic)
            if topic
            else (ErrorCode.unknown_topic_id, None, None)
        )
    try:
        validate_topic_name(name)
    except KafkaError as e:
        log.info("Metadata for topic %r refused: %s", name, e)
        return e.code, name, None
    topic = store.topics.get(name)
    if topic is None and allow_create:
        try:
            topic = ctx.controller.create_topic(name, -1, -1, {})
        except KafkaError as e:
            return e.code, name, None
    if topic is None:
        return ErrorCode.unknown_topic_or_partition, name, None
    return ErrorCode.none, name, topic


async def handle_metadata(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    m = response_module(request.api_key, request.api_version)
    body = request.body
    store = ctx.controller.store
    allow_create = (
        field(body, "allow_auto_topic_creation", True) and ctx.config.auto_create_topics_enable
    )
    if body.topics is None or (request.api_version == 0 and not body.topics):
        wanted = [(t.name, t.topic_id) for t in store.topics.values()]
        allow_create = False
    else:
        wanted = [(t.name, field(t, "topic_id")) for t in body.topics]
    topics = []
    for requested_name, topic_id in wanted:
        error, name, topic = _resolve(ctx, requested_name, topic_id, allow_create)
        topics.append(
            make(
                m.MetadataResponseTopic,
                error_code=error,
                name=name,
                topic_id=topic.topic_id if topic else (topic_id or ZERO_UUID),
                is_internal=bool(name in INTERNAL_TOPICS),
                partitions=_partitions(ctx, m, m.MetadataResponsePartition, topic) if topic else (),
                topic_authorized_operations=NO_AUTHORIZED_OPERATIONS,
            )
        )
    return make(
        m.MetadataResponse,
        throttle_time=NO_THROTTLE,
        brokers=(_this_broker(ctx, m.MetadataResponseBroker, node_id=ctx.config.broker_id),),
        cluster_id=ctx.controller.cluster_id,
        controller_id=ctx.config.broker_id,
        topics=tuple(topics),
        cluster_authorized_operations=NO_AUTHORIZED_OPERATIONS,
        error_code=ErrorCode.none,
    )


def _this_broker(ctx: BrokerContext, cls: type, **identity: Any) -> Any:
    """This broker as an entry of a Metadata or DescribeCluster response."""
    host, port = ctx.endpoints.advertised
    return make(cls, host=host, port=port, rack=ctx.config.broker_rack, **identity)


async def handle_describe_cluster(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    m = response_module(request.api_key, request.api_version)
    return make(
        m.DescribeClusterResponse,
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        error_message=None,
        endpoint_type=1,
        cluster_id=ctx.controller.cluster_id,
        controller_id=ctx.config.broker_id,
        brokers=(
            _this_broker(
                ctx, m.DescribeClusterBroker, broker_id=ctx.config.broker_id, is_fenced=False
            ),
        ),
        cluster_authorized_operations=NO_AUTHORIZED_OPERATIONS,
    )


async def handle_describe_topic_partitions(
    ctx: BrokerContext, request: Request, _splicer: object
) -> Any:
    m = response_module(request.api_key, request.api_version)
    body = request.body
    store = ctx.controller.store
    names = [t.name for t in body.topics] if body.topics else sorted(store.topics)
    cursor = body.cursor
    if cursor is not None:
        names = [n for n in names if n >= cursor.topic_name]
    budget = body.response_partition_limit
    topics, next_cursor = [], None
    for name in names:
        topic = store.topics.get(name)
        if topic is None:
            topics.append(
                make(
                    m.DescribeTopicPartitionsResponseTopic,
                    error_code=ErrorCode.unknown_topic_or_partition,
                    name=name,
                    topic_id=ZERO_UUID,
                    is_internal=False,
                    partitions=(),
                )
            )
            continue
        start = cursor.partition_index if cursor is not None and name == cursor.topic_name else 0
        partitions = _partitions(
            ctx,
            m,
            m.DescribeTopicPartitionsResponsePartition,
            topic,
            eligible_leader_replicas=None,
            last_known_elr=None,
        )[start:]
        if len(partitions) > budget:
            next_cursor = m.Cursor(topic_name=name, partition_index=start + budget)
            partitions = partitions[:budget]
        budget -= len(partitions)
        topics.append(
            make(
                m.DescribeTopicPartitionsResponseTopic,
                error_code=ErrorCode.none,
                name=name,
                topic_id=topic.topic_id,
                is_internal=name in INTERNAL_TOPICS,
                partitions=partitions,
            )
        )
        if next_cursor is not None or budget <= 0:
            break
    return make(
        m.DescribeTopicPartitionsResponse,
        throttle_time=NO_THROTTLE,
        topics=tuple(topics),
        next_cursor=next_cursor,
    )
