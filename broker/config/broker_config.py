"""Broker configuration keyed by Kafka's own property names.

Read from a `server.properties` file, then `--override key=value` on top; with neither,
the defaults run a useful broker: tiering to a local directory inside the log dir, and
metrics on `metrics.port` 9404. Every value is checked here, before anything touches
the disk, and a bad one is a `ConfigError` whose one line names the property and the fix.

Where Kafka logs and ignores a property it does not know, tierbroker refuses it (a typo
would otherwise leave a setting silently at its default), with "did you mean" when a
known name is close. A Kafka broker config that tierbroker does not implement is
accepted and noted (`ignored_properties`), so a Kafka `server.properties` still starts.
Plugins' own settings pass through under `rsm.config.*` and `rlmm.config.*`; the
security properties, Kafka's per-listener `listener.name.*` included, are kept as given
in `security` for the parts that read them.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Annotated, Any, NamedTuple

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from tierbroker.broker.config.connection_limits import (
    ConnectionLimits,
    connections_within_file_limit,
    parse_per_ip_overrides,
)
from tierbroker.broker.config.kafka_broker_configs import KAFKA_BROKER_CONFIGS
from tierbroker.broker.config.listeners import (
    ListenerConfig,
    ListenerError,
    parse_listener_config,
)
from tierbroker.broker.config.security_settings import (
    LISTENER_PREFIX,
    SECURITY_CONFIG_NAMES,
    SecuritySettings,
)
from tierbroker.storage.topic_configs import (
    TOPIC_CONFIGS,
    broker_default,
    format_value,
)

# Passed to the plugins (prefix removed), or Kafka's per-listener settings.
PASS_THROUGH_PREFIXES = ("rsm.config.", "rlmm.config.", "listener.name.")
MAX_PORT = 65535


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the property."""


def _kafka_bool(value: Any) -> Any:
    """Kafka's BOOLEAN: `true` or `false`, any case, nothing else (no yes/1/on)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text not in ("true", "false"):
        raise ValueError("must be true or false")
    return text == "true"


KafkaBool = Annotated[bool, BeforeValidator(_kafka_bool)]


def _port_or_none(value: Any) -> Any:
    """`metrics.port`: a port, 0 for a free one, or -1 for no endpoint."""
    try:
        port = int(str(value).strip())
    except ValueError:
        raise ValueError("must be an integer") from None
    if not -1 <= port <= MAX_PORT:
        raise ValueError(
            f"port {port} is out of range: use 1 to {MAX_PORT}, 0 for a free port, -1 for none"
        )
    return port


class Endpoint(NamedTuple):
    """A listener's host and port as configured (port 0: any free port)."""

    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


