"""Stock clients produce and consume through the broker: every record comes back identical."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.broker_process import BrokerProcess

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
MESSAGES = 100_000
PARTITIONS = 3


def create_topic(bootstrap: str, name: str, partitions: int = PARTITIONS, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1, config=configs)])[name].result(15)


def produce_all(
    bootstrap: str,
    topic: str,
    records: list[tuple[int, bytes, bytes, list[tuple[str, bytes | None]], int]],
    **conf: object,
) -> None:
    """Produce (partition, key, value, headers, timestamp) records; fail on any delivery error."""
    errors: list[KafkaError] = []
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **conf})
    for partition, key, value, headers, timestamp in records:
        while True:
            try:
                producer.produce(
                    topic,
                    value,
                    key,
                    partition=partition,
                    headers=headers,
                    timestamp=timestamp,
                    on_delivery=lambda err, _msg: errors.append(err) if err else None,
                )
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0
    assert errors == []


def consume_all(
    bootstrap: str, topic: str, partitions: int, expected: int, timeout_s: float = 90
) -> Iterator[object]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "round-trip", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < expected and time.monotonic() < deadline:
            for message in consumer.consume(min(10_000, expected - len(got)), 0.5):
                assert message.error() is None, message.error()
                got.append(message)
        yield from got
    finally:
        consumer.close()


@pytest.mark.parametrize("codec", CODECS)
def test_confluent_kafka_round_trip_per_codec(broker: BrokerProcess, codec: str) -> None:
    topic = f"round-trip-{codec}"
    create_topic(broker.bootstrap, topic)
    base_ts = int(time.time() * 1000) - MESSAGES
    records = [
        (
            i % PARTITIONS,
            f"key-{i}".encode(),
            f"value-{i}-".encode() * 5,
            [("h1", f"{i}".encode()), ("h2", None if i % 7 == 0 else b"x")],
            base_ts + i,
        )
        for i in range(MESSAGES)
    ]
    produce_all(
        broker.bootstrap,
        topic,
        records,
        **{"compression.type": codec, "acks": "all" if codec == "zstd" else 1},
    )
    by_partition: dict[int, list[tuple[bytes, bytes, list[tuple[str, bytes | None]], int]]] = {}
    for partition, key, value, headers, ts in records:
        by_partition.setdefault(partition, []).append((key, value, headers, ts))
    consumed: dict[int, list[object]] = {}
    for message in consume_all(broker.bootstrap, topic, PARTITIONS, MESSAGES):
        consumed.setdefault(message.partition(), []).append(message)  # type: ignore[attr-defined]
    for partition, expected in by_partition.items():
        messages = consumed[partition]
        assert [m.offset() for m in messages] == list(range(len(expected)))  # type: ignore[attr-defined]
        got = [(m.key(), m.value(), m.headers(), m.timestamp()[1]) for m in messages]  # type: ignore[attr-defined]
        assert got == expected
    # Watermarks and offsets for a timestamp in the middle of partition 0.
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "watermarks"})
    try:
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), 10) == (
            0,
            len(by_partition[0]),
        )
        middle = by_partition[0][1000][3]
        [found] = consumer.offsets_for_times([TopicPartition(topic, 0, middle)], 10)
        assert found.offset == 1000
        [beyond] = consumer.offsets_for_times(
            [TopicPartition(topic, 0, base_ts + 10 * MESSAGES)], 10
        )
        assert beyond.offset in (
            -1,
            len(by_partition[0]),
        )  # "no such offset": librdkafka reports the end
    finally:
        consumer.close()


def kcat(*args: str, stdin: str | None = None) -> str:
    if shutil.which("kcat") is None:
        pytest.fail("kcat is not installed: run `make test` (apt-get install -y kcat)")
    done = subprocess.run(["kcat", *args], input=stdin, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_kcat_round_trip_and_metadata(broker: BrokerProcess) -> None:
    lines = [f"k{i}:v{i}" for i in range(500)]
    kcat("-b", broker.bootstrap, "-P", "-t", "kcat-topic", "-K:", stdin="\n".join(lines) + "\n")
    out = kcat(
        "-b", broker.bootstrap, "-C", "-t", "kcat-topic", "-e", "-o", "beginning", "-f", "%k:%s\n"
    )
    assert out.splitlines() == lines
    metadata = json.loads(kcat("-b", broker.bootstrap, "-L", "-J"))
    assert [b["id"] for b in metadata["brokers"]] == [0]
    [topic] = [t for t in metadata["topics"] if t["topic"] == "kcat-topic"]
    assert [p["leader"] for p in topic["partitions"]] == [0]


def test_aiokafka_round_trip(broker: BrokerProcess) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.structs import TopicPartition as AioTopicPartition

    count = 5_000

    async def run() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=broker.bootstrap, enable_idempotence=False, acks=1
        )
        await producer.start()
        try:
            for i in range(count):
                value = None if i == 17 else f"v{i}".encode()
                await producer.send(
                    "aio", value, key=f"k{i}".encode(), partition=0, headers=[("h", b"%d" % i)]
                )
            await producer.flush()
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            bootstrap_servers=broker.bootstrap, group_id=None, enable_auto_commit=False
        )
        await consumer.start()
        try:
            tp = AioTopicPartition("aio", 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            got = []
            while len(got) < count:
                batch = await consumer.getmany(tp, timeout_ms=2000, max_records=700)
                assert batch, f"no progress after {len(got)} records"
                for records in batch.values():
                    assert len(records) <= 700
                    got += records
            assert [r.offset for r in got] == list(range(count))
            assert [(r.key, r.value, list(r.headers)) for r in got] == [
                (f"k{i}".encode(), None if i == 17 else f"v{i}".encode(), [("h", b"%d" % i)])
                for i in range(count)
            ]
            assert (await consumer.end_offsets([tp]))[tp] == count
            first_ts = got[0].timestamp
            found = await consumer.offsets_for_times({tp: first_ts})
            assert found[tp] is not None and found[tp].offset == 0
        finally:
            await consumer.stop()

    asyncio.run(run())


def test_kafka_python_round_trip(broker: BrokerProcess) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka import KafkaConsumer, KafkaProducer
        from kafka import TopicPartition as KpTopicPartition
        from kafka.admin import KafkaAdminClient
        from kafka.admin import NewTopic as KpNewTopic

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        admin.create_topics([KpNewTopic("kp", 1, 1)])
        assert "kp" in admin.list_topics()
        count = 5_000
        producer = KafkaProducer(
            bootstrap_servers=broker.bootstrap, enable_idempotence=False, acks=1
        )
        for i in range(count):
            producer.send("kp", f"v{i}".encode(), key=f"k{i}".encode(), partition=0)
        producer.flush(30)
        producer.close()
        consumer = KafkaConsumer(
            bootstrap_servers=broker.bootstrap,
            group_id=None,
            enable_auto_commit=False,
            consumer_timeout_ms=5000,
        )
        tp = KpTopicPartition("kp", 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        got = [(m.offset, m.key, m.value) for _, m in zip(range(count), consumer, strict=False)]
        consumer.close()
        assert got == [(i, f"k{i}".encode(), f"v{i}".encode()) for i in range(count)]
        admin.delete_topics(["kp"])
        assert "kp" not in admin.list_topics()
    finally:
        admin.close()
