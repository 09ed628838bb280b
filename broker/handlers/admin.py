"""Topic administration: CreateTopics, DeleteTopics, CreatePartitions and the config APIs."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from tierbroker.broker.cluster.controller import check_request_size
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
from tierbroker.storage.log_config import TOPIC_CONFIGS, format_value

TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4
DYNAMIC_TOPIC_CONFIG = 1
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5
UNKNOWN_CONFIG_TYPE = 0  # broker configs: their Java types are not tracked here
SET, DELETE = 0, 1  # IncrementalAlterConfigs operations; APPEND and SUBTRACT are refused
ZERO_UUID = uuid.UUID(int=0)

log = logging.getLogger(__name__)


def _error(e: KafkaError) -> tuple[ErrorCode, str]:
    return e.code, str(e.args[0])


async def handle_create_topics(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    """Create each topic; a request of too many partitions in all is refused whole, as
    Kafka's controller refuses an operation of too many records."""
    m = response_module(request.api_key, request.api_version)
    default = ctx.controller.default_partitions
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
    results = []
    for t in request.body.topics:
        topic: TopicRecord | None = None
        error, message = ErrorCode.none, None
        try:
            if too_large is not None:
                raise too_large
            partitions, replication = t.num_partitions, t.replication_factor
            if t.assignments:
                if partitions != -1 or replication != -1:
                    raise KafkaError(
                        ErrorCode.invalid_request,
                        "both assignments and num_partitions/replication_factor were given",
                    )
                partitions, replication = len(t.assignments), len(t.assignments[0].broker_ids)
                if any(tuple(a.broker_ids) != (ctx.config.broker_id,) for a in t.assignments):
                    raise KafkaError(
                        ErrorCode.invalid_replica_assignment,
                        f"assignments must name broker {ctx.config.broker_id} only",
                    )
            topic = await ctx.controller.create_topic_batched(
                t.name,
                partitions,
                replication,
                {c.name: c.value for c in t.configs},
                validate_only=request.body.validate_only,
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
                num_partitions=topic.partitions if topic else -1,
                replication_factor=topic.replication_factor if topic else -1,
                configs=tuple(_creatable_configs(ctx, m, topic)) if topic else (),
            )
        )
    return make(m.CreateTopicsResponse, throttle_time=NO_THROTTLE, topics=tuple(results))


def _creatable_configs(ctx: BrokerContext, m: Any, topic: TopicRecord) -> list[Any]:
    if not hasattr(m, "CreatableTopicConfigs"):
        return []
    return [
        m.CreatableTopicConfigs(
            name=name, value=value, read_only=False, config_source=source, is_sensitive=False
        )
        for name, value, source, _type in _topic_configs(ctx, topic)
    ]


ConfigRow = tuple[str, str, int, int]
"""(name, value, config source, config type) as DescribeConfigs reports them."""


def _topic_configs(ctx: BrokerContext, topic: TopicRecord) -> list[ConfigRow]:
    """Every topic config: overrides, broker defaults, Kafka defaults."""
    rows: list[ConfigRow] = []
    for name, definition in TOPIC_CONFIGS.items():
        kind = definition.config_type
        if name in topic.configs:
            rows.append((name, topic.configs[name], DYNAMIC_TOPIC_CONFIG, kind))
        elif name in ctx.controller.log_defaults:
            value = format_value(ctx.controller.log_defaults[name])
            rows.append((name, value, STATIC_BROKER_CONFIG, kind))
        else:
            rows.append((name, format_value(definition.default), DEFAULT_CONFIG, kind))
    return rows


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
                record = ctx.controller.store.by_id(topic_id) if topic_id else None
                if record is None:
                    raise KafkaError(ErrorCode.unknown_topic_id, f"no topic with id {topic_id}")
                name = record.name
            topic_id = ctx.controller.delete_topic(name).topic_id
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
    topics = ctx.controller.store.topics
    too_large: KafkaError | None = None
    try:
        check_request_size(
            [t.count - topics[t.name].partitions for t in request.body.topics if t.name in topics]
        )
    except KafkaError as e:
        too_large = e
    results = []
    for t in request.body.topics:
        error, message = ErrorCode.none, None
        try:
            if too_large is not None:
                raise too_large
            await ctx.controller.create_partitions(t.name, t.count, request.body.validate_only)
        except KafkaError as e:
            error, message = _error(e)
        results.append(
            make(
                m.CreatePartitionsTopicResult, name=t.name, error_code=error, error_message=message
            )
        )
    return make(m.CreatePartitionsResponse, throttle_time=NO_THROTTLE, results=tuple(results))


