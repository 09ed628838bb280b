"""The topic configs Apache Kafka defines: names, types, defaults, valid values, synonyms.

`TOPIC_CONFIGS` is the one table of what a topic may set: every config of Kafka 3.9 and
4.3 (3.9's deprecated `message.format.version` and
`message.timestamp.difference.max.ms` included, so that clients written for either are
accepted; `segment.bytes` keeps 3.9's lower bound, 14, so tests may roll small
segments), and Kafka 4.4's `remote.copy.lag.ms` / `remote.copy.lag.bytes` (KIP-1241,
delayed upload, after 4.3.1). Each config lists, as Kafka's `ServerTopicConfigSynonyms`
does, the broker properties that supply its default, first one first, each with its unit. Values are
parsed as Kafka's `ConfigDef` parses them: trimmed, booleans in any case, integers
within their Java type, lists split at commas.

Configs marked `applied=False` change nothing here (flushing, replication throttles,
...): they are checked, stored and reported as Kafka does, and setting one is logged
(`not_applied`). One value Kafka 4.1+ accepts is refused with INVALID_CONFIG, because
tierbroker does not honour it: an empty `cleanup.policy` (keep every record forever).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tierbroker.protocol.errors import ErrorCode, KafkaError

INT_MAX = 2**31 - 1
LONG_MAX = 2**63 - 1
MINUTE_MS = 60_000
HOUR_MS = 3_600_000


class ConfigType(enum.IntEnum):
    """Kafka's config types, as DescribeConfigs v3+ reports them (KIP-569)."""

    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7
    PASSWORD = 9  # a secret: described as sensitive, without its value


@dataclass(frozen=True, slots=True)
class Synonym:
    """A broker property that supplies a topic config's default, in `unit_ms` (1 but for
    hours and minutes); `has_default`: Kafka's broker config has a default of its own."""

    name: str
    unit_ms: int = 1
    has_default: bool = True


@dataclass(frozen=True, slots=True)
class ConfigDef:
    name: str
    config_type: ConfigType
    default: Any
    check: Callable[[Any], bool]
    valid: str  # the valid values, for messages
    synonyms: tuple[Synonym, ...] = ()
    applied: bool = True  # False: accepted and reported, but it changes nothing here

    @property
    def broker_property(self) -> str | None:
        """The broker property Kafka names as this config's server default."""
        return self.synonyms[0].name if self.synonyms else None


def _at_least(n: int) -> Callable[[Any], bool]:
    return lambda v: v >= n


def _between(low: float, high: float) -> Callable[[Any], bool]:
    return lambda v: low <= v <= high


def _one_of(*values: str) -> Callable[[Any], bool]:
    return lambda v: v in values


def _each_one_of(*values: str) -> Callable[[Any], bool]:
    return lambda items: all(item in values for item in items)


def _anything(_value: Any) -> bool:
    return True


_REPLICA = re.compile(r"([0-9]+:[0-9]+)?")


def _throttled_replicas(items: tuple[str, ...]) -> bool:
    """`*`, or `partitionId:brokerId` pairs (Kafka's ThrottledReplicaListValidator)."""
    return "".join(items) == "*" or all(_REPLICA.fullmatch(item) for item in items)


# Kafka 3.9's message format versions (MetadataVersion): a release, or a release and
# one of its inter-broker protocol versions ("2.8-IV1"), by how many it has; a longer
# release ("0.10.2.1", "2.8.2") names its first segments.
_IBP_VERSIONS = {
    "0.8.0": 0, "0.8.1": 0, "0.8.2": 0, "0.9.0": 0, "0.10.0": 2, "0.10.1": 3, "0.10.2": 1,
    "0.11.0": 3, "1.0": 1, "1.1": 1, "2.0": 2, "2.1": 3, "2.2": 2, "2.3": 2, "2.4": 2, "2.5": 1,
    "2.6": 1, "2.7": 3, "2.8": 2, "3.0": 2, "3.1": 1, "3.2": 1, "3.3": 4, "3.4": 1, "3.5": 3,
    "3.6": 3, "3.7": 5, "3.8": 1, "3.9": 1,
}  # fmt: skip
_MESSAGE_FORMAT_VERSIONS = frozenset(_IBP_VERSIONS) | {
    f"{release}-IV{iv}" for release, count in _IBP_VERSIONS.items() for iv in range(count)
}


