"""Metadata, DescribeCluster and DescribeTopicPartitions: what exists and who leads it.

Metadata creates unknown topics when the client allows it and
`auto.create.topics.enable` is on, as Kafka does. With an authorizer, a list of every
topic leaves out those the principal may not DESCRIBE, a topic asked for by name is
answered TOPIC_AUTHORIZATION_FAILED, and creating one needs CREATE on the cluster or it.
When the client asks (KIP-430), each topic and the cluster carry the operations the
principal may do on them; DescribeTopicPartitions always carries them, as Kafka's does.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from tierbroker.broker.handlers.authorize import (
    OPERATIONS_NOT_REQUESTED,
    Op,
    authorized,
    authorized_cluster,
    authorized_cluster_operations,
    authorized_operations,
    authorized_topics,
)
from tierbroker.broker.handlers.common import (
    NO_THROTTLE,
    BrokerContext,
    client_endpoint,
    field,
    make,
    response_module,
)
from tierbroker.broker.metadata.topic_admin import INTERNAL_TOPICS, validate_topic_name
from tierbroker.broker.metadata.zk_data import TopicAssignment
from tierbroker.broker.security.authorizer.acl import ResourceType
from tierbroker.protocol.codec import Request
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.storage.topic_partition import TopicPartition

ZERO_UUID = uuid.UUID(int=0)
log = logging.getLogger(__name__)
AUTO_CREATE_WAIT_S = 5.0  # longer, and the client is told LEADER_NOT_AVAILABLE and retries


def _partitions(
    ctx: BrokerContext,
    cls: Any,
    name: str,
    topic: TopicAssignment,
    unavailable_listener: ErrorCode = ErrorCode.listener_not_found,
    **extra: Any,
) -> tuple[Any, ...]:
    """Each partition's leader, leader epoch, replicas, ISR and offline replicas; a leader
    without the client's listener is no leader, with `unavailable_listener`."""
    live = ctx.metadata.brokers
    result = []
    for p, replicas in sorted(topic.partitions.items()):
        state = ctx.metadata.states.get(TopicPartition(name, p))
        leader = state.leader if state is not None and state.leader in live else -1
        error = ErrorCode.none if leader >= 0 else ErrorCode.leader_not_available
        if leader >= 0 and client_endpoint(live[leader]) is None:
            # The leader cannot be reached on the client's listener (Kafka's ZkMetadataCache).
            leader, error = -1, unavailable_listener
        result.append(
            make(
                cls,
                error_code=error,
                partition_index=p,
                leader_id=leader,
                leader_epoch=state.leader_epoch if state is not None else -1,
                replica_nodes=replicas,
                isr_nodes=state.isr if state is not None else (),
                offline_replicas=tuple(b for b in replicas if b not in live),
                **extra,
            )
        )
    return tuple(result)


async def _resolve(
    ctx: BrokerContext, name: str | None, topic_id: uuid.UUID | None, allow_create: bool
) -> tuple[ErrorCode, str | None, TopicAssignment | None]:
    """A requested topic: DESCRIBE on it is asked first (its existence is not told to who
    may not describe it); creating it needs CREATE on the cluster or the topic."""
    cache = ctx.metadata
    if not name:
        found = cache.topic_by_id(topic_id) if topic_id else None
        if found is None:
            return ErrorCode.unknown_topic_id, None, None
        if not authorized(ctx, Op.DESCRIBE, ResourceType.TOPIC, found):
            return ErrorCode.topic_authorization_failed, None, None
        return ErrorCode.none, found, cache.topics[found]
    if not authorized(ctx, Op.DESCRIBE, ResourceType.TOPIC, name):
        return ErrorCode.topic_authorization_failed, name, None
    try:
        validate_topic_name(name)
    except KafkaError as e:
        log.info("Metadata for topic %r refused: %s", name, e)
        return e.code, name, None
    topic = cache.topics.get(name)
    if topic is None and allow_create:
        if not (
            authorized_cluster(ctx, Op.CREATE)
            or authorized(ctx, Op.CREATE, ResourceType.TOPIC, name)
        ):
            return ErrorCode.topic_authorization_failed, name, None
        try:
            topic = await ctx.admin.create_topic(name, -1, -1, {}, timeout_s=AUTO_CREATE_WAIT_S)
        except KafkaError as e:
            if e.code == ErrorCode.request_timed_out:
                return ErrorCode.leader_not_available, name, None
            if e.code != ErrorCode.topic_already_exists:
                return e.code, name, None
            topic = cache.topics.get(name)
    if topic is None:
        return ErrorCode.unknown_topic_or_partition, name, None
    return ErrorCode.none, name, topic