class BrokerConfig(BaseModel):
    """The broker's properties; built by `load_config`, which refuses unknown names."""

    model_config = ConfigDict(frozen=True, populate_by_name=False, extra="ignore")

    broker_id: int = Field(0, alias="broker.id", ge=0)
    listeners: str = Field("PLAINTEXT://127.0.0.1:9092", alias="listeners")
    advertised_listeners: str | None = Field(None, alias="advertised.listeners")
    listener_security_protocol_map: str | None = Field(None, alias="listener.security.protocol.map")
    inter_broker_listener_name: str | None = Field(None, alias="inter.broker.listener.name")
    security_inter_broker_protocol: str | None = Field(None, alias="security.inter.broker.protocol")
    log_dirs: str = Field("/tmp/tierbroker-logs", alias="log.dirs")
    broker_rack: str | None = Field(None, alias="broker.rack")
    cluster_id: str | None = Field(None, alias="cluster.id")
    num_partitions: int = Field(1, alias="num.partitions", ge=1)
    default_replication_factor: int = Field(1, alias="default.replication.factor", ge=1)
    auto_create_topics_enable: KafkaBool = Field(True, alias="auto.create.topics.enable")
    delete_topic_enable: KafkaBool = Field(True, alias="delete.topic.enable")
    socket_request_max_bytes: int = Field(104_857_600, alias="socket.request.max.bytes", ge=1)
    queued_max_request_bytes: int = Field(104_857_600, alias="queued.max.request.bytes", ge=1)
    # By default what the open file limit leaves for connections, found at start.
    max_connections: int = Field(
        default_factory=connections_within_file_limit, alias="max.connections", ge=0
    )
    max_connections_per_ip: int = Field(2**31 - 1, alias="max.connections.per.ip", ge=0)
    max_connections_per_ip_overrides: str = Field("", alias="max.connections.per.ip.overrides")
    connections_max_idle_ms: int = Field(600_000, alias="connections.max.idle.ms", ge=1)
    # Client quotas' rates: this many samples of this many seconds each (Kafka's).
    quota_window_num: int = Field(11, alias="quota.window.num", ge=1)
    quota_window_size_seconds: int = Field(1, alias="quota.window.size.seconds", ge=1)
    # tierbroker's own: below this much free space on its filesystem, a log dir refuses
    # produce (KAFKA_STORAGE_ERROR) until space is freed. None: the larger of 1 GiB and 5%
    # of the filesystem; 0: no floor (a full disk takes the dir offline, as in Kafka).
    log_dir_min_free_bytes: int | None = Field(None, alias="log.dir.min.free.bytes", ge=0)
    log_retention_check_interval_ms: int = Field(
        300_000, alias="log.retention.check.interval.ms", ge=1
    )
    log_flush_offset_checkpoint_interval_ms: int = Field(
        60_000, alias="log.flush.offset.checkpoint.interval.ms", ge=1
    )
    replica_high_watermark_checkpoint_interval_ms: int = Field(
        5_000, alias="replica.high.watermark.checkpoint.interval.ms", ge=1
    )
    log_cleaner_enable: KafkaBool = Field(True, alias="log.cleaner.enable")
    log_cleaner_threads: int = Field(1, alias="log.cleaner.threads", ge=1)
    log_cleaner_dedupe_buffer_size: int = Field(
        134_217_728, alias="log.cleaner.dedupe.buffer.size", ge=1
    )
    log_cleaner_io_buffer_load_factor: float = Field(
        0.9, alias="log.cleaner.io.buffer.load.factor", gt=0, le=1
    )
    log_cleaner_io_max_bytes_per_second: float = Field(
        float("inf"), alias="log.cleaner.io.max.bytes.per.second", gt=0
    )
    log_cleaner_backoff_ms: int = Field(15_000, alias="log.cleaner.backoff.ms", ge=1)
    offsets_topic_num_partitions: int = Field(50, alias="offsets.topic.num.partitions", ge=1)
    offsets_topic_replication_factor: int = Field(3, alias="offsets.topic.replication.factor", ge=1)
    offsets_topic_segment_bytes: int = Field(104_857_600, alias="offsets.topic.segment.bytes", ge=1)
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
    transaction_state_log_num_partitions: int = Field(
        50, alias="transaction.state.log.num.partitions", ge=1
    )
    transaction_state_log_replication_factor: int = Field(
        3, alias="transaction.state.log.replication.factor", ge=1
    )
    transaction_state_log_min_isr: int = Field(2, alias="transaction.state.log.min.isr", ge=1)
    transaction_state_log_segment_bytes: int = Field(
        104_857_600, alias="transaction.state.log.segment.bytes", ge=1
    )
    transaction_max_timeout_ms: int = Field(900_000, alias="transaction.max.timeout.ms", ge=1)
    transactional_id_expiration_ms: int = Field(
        604_800_000, alias="transactional.id.expiration.ms", ge=1
    )
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = Field(
        10_000, alias="transaction.abort.timed.out.transaction.cleanup.interval.ms", ge=1
    )
    transaction_remove_expired_transaction_cleanup_interval_ms: int = Field(
        3_600_000, alias="transaction.remove.expired.transaction.cleanup.interval.ms", ge=1
    )
    # The transaction.version feature level this broker finalizes (Kafka's is set with
    # kafka-features.sh): 2 is KIP-890's transactions v2, 1 and 0 the protocol before it.
    transaction_version: int = Field(2, alias="transaction.version", ge=0, le=2)
    request_timeout_ms: int = Field(30_000, alias="request.timeout.ms", ge=1)
    producer_id_expiration_ms: int = Field(86_400_000, alias="producer.id.expiration.ms", ge=1)
    producer_id_expiration_check_interval_ms: int = Field(
        600_000, alias="producer.id.expiration.check.interval.ms", ge=1
    )
    # On, unlike Kafka: topics still opt in (remote.storage.enable), and the default plugin
    # keeps the remote tier in a directory inside the first log dir.
    remote_log_storage_system_enable: KafkaBool = Field(
        True, alias="remote.log.storage.system.enable"
    )
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
    remote_log_metadata_custom_metadata_max_bytes: int = Field(
        128, alias="remote.log.metadata.custom.metadata.max.bytes", ge=0
    )
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
    # tierbroker's own: how long a copy may stay COPY_SEGMENT_STARTED before the leader's
    # expiration task takes it for abandoned (a broker died mid-copy) and deletes its objects.
    remote_log_manager_stuck_copy_timeout_ms: int = Field(
        300_000, alias="remote.log.manager.stuck.copy.timeout.ms", ge=1
    )
    # tierbroker's own: the bound on each call of the remote-log tasks to the storage and
    # metadata plugins; a copy past it is cancelled, cleaned up and retried with back-off.
    remote_log_manager_call_timeout_ms: int = Field(
        60_000, alias="remote.log.manager.call.timeout.ms", ge=1
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
    # KIP-1023: an empty follower of a tiered partition starts at its leader's earliest
    # offset pending upload, not at its local log start: it replicates only what the remote
    # tier lacks. On, unlike Kafka (default false); static here, dynamic in Kafka, as
    # tierbroker's dynamic broker configs are the topic defaults only.
    follower_fetch_last_tiered_offset_enable: KafkaBool = Field(
        True, alias="follower.fetch.last.tiered.offset.enable"
    )
    controlled_shutdown_enable: KafkaBool = Field(True, alias="controlled.shutdown.enable")
    controlled_shutdown_max_retries: int = Field(3, alias="controlled.shutdown.max.retries", ge=1)
    controlled_shutdown_retry_backoff_ms: int = Field(
        5000, alias="controlled.shutdown.retry.backoff.ms", ge=0
    )
    auto_leader_rebalance_enable: KafkaBool = Field(True, alias="auto.leader.rebalance.enable")
    leader_imbalance_check_interval_seconds: int = Field(
        300, alias="leader.imbalance.check.interval.seconds", ge=1
    )
    leader_imbalance_per_broker_percentage: int = Field(
        10, alias="leader.imbalance.per.broker.percentage", ge=0, le=100
    )
    replica_selector_class: str | None = Field(None, alias="replica.selector.class")
    metrics_port: Annotated[int, BeforeValidator(_port_or_none)] = Field(9404, alias="metrics.port")
    # `rsm.config.*` and `rlmm.config.*`, prefixes removed.
    rsm_configs: dict[str, str] = Field(default_factory=dict, exclude=True)
    rlmm_configs: dict[str, str] = Field(default_factory=dict, exclude=True)
    # tierbroker's bound on a whole shutdown (Kafka has none): past it, an uncontrolled one.
    shutdown_timeout_ms: int = Field(30_000, alias="shutdown.timeout.ms", ge=0)
    # Topic defaults (log.*): the topic config table names the broker properties of each.
    log_defaults: dict[str, Any] = Field(default_factory=dict, exclude=True)
    # Those broker properties as set (DescribeConfigs reports them as synonyms).
    log_default_synonyms: dict[str, str] = Field(default_factory=dict, exclude=True)
    # TLS, SASL and authorizer properties as given, `listener.name.*` overrides included.
    security: SecuritySettings = Field(default_factory=SecuritySettings, exclude=True)
    # Kafka broker configs that were set but that tierbroker does not implement.
    ignored_properties: tuple[str, ...] = Field((), exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _collect_log_defaults(cls, values: dict[str, Any]) -> dict[str, Any]:
        """Topic defaults from the broker's `log.*` properties, checked as topic configs are."""
        values = dict(values)
        defaults: dict[str, Any] = {}
        for definition in TOPIC_CONFIGS.values():
            found = next((s for s in definition.synonyms if s.name in values), None)
            if found is not None:  # the first synonym set wins, as in Kafka
                defaults[definition.name] = broker_default(
                    found.name, values[found.name], definition, found.unit_ms
                )
        values["log_defaults"] = defaults
        values["log_default_synonyms"] = {
            s.name: format_value(values[s.name])
            for d in TOPIC_CONFIGS.values()
            for s in d.synonyms
            if s.name in values
        }
        values["security"] = SecuritySettings(
            {
                k: str(v)
                for k, v in values.items()
                if isinstance(k, str)
                and (k in SECURITY_CONFIG_NAMES or k.startswith(LISTENER_PREFIX))
            }
        )
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
    def _check_listeners(self) -> BrokerConfig:
        try:
            _ = self.listener_config
        except ListenerError as e:
            raise ConfigError(str(e)) from None
        if not self.log_dir_paths:
            raise ConfigError(f"log.dirs={self.log_dirs!r}: name at least one directory")
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
            max_connections_by_file_limit=connections_within_file_limit(),
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
    def listener_config(self) -> ListenerConfig:
        """The listeners to bind, what each advertises, and the inter-broker one."""
        return parse_listener_config(
            self.listeners,
            self.advertised_listeners,
            self.listener_security_protocol_map,
            self.inter_broker_listener_name,
            self.security_inter_broker_protocol,
        )


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


def tierbroker_names() -> frozenset[str]:
    """Every property name tierbroker reads (plugin prefixes aside)."""
    names = {f.alias for f in BrokerConfig.model_fields.values() if f.alias}
    names |= {s.name for d in TOPIC_CONFIGS.values() for s in d.synonyms}
    return frozenset(names | SECURITY_CONFIG_NAMES | {"log.dir"})


def load_config(path: Path | None, overrides: list[str]) -> BrokerConfig:
    """Read `path` (if given) and apply `key=value` overrides; `ConfigError` if a property
    is unknown or a value is not valid."""
    try:
        props = parse_properties(path.read_text(encoding="utf-8")) if path else {}
    except OSError as e:
        raise ConfigError(f"--config {path}: cannot read it ({e.strerror or e})") from None
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--override {item!r}: expected key=value")
        props[key.strip()] = value.strip()
    known = tierbroker_names()
    unknown = [k for k in props if k not in known and not k.startswith(PASS_THROUGH_PREFIXES)]
    ignored = tuple(sorted(k for k in unknown if k in KAFKA_BROKER_CONFIGS))
    for key in unknown:
        if key not in KAFKA_BROKER_CONFIGS:
            raise ConfigError(_unknown_property(key, known))
    if "log.dir" in props and "log.dirs" not in props:
        props["log.dirs"] = props["log.dir"]
    try:
        return BrokerConfig.model_validate({**props, "ignored_properties": ignored})
    except ValidationError as e:
        errors = "; ".join(_describe(err) for err in e.errors())
        raise ConfigError(errors) from None


def _unknown_property(key: str, known: frozenset[str]) -> str:
    close = difflib.get_close_matches(key, sorted(known | KAFKA_BROKER_CONFIGS), n=1, cutoff=0.8)
    hint = f"did you mean {close[0]!r}?" if close else "check its spelling"
    return (
        f"unknown property {key!r}: {hint} "
        "(a plugin's own settings go under rsm.config.* or rlmm.config.*)"
    )


def _describe(err: Any) -> str:
    """One validation error as a line that names the property."""
    prop = err["loc"][0] if err["loc"] else ""
    if err["type"] == "value_error":  # our own checks
        message = str(err["ctx"]["error"])
        # A field's check gives the fix; a model check names the property itself.
        return f"{prop}={err['input']!r}: {message}" if prop else message
    return f"{prop}={err['input']!r}: {err['msg']}"
