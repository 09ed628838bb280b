"""The config APIs: DescribeConfigs, AlterConfigs and IncrementalAlterConfigs.

A topic's configs are its overrides over the topic defaults in force; a broker's are
its properties, static (server.properties) or, for the topic defaults (`log.*`), dynamic
(`DynamicBrokerConfig`): sources and synonyms as Kafka's `ConfigHelper` reports them.
With an authorizer, describing needs DESCRIBE_CONFIGS and altering ALTER_CONFIGS, on the
topic (TOPIC_AUTHORIZATION_FAILED) or, for a broker, the cluster (CLUSTER_...).
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from tierbroker.broker.config.broker_config import BrokerConfig
from tierbroker.broker.config.kafka_broker_configs import KAFKA_BROKER_CONFIG_TYPES
from tierbroker.broker.config.security_settings import is_secret
from tierbroker.broker.handlers.authorize import require
from tierbroker.broker.handlers.common import (
    NO_THROTTLE,
    BrokerContext,
    field,
    make,
    response_module,
)
from tierbroker.broker.metadata.dynamic_broker_config import DYNAMIC_LOG_CONFIGS
from tierbroker.broker.metadata.zk_data import DEFAULT_BROKER_ENTITY
from tierbroker.broker.security.authorizer.acl import CLUSTER_NAME, AclOperation, ResourceType
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
# Kafka's config sources (DescribeConfigsResponse).
DYNAMIC_TOPIC_CONFIG = 1
DYNAMIC_BROKER_CONFIG = 2
DYNAMIC_DEFAULT_BROKER_CONFIG = 3
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3  # IncrementalAlterConfigs operations


def _error(e: KafkaError) -> tuple[ErrorCode, str]:
    return e.code, str(e.args[0])


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


def topic_configs(ctx: BrokerContext, configs: dict[str, str]) -> list[ConfigRow]:
    """Every topic config: the topic's override, else the topic default in force.

    Synonyms and source as Kafka's ConfigHelper gives them: the override, then the
    broker properties set (dynamic for this broker, dynamic for the cluster, static),
    then those with a default of their own; the source is the first synonym's.
    """
    overrides = check_overrides(configs)
    defaults = ctx.admin.log_defaults()
    levels = _broker_levels(ctx)
    rows = []
    for name, definition in TOPIC_CONFIGS.items():
        synonyms = _broker_synonyms(definition, levels)
        if name in overrides:
            value = format_value(overrides[name])
            synonyms.insert(0, (name, value, DYNAMIC_TOPIC_CONFIG))
        else:
            value = format_value(defaults.get(name, definition.default))
        source = synonyms[0][2] if synonyms else DEFAULT_CONFIG
        rows.append(ConfigRow(name, value, source, definition.config_type, tuple(synonyms)))
    return rows


Levels = Sequence[tuple[Mapping[str, str], int]]
"""The broker properties set at each level, first the one that wins, with its source."""


def _broker_levels(ctx: BrokerContext) -> Levels:
    own, cluster = ctx.dynamic_config.layers()
    return (
        (own, DYNAMIC_BROKER_CONFIG),
        (cluster, DYNAMIC_DEFAULT_BROKER_CONFIG),
        (ctx.config.log_default_synonyms, STATIC_BROKER_CONFIG),
    )


def _broker_synonyms(definition: ConfigDef, levels: Levels) -> list[Synonym]:
    """The broker properties behind a topic config's default: those set, level by level,
    then those with a default, dropping any listed before the first synonym's own (as
    Kafka does: so `retention.ms` from `log.retention.hours` alone reports no synonym)."""
    found = [
        (s.name, properties[s.name], source)
        for properties, source in levels
        for s in definition.synonyms
        if s.name in properties
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
        # As Kafka: a secret is sensitive and its value null, in its synonyms too.
        configs = tuple(
            make(
                m.DescribeConfigsResourceResult,
                name=row.name,
                value=None if is_secret(row.name) else row.value,
                read_only=row.read_only,
                config_source=row.source,
                is_sensitive=is_secret(row.name),
                synonyms=tuple(
                    m.DescribeConfigsSynonym(
                        name=name, value=None if is_secret(name) else value, source=source
                    )
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


def _require(ctx: BrokerContext, operation: AclOperation, resource_type: int, name: str) -> None:
    """A topic's configs need `operation` on the topic, a broker's on the cluster."""
    if resource_type == TOPIC_RESOURCE:
        require(ctx, operation, ResourceType.TOPIC, name)
    elif resource_type == BROKER_RESOURCE:
        require(ctx, operation, ResourceType.CLUSTER, CLUSTER_NAME)


def _describe(ctx: BrokerContext, resource_type: int, name: str) -> list[ConfigRow]:
    _require(ctx, AclOperation.DESCRIBE_CONFIGS, resource_type, name)
    if resource_type == TOPIC_RESOURCE:
        ctx.admin.topic_or_error(name)
        return topic_configs(ctx, ctx.metadata.configs.get(name, {}))
    if resource_type == BROKER_RESOURCE:
        if ctx.dynamic_config.entity(name) == DEFAULT_BROKER_ENTITY:
            # As Kafka: the cluster's dynamic defaults alone, each its own only synonym.
            _own, cluster = ctx.dynamic_config.layers()
            return [
                ConfigRow(
                    prop,
                    value,
                    DYNAMIC_DEFAULT_BROKER_CONFIG,
                    DYNAMIC_LOG_CONFIGS[prop].config_type,
                    ((prop, value, DYNAMIC_DEFAULT_BROKER_CONFIG),),
                )
                for prop, value in sorted(cluster.items())
                if prop in DYNAMIC_LOG_CONFIGS
            ]
        return _broker_configs(ctx)
    raise KafkaError(ErrorCode.invalid_request, f"resource type {resource_type} is not supported")


def _broker_configs(ctx: BrokerContext) -> list[ConfigRow]:
    """Every property the broker reads, each with the synonyms behind it: the static ones
    from server.properties if set there, else their default, read-only; the topic
    defaults (`log.*`) with their dynamic values too."""
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
    rows += _given_properties(config)
    return sorted(rows + _topic_default_properties(_broker_levels(ctx)))


def _given_properties(config: BrokerConfig) -> list[ConfigRow]:
    """The properties read where they are used, as given: security (`ssl.*`, `sasl.*`,
    `listener.name.*`, ...) and the plugins' (`rsm.config.*`, `rlmm.config.*`); as Kafka
    lists a broker's original properties."""
    given = dict(config.security.values)
    for prefix, plugin_configs in (
        ("rsm.config.", config.rsm_configs),
        ("rlmm.config.", config.rlmm_configs),
    ):
        given.update({prefix + k: v for k, v in plugin_configs.items()})
    return [
        ConfigRow(
            name,
            value,
            STATIC_BROKER_CONFIG,
            ConfigType.PASSWORD if is_secret(name) else ConfigType.STRING,
            ((name, value, STATIC_BROKER_CONFIG),),
            read_only=True,
        )
        for name, value in given.items()
    ]