async def handle_metadata(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    m = response_module(request.api_key, request.api_version)
    body = request.body
    cache = ctx.metadata
    allow_create = (
        field(body, "allow_auto_topic_creation", True) and ctx.config.auto_create_topics_enable
    )
    if body.topics is None or (request.api_version == 0 and not body.topics):
        wanted = [
            (name, t.topic_id)
            for name, t in sorted(cache.topics.items())
            if authorized(ctx, Op.DESCRIBE, ResourceType.TOPIC, name, log_if_denied=False)
        ]
        allow_create = False
    else:
        wanted = [(t.name, field(t, "topic_id")) for t in body.topics]
    # Kafka tells clients before Metadata v6 of a missing listener as of a missing leader.
    listener_error = (
        ErrorCode.listener_not_found if request.api_version >= 6 else ErrorCode.leader_not_available
    )
    topic_operations = field(body, "include_topic_authorized_operations", False)
    topics = []
    for requested_name, topic_id in wanted:
        error, name, topic = await _resolve(ctx, requested_name, topic_id, allow_create)
        topics.append(
            make(
                m.MetadataResponseTopic,
                error_code=error,
                name=name,
                topic_id=topic.topic_id if topic else (topic_id or ZERO_UUID),
                is_internal=bool(name in INTERNAL_TOPICS),
                partitions=(
                    _partitions(ctx, m.MetadataResponsePartition, name, topic, listener_error)
                    if topic and name
                    else ()
                ),
                topic_authorized_operations=(
                    authorized_operations(ctx, ResourceType.TOPIC, name)
                    if topic_operations and name
                    else OPERATIONS_NOT_REQUESTED
                ),
            )
        )
    cluster_operations = OPERATIONS_NOT_REQUESTED
    if field(body, "include_cluster_authorized_operations", False):  # v8 to v10
        cluster_operations = authorized_cluster_operations(ctx)
    return make(
        m.MetadataResponse,
        throttle_time=NO_THROTTLE,
        brokers=_brokers(ctx, m.MetadataResponseBroker, "node_id"),
        cluster_id=cache.cluster_id,
        controller_id=cache.controller_id,
        topics=tuple(topics),
        cluster_authorized_operations=cluster_operations,
        error_code=ErrorCode.none,
    )


def _brokers(ctx: BrokerContext, cls: type, id_field: str, **extra: Any) -> tuple[Any, ...]:
    """Every live broker as an entry of a Metadata or DescribeCluster response."""
    return tuple(
        make(cls, host=e.host, port=e.port, rack=b.rack, **{id_field: b.broker_id}, **extra)
        for _, b in sorted(ctx.metadata.brokers.items())
        if (e := client_endpoint(b)) is not None
    )


async def handle_describe_cluster(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    m = response_module(request.api_key, request.api_version)
    return make(
        m.DescribeClusterResponse,
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        error_message=None,
        endpoint_type=1,
        cluster_id=ctx.metadata.cluster_id,
        controller_id=ctx.metadata.controller_id,
        brokers=_brokers(ctx, m.DescribeClusterBroker, "broker_id", is_fenced=False),
        cluster_authorized_operations=(
            authorized_cluster_operations(ctx)
            if request.body.include_cluster_authorized_operations
            else OPERATIONS_NOT_REQUESTED
        ),
    )


async def handle_describe_topic_partitions(
    ctx: BrokerContext, request: Request, _splicer: object
) -> Any:
    m = response_module(request.api_key, request.api_version)
    body = request.body
    cache = ctx.metadata
    if body.topics:
        names = [t.name for t in body.topics]
    else:  # every topic the principal may describe
        names = sorted(authorized_topics(ctx, Op.DESCRIBE, cache.topics, log_if_denied=False))
    cursor = body.cursor
    if cursor is not None:
        names = [n for n in names if n >= cursor.topic_name]
    budget = body.response_partition_limit
    topics, next_cursor = [], None
    for name in names:
        topic = cache.topics.get(name)
        allowed = authorized(ctx, Op.DESCRIBE, ResourceType.TOPIC, name)
        if topic is None or not allowed:
            topics.append(
                make(
                    m.DescribeTopicPartitionsResponseTopic,
                    error_code=ErrorCode.unknown_topic_or_partition
                    if allowed
                    else ErrorCode.topic_authorization_failed,
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
            m.DescribeTopicPartitionsResponsePartition,
            name,
            topic,
            # No ELR here (KIP-966 is not implemented): empty, as Kafka's controller
            # answers with it disabled; Kafka's Admin client fails on null.
            eligible_leader_replicas=(),
            last_known_elr=(),
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
                topic_authorized_operations=authorized_operations(ctx, ResourceType.TOPIC, name),
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
