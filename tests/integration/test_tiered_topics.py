"""Tiered storage with real clients, once on the LocalFs tier and once on S3 (moto's server)."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from tests.integration.broker_process import BrokerProcess
from tests.integration.moto_server import MotoServer

TOTAL_MIB = 50
VALUE = 1024
MESSAGES = TOTAL_MIB * 1024 * 1024 // VALUE
TOPIC = "tiered"
FAST = {"remote.log.manager.task.interval.ms": "300", "log.retention.check.interval.ms": "300"}


class Tier:
    def __init__(self, name: str, tmp_path: Path) -> None:
        self.name = name
        self.tmp_path = tmp_path
        self.moto: MotoServer | None = None

    def overrides(self) -> dict[str, str]:
        if self.name == "localfs":
            return FAST
        self.moto = MotoServer().start()
        self.moto.create_bucket("tiered-bucket")
        return {**FAST, **self.moto.rsm_overrides("tiered-bucket")}

    def segment_objects(self) -> list[str]:
        """Keys (or paths) of remote segment data objects of the topic."""
        if self.moto is None:
            return sorted(
                str(p) for p in (self.tmp_path / "remote").rglob("*.log") if f"/{TOPIC}-" in str(p)
            )
        listed = self.moto.client().list_objects_v2(Bucket="tiered-bucket")  # type: ignore[attr-defined]
        return sorted(
            o["Key"]
            for o in listed.get("Contents", [])
            if o["Key"].endswith(".log") and f"/{TOPIC}-" in o["Key"]
        )

    def stop(self) -> None:
        if self.moto is not None:
            self.moto.stop()


@pytest.fixture(params=["localfs", "s3"])
def tier(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Tier]:
    t = Tier(request.param, tmp_path)
    yield t
    t.stop()


def status(broker: BrokerProcess) -> dict[str, Any]:
    url = f"http://127.0.0.1:{broker.overrides['metrics.port']}/tier/status"
    with urllib.request.urlopen(url, timeout=5) as response:
        rows = [r for r in json.load(response) if r["topic"] == TOPIC]
    return rows[0] if rows else {}


def wait_for(condition: Any, what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def settled(broker: BrokerProcess) -> bool:
    s = status(broker)
    return bool(s) and s["copy_lag_segments"] == 0 and s["local_bytes"] <= 4 * 1024 * 1024


def log_start_settled(broker: BrokerProcess) -> bool:
    """True if the log start offset stays put over several expiration runs."""
    before = status(broker)["log_start_offset"]
    time.sleep(1.5)
    return bool(status(broker)["log_start_offset"] == before)


def read_all_confluent(bootstrap: str, count: int) -> list[tuple[int, bytes]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "tiered",
            "enable.auto.commit": False,
            "fetch.max.bytes": 8 * 1024 * 1024,
        }
    )
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    got: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 120
    try:
        while len(got) < count and time.monotonic() < deadline:
            for m in consumer.consume(5000, 0.5):
                assert m.error() is None, m.error()
                got.append((m.offset(), m.key()))
    finally:
        consumer.close()
    return got


def expected_keys(count: int) -> list[tuple[int, bytes]]:
    return [(i, b"%d" % i) for i in range(count)]


def test_tiered_topic_end_to_end(tier: Tier) -> None:
    broker = BrokerProcess(tier.tmp_path, tier.overrides()).start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics(
            [
                NewTopic(
                    TOPIC,
                    1,
                    1,
                    config={
                        "remote.storage.enable": "true",
                        "segment.bytes": str(1 << 20),
                        "local.retention.bytes": str(2 << 20),
                    },
                )
            ]
        )[TOPIC].result(15)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "acks": 1})
        value = b"v" * VALUE
        for i in range(MESSAGES):
            while True:
                try:
                    producer.produce(TOPIC, value, b"%d" % i, partition=0)
                    break
                except BufferError:
                    producer.poll(0.05)
        assert producer.flush(120) == 0
        wait_for(lambda: settled(broker), "copy lag 0 and the local log holding only the tail")
        s = status(broker)
        assert s["log_start_offset"] == 0 and s["local_log_start_offset"] > 0
        assert s["remote_log_end_offset"] >= s["local_log_start_offset"] - 1
        objects = tier.segment_objects()
        assert len(objects) == s["remote_segments"] > 0

        assert read_all_confluent(broker.bootstrap, MESSAGES) == expected_keys(MESSAGES)
        assert_kcat_reads_everything(broker.bootstrap)
        assert_aiokafka_reads_everything(broker.bootstrap)

        broker.stop(signal.SIGKILL)
        broker = broker.restarted()
        wait_for(lambda: settled(broker), "the restarted broker to settle")
        assert tier.segment_objects() == objects, "segments were uploaded again after the restart"
        assert status(broker)["log_start_offset"] == 0
        assert read_all_confluent(broker.bootstrap, MESSAGES) == expected_keys(MESSAGES)

        # Lower retention.bytes: the oldest remote segments go and the earliest offset moves.
        resource = ConfigResource(
            "topic",
            TOPIC,
            incremental_configs=[
                ConfigEntry(
                    "retention.bytes", str(20 << 20), incremental_operation=AlterConfigOpType.SET
                )
            ],
        )
        admin.incremental_alter_configs([resource])[resource].result(15)
        wait_for(
            lambda: status(broker)["log_start_offset"] > 0, "remote retention to move the log start"
        )
        wait_for(lambda: log_start_settled(broker), "remote retention to finish")
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "low"})
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), 10)
        finally:
            consumer.close()
        assert low == status(broker)["log_start_offset"] > 0 and high == MESSAGES
        wait_for(lambda: len(tier.segment_objects()) < len(objects), "remote objects to be deleted")

        admin.delete_topics([TOPIC])[TOPIC].result(15)
        wait_for(lambda: not tier.segment_objects(), "the deleted topic's remote objects to go")
    finally:
        broker.kill()


def assert_kcat_reads_everything(bootstrap: str) -> None:
    if shutil.which("kcat") is None:
        pytest.fail("kcat is not installed: run `make test` (apt-get install -y kcat)")
    done = subprocess.run(
        [
            "kcat",
            "-b",
            bootstrap,
            "-C",
            "-t",
            TOPIC,
            "-p",
            "0",
            "-o",
            "beginning",
            "-e",
            "-f",
            "%o:%k\n",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split()
    assert lines == [f"{i}:{i}" for i in range(MESSAGES)]


def assert_aiokafka_reads_everything(bootstrap: str) -> None:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition as AioTopicPartition

    async def run() -> list[tuple[int, bytes | None]]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False
        )
        await consumer.start()
        got: list[tuple[int, bytes | None]] = []
        try:
            tp = AioTopicPartition(TOPIC, 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            deadline = time.monotonic() + 120
            while len(got) < MESSAGES and time.monotonic() < deadline:
                for records in (await consumer.getmany(tp, timeout_ms=1000)).values():
                    got += [(r.offset, r.key) for r in records]
        finally:
            await consumer.stop()
        return got

    assert asyncio.run(run()) == expected_keys(MESSAGES)
