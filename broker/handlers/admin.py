"""Topic administration: CreateTopics, DeleteTopics and CreatePartitions (the config APIs
are in `configs`). With an authorizer they need CREATE on the cluster or the topic, DELETE
and ALTER on the topic (TOPIC_AUTHORIZATION_FAILED)."""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from typing import Any

from tierbroker.broker.handlers.authorize import Op, authorized_cluster, require
from tierbroker.broker.handlers.common import (
    NO_THROTTLE,
    BrokerContext,
    make,
    response_module,
)
from tierbroker.broker.handlers.configs import topic_configs
from tierbroker.broker.metadata.create_options import split_create_options
from tierbroker.broker.metadata.topic_admin import check_request_size
from tierbroker.broker.metadata.zk_data import TopicAssignment
from tierbroker.broker.security.authorizer.acl import ResourceType
from tierbroker.protocol.codec import Request
from tierbroker.protocol.errors import ErrorCode, KafkaError

ZERO_UUID = uuid.UUID(int=0)

log = logging.getLogger(__name__)


def _error(e: KafkaError) -> tuple[ErrorCode, str]:
    return e.code, str(e.args[0])


async def handle_create_topics(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    """Create each topic; a request of too many partitions in all is refused whole, as
    Kafka's controller refuses an operation of too many records."""
    m = response_module(request.api_key, request.api_version)
    default = ctx.admin.default_partitions
    too_large: KafkaError | None = None
    try:
        check_request_size(
            [
                len(t.assignments) or (default if t.num_partitions == -1 else t.num_partitions)
                for t in request.body.topics
            ]
        )
    except KafkaError as e:
        log.info("CreateTopics of %d topics refused: %s", len(request.body.topics), e)
        too_large = e
    # A name given twice is refused, with one result, and neither entry is created.
    counts = Counter(t.name for t in request.body.topics)
    create_any = authorized_cluster(ctx, Op.CREATE)  # else CREATE on each topic is asked
    answered: set[str] = set()
    results = []
    for t in request.body.topics:
        if t.name in answered:
            continue
        answered.add(t.name)
        topic: TopicAssignment | None = None
        overrides: dict[str, str] = {}
        error, message = ErrorCode.none, None
        try:
            overrides, options = split_create_options({c.name: c.value for c in t.configs})
            if counts[t.name] > 1:
                raise KafkaError(
                    ErrorCode.invalid_request, f"topic {t.name!r} is given more than once"
                )
            if not create_any:
                require(ctx, Op.CREATE, ResourceType.TOPIC, t.name)
            if too_large is not None:
                raise too_large
            partitions, replication = t.num_partitions, t.replication_factor
            if t.assignments and (partitions != -1 or replication != -1):
                raise KafkaError(
                    ErrorCode.invalid_request,
                    "both assignments and num_partitions/replication_factor were given",
                )
            topic = await ctx.admin.create_topic(
                t.name,
                partitions,
                replication,
                overrides,
                assignment={a.partition_index: a.broker_ids for a in t.assignments},
                validate_only=request.body.validate_only,
                timeout_s=request.body.timeout.total_seconds(),
                options=options,
            )
        except KafkaError as e:
            log.info("CreateTopics %r refused: %s", t.name, e)
            error, message = _error(e)
        results.append(
            make(
                m.CreatableTopicResult,
                name=t.name,
                topic_id=topic.topic_id if topic else ZERO_UUID,
                error_code=error,
                error_message=message,
                topic_config_error_code=ErrorCode.none,
                num_partitions=len(topic.partitions) if topic else -1,
                replication_factor=len(topic.partitions[0]) if topic else -1,
                configs=tuple(_creatable_configs(ctx, m, overrides)) if topic else (),
            )
        )
    return make(m.CreateTopicsResponse, throttle_time=NO_THROTTLE, topics=tuple(results))


def _creatable_configs(ctx: BrokerContext, m: Any, overrides: dict[str, str]) -> list[Any]:
    if not hasattr(m, "CreatableTopicConfigs"):
        return []
    return [
        m.CreatableTopicConfigs(
            name=row.name,
            value=row.value,
            read_only=False,
            config_source=row.source,
            is_sensitive=False,
        )
        for row in topic_configs(ctx, overrides)
    ]


async def handle_delete_topics(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    m = response_module(request.api_key, request.api_version)
    body = request.body
    if request.api_version >= 6:
        wanted = [(t.name, t.topic_id) for t in body.topics]
    else:
        wanted = [(name, None) for name in body.topic_names]
    results = []
    for name, topic_id in wanted:
        error, message = ErrorCode.none, None
        try:
            if not ctx.config.delete_topic_enable:
                raise KafkaError(ErrorCode.topic_deletion_disabled, "delete.topic.enable is false")
            if not name:
                name = ctx.metadata.topic_by_id(topic_id) if topic_id else None
                if name is None:
                    raise KafkaError(ErrorCode.unknown_topic_id, f"no topic with id {topic_id}")
            require(ctx, Op.DELETE, ResourceType.TOPIC, name)
            topic_id = await ctx.admin.delete_topic(name, body.timeout.total_seconds())
        except KafkaError as e:
            error, message = _error(e)
        results.append(
            make(
                m.DeletableTopicResult,
                name=name,
                topic_id=topic_id or ZERO_UUID,
                error_code=error,
                error_message=message,
            )
        )
    return make(m.DeleteTopicsResponse, throttle_time=NO_THROTTLE, responses=tuple(results))


async def handle_create_partitions(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    m = response_module(request.api_key, request.api_version)
    cache = ctx.metadata
    too_large: KafkaError | None = None
    try:
        check_request_size([t.count - cache.partition_count(t.name) for t in request.body.topics])
    except KafkaError as e:
        too_large = e
    results = []
    for t in request.body.topics:
        error, message = ErrorCode.none, None
        try:
            require(ctx, Op.ALTER, ResourceType.TOPIC, t.name)
            if too_large is not None:
                raise too_large
            await ctx.admin.create_partitions(
                t.name,
                t.count,
                [a.broker_ids for a in t.assignments] if t.assignments else None,
                request.body.validate_only,
                request.body.timeout.total_seconds(),
            )
        except KafkaError as e:
            error, message = _error(e)
        results.append(
            make(
                m.CreatePartitionsTopicResult, name=t.name, error_code=error, error_message=message
            )
        )
    return make(m.CreatePartitionsResponse, throttle_time=NO_THROTTLE, results=tuple(results))
