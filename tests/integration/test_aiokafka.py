"""aiokafka against the broker: records (keys, headers, a null value, explicit timestamps)
come back identical through assign() + seek_to_beginning(), getmany(max_records) keeps its
limit, small fetch limits still make progress, and end/beginning offsets and offsets by
timestamp are those Apache Kafka would report."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.structs import TopicPartition

from tests.integration.broker_process import BrokerProcess

COUNT = 5_000
PARTITIONS = 3
NULL_VALUE_AT = 17

Headers = list[tuple[str, bytes | None]]
# (offset, key, value, headers, timestamp) per partition, in offset order.
Row = tuple[int, bytes | None, bytes | None, Headers, int]


def make_records(base_ts: int) -> list[tuple[int, bytes, bytes | None, Headers, int]]:
    """(partition, key, value, headers, timestamp); timestamps jitter so they are not
    monotonic within a partition."""
    return [
        (
            i % PARTITIONS,
            b"k%d" % i,
            None if i == NULL_VALUE_AT else b"v%d-" % i * 8,
            [("seq", b"%d" % i), ("empty", None if i % 2 else b"")],
            base_ts + i * 10 + (i * 7919) % 23,
        )
        for i in range(COUNT)
    ]


def expected_rows(records: list[tuple[int, bytes, bytes | None, Headers, int]]) -> dict[int, Any]:
    rows: dict[int, list[Row]] = {p: [] for p in range(PARTITIONS)}
    for partition, key, value, headers, ts in records:
        rows[partition].append((len(rows[partition]), key, value, headers, ts))
    return rows


async def create_topic(bootstrap: str, topic: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    finally:
        await admin.close()


async def produce(bootstrap: str, topic: str, records: list[Any], codec: str | None) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        enable_idempotence=False,
        acks=1,
        compression_type=codec,
        linger_ms=5,
    )
    await producer.start()
    try:
        futures = []
        for partition, key, value, headers, ts in records:
            futures.append(
                await producer.send(
                    topic, value, key=key, partition=partition, timestamp_ms=ts, headers=headers
                )
            )
        metadata = await asyncio.gather(*futures)
    finally:
        await producer.stop()
    # Every send was acknowledged with the next offset of its partition.
    next_offset = dict.fromkeys(range(PARTITIONS), 0)
    for (partition, *_), md in zip(records, metadata, strict=True):
        assert (md.topic, md.partition, md.offset) == (topic, partition, next_offset[partition])
        next_offset[partition] += 1


def row(record: Any) -> Row:
    assert record.timestamp_type == 0  # CreateTime
    return (record.offset, record.key, record.value, list(record.headers), record.timestamp)


@pytest.mark.parametrize("codec", [None, "gzip", "snappy", "lz4", "zstd"])
async def test_round_trip(broker: BrokerProcess, codec: str | None) -> None:
    topic = f"aio-{codec or 'none'}"
    await create_topic(broker.bootstrap, topic)
    base_ts = int(time.time() * 1000) - 3_600_000
    records = make_records(base_ts)
    await produce(broker.bootstrap, topic, records, codec)
    expected = expected_rows(records)
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]

    consumer = AIOKafkaConsumer(
        bootstrap_servers=broker.bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="none",
    )
    await consumer.start()
    try:
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        got: dict[int, list[Row]] = {p: [] for p in range(PARTITIONS)}
        total = 0
        deadline = time.monotonic() + 30
        while total < COUNT:
            assert time.monotonic() < deadline, f"only {total} of {COUNT} records in 30 s"
            batch = await consumer.getmany(timeout_ms=1000, max_records=700)
            assert sum(len(rs) for rs in batch.values()) <= 700
            for tp, rs in batch.items():
                got[tp.partition] += [row(r) for r in rs]
                total += len(rs)
        assert got == expected
        assert await consumer.getmany(timeout_ms=300) == {}, "records beyond those produced"
        sizes = {tp: len(expected[tp.partition]) for tp in tps}
        assert {tp: await consumer.position(tp) for tp in tps} == sizes
        assert await consumer.end_offsets(tps) == sizes
        assert await consumer.beginning_offsets(tps) == dict.fromkeys(tps, 0)

        # The null value comes back as None.
        null_tp = TopicPartition(topic, NULL_VALUE_AT % PARTITIONS)
        consumer.seek(null_tp, NULL_VALUE_AT // PARTITIONS)
        record = await consumer.getone(null_tp)
        assert (record.key, record.value) == (b"k%d" % NULL_VALUE_AT, None)

        # Offsets by timestamp: the first offset whose timestamp is >= the one asked for.
        def first_at_or_after(partition: int, ts: int) -> int:
            return next(r[0] for r in expected[partition] if r[4] >= ts)

        middle = {tp: expected[tp.partition][len(expected[tp.partition]) // 2][4] for tp in tps}
        found = await consumer.offsets_for_times(middle)
        for tp in tps:
            offset = first_at_or_after(tp.partition, middle[tp])
            assert found[tp] is not None, tp
            assert (found[tp].offset, found[tp].timestamp) == (
                offset,
                expected[tp.partition][offset][4],
            ), tp
        between = {tp: ts + 1 for tp, ts in middle.items()}
        found = await consumer.offsets_for_times(between)
        for tp in tps:
            assert found[tp] is not None and found[tp].offset == first_at_or_after(
                tp.partition, between[tp]
            ), tp
        before = await consumer.offsets_for_times(dict.fromkeys(tps, base_ts - 1000))
        assert {tp: o.offset for tp, o in before.items() if o is not None} == dict.fromkeys(tps, 0)
        # After the last timestamp Kafka answers offset -1: aiokafka reports None.
        last = max(r[4] for rows in expected.values() for r in rows)
        assert await consumer.offsets_for_times(dict.fromkeys(tps, last + 1)) == dict.fromkeys(
            tps, None
        )
    finally:
        await consumer.stop()


async def test_small_fetch_limits_still_progress(broker: BrokerProcess) -> None:
    """With fetch limits smaller than a batch, Kafka still returns the first batch whole
    (KIP-74), so a consumer reading from the middle of the log gets everything."""
    topic = "aio-small-fetches"
    await create_topic(broker.bootstrap, topic)
    records = make_records(int(time.time() * 1000) - 3_600_000)
    await produce(broker.bootstrap, topic, records, "lz4")
    expected = expected_rows(records)[0]
    consumer = AIOKafkaConsumer(
        bootstrap_servers=broker.bootstrap,
        group_id=None,
        enable_auto_commit=False,
        max_partition_fetch_bytes=512,
        fetch_max_bytes=1024,
    )
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        start = 1234
        consumer.seek(tp, start)
        got: list[Row] = []
        deadline = time.monotonic() + 30
        while len(got) < len(expected) - start:
            assert time.monotonic() < deadline, f"only {len(got)} records in 30 s"
            batch = await consumer.getmany(tp, timeout_ms=1000, max_records=100)
            got += [row(r) for r in batch.get(tp, [])]
        assert got == expected[start:]
    finally:
        await consumer.stop()
