"""A broker storing its remote segments compressed and encrypted (LocalFs tier): stock
consumers read them back, the stored bytes hold no record in the clear, a wrong key is
refused with one error while the broker serves on, and a rotated key reads old segments
and encrypts new ones."""

from __future__ import annotations

import json
import os
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.broker_process import BrokerProcess
from tests.integration.tiering_helpers import (
    check_records,
    fetch,
    produce,
    read_confluent,
    status,
    value_of,
)
from tests.integration.waiting import wait_for
from tierbroker.protocol.errors import ErrorCode

TOPIC = "sealed"
RECORDS = 6000
VALUE_SIZE = 560  # letters in order, after the record's number: compressible


def key_settings(keys: Path, *ids: str, active: str) -> dict[str, str]:
    settings = {
        "rsm.config.encryption.keys": ",".join(ids),
        "rsm.config.encryption.enabled": "true",
        "rsm.config.encryption.key.id": active,
    }
    for key_id in ids:
        settings[f"rsm.config.encryption.keys.{key_id}.file"] = str(keys / f"{key_id}.key")
    return settings


def fetch_error(broker: BrokerProcess, offset: int) -> int:
    """The error code of a Fetch of partition 0 at `offset`, retried while it times out."""
    for _ in range(20):
        answer = fetch(broker.port, TOPIC, offset, max_wait_ms=500)
        if answer.error != ErrorCode.request_timed_out:
            break
    return answer.error


def read_all(broker: BrokerProcess, count: int) -> None:
    result = read_confluent(broker.bootstrap, TOPIC, 0, count, timeout_s=60)
    check_records(result.records, 0, count, VALUE_SIZE)


def remote_files(broker: BrokerProcess, suffix: str) -> list[Path]:
    return sorted((broker.data_dir / "logs" / "remote").rglob(f"*.{suffix}"))


def test_sealed_segments_read_back_a_wrong_key_is_refused_and_keys_rotate(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    for key_id in ("k1", "k2"):
        (keys / f"{key_id}.key").write_bytes(os.urandom(32))
    base = {
        "remote.log.manager.task.interval.ms": "300",
        "log.retention.check.interval.ms": "300",
        "rsm.config.compression.enabled": "true",
        "rsm.config.chunk.size": "65536",
    }
    (tmp_path / "broker").mkdir()
    broker = BrokerProcess(tmp_path / "broker", {**base, **key_settings(keys, "k1", active="k1")})
    broker.start()
    try:
        config = {
            "remote.storage.enable": "true",
            "segment.bytes": str(512 << 10),
            "local.retention.bytes": str(512 << 10),
        }
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(TOPIC, 1, 1, config=config)])[TOPIC].result(15)
        produce(broker.bootstrap, TOPIC, 0, RECORDS, VALUE_SIZE)
        wait_for(
            lambda: (
                (s := status(broker, TOPIC))
                and s["copy_lag_segments"] == 0
                and s["local_log_start_offset"] > RECORDS // 2
            ),
            "most of the topic to be in the remote tier only",
        )
        read_all(broker, RECORDS)
        logs = remote_files(broker, "log")
        stored = b"".join(p.read_bytes() for p in logs)
        assert value_of(RECORDS // 3, VALUE_SIZE) not in stored
        tiered = status(broker, TOPIC)["remote_bytes"]
        assert len(stored) < tiered / 5  # compressed, then encrypted
        manifests = [json.loads(p.read_text()) for p in remote_files(broker, "manifest.json")]
        assert {m["objects"]["log"]["encryption"]["key_id"] for m in manifests} == {"k1"}

        # Another key under the same id: the remote reads fail, with one clear error.
        good = (keys / "k1.key").read_bytes()
        (keys / "k1.key").write_bytes(os.urandom(32))
        broker.stop()
        broker = broker.restarted()
        assert fetch_error(broker, 0) == ErrorCode.kafka_storage_error
        assert "key 'k1' does not open its data key" in broker.log()
        local_start = status(broker, TOPIC)["local_log_start_offset"]
        assert fetch_error(broker, local_start) == ErrorCode.none  # the local tier serves on

        # k1 back, k2 made active: old segments read with k1, new ones sealed with k2.
        (keys / "k1.key").write_bytes(good)
        broker.stop()
        broker = BrokerProcess(
            tmp_path / "broker", {**base, **key_settings(keys, "k1", "k2", active="k2")}
        ).start()
        produce(broker.bootstrap, TOPIC, RECORDS, RECORDS, VALUE_SIZE)
        wait_for(
            lambda: (
                len(remote_files(broker, "manifest.json")) > len(manifests)
                and status(broker, TOPIC)["copy_lag_segments"] == 0
            ),
            "the new segments to be tiered",
        )
        read_all(broker, 2 * RECORDS)
        rotated = [json.loads(p.read_text()) for p in remote_files(broker, "manifest.json")]
        assert {m["objects"]["log"]["encryption"]["key_id"] for m in rotated} == {"k1", "k2"}
    finally:
        broker.kill()