def _message_format_version(value: str) -> bool:
    segments = value.split(".")
    count = 3 if value.startswith("0.") else 2
    key = value if count >= len(segments) else ".".join(segments[:count])
    return key in _MESSAGE_FORMAT_VERSIONS


def _gzip_level(level: int) -> bool:
    return 1 <= level <= 9 or level == -1


_BOOL = (_anything, "true or false")
_CLEANUP = "delete, compact or both"
_THROTTLED = "'*' or a list of partitionId:brokerId"
_COMPRESSION = ("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd")
_TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")
_T = ConfigType
_S = Synonym

_CONFIGS = (
    ConfigDef("cleanup.policy", _T.LIST, "delete", _each_one_of("delete", "compact"), _CLEANUP,
              (_S("log.cleanup.policy"),)),
    ConfigDef("compression.type", _T.STRING, "producer", _one_of(*_COMPRESSION),
              "one of " + ", ".join(_COMPRESSION), (_S("compression.type"),)),
    ConfigDef("compression.gzip.level", _T.INT, -1, _gzip_level, "1 to 9, or -1",
              (_S("compression.gzip.level"),)),
    ConfigDef("compression.lz4.level", _T.INT, 9, _between(1, 17), "1 to 17",
              (_S("compression.lz4.level"),)),
    ConfigDef("compression.zstd.level", _T.INT, 3, _between(-131072, 22), "-131072 to 22",
              (_S("compression.zstd.level"),)),
    ConfigDef("delete.retention.ms", _T.LONG, 86_400_000, _at_least(0), ">= 0",
              (_S("log.cleaner.delete.retention.ms"),)),
    ConfigDef("file.delete.delay.ms", _T.LONG, 60_000, _at_least(0), ">= 0",
              (_S("log.segment.delete.delay.ms"),)),
    ConfigDef("flush.messages", _T.LONG, LONG_MAX, _at_least(1), ">= 1",
              (_S("log.flush.interval.messages"),), applied=False),
    ConfigDef("flush.ms", _T.LONG, LONG_MAX, _at_least(0), ">= 0",
              (_S("log.flush.interval.ms", has_default=False),
               _S("log.flush.scheduler.interval.ms")), applied=False),
    ConfigDef("follower.replication.throttled.replicas", _T.LIST, "", _throttled_replicas,
              _THROTTLED, applied=False),
    ConfigDef("index.interval.bytes", _T.INT, 4096, _at_least(0), ">= 0",
              (_S("log.index.interval.bytes"),)),
    ConfigDef("leader.replication.throttled.replicas", _T.LIST, "", _throttled_replicas,
              _THROTTLED, applied=False),
    ConfigDef("local.retention.bytes", _T.LONG, -2, _at_least(-2), ">= -2",
              (_S("log.local.retention.bytes"),)),
    ConfigDef("local.retention.ms", _T.LONG, -2, _at_least(-2), ">= -2",
              (_S("log.local.retention.ms"),)),
    ConfigDef("max.compaction.lag.ms", _T.LONG, LONG_MAX, _at_least(1), ">= 1",
              (_S("log.cleaner.max.compaction.lag.ms"),)),
    ConfigDef("max.message.bytes", _T.INT, 1_048_588, _at_least(0), ">= 0",
              (_S("message.max.bytes"),)),
    ConfigDef("message.downconversion.enable", _T.BOOLEAN, True, *_BOOL,
              (_S("log.message.downconversion.enable"),), applied=False),
    ConfigDef("message.format.version", _T.STRING, "3.0-IV1", _message_format_version,
              "a Kafka version, e.g. 3.0-IV1", (_S("log.message.format.version"),),
              applied=False),
    ConfigDef("message.timestamp.after.max.ms", _T.LONG, 3_600_000, _at_least(0), ">= 0",
              (_S("log.message.timestamp.after.max.ms"),)),
    ConfigDef("message.timestamp.before.max.ms", _T.LONG, LONG_MAX, _at_least(0), ">= 0",
              (_S("log.message.timestamp.before.max.ms"),)),
    ConfigDef("message.timestamp.difference.max.ms", _T.LONG, LONG_MAX, _at_least(0), ">= 0",
              (_S("log.message.timestamp.difference.max.ms"),)),
    ConfigDef("message.timestamp.type", _T.STRING, "CreateTime", _one_of(*_TIMESTAMP_TYPES),
              " or ".join(_TIMESTAMP_TYPES), (_S("log.message.timestamp.type"),)),
    ConfigDef("min.cleanable.dirty.ratio", _T.DOUBLE, 0.5, _between(0, 1), "0 to 1",
              (_S("log.cleaner.min.cleanable.ratio"),)),
    ConfigDef("min.compaction.lag.ms", _T.LONG, 0, _at_least(0), ">= 0",
              (_S("log.cleaner.min.compaction.lag.ms"),)),
    ConfigDef("min.insync.replicas", _T.INT, 1, _at_least(1), ">= 1",
              (_S("min.insync.replicas"),), applied=False),
    ConfigDef("preallocate", _T.BOOLEAN, False, *_BOOL, (_S("log.preallocate"),),
              applied=False),
    # KIP-1241's delayed upload: Kafka 4.4's (trunk), not in 4.3.1; -1 follows local.retention.*.
    ConfigDef("remote.copy.lag.bytes", _T.LONG, 0, _at_least(-1), ">= -1",
              (_S("log.remote.copy.lag.bytes"),)),
    ConfigDef("remote.copy.lag.ms", _T.LONG, 0, _at_least(-1), ">= -1",
              (_S("log.remote.copy.lag.ms"),)),
    ConfigDef("remote.log.copy.disable", _T.BOOLEAN, False, *_BOOL),
    ConfigDef("remote.log.delete.on.disable", _T.BOOLEAN, False, *_BOOL),
    ConfigDef("remote.storage.enable", _T.BOOLEAN, False, *_BOOL),
    ConfigDef("retention.bytes", _T.LONG, -1, _anything, "a long",
              (_S("log.retention.bytes"),)),
    ConfigDef("retention.ms", _T.LONG, 604_800_000, _at_least(-1), ">= -1",
              (_S("log.retention.ms", has_default=False),
               _S("log.retention.minutes", MINUTE_MS, has_default=False),
               _S("log.retention.hours", HOUR_MS))),
    ConfigDef("segment.bytes", _T.INT, 1_073_741_824, _at_least(14), ">= 14",
              (_S("log.segment.bytes"),)),
    ConfigDef("segment.index.bytes", _T.INT, 10_485_760, _at_least(4), ">= 4",
              (_S("log.index.size.max.bytes"),)),
    ConfigDef("segment.jitter.ms", _T.LONG, 0, _at_least(0), ">= 0",
              (_S("log.roll.jitter.ms", has_default=False), _S("log.roll.jitter.hours", HOUR_MS)),
              applied=False),
    ConfigDef("segment.ms", _T.LONG, 604_800_000, _at_least(1), ">= 1",
              (_S("log.roll.ms", has_default=False), _S("log.roll.hours", HOUR_MS))),
    ConfigDef("unclean.leader.election.enable", _T.BOOLEAN, False, *_BOOL,
              (_S("unclean.leader.election.enable"),), applied=False),
)  # fmt: skip
TOPIC_CONFIGS: Mapping[str, ConfigDef] = {c.name: c for c in _CONFIGS}


