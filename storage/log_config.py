"""Topic-level log configuration, with Kafka's names, defaults and checks.

`TOPIC_CONFIGS` is the one table of what a topic may set: its type, default, the
broker property that supplies the default, and its valid values. Configs Kafka has
but tierbroker does not implement are refused, never silently ignored.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from tierbroker.protocol.errors import ErrorCode, KafkaError


class ConfigType(enum.IntEnum):
    """Kafka's config types, as DescribeConfigs v3+ reports them (KIP-569)."""

    BOOLEAN = 1
    STRING = 2
    INT = 3
    LONG = 5
    LIST = 7


@dataclass(frozen=True, slots=True)
class ConfigDef:
    name: str
    type: type
    default: Any
    broker_property: str | None
    check: Callable[[Any], bool]
    valid: str
    config_type: ConfigType


def _at_least(n: int) -> Callable[[Any], bool]:
    return lambda v: v >= n


def _one_of(*values: object) -> Callable[[Any], bool]:
    return lambda v: v in values


_CONFIGS = (
    ConfigDef(
        "cleanup.policy",
        str,
        "delete",
        "log.cleanup.policy",
        _one_of("delete"),
        "delete (compaction is not supported)",
        ConfigType.LIST,
    ),
    ConfigDef(
        "retention.ms",
        int,
        604_800_000,
        "log.retention.ms",
        _at_least(-1),
        ">= -1",
        ConfigType.LONG,
    ),
    ConfigDef(
        "retention.bytes", int, -1, "log.retention.bytes", _at_least(-1), ">= -1", ConfigType.LONG
    ),
    ConfigDef(
        "segment.bytes",
        int,
        1_073_741_824,
        "log.segment.bytes",
        _at_least(14),
        ">= 14",
        ConfigType.INT,
    ),
    ConfigDef("segment.ms", int, 604_800_000, "log.roll.ms", _at_least(1), ">= 1", ConfigType.LONG),
    ConfigDef(
        "segment.index.bytes",
        int,
        10_485_760,
        "log.index.size.max.bytes",
        _at_least(8),
        ">= 8",
        ConfigType.INT,
    ),
    ConfigDef(
        "index.interval.bytes",
        int,
        4096,
        "log.index.interval.bytes",
        _at_least(0),
        ">= 0",
        ConfigType.INT,
    ),
    ConfigDef(
        "max.message.bytes",
        int,
        1_048_588,
        "message.max.bytes",
        _at_least(0),
        ">= 0",
        ConfigType.INT,
    ),
    ConfigDef(
        "message.timestamp.type",
        str,
        "CreateTime",
        "log.message.timestamp.type",
        _one_of("CreateTime", "LogAppendTime"),
        "CreateTime or LogAppendTime",
        ConfigType.STRING,
    ),
    ConfigDef(
        "message.timestamp.before.max.ms",
        int,
        9_223_372_036_854_775_807,
        "log.message.timestamp.before.max.ms",
        _at_least(0),
        ">= 0",
        ConfigType.LONG,
    ),
    ConfigDef(
        "message.timestamp.after.max.ms",
        int,
        3_600_000,
        "log.message.timestamp.after.max.ms",
        _at_least(0),
        ">= 0",
        ConfigType.LONG,
    ),
    ConfigDef(
        "remote.storage.enable",
        bool,
        False,
        None,
        _one_of(True, False),
        "true or false",
        ConfigType.BOOLEAN,
    ),
    ConfigDef(
        "local.retention.ms",
        int,
        -2,
        "log.local.retention.ms",
        _at_least(-2),
        ">= -2",
        ConfigType.LONG,
    ),
    ConfigDef(
        "local.retention.bytes",
        int,
        -2,
        "log.local.retention.bytes",
        _at_least(-2),
        ">= -2",
        ConfigType.LONG,
    ),
    ConfigDef(
        "remote.log.copy.disable",
        bool,
        False,
        None,
        _one_of(True, False),
        "true or false",
        ConfigType.BOOLEAN,
    ),
    ConfigDef(
        "remote.log.delete.on.disable",
        bool,
        False,
        None,
        _one_of(True, False),
        "true or false",
        ConfigType.BOOLEAN,
    ),
    ConfigDef(
        "file.delete.delay.ms",
        int,
        60_000,
        "log.segment.delete.delay.ms",
        _at_least(0),
        ">= 0",
        ConfigType.LONG,
    ),
)
TOPIC_CONFIGS: Mapping[str, ConfigDef] = {c.name: c for c in _CONFIGS}


def format_value(value: Any) -> str:
    """A config value as Kafka prints it: booleans in lower case."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _parse_bool(raw: str) -> bool:
    if raw.lower() not in ("true", "false"):
        raise ValueError(raw)
    return raw.lower() == "true"


def parse_value(definition: ConfigDef, raw: str) -> Any:
    """Parse and check one topic config value; `KafkaError(INVALID_CONFIG)` if bad."""
    try:
        value = (
            _parse_bool(raw.strip()) if definition.type is bool else definition.type(raw.strip())
        )
    except ValueError:
        raise KafkaError(
            ErrorCode.invalid_config,
            f"{definition.name}={raw!r}: not a valid {definition.type.__name__}",
        ) from None
    if not definition.check(value):
        raise KafkaError(
            ErrorCode.invalid_config, f"{definition.name}={raw!r}: must be {definition.valid}"
        )
    return value


def check_overrides(overrides: Mapping[str, str]) -> dict[str, Any]:
    """Validate topic config overrides by name and value."""
    parsed = {}
    for name, raw in overrides.items():
        definition = TOPIC_CONFIGS.get(name)
        if definition is None:
            raise KafkaError(
                ErrorCode.invalid_config, f"unknown or unsupported topic config {name!r}"
            )
        parsed[name] = parse_value(definition, raw)
    return parsed


@dataclass(frozen=True, slots=True, kw_only=True)
class LogConfig:
    """The effective configuration of one partition's log."""

    cleanup_policy: str = "delete"
    retention_ms: int = 604_800_000
    retention_bytes: int = -1
    segment_bytes: int = 1_073_741_824
    segment_ms: int = 604_800_000
    segment_index_bytes: int = 10_485_760
    index_interval_bytes: int = 4096
    max_message_bytes: int = 1_048_588
    message_timestamp_type: str = "CreateTime"
    # CreateTime only: how far a record's timestamp may lie before / after the broker's clock.
    message_timestamp_before_max_ms: int = 9_223_372_036_854_775_807
    message_timestamp_after_max_ms: int = 3_600_000
    file_delete_delay_ms: int = 60_000
    remote_storage_enable: bool = False
    local_retention_ms: int = -2  # -2: follow retention.ms
    local_retention_bytes: int = -2  # -2: follow retention.bytes
    remote_log_copy_disable: bool = False
    remote_log_delete_on_disable: bool = False

    @property
    def effective_local_retention_ms(self) -> int:
        return self.retention_ms if self.local_retention_ms == -2 else self.local_retention_ms

    @property
    def effective_local_retention_bytes(self) -> int:
        return (
            self.retention_bytes if self.local_retention_bytes == -2 else self.local_retention_bytes
        )

    @classmethod
    def from_configs(cls, values: Mapping[str, Any]) -> LogConfig:
        """Build from Kafka-named values (`segment.bytes`, ...); absent names keep defaults."""
        names = {f.name for f in fields(cls)}
        return cls(
            **{k.replace(".", "_"): v for k, v in values.items() if k.replace(".", "_") in names}
        )
