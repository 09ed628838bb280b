"""Topic administration: CreateTopics, DeleteTopics, CreatePartitions and the config APIs."""

from __future__ import annotations

import itertools
import logging
import re
import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

from tierbroker.broker.config.kafka_broker_configs import KAFKA_BROKER_CONFIG_TYPES
from tierbroker.broker.handlers.common import (
    NO_THROTTLE,
    BrokerContext,
    field,
    make,
    response_module,
)
from tierbroker.broker.metadata.topic_admin import check_request_size
from tierbroker.broker.metadata.zk_data import TopicAssignment
from tierbroker.protocol.codec import Request
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.storage.topic_configs import (
    TOPIC_CONFIGS,
    ConfigDef,
    ConfigType,
    check_overrides,
    format_value,
)

TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4
DYNAMIC_TOPIC_CONFIG = 1
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3  # IncrementalAlterConfigs operations
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
    answered: set[str] = set()
    results = []
    for t in request.body.topics:
        if t.name in answered:
            continue
        answered.add(t.name)
        topic: TopicAssignment | None = None
        overrides = {c.name: c.value for c in t.configs}
        error, message = ErrorCode.none, None
        try:
            if counts[t.name] > 1:
                raise KafkaError(
                    ErrorCode.invalid_request, f"topic {t.name!r} is given more than once"
                )
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
        for row in _topic_configs(ctx, overrides)
    ]


Synonym = tuple[str, str, int]
"""(name, value, config source) of a config's synonym, as DescribeConfigs reports it."""


class ConfigRow(NamedTuple):
    """One config as DescribeConfigs reports it."""

    name: str
    value: str | None
    source: int
    config_type: int
    synonyms: tuple[Synonym, ...] = ()
    read_only: bool = False


def _topic_configs(ctx: BrokerContext, configs: dict[str, str]) -> list[ConfigRow]:
    """Every topic config: the topic's override, else the broker's default, else Kafka's.

    Synonyms and source as Kafka's ConfigHelper gives them: the override, then the
    broker properties set, then those with a default of their own, each in the order
    Kafka tries them; the source is the first synonym's.
    """
    overrides = check_overrides(configs)
    rows = []
    for name, definition in TOPIC_CONFIGS.items():
        synonyms = _broker_synonyms(definition, ctx.config.log_default_synonyms)
        if name in overrides:
            value = format_value(overrides[name])
            synonyms.insert(0, (name, value, DYNAMIC_TOPIC_CONFIG))
        else:
            value = format_value(ctx.admin.log_defaults.get(name, definition.default))
        source = synonyms[0][2] if synonyms else DEFAULT_CONFIG
        rows.append(ConfigRow(name, value, source, definition.config_type, tuple(synonyms)))
    return rows


def _broker_synonyms(definition: ConfigDef, set_properties: dict[str, str]) -> list[Synonym]:
    """The broker properties behind a topic config's default: those set, then those with
    a default, dropping any listed before the first synonym's own (as Kafka does: so
    `retention.ms` from `log.retention.hours` alone reports no synonym)."""
    found = [
        (s.name, set_properties[s.name], STATIC_BROKER_CONFIG)
        for s in definition.synonyms
        if s.name in set_properties
    ]
    found += [
        (s.name, format_value(_in_unit(definition.default, s.unit_ms)), DEFAULT_CONFIG)
        for s in definition.synonyms
        if s.has_default
    ]
    first = definition.broker_property
    return list(itertools.dropwhile(lambda synonym: synonym[0] != first, found))