def format_value(value: Any) -> str:
    """A config value as Kafka prints it: booleans in lower case."""
    return str(value).lower() if isinstance(value, bool) else str(value)


_INTEGER = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_LIMITS = {ConfigType.INT: INT_MAX, ConfigType.LONG: LONG_MAX}
_TYPE_NAMES = {
    ConfigType.BOOLEAN: "true or false",
    ConfigType.INT: "an int",
    ConfigType.LONG: "a long",
    ConfigType.DOUBLE: "a double",
}


def _parse(config_type: ConfigType, text: str) -> Any:
    """A trimmed value of `config_type` (a list: its items); `ValueError` if it is not one."""
    if config_type is ConfigType.BOOLEAN:
        if text.lower() not in ("true", "false"):
            raise ValueError(text)
        return text.lower() == "true"
    if config_type in _LIMITS:
        limit = _LIMITS[config_type]
        if not _INTEGER.fullmatch(text) or not -limit - 1 <= int(text) <= limit:
            raise ValueError(text)
        return int(text)
    if config_type is ConfigType.DOUBLE:
        if not _DECIMAL.fullmatch(text):
            raise ValueError(text)
        return float(text)
    if config_type is ConfigType.LIST:  # Kafka splits at commas and the spaces around them
        return tuple(re.split(r"\s*,\s*", text)) if text else ()
    return text


