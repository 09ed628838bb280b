"""Broker configuration keyed by Kafka's own property names.

Read from a `server.properties` file, then `--override key=value` on top. Unknown
properties are logged and ignored, as Kafka does; known ones are type-checked.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tierbroker.broker.acceptor import ConnectionLimits, parse_per_ip_overrides
from tierbroker.protocol.errors import KafkaError
from tierbroker.storage.topic_configs import (
    TOPIC_CONFIGS,
    ConfigDef,
    ConfigType,
    format_value,
    parse_value,
)

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the property."""


class BrokerConfig(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=False, extra="ignore")

    broker_id: int = Field(0, alias="broker.id", ge=0)
    listeners: str = Field("PLAINTEXT://127.0.0.1:9092", alias="listeners")
    advertised_listeners: str | None = Field(None, alias="advertised.listeners")
    log_dirs: str = Field("/tmp/tierbroker-logs", alias="log.dirs")
    broker_rack: str | None = Field(None, alias="broker.rack")
    cluster_id: str | None = Field(None, alias="cluster.id")
    num_partitions: int = Field(1, alias="num.partitions", ge=1)
    default_replication_factor: int = Field(1, alias="default.replication.factor", ge=1)
    auto_create_topics_enable: bool = Field(True, alias="auto.create.topics.enable")
    delete_topic_enable: bool = Field(True, alias="delete.topic.enable")
    socket_request_max_bytes: int = Field(104_857_600, alias="socket.request.max.bytes", ge=1)
    queued_max_request_bytes: int = Field(104_857_600, alias="queued.max.request.bytes", ge=1)
    max_connections: int = Field(2**31 - 1, alias="max.connections", ge=0)
    max_connections_per_ip: int = Field(2**31 - 1, alias="max.connections.per.ip", ge=0)
    max_connections_per_ip_overrides: str = Field("", alias="max.connections.per.ip.overrides")
    connections_max_idle_ms: int = Field(600_000, alias="connections.max.idle.ms", ge=1)
    log_retention_check_interval_ms: int = Field(
        300_000, alias="log.retention.check.interval.ms", ge=1
    )
    log_flush_offset_checkpoint_interval_ms: int = Field(
        60_000, alias="log.flush.offset.checkpoint.interval.ms", ge=1
    )
    replica_high_watermark_checkpoint_interval_ms: int = Field(
        5_000, alias="replica.high.watermark.checkpoint.interval.ms", ge=1
    )
    offsets_topic_num_partitions: int = Field(50, alias="offsets.topic.num.partitions", ge=1)
    offsets_topic_replication_factor: int = Field(3, alias="offsets.topic.replication.factor", ge=1)
    offsets_retention_minutes: int = Field(10_080, alias="offsets.retention.minutes", ge=1)
    offsets_retention_check_interval_ms: int = Field(
        600_000, alias="offsets.retention.check.interval.ms", ge=1
    )
    offset_metadata_max_bytes: int = Field(4096, alias="offset.metadata.max.bytes", ge=0)
    group_min_session_timeout_ms: int = Field(6_000, alias="group.min.session.timeout.ms", ge=0)
    group_max_session_timeout_ms: int = Field(1_800_000, alias="group.max.session.timeout.ms", ge=0)
    group_initial_rebalance_delay_ms: int = Field(
        3_000, alias="group.initial.rebalance.delay.ms", ge=0
    )
    group_max_size: int = Field(2**31 - 1, alias="group.max.size", ge=1)
    producer_id_expiration_ms: int = Field(86_400_000, alias="producer.id.expiration.ms", ge=1)
    producer_id_expiration_check_interval_ms: int = Field(
        600_000, alias="producer.id.expiration.check.interval.ms", ge=1
    )
    remote_log_storage_system_enable: bool = Field(False, alias="remote.log.storage.system.enable")
    remote_log_storage_manager_class_name: str = Field(
        "localfs", alias="remote.log.storage.manager.class.name"
    )
    remote_log_storage_manager_class_path: str | None = Field(
        None, alias="remote.log.storage.manager.class.path"
    )
    remote_log_metadata_manager_class_name: str = Field(
        "topic", alias="remote.log.metadata.manager.class.name"
    )
    remote_log_metadata_topic_num_partitions: int = Field(
        50, alias="remote.log.metadata.topic.num.partitions", ge=1
    )
    remote_log_manager_task_interval_ms: int = Field(
        30_000, alias="remote.log.manager.task.interval.ms", ge=1
    )
    remote_log_manager_copier_thread_pool_size: int = Field(
        10, alias="remote.log.manager.copier.thread.pool.size", ge=1
    )
    remote_log_manager_expiration_thread_pool_size: int = Field(
        10, alias="remote.log.manager.expiration.thread.pool.size", ge=1
    )
    remote_log_manager_follower_thread_pool_size: int = Field(
        2, alias="remote.log.manager.follower.thread.pool.size", ge=1
    )
    # Deprecated by Kafka 4.2 for the follower pool's own name; accepted, ignored.
    remote_log_manager_thread_pool_size: int = Field(
        2, alias="remote.log.manager.thread.pool.size", ge=1
    )
    remote_log_reader_threads: int = Field(10, alias="remote.log.reader.threads", ge=1)
    remote_log_reader_max_pending_tasks: int = Field(
        100, alias="remote.log.reader.max.pending.tasks", ge=1
    )
    remote_log_index_file_cache_total_size_bytes: int = Field(
        1 << 30, alias="remote.log.index.file.cache.total.size.bytes", ge=1
    )
    remote_fetch_max_wait_ms: int = Field(500, alias="remote.fetch.max.wait.ms", ge=1)
    remote_log_manager_copy_max_bytes_per_second: int = Field(
        2**63 - 1, alias="remote.log.manager.copy.max.bytes.per.second", ge=1
    )
    remote_log_manager_fetch_max_bytes_per_second: int = Field(
        2**63 - 1, alias="remote.log.manager.fetch.max.bytes.per.second", ge=1
    )
    remote_log_manager_task_retry_backoff_ms: int = Field(
        500, alias="remote.log.manager.task.retry.backoff.ms", ge=1
    )
    remote_log_manager_task_retry_backoff_max_ms: int = Field(
        30_000, alias="remote.log.manager.task.retry.backoff.max.ms", ge=1
    )
    remote_log_metadata_topic_replication_factor: int = Field(
        3, alias="remote.log.metadata.topic.replication.factor", ge=1
    )
    # The cluster: where its metadata lives, and how replicas follow their leaders.
    metadata_store: str = Field(
        "inprocess", alias="metadata.store", pattern="^(inprocess|zookeeper)$"
    )
    zookeeper_connect: str | None = Field(None, alias="zookeeper.connect")
    zookeeper_session_timeout_ms: int = Field(18_000, alias="zookeeper.session.timeout.ms", ge=1)
    zookeeper_connection_timeout_ms: int | None = Field(
        None, alias="zookeeper.connection.timeout.ms", ge=1
    )
    replica_lag_time_max_ms: int = Field(30_000, alias="replica.lag.time.max.ms", ge=1)
    replica_fetch_wait_max_ms: int = Field(500, alias="replica.fetch.wait.max.ms", ge=0)
    replica_fetch_min_bytes: int = Field(1, alias="replica.fetch.min.bytes", ge=1)
    replica_fetch_max_bytes: int = Field(1_048_576, alias="replica.fetch.max.bytes", ge=0)
    replica_fetch_response_max_bytes: int = Field(
        10_485_760, alias="replica.fetch.response.max.bytes", ge=0
    )
    replica_fetch_backoff_ms: int = Field(1000, alias="replica.fetch.backoff.ms", ge=0)
    replica_socket_timeout_ms: int = Field(30_000, alias="replica.socket.timeout.ms", ge=1)
    controlled_shutdown_enable: bool = Field(True, alias="controlled.shutdown.enable")
    replica_selector_class: str | None = Field(None, alias="replica.selector.class")
    metrics_port: int = Field(-1, alias="metrics.port", ge=-1)
    # `rsm.config.*` and `rlmm.config.*`, prefixes removed.
    rsm_configs: dict[str, str] = Field(default_factory=dict, exclude=True)
    rlmm_configs: dict[str, str] = Field(default_factory=dict, exclude=True)
    controlled_shutdown_timeout_ms: int = Field(30_000, alias="shutdown.timeout.ms", ge=0)
    # Topic defaults (log.*): the topic config table names the broker properties of each.
    log_defaults: dict[str, Any] = Field(default_factory=dict, exclude=True)
    # Those broker properties as set (DescribeConfigs reports them as synonyms).
    log_default_synonyms: dict[str, str] = Field(default_factory=dict, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _collect_log_defaults(cls, values: dict[str, Any]) -> dict[str, Any]:
        """Topic defaults from the broker's `log.*` properties, checked as topic configs are."""
        values = dict(values)
        defaults: dict[str, Any] = {}
        for definition in TOPIC_CONFIGS.values():
            found = next((s for s in definition.synonyms if s.name in values), None)
            if found is not None:  # the first synonym set wins, as in Kafka
                defaults[definition.name] = _checked_default(
                    found.name, values[found.name], definition, found.unit_ms
                )
        values["log_defaults"] = defaults
        values["log_default_synonyms"] = {
            s.name: format_value(values[s.name])
            for d in TOPIC_CONFIGS.values()
            for s in d.synonyms
            if s.name in values
        }
        for prefix, key in (("rsm.config.", "rsm_configs"), ("rlmm.config.", "rlmm_configs")):
            values[key] = {
                k[len(prefix) :]: str(v)
                for k, v in values.items()
                if isinstance(k, str) and k.startswith(prefix)
            }
        return values

    @model_validator(mode="after")
    def _check_per_ip_overrides(self) -> BrokerConfig:
        try:
            parse_per_ip_overrides(self.max_connections_per_ip_overrides)
        except ValueError as e:
            raise ValueError(f"max.connections.per.ip.overrides: {e}") from None
        return self

    @model_validator(mode="after")
    def _check_metadata_store(self) -> BrokerConfig:
        if self.metadata_store == "zookeeper" and not self.zookeeper_connect:
            raise ValueError("metadata.store=zookeeper needs zookeeper.connect=host:port[/chroot]")
        return self

    @property
    def connection_limits(self) -> ConnectionLimits:
        return ConnectionLimits(
            max_connections=self.max_connections,
            max_connections_per_ip=self.max_connections_per_ip,
            max_connections_per_ip_overrides=parse_per_ip_overrides(
                self.max_connections_per_ip_overrides
            ),
            connections_max_idle_ms=self.connections_max_idle_ms,
        )

    @property
    def log_dir_paths(self) -> list[Path]:
        return [Path(p.strip()) for p in self.log_dirs.split(",") if p.strip()]

    @property
    def listener(self) -> tuple[str, int]:
        return _host_port(self.listeners, "listeners")

    @property
    def advertised_listener(self) -> tuple[str, int]:
        host, port = _host_port(self.advertised_listeners or self.listeners, "advertised.listeners")
        return ("127.0.0.1" if host in ("", "0.0.0.0") else host), port


def _checked_default(prop: str, raw: Any, definition: ConfigDef, unit_ms: int = 1) -> Any:
    """The topic default `prop` supplies, in the topic config's unit, checked as the topic
    config is; a `ValueError` naming `prop` and the valid values if it is not valid."""
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


def _host_port(listeners: str, name: str) -> tuple[str, int]:
    first = listeners.split(",")[0].strip()
    parts = urlsplit(first)
    if parts.scheme.upper() != "PLAINTEXT" or parts.port is None:
        raise ConfigError(f"{name}={listeners!r}: expected PLAINTEXT://host:port")
    return parts.hostname or "", parts.port


def parse_properties(text: str) -> dict[str, str]:
    """Java .properties: `key=value` or `key: value`, `#`/`!` comments, `\\` continuations."""
    props: dict[str, str] = {}
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.strip()
        pending = ""
        if not line or line[0] in "#!":
            continue
        if line.endswith("\\"):
            pending = line[:-1]
            continue
        cut = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if cut < 0:
            raise ConfigError(f"cannot parse property line {raw!r}")
        props[line[:cut].strip()] = line[cut + 1 :].strip()
    return props


def load_config(path: Path | None, overrides: list[str]) -> BrokerConfig:
    """Read `path` (if given) and apply `key=value` overrides; unknown keys are logged."""
    props = parse_properties(path.read_text(encoding="utf-8")) if path else {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--override {item!r}: expected key=value")
        props[key.strip()] = value.strip()
    known = {f.alias for f in BrokerConfig.model_fields.values() if f.alias}
    known |= {s.name for d in TOPIC_CONFIGS.values() for s in d.synonyms} | {"log.dir"}
    plugin_keys = {k for k in props if k.startswith(("rsm.config.", "rlmm.config."))}
    for key in sorted(set(props) - known - plugin_keys):
        log.warning("The configuration %r was supplied but isn't a known config", key)
    if "log.dir" in props and "log.dirs" not in props:
        props["log.dirs"] = props["log.dir"]
    try:
        return BrokerConfig.model_validate(props)
    except ValidationError as e:
        errors = "; ".join(_describe(err) for err in e.errors())
        raise ConfigError(errors) from None


def _describe(err: Any) -> str:
    """One validation error as a line that names the property."""
    if err["type"] == "value_error":  # our own checks: the message names the property
        return str(err["ctx"]["error"])
    return f"{err['loc'][0] if err['loc'] else ''}: {err['msg']}"
