"""confluent-kafka (librdkafka) against the broker: 100,000 records per compression codec
come back identical (key, value, headers, timestamp), per partition in order, at dense
offsets; watermarks and offsets by timestamp are those Apache Kafka would report."""

from __future__ import annotations

import random
import time
from typing import Any

import pytest
from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    Consumer,
    KafkaError,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from tests.integration.broker_process import BrokerProcess

MESSAGES = 100_000
VALUE_SIZE = 100

Headers = list[tuple[str, bytes | None]]
# (key, value, headers, timestamp) as produced; index in the partition's list = offset.
Record = tuple[bytes | None, bytes, Headers, int]


def make_records(partitions: int, base_ts: int) -> dict[int, list[Record]]:
    """MESSAGES small records spread round-robin over the partitions.

    Values are half text (compressible) and half random bytes; every 1000th key is null;
    each record has two headers, the second one null on every third record; timestamps
    grow with the index but jitter by up to +-50 ms, so they are not monotonic within
    a partition (offsets by timestamp must still find the *first* record at or after).
    """
    rng = random.Random(20240601)
    by_partition: dict[int, list[Record]] = {p: [] for p in range(partitions)}
    for i in range(MESSAGES):
        prefix = b"%06d|" % i
        if i % 2:
            value = prefix + rng.randbytes(VALUE_SIZE - len(prefix))
        else:
            value = (prefix + b"value-%d-" % i * 10)[:VALUE_SIZE]
        key = None if i % 1000 == 999 else b"key-%06d" % i
        headers: Headers = [("seq", b"%d" % i), ("maybe", None if i % 3 == 0 else b"present")]
        timestamp = base_ts + i + rng.randint(-50, 50)
        by_partition[i % partitions].append((key, value, headers, timestamp))
    return by_partition


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(15)


def produce(
    bootstrap: str, topic: str, by_partition: dict[int, list[Record]], **conf: Any
) -> dict[int, list[int]]:
    """Produce every record, interleaving partitions as a real producer would; returns
    the offsets of the delivery reports per partition, in the order they were produced."""
    errors: list[KafkaError] = []
    reported: dict[int, list[tuple[int, int]]] = {p: [] for p in by_partition}

    def on_delivery(err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            # Every value starts with its sequence number: the order of production.
            reported[msg.partition()].append((int(msg.value()[:6]), msg.offset()))

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **conf})
    partitions = len(by_partition)
    for i in range(MESSAGES):
        p = i % partitions
        key, value, headers, timestamp = by_partition[p][i // partitions]
        while True:
            try:
                producer.produce(
                    topic,
                    value,
                    key,
                    partition=p,
                    headers=headers,
                    timestamp=timestamp,
                    on_delivery=on_delivery,
                )
                break
            except BufferError:
                producer.poll(0.05)
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0, "messages still in flight after 60 s"
    assert errors == [], errors[:5]
    return {p: [offset for _, offset in sorted(r)] for p, r in reported.items()}


def consume(bootstrap: str, topic: str, expected: dict[int, int]) -> dict[int, list[Any]]:
    """Every record of every partition from offset 0: (offset, key, value, headers, ts)."""
    # confluent-kafka refuses a Consumer without group.id; the group is never joined
    # (assign, not subscribe) and nothing is committed.
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "confluent-kafka-round-trip",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "error",
        }
    )
    got: dict[int, list[Any]] = {p: [] for p in expected}
    total, wanted = 0, sum(expected.values())
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in expected])
        deadline = time.monotonic() + 60
        while total < wanted and time.monotonic() < deadline:
            for m in consumer.consume(10_000, 0.5):
                assert m.error() is None, m.error()
                assert m.topic() == topic
                ts_type, ts = m.timestamp()
                assert ts_type == TIMESTAMP_CREATE_TIME
                got[m.partition()].append((m.offset(), m.key(), m.value(), m.headers(), ts))
                total += 1
        # Nothing beyond what was produced.
        extra = consumer.consume(1000, 0.5)
        assert [(m.partition(), m.offset(), m.error()) for m in extra] == []
    finally:
        consumer.close()
    assert total == wanted, f"consumed {total} of {wanted} records in 60 s"
    return got


def first_mismatch(got: list[Any], expected: list[Any]) -> str:
    for i, (g, e) in enumerate(zip(got, expected, strict=False)):
        if g != e:
            return f"first difference at index {i}: got {g!r}, expected {e!r}"
    return f"lengths differ: got {len(got)}, expected {len(expected)}"


def first_at_or_after(records: list[Record], timestamp: int) -> int:
    """Kafka's answer to ListOffsets(timestamp): the first offset with ts >= timestamp."""
    return next((o for o, r in enumerate(records) if r[3] >= timestamp), -1)


