"""Restarts: after SIGTERM and after SIGKILL, everything acknowledged is still there."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.broker_process import BrokerProcess

SMALL_SEGMENTS = {"log.segment.bytes": "1048576"}


def create_topic(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the result is in
    admin.create_topics([NewTopic("t", 1, 1)])["t"].result(15)


def read_partition(
    bootstrap: str, topic: str, until: int, timeout_s: float = 60
) -> list[tuple[int, bytes]]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "restart", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    got: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < until and time.monotonic() < deadline:
            for m in consumer.consume(5000, 0.5):
                assert m.error() is None, m.error()
                got.append((m.offset(), m.value()))
    finally:
        consumer.close()
    return got


def test_sigterm_shuts_down_cleanly_and_keeps_everything(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path, SMALL_SEGMENTS).start()
    try:
        create_topic(broker.bootstrap)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": 1, "linger.ms": 5})
        values = [b"value-%d-" % i * 20 for i in range(30_000)]
        for v in values:
            producer.produce("t", v, partition=0)
            producer.poll(0)
        assert producer.flush(60) == 0
        assert broker.stop(signal.SIGTERM) == 0
        assert "shut down cleanly" in broker.log()
        assert (tmp_path / "logs" / ".kafka_cleanshutdown").exists()
        broker = broker.restarted()
        got = read_partition(broker.bootstrap, "t", len(values))
        assert got == list(enumerate(values))
    finally:
        broker.kill()


def test_sigkill_loses_nothing_acknowledged(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path, SMALL_SEGMENTS).start()
    try:
        create_topic(broker.bootstrap)
        acked: list[tuple[int, bytes]] = []
        stop = threading.Event()

        def produce() -> None:
            producer = Producer(
                {
                    "bootstrap.servers": broker.bootstrap,
                    "acks": 1,
                    "linger.ms": 2,
                    "message.timeout.ms": 5000,
                    "retries": 0,
                }
            )

            def on_delivery(err: object, msg: object) -> None:
                if err is None:
                    acked.append((msg.offset(), msg.value()))  # type: ignore[attr-defined]

            i = 0
            while not stop.is_set():
                try:
                    producer.produce(
                        "t", b"record-%d-" % i * 10, partition=0, on_delivery=on_delivery
                    )
                    i += 1
                except BufferError:
                    pass
                producer.poll(0)
            producer.flush(10)

        thread = threading.Thread(target=produce)
        thread.start()
        deadline = time.monotonic() + 30
        while len(acked) < 20_000 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(acked) >= 20_000, "the producer made no progress"
        broker.stop(signal.SIGKILL)
        stop.set()
        thread.join(30)
        assert "Traceback" not in broker.log()
        broker = broker.restarted()
        got = dict(read_partition(broker.bootstrap, "t", max(o for o, _ in acked) + 1))
        assert sorted(got) == list(range(len(got))), "offsets are not dense"
        missing = [(o, v) for o, v in acked if got.get(o) != v]
        assert missing == []
    finally:
        broker.kill()


@pytest.mark.parametrize("torn", [b"\x00\x00", b"garbage" * 100])
def test_torn_tail_is_cut_on_recovery(tmp_path: Path, torn: bytes) -> None:
    broker = BrokerProcess(tmp_path, SMALL_SEGMENTS).start()
    try:
        create_topic(broker.bootstrap)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": 1})
        for i in range(1000):
            producer.produce("t", b"v%d" % i, partition=0)
        assert producer.flush(30) == 0
        broker.stop(signal.SIGKILL)
        active = max((tmp_path / "logs" / "t-0").glob("*.log"))
        with open(active, "ab") as f:
            f.write(torn)
        broker = broker.restarted()
        assert "truncated" in broker.log()
        assert [v for _, v in read_partition(broker.bootstrap, "t", 1000)] == [
            b"v%d" % i for i in range(1000)
        ]
    finally:
        broker.kill()
