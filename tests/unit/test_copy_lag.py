"""KIP-1241's delayed upload: `remote.copy.lag.ms` / `remote.copy.lag.bytes`, their checks
against local retention, and which rolled segments the copy task takes under them."""

from __future__ import annotations

import dataclasses
import time
import uuid
from pathlib import Path

import pytest

from tests.unit.test_rlm_components import build_log
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.rlm.config import RemoteLogManagerConfig
from tierbroker.rlm.copy_task import CopyTask, past_copy_lag
from tierbroker.rlm.tiered_partition import TieredPartition
from tierbroker.storage.log import Log
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.remote.segment_metadata import TopicIdPartition
from tierbroker.storage.topic_configs import TOPIC_CONFIGS, check_overrides
from tierbroker.storage.topic_partition import TopicPartition

# Kafka's RemoteLogManagerTest cases: segments of 40 and 30 bytes, then an active one of 20.
BEHIND_FIRST, BEHIND_SECOND = 50, 20


@pytest.mark.parametrize(
    ("lag_ms", "lag_bytes", "ages", "expected"),
    [
        (100, -1, (50, 0), 0),  # too young, no size lag: nothing
        (100, -1, (100, 50), 1),  # exactly the lag old: the first
        (-1, 60, (0, 0), 0),  # 50 bytes behind the first < 60
        (-1, 50, (0, 0), 1),  # 50 behind the first, 20 behind the second
        (0, 60, (0, 0), 2),  # a lag of 0 copies at once, whatever the other says
        (100, 0, (0, 0), 2),
        (-1, -1, (10**9, 10**9), 0),  # both unlimited (local retention -1): never
        (100, 60, (101, 20), 1),  # time passes, size does not: either suffices
        (100, 50, (50, 20), 1),  # size passes, time does not
        (100, 60, (50, 0), 0),  # neither
        (100, -1, (-5, 0), 1),  # a timestamp in the future does not hold a segment back
    ],
)
def test_a_segment_passes_when_old_or_far_enough_behind_the_log_end(
    lag_ms: int, lag_bytes: int, ages: tuple[int, int], expected: int
) -> None:
    passed = 0
    for age, behind in zip(ages, (BEHIND_FIRST, BEHIND_SECOND), strict=True):
        if not past_copy_lag(age, behind, lag_ms, lag_bytes):
            break
        passed += 1
    assert passed == expected


def test_the_configs_are_kafkas_longs_with_defaults_of_zero_and_broker_synonyms() -> None:
    for name, synonym in (
        ("remote.copy.lag.ms", "log.remote.copy.lag.ms"),
        ("remote.copy.lag.bytes", "log.remote.copy.lag.bytes"),
    ):
        definition = TOPIC_CONFIGS[name]
        assert (definition.default, definition.broker_property) == (0, synonym)
        assert check_overrides({name: " -1 "}) == {name: -1}
        with pytest.raises(KafkaError, match=f"{name}='-2': must be >= -1"):
            check_overrides({name: "-2"})
        with pytest.raises(KafkaError, match="not a long"):
            check_overrides({name: "soon"})


def test_minus_one_stands_for_the_effective_local_retention() -> None:
    config = LogConfig(
        retention_ms=1000,
        local_retention_ms=-2,
        retention_bytes=2000,
        local_retention_bytes=1800,
        remote_copy_lag_ms=-1,
        remote_copy_lag_bytes=-1,
    )
    assert (config.effective_remote_copy_lag_ms, config.effective_remote_copy_lag_bytes) == (
        1000,
        1800,
    )
    assert LogConfig().effective_remote_copy_lag_ms == 0  # the default: copy at once


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"retention_ms": 1000, "remote_copy_lag_ms": 1001},
            "Invalid value 1001 for configuration remote.copy.lag.ms: Value must not exceed "
            "local.retention.ms (effective value: 1000)",
        ),
        (
            {"retention_bytes": 1000, "local_retention_bytes": 500, "remote_copy_lag_bytes": 501},
            "Invalid value 501 for configuration remote.copy.lag.bytes: Value must not exceed "
            "local.retention.bytes (effective value: 500)",
        ),
    ],
)
def test_a_lag_beyond_local_retention_is_refused(values: dict[str, int], message: str) -> None:
    with pytest.raises(KafkaError) as refused:
        LogConfig(remote_storage_enable=True, **values).check()  # type: ignore[arg-type]
    assert refused.value.code == ErrorCode.invalid_config
    assert refused.value.args[0] == message


@pytest.mark.parametrize(
    "values",
    [
        {"retention_ms": 1000, "remote_copy_lag_ms": 0, "remote_copy_lag_bytes": 0},
        {"retention_ms": 1000, "local_retention_ms": 900, "remote_copy_lag_ms": -1},
        {"retention_ms": -1, "remote_copy_lag_ms": 10**12},  # unlimited local retention
        {"retention_ms": 1000, "remote_copy_lag_ms": 1000},
    ],
)
def test_lags_within_local_retention_are_taken(values: dict[str, int]) -> None:
    LogConfig(remote_storage_enable=True, **values).check()  # type: ignore[arg-type]


# The copy task ------------------------------------------------------------------------


TIP = TopicIdPartition(uuid.uuid4(), TopicPartition("lagged", 0))


def copy_task(lg: Log) -> CopyTask:
    partition = TieredPartition(TIP, lg)
    return CopyTask(partition, 0, RemoteLogManagerConfig(), None, None, None, None, None)  # type: ignore[arg-type]


def with_lag(lg: Log, **lags: int) -> None:
    lg.config = dataclasses.replace(lg.config, **lags)  # type: ignore[arg-type]


def test_the_copy_task_holds_back_the_segments_within_the_size_lag(tmp_path: Path) -> None:
    lg = build_log(tmp_path, TIP)
    rolled = lg.segments[:-1]
    assert len(rolled) >= 4
    assert [s.base_offset for s in copy_task(lg).eligible_segments()] == [
        s.base_offset for s in rolled
    ]
    # Hold back the newest two rolled segments: the bytes from the third newest's end on.
    lag = lg.size_in_bytes - sum(s.size for s in rolled[:-2])
    with_lag(lg, remote_copy_lag_bytes=lag, remote_copy_lag_ms=-1)  # local retention: -1
    eligible = copy_task(lg).eligible_segments()
    assert [s.base_offset for s in eligible] == [s.base_offset for s in rolled[:-2]]
    with_lag(lg, remote_copy_lag_bytes=lag + 1)
    assert len(copy_task(lg).eligible_segments()) == len(rolled) - 3
    # What is copied is skipped, and the lag still ends the list.
    lg.update_highest_offset_in_remote_storage(rolled[0].next_offset - 1)
    assert copy_task(lg).eligible_segments()[0] is rolled[1]


def test_the_copy_task_holds_back_segments_younger_than_the_time_lag(tmp_path: Path) -> None:
    lg = build_log(tmp_path, TIP)  # records about an hour old
    with_lag(lg, remote_copy_lag_ms=2 * 3_600_000, remote_copy_lag_bytes=-1)
    assert copy_task(lg).eligible_segments() == []
    age_ms = int(time.time() * 1000) - lg.segments[0].largest_timestamp_ms()
    with_lag(lg, remote_copy_lag_ms=age_ms - 60_000)
    assert len(copy_task(lg).eligible_segments()) == len(lg.segments) - 1
