"""A tiered partition whose offset checkpoints are lost restores its log start offset from the
remote tier: the records remote retention deleted stay gone, and every surviving record is
read from the beginning by stock clients."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from tests.integration.broker_process import BrokerProcess
from tests.integration.tiering_helpers import (
    EARLIEST,
    check_records,
    list_offsets,
    produce,
    read_confluent,
    read_kcat,
    status,
)
from tests.integration.waiting import wait_for

FAST = {
    "remote.log.manager.task.interval.ms": "300",
    "log.retention.check.interval.ms": "300",
}
VALUE_SIZE = 500
COUNT = 6000
TOPIC = "lost"
LOST = (
    "log-start-offset-checkpoint",
    "recovery-point-offset-checkpoint",
    "replication-offset-checkpoint",
    ".kafka_cleanshutdown",
)


def set_retention_bytes(admin: AdminClient, value: int) -> None:
    entry = ConfigEntry("retention.bytes", str(value), incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource("topic", TOPIC, incremental_configs=[entry])
    admin.incremental_alter_configs([resource])[resource].result(15)


def settled_log_start_offset(broker: BrokerProcess) -> int:
    """The log start offset once remote retention has deleted what it will and nothing moves."""
    seen: list[dict[str, int]] = []

    def settled() -> int | None:
        s = status(broker, TOPIC)
        row = {
            k: s.get(k, -1) for k in ("log_start_offset", "remote_segments", "copy_lag_segments")
        }
        seen.append(row)
        stable = len(seen) >= 5 and all(r == row for r in seen[-5:])
        if stable and row["log_start_offset"] > 0 and row["copy_lag_segments"] == 0:
            return row["log_start_offset"]
        return None

    return wait_for(settled, "remote retention to settle", interval_s=0.5, show=lambda: seen[-1:])


def test_lost_checkpoints_restore_the_log_start_offset_from_the_remote_tier(
    tmp_path: Path,
) -> None:
    broker = BrokerProcess(tmp_path, FAST).start()
    try:
        config = {
            "remote.storage.enable": "true",
            "segment.bytes": str(64 * 1024),
            "local.retention.bytes": str(128 * 1024),
        }
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(TOPIC, 1, 1, config=config)])[TOPIC].result(15)
        # Small batches make segments of about segment.bytes: librdkafka's default batches of
        # up to 1 MB would roll segments of that size, and retention, which goes a segment at a
        # time, could then leave nothing remote only.
        produce(broker.bootstrap, TOPIC, 0, COUNT, VALUE_SIZE, batch_size=16 * 1024)
        # Retention counts local bytes not yet copied: set while the copy lags, it could take
        # every remote segment. Set once all is copied, it leaves some records remote only.
        wait_for(
            lambda: status(broker, TOPIC)["copy_lag_segments"] == 0,
            "every rolled segment to be copied",
            show=lambda: status(broker, TOPIC),
        )
        set_retention_bytes(admin, 1024 * 1024)  # about a third of what was produced
        start = settled_log_start_offset(broker)
        assert start < status(broker, TOPIC)["local_log_start_offset"]  # some are remote only

        broker.stop()
        log_dir = tmp_path / "logs"
        for name in LOST:
            (log_dir / name).unlink()
        broker = broker.restarted()

        assert list_offsets(broker.port, TOPIC, EARLIEST)[:2] == (0, start)
        assert status(broker, TOPIC)["log_start_offset"] == start
        surviving = COUNT - start
        got = read_confluent(broker.bootstrap, TOPIC, EARLIEST, surviving, timeout_s=60)
        check_records(got.records, start, surviving, VALUE_SIZE)
        check_records(
            read_kcat(broker.bootstrap, TOPIC, timeout_s=60).records, start, surviving, VALUE_SIZE
        )
    finally:
        broker.kill()