async def handle_describe_configs(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    m = response_module(request.api_key, request.api_version)
    results = []
    for r in request.body.resources:
        error, message, rows = ErrorCode.none, None, []
        try:
            rows = _describe(ctx, r.resource_type, r.resource_name)
        except KafkaError as e:
            error, message = _error(e)
        keys = set(r.configuration_keys) if r.configuration_keys else None
        configs = tuple(
            make(
                m.DescribeConfigsResourceResult,
                name=name,
                value=value,
                read_only=r.resource_type == BROKER_RESOURCE,
                config_source=source,
                is_sensitive=False,
                synonyms=(),
                config_type=config_type,
                documentation=None,
            )
            for name, value, source, config_type in rows
            if keys is None or name in keys
        )
        results.append(
            make(
                m.DescribeConfigsResult,
                error_code=error,
                error_message=message,
                resource_type=r.resource_type,
                resource_name=r.resource_name,
                configs=configs,
            )
        )
    return make(m.DescribeConfigsResponse, throttle_time=NO_THROTTLE, results=tuple(results))


def _describe(ctx: BrokerContext, resource_type: int, name: str) -> list[ConfigRow]:
    if resource_type == TOPIC_RESOURCE:
        return _topic_configs(ctx, ctx.controller.topic_or_error(name))
    if resource_type == BROKER_RESOURCE:
        if name not in ("", str(ctx.config.broker_id)):
            raise KafkaError(ErrorCode.invalid_request, f"broker {name!r} is not this broker")
        values = ctx.config.model_dump(by_alias=True)
        # The port bound, which `tier status` asks for (metrics.port=0 binds a free one).
        metrics_port = ctx.endpoints.metrics_port
        values["metrics.port"] = -1 if metrics_port is None else metrics_port
        return sorted(
            (k, "" if v is None else format_value(v), STATIC_BROKER_CONFIG, UNKNOWN_CONFIG_TYPE)
            for k, v in values.items()
        )
    raise KafkaError(ErrorCode.invalid_request, f"resource type {resource_type} is not supported")


async def handle_alter_configs(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    """AlterConfigs replaces a topic's overrides with the given set."""
    m = response_module(request.api_key, request.api_version)

    def new_configs(r: Any, _current: dict[str, str]) -> dict[str, str]:
        return {c.name: c.value for c in r.configs if c.value is not None}

    return _alter(
        ctx, m, m.AlterConfigsResourceResponse, m.AlterConfigsResponse, request, new_configs
    )


async def handle_incremental_alter_configs(
    ctx: BrokerContext, request: Request, _splicer: object
) -> Any:
    """IncrementalAlterConfigs sets or deletes single overrides (topic configs have no lists)."""
    m = response_module(request.api_key, request.api_version)

    def new_configs(r: Any, current: dict[str, str]) -> dict[str, str]:
        configs = dict(current)
        for c in r.configs:
            if c.config_operation == SET:
                configs[c.name] = c.value or ""
            elif c.config_operation == DELETE:
                configs.pop(c.name, None)
            else:
                raise KafkaError(
                    ErrorCode.invalid_config,
                    f"{c.name}: APPEND and SUBTRACT apply to list configs only",
                )
        return configs

    return _alter(
        ctx,
        m,
        m.AlterConfigsResourceResponse,
        m.IncrementalAlterConfigsResponse,
        request,
        new_configs,
    )


def _alter(
    ctx: BrokerContext,
    m: Any,
    result_cls: Any,
    response_cls: Any,
    request: Request,
    new_configs: Any,
) -> Any:
    results = []
    for r in request.body.resources:
        error, message = ErrorCode.none, None
        try:
            if r.resource_type != TOPIC_RESOURCE:
                raise KafkaError(
                    ErrorCode.invalid_request,
                    f"resource type {r.resource_type}: only topic configs can be altered",
                )
            topic = ctx.controller.topic_or_error(r.resource_name)
            ctx.controller.alter_configs(
                r.resource_name,
                new_configs(r, topic.configs),
                field(request.body, "validate_only", False),
            )
        except KafkaError as e:
            error, message = _error(e)
        results.append(
            make(
                result_cls,
                error_code=error,
                error_message=message,
                resource_type=r.resource_type,
                resource_name=r.resource_name,
            )
        )
    return make(response_cls, throttle_time=NO_THROTTLE, responses=tuple(results))