def _in_unit(value: Any, unit_ms: int) -> Any:
    """A default in ms in a synonym's unit (hours: `log.retention.hours`)."""
    return value if unit_ms == 1 else value // unit_ms


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
        with_synonyms = field(request.body, "include_synonyms", False)
        configs = tuple(
            make(
                m.DescribeConfigsResourceResult,
                name=row.name,
                value=row.value,
                read_only=row.read_only,
                config_source=row.source,
                is_sensitive=False,
                synonyms=tuple(
                    m.DescribeConfigsSynonym(name=name, value=value, source=source)
                    for name, value, source in row.synonyms
                )
                if with_synonyms
                else (),
                config_type=row.config_type,
                documentation=None,
            )
            for row in rows
            if keys is None or row.name in keys
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
        ctx.admin.topic_or_error(name)
        return _topic_configs(ctx, ctx.metadata.configs.get(name, {}))
    if resource_type == BROKER_RESOURCE:
        if name not in ("", str(ctx.config.broker_id)):
            raise KafkaError(ErrorCode.invalid_request, f"broker {name!r} is not this broker")
        return _broker_configs(ctx)
    raise KafkaError(ErrorCode.invalid_request, f"resource type {resource_type} is not supported")


def _broker_configs(ctx: BrokerContext) -> list[ConfigRow]:
    """Every property the broker reads, as Kafka describes a static broker config: from
    server.properties if set there, else its default, each with the synonyms behind it.
    All are read-only: tierbroker changes no broker config at run time."""
    config = ctx.config
    values = config.model_dump(by_alias=True)
    # The port bound, which `tier status` asks for (metrics.port=0 binds a free one).
    metrics_port = ctx.endpoints.metrics_port
    values["metrics.port"] = -1 if metrics_port is None else metrics_port
    rows = []
    for field_name, info in type(config).model_fields.items():
        prop = info.alias
        if prop is None or prop not in values:
            continue
        value = None if values[prop] is None else format_value(values[prop])
        default = info.get_default(call_default_factory=True)
        synonyms: list[Synonym] = []
        if field_name in config.model_fields_set:
            synonyms.append((prop, value or "", STATIC_BROKER_CONFIG))
        if default is not None:
            synonyms.append((prop, format_value(default), DEFAULT_CONFIG))
        source = synonyms[0][2] if synonyms else DEFAULT_CONFIG
        config_type = _config_type(prop, info.annotation)
        rows.append(ConfigRow(prop, value, source, config_type, tuple(synonyms), read_only=True))
    return sorted(rows + _topic_default_properties(config.log_default_synonyms))


def _topic_default_properties(set_properties: dict[str, str]) -> list[ConfigRow]:
    """The broker properties behind topic defaults (`log.retention.ms`, ...)."""
    rows = []
    for definition in TOPIC_CONFIGS.values():
        for synonym in definition.synonyms:
            value = set_properties.get(synonym.name)
            synonyms: list[Synonym] = []
            if value is not None:
                synonyms.append((synonym.name, value, STATIC_BROKER_CONFIG))
            if synonym.has_default:
                default = format_value(_in_unit(definition.default, synonym.unit_ms))
                synonyms.append((synonym.name, default, DEFAULT_CONFIG))
            rows.append(
                ConfigRow(
                    synonym.name,
                    synonyms[0][1] if synonyms else None,
                    synonyms[0][2] if synonyms else DEFAULT_CONFIG,
                    # Kafka's hours and minutes are ints where the topic's ms are longs.
                    definition.config_type if synonym.unit_ms == 1 else ConfigType.INT,
                    tuple(synonyms),
                    read_only=True,
                )
            )
    return rows


def _config_type(prop: str, annotation: Any) -> int:
    """Kafka's type of broker property `prop`, read by tierbroker as `annotation`."""
    kafka_type = KAFKA_BROKER_CONFIG_TYPES.get(prop)
    if kafka_type is not None:
        return ConfigType[kafka_type]
    text = str(annotation)  # "int | None", "typing.Annotated[bool, ...]", "<class 'str'>"
    if re.search(r"\bbool\b", text):
        return ConfigType.BOOLEAN
    return ConfigType.INT if re.search(r"\bint\b", text) else ConfigType.STRING


async def handle_alter_configs(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    """AlterConfigs replaces a topic's overrides with the given set."""
    m = response_module(request.api_key, request.api_version)

    def new_configs(r: Any, _current: dict[str, str]) -> dict[str, str]:
        return {c.name: c.value for c in r.configs if c.value is not None}

    return await _alter(
        ctx, m, m.AlterConfigsResourceResponse, m.AlterConfigsResponse, request, new_configs
    )


async def handle_incremental_alter_configs(
    ctx: BrokerContext, request: Request, _splicer: object
) -> Any:
    """IncrementalAlterConfigs sets or deletes single overrides, or adds items to or
    removes items from a list config (`cleanup.policy`, the throttled replicas)."""
    m = response_module(request.api_key, request.api_version)

    def new_configs(r: Any, current: dict[str, str]) -> dict[str, str]:
        configs = dict(current)
        for c in r.configs:
            if c.config_operation == SET:
                configs[c.name] = c.value or ""
            elif c.config_operation == DELETE:
                configs.pop(c.name, None)
            elif c.config_operation in (APPEND, SUBTRACT):
                configs[c.name] = _altered_list(c.name, c.config_operation, c.value, configs)
            else:
                raise KafkaError(
                    ErrorCode.invalid_request, f"{c.name}: unknown operation {c.config_operation}"
                )
        return configs

    return await _alter(
        ctx,
        m,
        m.AlterConfigsResourceResponse,
        m.IncrementalAlterConfigsResponse,
        request,
        new_configs,
    )


def _altered_list(name: str, operation: int, value: str | None, configs: dict[str, str]) -> str:
    """The list `name` (its override, else its default) with the items of `value` appended
    (those not in it yet) or subtracted, as Kafka's APPEND and SUBTRACT make it."""
    definition = TOPIC_CONFIGS.get(name)
    if definition is None or definition.config_type != ConfigType.LIST:
        raise KafkaError(
            ErrorCode.invalid_config, f"{name}: APPEND and SUBTRACT apply to list configs only"
        )
    old = configs.get(name, format_value(definition.default))
    items = [item.strip() for item in old.split(",") if item.strip()]
    altered = [item.strip() for item in (value or "").split(",") if item.strip()]
    if operation == APPEND:
        return ",".join(items + [item for item in altered if item not in items])
    return ",".join(item for item in items if item not in altered)


async def _alter(
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
            if r.resource_type == TOPIC_RESOURCE:
                ctx.admin.topic_or_error(r.resource_name)
                await ctx.admin.alter_configs(
                    r.resource_name,
                    new_configs(r, ctx.metadata.configs.get(r.resource_name, {})),
                    field(request.body, "validate_only", False),
                )
            elif not _deletes_unset_broker_configs(ctx, r):
                raise KafkaError(
                    ErrorCode.invalid_request,
                    f"resource type {r.resource_type}: only topic configs can be altered",
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


class _AlteredResource(Protocol):
    """A resource of an (Incremental)AlterConfigs request, of any version."""

    @property
    def resource_type(self) -> int: ...
    @property
    def resource_name(self) -> str: ...
    @property
    def configs(self) -> Sequence[Any]: ...


def _deletes_unset_broker_configs(ctx: BrokerContext, r: _AlteredResource) -> bool:
    """Whether `r` only DELETEs (IncrementalAlterConfigs) configs of this broker: it has
    no dynamic configs, so nothing is to be deleted and, as in Kafka, that succeeds
    (kafka-reassign-partitions --verify clears replication throttles so)."""
    if r.resource_type != BROKER_RESOURCE:
        return False
    if r.resource_name not in ("", str(ctx.config.broker_id)):
        raise KafkaError(
            ErrorCode.invalid_request, f"broker {r.resource_name!r} is not this broker"
        )
    return all(field(c, "config_operation", SET) == DELETE for c in r.configs)