@pytest.mark.parametrize(
    ("codec", "partitions", "acks"),
    [
        ("none", 1, "1"),
        ("gzip", 3, "1"),
        ("snappy", 1, "1"),
        ("lz4", 3, "1"),
        ("zstd", 3, "all"),
    ],
    ids=["none-1p-acks1", "gzip-3p-acks1", "snappy-1p-acks1", "lz4-3p-acks1", "zstd-3p-acksall"],
)
def test_round_trip_per_codec(
    broker: BrokerProcess, codec: str, partitions: int, acks: str
) -> None:
    topic = f"cfk-{codec}"
    create_topic(broker.bootstrap, topic, partitions)
    base_ts = int(time.time() * 1000) - 3_600_000
    records = make_records(partitions, base_ts)

    reported = produce(
        broker.bootstrap, topic, records, **{"compression.type": codec, "acks": acks}
    )
    for p, offsets in reported.items():
        # Delivery reports: each record got the next offset of its partition.
        assert offsets == list(range(len(records[p]))), first_mismatch(
            offsets, list(range(len(records[p])))
        )

    consumed = consume(broker.bootstrap, topic, {p: len(r) for p, r in records.items()})
    for p, expected_records in records.items():
        expected = [(o, *r) for o, r in enumerate(expected_records)]
        assert consumed[p] == expected, f"partition {p}: " + first_mismatch(consumed[p], expected)

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "cfk-offsets"})
    try:
        for p, expected_records in records.items():
            assert consumer.get_watermark_offsets(TopicPartition(topic, p), 10) == (
                0,
                len(expected_records),
            ), f"partition {p}"

        def offsets_for(targets: dict[int, int]) -> dict[int, int]:
            found = consumer.offsets_for_times(
                [TopicPartition(topic, p, ts) for p, ts in targets.items()], 10
            )
            assert all(tp.error is None for tp in found), found
            return {tp.partition: tp.offset for tp in found}

        # A timestamp of a record in the middle, one between records, one before the first.
        middle = {p: r[len(r) // 2][3] for p, r in records.items()}
        assert offsets_for(middle) == {
            p: first_at_or_after(r, middle[p]) for p, r in records.items()
        }
        between = {p: r[len(r) // 3][3] + 1 for p, r in records.items()}
        assert offsets_for(between) == {
            p: first_at_or_after(r, between[p]) for p, r in records.items()
        }
        assert offsets_for({p: base_ts - 60_000 for p in records}) == {p: 0 for p in records}
        # After the last timestamp Kafka answers offset -1, which librdkafka reports as is
        # (OFFSET_END).
        last = max(r[3] for rs in records.values() for r in rs)
        assert offsets_for({p: last + 1 for p in records}) == {p: -1 for p in records}
    finally:
        consumer.close()

    # The same through the admin API, with OffsetSpec.max_timestamp() (ListOffsets v7+):
    # Kafka answers the first record holding the partition's largest timestamp.
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    specs = {
        "earliest": OffsetSpec.earliest(),
        "latest": OffsetSpec.latest(),
        "max_timestamp": OffsetSpec.max_timestamp(),
        "middle": OffsetSpec.for_timestamp(middle[0]),
    }
    for name, spec in specs.items():
        futures = admin.list_offsets({TopicPartition(topic, p): spec for p in records})
        for tp, future in futures.items():
            info = future.result(15)
            r = records[tp.partition]
            if name == "earliest":
                assert info.offset == 0
            elif name == "latest":
                assert info.offset == len(r)
            elif name == "max_timestamp":
                top = max(rec[3] for rec in r)
                assert (info.offset, info.timestamp) == (first_at_or_after(r, top), top), name
            else:
                expected_offset = first_at_or_after(r, middle[0])
                assert info.offset == expected_offset, (name, tp.partition)
                assert info.timestamp == r[expected_offset][3], (name, tp.partition)


def test_consumer_closing_mid_fetch_is_not_a_broker_error(broker: BrokerProcess) -> None:
    """A consumer that closes while a fetch response is still being written is routine
    (Kafka logs the disconnect at DEBUG): the broker must not log an error or a traceback,
    and goes on serving."""
    topic = "cfk-close-mid-fetch"
    partitions = 3
    create_topic(broker.bootstrap, topic, partitions)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20})
    value = b"x" * 10_000
    count = 1500  # 5 MB a partition: more than one fetch (max.partition.fetch.bytes=1 MB)
    for i in range(count):
        while True:
            try:
                producer.produce(topic, value, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(30) == 0

    for _ in range(10):
        # Default fetch sizes: after the first record arrives, the next fetches are in
        # flight, and close() drops the connection while the broker is writing them.
        consumer = Consumer(
            {
                "bootstrap.servers": broker.bootstrap,
                "group.id": "cfk-close",
                "enable.auto.commit": False,
            }
        )
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        first = consumer.poll(15)
        consumer.close()
        assert first is not None and first.error() is None
        time.sleep(0.3)  # let the broker notice the disconnect
        if "Traceback" in broker.log():
            break
    log = broker.log()
    first_error = log.find(" ERROR ")
    assert first_error < 0 and "Traceback" not in log, "broker log:\n" + log[first_error:]

    got = consume(broker.bootstrap, topic, dict.fromkeys(range(partitions), count // partitions))
    assert all(len(rows) == count // partitions for rows in got.values())