def _topic_default_properties(levels: Levels) -> list[ConfigRow]:
    """The broker properties behind topic defaults (`log.retention.ms`, ...)."""
    rows = []
    for definition in TOPIC_CONFIGS.values():
        for synonym in definition.synonyms:
            synonyms: list[Synonym] = [
                (synonym.name, properties[synonym.name], source)
                for properties, source in levels
                if synonym.name in properties
            ]
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
                    read_only=synonym.name not in DYNAMIC_LOG_CONFIGS,
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
    """AlterConfigs replaces a topic's overrides, or a broker's dynamic configs, with the
    given set."""
    m = response_module(request.api_key, request.api_version)

    def new_configs(r: Any, _current: dict[str, str]) -> dict[str, str]:
        return {c.name: c.value for c in r.configs if c.value is not None}

    return await _alter(
        ctx, m, m.AlterConfigsResourceResponse, m.AlterConfigsResponse, request, new_configs
    )


async def handle_incremental_alter_configs(
    ctx: BrokerContext, request: Request, _splicer: object
) -> Any:
    """IncrementalAlterConfigs sets or deletes single configs, or adds items to or removes
    items from a list config (`cleanup.policy`, the throttled replicas)."""
    m = response_module(request.api_key, request.api_version)

    def new_configs(r: Any, current: dict[str, str]) -> dict[str, str]:
        definitions = TOPIC_CONFIGS if r.resource_type == TOPIC_RESOURCE else DYNAMIC_LOG_CONFIGS
        configs = dict(current)
        for c in r.configs:
            if c.config_operation == SET:
                configs[c.name] = c.value or ""
            elif c.config_operation == DELETE:
                configs.pop(c.name, None)
            elif c.config_operation in (APPEND, SUBTRACT):
                configs[c.name] = _altered_list(
                    c.name, definitions.get(c.name), c.config_operation, c.value, configs
                )
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


def _altered_list(
    name: str,
    definition: ConfigDef | None,
    operation: int,
    value: str | None,
    configs: dict[str, str],
) -> str:
    """The list `name` (as set, else its default) with the items of `value` appended (those
    not in it yet) or subtracted, as Kafka's APPEND and SUBTRACT make it."""
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


class _AlteredResource(Protocol):
    """A resource of an (Incremental)AlterConfigs request, of any version."""

    @property
    def resource_type(self) -> int: ...
    @property
    def resource_name(self) -> str: ...
    @property
    def configs(self) -> Sequence[Any]: ...


NewConfigs = Callable[[_AlteredResource, dict[str, str]], dict[str, str]]
"""A resource's configs after the request, from those it has."""


async def _alter(
    ctx: BrokerContext,
    m: Any,
    result_cls: Any,
    response_cls: Any,
    request: Request,
    new_configs: NewConfigs,
) -> Any:
    validate_only = field(request.body, "validate_only", False)
    results = []
    for r in request.body.resources:
        error, message = ErrorCode.none, None
        try:
            _require(ctx, AclOperation.ALTER_CONFIGS, r.resource_type, r.resource_name)
            if r.resource_type == TOPIC_RESOURCE:
                ctx.admin.topic_or_error(r.resource_name)
                await ctx.admin.alter_configs(
                    r.resource_name,
                    new_configs(r, ctx.metadata.configs.get(r.resource_name, {})),
                    validate_only,
                )
            elif r.resource_type == BROKER_RESOURCE:
                await ctx.dynamic_config.alter(
                    r.resource_name, functools.partial(new_configs, r), validate_only
                )
            else:
                raise KafkaError(
                    ErrorCode.invalid_request,
                    f"resource type {r.resource_type}: only topic and broker configs alter",
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
