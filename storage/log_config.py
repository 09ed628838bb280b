"""`LogConfig`: the effective configuration of one partition's log.

Built from Kafka-named values (`segment.bytes`, ...) once they are checked against
`topic_configs.TOPIC_CONFIGS`, whose defaults it repeats. Every Kafka topic config
has a field, also those tierbroker does not act on (`min.insync.replicas`, ...), so
code that comes to use one reads it here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, NoReturn

from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.protocol.records import Compression
from tierbroker.storage.topic_configs import LONG_MAX

_CODECS = {
    "uncompressed": Compression.NONE,
    "gzip": Compression.GZIP,
    "snappy": Compression.SNAPPY,
    "lz4": Compression.LZ4,
    "zstd": Compression.ZSTD,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class LogConfig:
    """One field per topic config, named as the config with `_` for `.`."""

    cleanup_policy: str = "delete"
    compression_type: str = "producer"
    compression_gzip_level: int = -1
    compression_lz4_level: int = 9
    compression_zstd_level: int = 3
    delete_retention_ms: int = 86_400_000
    file_delete_delay_ms: int = 60_000
    flush_messages: int = LONG_MAX
    flush_ms: int = LONG_MAX
    follower_replication_throttled_replicas: str = ""
    index_interval_bytes: int = 4096
    leader_replication_throttled_replicas: str = ""
    local_retention_bytes: int = -2  # -2: follow retention.bytes
    local_retention_ms: int = -2  # -2: follow retention.ms
    max_compaction_lag_ms: int = LONG_MAX
    max_message_bytes: int = 1_048_588
    message_downconversion_enable: bool = True
    message_format_version: str = "3.0-IV1"
    # CreateTime only: how far a record's timestamp may lie before / after the broker's clock.
    message_timestamp_after_max_ms: int = 3_600_000
    message_timestamp_before_max_ms: int = LONG_MAX
    message_timestamp_difference_max_ms: int = LONG_MAX  # Kafka 3.x; see timestamp_*_max_ms
    message_timestamp_type: str = "CreateTime"
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    min_insync_replicas: int = 1
    preallocate: bool = False
    # KIP-1241: a rolled segment is copied once this old or this far behind the log end;
    # 0: at once, -1: the effective local.retention.* (see effective_remote_copy_lag_*).
    remote_copy_lag_bytes: int = 0
    remote_copy_lag_ms: int = 0
    remote_log_copy_disable: bool = False
    remote_log_delete_on_disable: bool = False
    remote_storage_enable: bool = False
    retention_bytes: int = -1
    retention_ms: int = 604_800_000
    segment_bytes: int = 1_073_741_824
    segment_index_bytes: int = 10_485_760
    segment_jitter_ms: int = 0
    segment_ms: int = 604_800_000
    unclean_leader_election_enable: bool = False

    @property
    def compact(self) -> bool:
        """The cleaner keeps the last record of each key (`compact` or `compact,delete`)."""
        return "compact" in self.cleanup_policy  # one of delete, compact or both

    @property
    def delete(self) -> bool:
        """Time and size retention apply (`delete` or `compact,delete`)."""
        return "delete" in self.cleanup_policy

    @property
    def effective_local_retention_ms(self) -> int:
        return self.retention_ms if self.local_retention_ms == -2 else self.local_retention_ms

    @property
    def effective_local_retention_bytes(self) -> int:
        return (
            self.retention_bytes if self.local_retention_bytes == -2 else self.local_retention_bytes
        )

    @property
    def effective_remote_copy_lag_ms(self) -> int:
        """Kafka's `remoteCopyLagMs()`: -1 stands for the effective local retention."""
        lag = self.remote_copy_lag_ms
        return self.effective_local_retention_ms if lag == -1 else lag

    @property
    def effective_remote_copy_lag_bytes(self) -> int:
        """Kafka's `remoteCopyLagBytes()`: -1 stands for the effective local retention."""
        lag = self.remote_copy_lag_bytes
        return self.effective_local_retention_bytes if lag == -1 else lag

    @property
    def timestamp_before_max_ms(self) -> int:
        """before.max.ms, or as Kafka 3.x, difference.max.ms where before is left unbounded."""
        before = self.message_timestamp_before_max_ms
        return before if before != LONG_MAX else self.message_timestamp_difference_max_ms

    @property
    def timestamp_after_max_ms(self) -> int:
        """after.max.ms, or as Kafka 3.x, difference.max.ms where after is left unbounded."""
        after = self.message_timestamp_after_max_ms
        return after if after != LONG_MAX else self.message_timestamp_difference_max_ms

    @property
    def compression_codec(self) -> Compression | None:
        """The codec batches are stored in; None: as the producer sent them."""
        return _CODECS.get(self.compression_type)

    @property
    def compression_level(self) -> int | None:
        """The topic's level for its codec (KIP-390); None: the codec's own default."""
        level = {
            "gzip": self.compression_gzip_level,
            "lz4": self.compression_lz4_level,
            "zstd": self.compression_zstd_level,
        }.get(self.compression_type)
        return None if level == -1 else level

    def check(self) -> None:
        """Kafka's checks across configs; `KafkaError(INVALID_CONFIG)` naming both values."""
        if self.min_compaction_lag_ms > self.max_compaction_lag_ms:
            raise KafkaError(
                ErrorCode.invalid_config,
                f"min.compaction.lag.ms {self.min_compaction_lag_ms} > "
                f"max.compaction.lag.ms {self.max_compaction_lag_ms}",
            )
        if not self.remote_storage_enable:
            return
        if self.cleanup_policy != "delete":  # Kafka's words (LogConfig, 4.1+)
            raise KafkaError(
                ErrorCode.invalid_config,
                "Remote log storage only supports topics with cleanup.policy=delete or "
                "cleanup.policy being an empty list.",
            )
        for kind, total, local in (
            ("bytes", self.retention_bytes, self.local_retention_bytes),
            ("ms", self.retention_ms, self.local_retention_ms),
        ):
            if total > -1 and local == -1:
                _invalid(
                    f"local.retention.{kind}",
                    local,
                    f"Value must not be -1 as retention.{kind} value is set as {total}.",
                )
            if total > -1 and local != -2 and local > total:
                _invalid(
                    f"local.retention.{kind}",
                    local,
                    f"Value must not be more than retention.{kind} property value: {total}",
                )
        for kind, lag, local in (
            ("ms", self.remote_copy_lag_ms, self.effective_local_retention_ms),
            ("bytes", self.remote_copy_lag_bytes, self.effective_local_retention_bytes),
        ):
            if lag > 0 and local >= 0 and lag > local:  # KIP-1241
                _invalid(
                    f"remote.copy.lag.{kind}",
                    lag,
                    f"Value must not exceed local.retention.{kind} (effective value: {local})",
                )
        if self.remote_log_copy_disable:  # KIP-950, Kafka's words
            for kind, total, local in (
                ("bytes", self.retention_bytes, self.local_retention_bytes),
                ("ms", self.retention_ms, self.local_retention_ms),
            ):
                if local not in (-2, total):
                    raise KafkaError(
                        ErrorCode.invalid_config,
                        f"When `remote.log.copy.disable` is set to true, the `local.retention."
                        f"{kind}` and `retention.{kind}` must be set to the identical value "
                        "because there will be no more logs copied to the remote storage.",
                    )

    @classmethod
    def from_configs(cls, values: Mapping[str, Any]) -> LogConfig:
        """Build from Kafka-named values (`segment.bytes`, ...); absent names keep defaults."""
        names = {f.name for f in fields(cls)}
        return cls(
            **{k.replace(".", "_"): v for k, v in values.items() if k.replace(".", "_") in names}
        )


def _invalid(name: str, value: int, reason: str) -> NoReturn:
    """INVALID_CONFIG in the words of Kafka's `ConfigException(name, value, message)`."""
    raise KafkaError(
        ErrorCode.invalid_config, f"Invalid value {value} for configuration {name}: {reason}"
    )
