"""A tiered topic's switches, set with confluent-kafka's AdminClient on a broker process
with the LocalFs tier: KIP-1241's delayed upload (`remote.copy.lag.bytes`), and KIP-950's
read-only tier (`remote.log.copy.disable`) and turning tiering off
(`remote.storage.enable=false` needs `remote.log.delete.on.disable=true`).

What is tiered is read from `/tier/status`; the local segments' sizes from the log's
directory, so the copy lag's boundary is checked to the byte.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
)

from tests.integration.broker_process import BrokerProcess
from tests.integration.tiering_helpers import (
    LocalFsTier,
    check_records,
    produce,
    read_confluent,
    status,
)
from tests.integration.waiting import wait_for

SEGMENT_BYTES = 64 * 1024
VALUE_SIZE = 500
TIMEOUT_S = 15
FAST = {
    "remote.log.manager.task.interval.ms": "200",
    "log.retention.check.interval.ms": "200",
    "remote.log.storage.manager.class.name": "localfs",
}
SET, DELETE = AlterConfigOpType.SET, AlterConfigOpType.DELETE


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path_factory.mktemp("switches"), FAST).start()
    try:
        yield process
    finally:
        process.kill()
    assert "Traceback" not in process.log(), process.log()[-5000:]


@pytest.fixture
def admin(broker: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def create(admin: AdminClient, topic: str, **configs: str) -> None:
    config = {"remote.storage.enable": "true", "segment.bytes": str(SEGMENT_BYTES), **configs}
    admin.create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result(TIMEOUT_S)


def alter(admin: AdminClient, topic: str, *changes: tuple[str, str, AlterConfigOpType]) -> None:
    entries = [ConfigEntry(n, v, incremental_operation=op) for n, v, op in changes]
    resource = ConfigResource("topic", topic, incremental_configs=entries)
    admin.incremental_alter_configs([resource])[resource].result(TIMEOUT_S)


def refusal(admin: AdminClient, topic: str, *changes: tuple[str, str, AlterConfigOpType]) -> Any:
    with pytest.raises(KafkaException) as refused:
        alter(admin, topic, *changes)
    error = refused.value.args[0]
    assert error.code() == KafkaError.INVALID_CONFIG, error
    return error.str()


def describe(admin: AdminClient, topic: str) -> dict[str, ConfigEntry]:
    resource = ConfigResource("topic", topic)
    return dict(admin.describe_configs([resource])[resource].result(timeout=TIMEOUT_S))


def local_segments(broker: BrokerProcess, topic: str) -> list[tuple[int, int]]:
    """(base offset, bytes) of each local segment, oldest first."""
    directory = broker.data_dir / "logs" / f"{topic}-0"
    return sorted((int(p.stem), p.stat().st_size) for p in directory.glob("*.log"))


def bytes_after(segments: list[tuple[int, int]], end_offset: int) -> int:
    """Bytes of the local log after offset `end_offset` (a segment's last offset)."""
    return sum(size for base, size in segments if base > end_offset)


# KIP-1241 -------------------------------------------------------------------------------


def test_the_copy_lag_configs_are_described_with_their_defaults(admin: AdminClient) -> None:
    create(admin, "lag-defaults")
    configs = describe(admin, "lag-defaults")
    for name in ("remote.copy.lag.ms", "remote.copy.lag.bytes"):
        assert (configs[name].value, configs[name].source) == (
            "0",
            ConfigSource.DEFAULT_CONFIG.value,
        )


def test_segments_within_the_copy_lag_stay_local_until_it_is_lowered(
    broker: BrokerProcess, admin: AdminClient
) -> None:
    topic = "lagged"
    lag = 5 * SEGMENT_BYTES
    # The time lag follows local retention (retention.ms, 7 days): the size lag decides.
    create(admin, topic, **{"remote.copy.lag.bytes": str(lag), "remote.copy.lag.ms": "-1"})
    count = 3000
    produce(broker.bootstrap, topic, 0, count, VALUE_SIZE, batch_size=16384)

    def held_back() -> dict[str, Any] | None:
        """The status once the copy took every segment the lag lets go, and no other."""
        s = status(broker, topic)
        if not s or s["log_end_offset"] != count or s["remote_log_end_offset"] < 0:
            return None
        segments = local_segments(broker, topic)
        tiered_end = s["remote_log_end_offset"]
        pending = [base for base, _ in segments[:-1] if base > tiered_end]
        # The last copied segment had at least `lag` bytes after it; the first held back,
        # once it is taken off, leaves fewer.
        first_pending_end = (pending[1] if len(pending) > 1 else segments[-1][0]) - 1
        if bytes_after(segments, tiered_end) >= lag > bytes_after(segments, first_pending_end):
            return s
        return None

    s = wait_for(
        held_back, "the copy to stop at the copy lag", 30, show=lambda: status(broker, topic)
    )
    assert s["copy_lag_segments"] >= 4  # the lag holds back about five 64 KiB segments
    assert describe(admin, topic)["remote.copy.lag.bytes"].value == str(lag)

    alter(admin, topic, ("remote.copy.lag.bytes", "0", SET))
    s = wait_for(
        lambda: (s := status(broker, topic))["copy_lag_segments"] == 0 and s,
        "every rolled segment to be copied once the lag is 0",
        30,
        show=lambda: status(broker, topic),
    )
    assert s["remote_log_end_offset"] == local_segments(broker, topic)[-1][0] - 1


def test_a_copy_lag_beyond_local_retention_is_refused_in_kafkas_words(admin: AdminClient) -> None:
    create(admin, "lag-refused", **{"local.retention.bytes": "100000"})
    message = refusal(admin, "lag-refused", ("remote.copy.lag.bytes", "100001", SET))
    assert message == (
        "Invalid value 100001 for configuration remote.copy.lag.bytes: Value must not exceed "
        "local.retention.bytes (effective value: 100000)"
    )
    alter(admin, "lag-refused", ("remote.copy.lag.bytes", "100000", SET))
    with pytest.raises(KafkaException) as refused:
        create(admin, "lag-negative", **{"remote.copy.lag.ms": "-2"})
    assert refused.value.args[0].code() == KafkaError.INVALID_CONFIG


# KIP-950 --------------------------------------------------------------------------------


def test_copy_disabled_keeps_remote_reads_and_retention_and_turning_off_needs_delete(
    broker: BrokerProcess, admin: AdminClient
) -> None:
    topic = "read-only"
    tier = LocalFsTier(broker.data_dir)
    create(admin, topic, **{"local.retention.bytes": str(2 * SEGMENT_BYTES)})
    produce(broker.bootstrap, topic, 0, 2000, VALUE_SIZE, batch_size=16384)
    tiered = wait_for(
        lambda: (
            (s := status(broker, topic))["copy_lag_segments"] == 0
            and s["local_log_start_offset"] > 0
            and s
        ),
        "the topic tiered and its local log trimmed",
        30,
        show=lambda: status(broker, topic),
    )
    # Copies off: local retention must then equal retention (Kafka's rule and words).
    message = refusal(admin, topic, ("remote.log.copy.disable", "true", SET))
    assert message.startswith("When `remote.log.copy.disable` is set to true, the `local.")
    alter(
        admin,
        topic,
        ("remote.log.copy.disable", "true", SET),
        ("local.retention.bytes", "", DELETE),
    )
    produce(broker.bootstrap, topic, 2000, 1000, VALUE_SIZE, batch_size=16384)
    wait_for(lambda: status(broker, topic)["log_end_offset"] == 3000, "the new records", TIMEOUT_S)
    s = status(broker, topic)
    assert s["remote_log_end_offset"] == tiered["remote_log_end_offset"]  # nothing copied
    assert s["copy_lag_segments"] > 0
    # Remote reads go on: everything from offset 0, through the remote tier.
    check_records(read_confluent(broker.bootstrap, topic, 0, 3000).records, 0, 3000, VALUE_SIZE)

    # Remote retention goes on too; local retention is the topic's retention again.
    alter(admin, topic, ("retention.bytes", str(4 * SEGMENT_BYTES), SET))
    trimmed = wait_for(
        lambda: (
            (s := status(broker, topic))["log_start_offset"] > 0
            and s["remote_segments"] < tiered["remote_segments"]
            and s
        ),
        "retention.bytes to delete the oldest segments of both tiers",
        30,
        show=lambda: status(broker, topic),
    )
    assert trimmed["remote_log_end_offset"] == tiered["remote_log_end_offset"]

    # Turning tiering off without deleting the remote data is refused, in Kafka's words.
    message = refusal(admin, topic, ("remote.storage.enable", "false", SET))
    assert message.startswith("It is invalid to disable remote storage without deleting")
    assert tier.objects(topic)
    alter(
        admin,
        topic,
        ("remote.storage.enable", "false", SET),
        ("remote.log.delete.on.disable", "true", SET),
    )
    wait_for(
        lambda: not tier.objects(topic),
        "the remote data to be deleted once tiering is off",
        30,
        show=lambda: sorted(tier.objects(topic))[:5],
    )