def parse_value(definition: ConfigDef, raw: str) -> Any:
    """Parse and check one topic config value (a list: its items joined by commas);
    `KafkaError(INVALID_CONFIG)` if bad."""
    name = definition.name
    try:
        value = _parse(definition.config_type, raw.strip())
    except ValueError:
        kind = _TYPE_NAMES[definition.config_type]  # strings and lists always parse
        raise KafkaError(ErrorCode.invalid_config, f"{name}={raw!r}: not {kind}") from None
    if not definition.check(value):
        raise KafkaError(ErrorCode.invalid_config, f"{name}={raw!r}: must be {definition.valid}")
    if name == "cleanup.policy" and not value:
        raise KafkaError(
            ErrorCode.invalid_config,
            f"cleanup.policy={raw!r}: an empty policy (keep every record) is not supported",
        )
    return ",".join(value) if definition.config_type is ConfigType.LIST else value


def broker_default(prop: str, raw: Any, definition: ConfigDef, unit_ms: int = 1) -> Any:
    """The topic default broker property `prop` supplies, in the topic config's unit,
    checked as the topic config is; a `ValueError` naming `prop` and the valid values."""
    text = format_value(raw) if isinstance(raw, bool) else str(raw)
    try:
        if prop.startswith("log.retention."):  # Kafka: any negative retention is unlimited
            text = str(max(int(text.strip()) * unit_ms, -1))
        elif unit_ms != 1:
            text = str(int(text.strip()) * unit_ms)
        return parse_value(definition, text)
    except (KafkaError, ValueError):
        kind = "an integer " if definition.config_type in (ConfigType.INT, ConfigType.LONG) else ""
        unit = f" once in ms (x {unit_ms})" if unit_ms != 1 else ""
        raise ValueError(f"{prop}={raw!r}: must be {kind}{definition.valid}{unit}") from None


def check_overrides(overrides: Mapping[str, str | None]) -> dict[str, Any]:
    """Validate topic config overrides by name and value; the parsed values."""
    parsed = {}
    for name, raw in overrides.items():
        definition = TOPIC_CONFIGS.get(name)
        if definition is None:
            raise KafkaError(ErrorCode.invalid_config, f"unknown topic config {name!r}")
        if raw is None:  # CreateTopics allows a null value; Kafka refuses it
            raise KafkaError(ErrorCode.invalid_config, f"{name}: a null value is not supported")
        parsed[name] = parse_value(definition, raw)
    return parsed


def not_applied(overrides: Mapping[str, str]) -> list[str]:
    """The names among `overrides` of configs that change nothing in tierbroker."""
    return sorted(name for name in overrides if not TOPIC_CONFIGS[name].applied)
