"""A broker storing its remote segments compressed and encrypted (LocalFs tier): stock
consumers read them back, the stored bytes hold no record in the clear, a wrong key is
refused with one error while the broker serves on, and a rotated key reads old segments
and encrypts new ones."""

from __future__ import annotations

import datetime
import json
import os
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic

from tests.integration.broker_process import BrokerProcess
from tests.integration.tiering_helpers import status
from tests.integration.waiting import wait_for
from tests.integration.wire import WireClient
from tierbroker.protocol.errors import ErrorCode

TOPIC = "sealed"
RECORDS = 6000
VALUE = b"a compressible record value " * 20  # 560 bytes, the same in every record


def key_settings(keys: Path, *ids: str, active: str) -> dict[str, str]:
    settings = {
        "rsm.config.encryption.keys": ",".join(ids),
        "rsm.config.encryption.enabled": "true",
        "rsm.config.encryption.key.id": active,
    }
    for key_id in ids:
        settings[f"rsm.config.encryption.keys.{key_id}.file"] = str(keys / f"{key_id}.key")
    return settings


def produce(broker: BrokerProcess, start: int, count: int) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for i in range(start, start + count):
        producer.produce(TOPIC, VALUE, b"%d" % i, partition=0)
        producer.poll(0)
    assert producer.flush(60) == 0


def read_keys(broker: BrokerProcess, count: int) -> list[bytes]:
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "s", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        while len(got) < count and time.monotonic() < deadline:
            got += [m.key() for m in consumer.consume(2000, 0.3) if m.error() is None]
    finally:
        consumer.close()
    return got


def fetch_error(broker: BrokerProcess, offset: int) -> ErrorCode:
    """The error code of a Fetch of partition 0 at `offset` (retried while it times out)."""
    request = FetchRequest(
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=500),
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(
            FetchTopic(
                topic=TOPIC,
                partitions=(
                    FetchPartition(
                        partition=0,
                        current_leader_epoch=-1,
                        fetch_offset=offset,
                        log_start_offset=-1,
                        partition_max_bytes=1 << 20,
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
        rack_id="",
    )
    with WireClient(broker.port) as client:
        for _ in range(20):
            code = ErrorCode(client.request(request).responses[0].partitions[0].error_code)
            if code != ErrorCode.request_timed_out:
                return code
    return code


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
        produce(broker, 0, RECORDS)
        wait_for(
            lambda: (
                (s := status(broker, TOPIC))
                and s["copy_lag_segments"] == 0
                and s["local_log_start_offset"] > RECORDS // 2
            ),
            "most of the topic to be in the remote tier only",
        )
        expected = [b"%d" % i for i in range(RECORDS)]
        assert read_keys(broker, RECORDS) == expected
        logs = remote_files(broker, "log")
        stored = b"".join(p.read_bytes() for p in logs)
        assert VALUE[:100] not in stored and b"%d" % (RECORDS // 3) not in stored
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
        produce(broker, RECORDS, RECORDS)
        wait_for(
            lambda: (
                len(remote_files(broker, "manifest.json")) > len(manifests)
                and status(broker, TOPIC)["copy_lag_segments"] == 0
            ),
            "the new segments to be tiered",
        )
        assert read_keys(broker, 2 * RECORDS) == [b"%d" % i for i in range(2 * RECORDS)]
        rotated = [json.loads(p.read_text()) for p in remote_files(broker, "manifest.json")]
        assert {m["objects"]["log"]["encryption"]["key_id"] for m in rotated} == {"k1", "k2"}
    finally:
        broker.kill()
