"""Topic configs are parsed and checked as Kafka's LogConfig does, one at a time and together."""

from __future__ import annotations

import pytest

from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.protocol.records import Compression
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.topic_configs import (
    TOPIC_CONFIGS,
    check_overrides,
    format_value,
    not_applied,
)


def refusal(overrides: dict[str, str | None]) -> str:
    with pytest.raises(KafkaError) as refused:
        check_overrides(overrides)
    assert refused.value.code == ErrorCode.invalid_config
    return str(refused.value)


def test_each_default_reads_back_as_itself_into_the_log_config() -> None:
    defaults = {name: format_value(d.default) for name, d in TOPIC_CONFIGS.items()}
    parsed = check_overrides(defaults)
    assert {name: format_value(v) for name, v in parsed.items()} == defaults
    assert LogConfig.from_configs(parsed) == LogConfig(), "LogConfig repeats the table's defaults"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("segment.bytes", "2147483648"),  # above Java's int
        ("retention.ms", "9223372036854775808"),  # above Java's long
        ("segment.bytes", "1_000"),
        ("segment.bytes", "13"),
        ("segment.index.bytes", "3"),
        ("min.insync.replicas", "0"),
        ("min.cleanable.dirty.ratio", "1.5"),
        ("min.cleanable.dirty.ratio", "nan"),
        ("compression.type", "brotli"),
        ("compression.type", "ZSTD"),  # Kafka's names are case-sensitive
        ("compression.gzip.level", "0"),
        ("compression.lz4.level", "18"),
        ("compression.zstd.level", "23"),
        ("unclean.leader.election.enable", "yes"),
        ("leader.replication.throttled.replicas", "7"),
        ("follower.replication.throttled.replicas", "*,1:2"),
        ("message.format.version", "9.9"),
        ("message.format.version", "3.0-IV2"),
        ("message.timestamp.type", "Now"),
        ("segment.jitter.ms", "-1"),
        ("local.retention.ms", "-3"),
        ("cleanup.policy", "remove"),
    ],
)
def test_invalid_values_are_refused_naming_the_config(name: str, value: str) -> None:
    assert refusal({name: value}).startswith(f"INVALID_CONFIG: {name}={value!r}")


@pytest.mark.parametrize(
    ("name", "value", "parsed"),
    [
        ("segment.bytes", " +2048 ", 2048),
        ("preallocate", "TRUE", True),
        ("min.cleanable.dirty.ratio", ".25", 0.25),
        ("compression.gzip.level", "-1", -1),
        ("compression.zstd.level", "-131072", -131072),
        ("leader.replication.throttled.replicas", "*", "*"),
        ("follower.replication.throttled.replicas", "0:1 , 1:2,", "0:1,1:2,"),
        ("message.format.version", "2.8.1", "2.8.1"),  # a release names its first segments
        ("message.format.version", "0.10.2-IV0", "0.10.2-IV0"),
        ("cleanup.policy", "delete, delete", "delete,delete"),
        ("retention.bytes", "-100", -100),  # Kafka bounds retention.bytes by nothing
    ],
)
def test_valid_values_are_parsed_as_kafka_parses_them(
    name: str, value: str, parsed: object
) -> None:
    assert check_overrides({name: value}) == {name: parsed}


@pytest.mark.parametrize(
    ("policy", "parsed"),
    [
        ("compact", "compact"),
        ("delete,compact", "delete,compact"),
        ("compact, delete", "compact,delete"),
    ],
)
def test_compaction_policies_are_accepted(policy: str, parsed: str) -> None:
    assert check_overrides({"cleanup.policy": policy}) == {"cleanup.policy": parsed}


def test_an_empty_policy_is_refused_saying_so() -> None:
    assert "an empty policy" in refusal({"cleanup.policy": ""})


@pytest.mark.parametrize("policy", ["compact", "compact,delete"])
def test_a_tiered_topic_cannot_be_compacted_in_kafkas_words(policy: str) -> None:
    config = LogConfig.from_configs({"cleanup.policy": policy, "remote.storage.enable": True})
    with pytest.raises(KafkaError, match="Remote log storage only supports topics with "):
        config.check()


def test_an_unknown_name_or_a_null_value_is_refused() -> None:
    assert "unknown topic config 'retention.minutes'" in refusal({"retention.minutes": "5"})
    assert "retention.ms: a null value" in refusal({"retention.ms": None})


def test_configs_without_effect_are_named() -> None:
    overrides = {"preallocate": "true", "retention.ms": "1000", "min.insync.replicas": "2"}
    assert not_applied(overrides) == ["min.insync.replicas", "preallocate"]
    config = LogConfig.from_configs(check_overrides(overrides))
    assert (config.min_insync_replicas, config.unclean_leader_election_enable) == (2, False)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"min.compaction.lag.ms": 10, "max.compaction.lag.ms": 5},
            "min.compaction.lag.ms 10 > max.compaction.lag.ms 5",
        ),
        (
            {"remote.storage.enable": True, "retention.bytes": 100, "local.retention.bytes": 200},
            "Invalid value 200 for configuration local.retention.bytes: Value must not be more "
            "than retention.bytes property value: 100",
        ),
        (
            {"remote.storage.enable": True, "retention.ms": 1000, "local.retention.ms": -1},
            "Invalid value -1 for configuration local.retention.ms: Value must not be -1 as "
            "retention.ms value is set as 1000.",
        ),
        (
            {
                "remote.storage.enable": True,
                "remote.log.copy.disable": True,
                "retention.ms": 1000,
                "local.retention.ms": 500,
            },
            "When `remote.log.copy.disable` is set to true, the `local.retention.ms` and "
            "`retention.ms` must be set to the identical value",
        ),
    ],
)
def test_configs_are_checked_together(values: dict[str, object], message: str) -> None:
    """In Kafka's words (LogConfig's checks), so its documentation and answers apply."""
    with pytest.raises(KafkaError) as refused:
        LogConfig.from_configs(values).check()
    assert refused.value.code == ErrorCode.invalid_config
    assert message in str(refused.value)


def test_local_retention_may_exceed_retention_without_a_remote_tier() -> None:
    LogConfig.from_configs({"retention.bytes": 100, "local.retention.bytes": 200}).check()


def test_compression_type_names_the_codec_and_its_level() -> None:
    def target(**values: object) -> tuple[Compression | None, int | None]:
        config = LogConfig.from_configs(values)
        return config.compression_codec, config.compression_level

    assert target() == (None, None)  # producer: as produced
    assert target(**{"compression.type": "uncompressed"}) == (Compression.NONE, None)
    assert target(**{"compression.type": "gzip"}) == (Compression.GZIP, None)  # -1: default
    assert target(**{"compression.type": "gzip", "compression.gzip.level": 9}) == (
        Compression.GZIP,
        9,
    )
    assert target(**{"compression.type": "zstd", "compression.lz4.level": 1}) == (
        Compression.ZSTD,
        3,
    )
    assert target(**{"compression.type": "snappy"}) == (Compression.SNAPPY, None)


def test_the_timestamp_difference_bounds_what_before_and_after_leave_unbounded() -> None:
    """Kafka 3.x: message.timestamp.difference.max.ms applies where before/after are at
    their unbounded value."""
    config = LogConfig.from_configs(
        {
            "message.timestamp.difference.max.ms": 5000,
            "message.timestamp.after.max.ms": 2**63 - 1,
        }
    )
    assert (config.timestamp_before_max_ms, config.timestamp_after_max_ms) == (5000, 5000)
    assert LogConfig().timestamp_after_max_ms == 3_600_000
