"""The record-level helpers of `TierbrokerCluster`, over the wire with confluent-kafka.

Each call opens its own client and closes it before returning, so a test needs no client
code and leaves no connection behind: `produce` (acks=all, in order, every record
acknowledged or an `AssertionError` naming the error), `read` (the records of one
partition from an offset up to its high watermark, decoded), `committed` (a group's
committed offsets). The producer is not idempotent: librdkafka's takes half a second to
get its producer id, longer than the rest of a test; a retry after a broker failed
mid-request may write a record twice, as any such producer's may.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

Value = bytes | str | None
ProducedRecord = Value | tuple[Value, Value]  # a value, or (key, value)


@dataclass(frozen=True, slots=True)
class Record:
    """A record as read back: where it is, and what it holds."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_ms: int


def produce(
    bootstrap: str,
    topic: str,
    records: Iterable[ProducedRecord],
    partition: int | None = None,
    headers: dict[str, bytes] | None = None,
    timeout_s: float = 30.0,
) -> list[tuple[int, int]]:
    """Produce and wait for every acknowledgement; the (partition, offset) of each record,
    in order."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 1,
            "max.in.flight.requests.per.connection": 1,  # retries keep the order
        }
    )
    results: list[tuple[int, int] | KafkaError] = []
    slots: list[int] = []

    def delivered(index: int) -> Any:
        def on_delivery(error: KafkaError | None, message: Any) -> None:
            results[index] = error if error is not None else (message.partition(), message.offset())

        return on_delivery

    for record in records:
        key, value = record if isinstance(record, tuple) else (None, record)
        slots.append(len(results))
        results.append(KafkaError(KafkaError._TIMED_OUT))
        options: dict[str, Any] = {"key": key, "value": value, "headers": headers}
        if partition is not None:
            options["partition"] = partition
        while True:
            try:
                producer.produce(topic, on_delivery=delivered(slots[-1]), **options)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.1)
    left = producer.flush(timeout_s)
    assert left == 0, f"{left} records to {topic} not acknowledged within {timeout_s:g}s"
    errors = [r for r in results if isinstance(r, KafkaError)]
    assert not errors, f"producing to {topic}: {len(errors)} records failed, first: {errors[0]}"
    return [r for r in results if not isinstance(r, KafkaError)]


def read(
    bootstrap: str,
    topic: str,
    partition: int,
    from_offset: int,
    end_offset: int,
    timeout_s: float,
    client_rack: str | None = None,
) -> list[Record]:
    """The records of the partition in [from_offset, end_offset), decoded."""
    if end_offset <= from_offset:
        return []
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": "tierbroker-testing-reader",  # never joins nor commits: assign() only
        "enable.auto.commit": False,
        "enable.partition.eof": True,
    }
    if client_rack is not None:
        config["client.rack"] = client_rack
    consumer = Consumer(config)
    start = OFFSET_BEGINNING if from_offset <= 0 else from_offset
    consumer.assign([TopicPartition(topic, partition, start)])
    records: list[Record] = []
    deadline = time.monotonic() + timeout_s
    try:
        while not records or records[-1].offset < end_offset - 1:
            remaining = deadline - time.monotonic()
            assert remaining > 0, (
                f"read {topic}-{partition} up to offset {end_offset}: got {len(records)} records "
                f"(last offset {records[-1].offset if records else None}) in {timeout_s:g}s"
            )
            message = consumer.poll(min(remaining, 0.5))
            if message is None:
                continue
            error, offset = message.error(), message.offset()
            assert offset is not None  # every fetched message and partition EOF has one
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    if offset >= end_offset:
                        break  # offsets past the last record are gone (compaction, aborts)
                    continue
                raise AssertionError(f"reading {topic}-{partition}: {error}")
            if offset >= end_offset:
                break
            headers = message.headers() or []
            records.append(
                Record(
                    topic=topic,
                    partition=partition,
                    offset=offset,
                    key=message.key(),
                    value=message.value(),
                    headers=tuple(
                        (name, value.encode() if isinstance(value, str) else value)
                        for name, value in (
                            headers.items() if isinstance(headers, dict) else headers
                        )
                    ),
                    timestamp_ms=message.timestamp()[1],
                )
            )
    finally:
        consumer.close()
    return records


def committed(bootstrap: str, group: str, timeout_s: float) -> dict[tuple[str, int], int]:
    """The group's committed offsets by (topic, partition); partitions without one left out."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    admin = AdminClient({"bootstrap.servers": bootstrap})
    future = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group]
    answer = future.result(timeout_s)
    return {
        (tp.topic, tp.partition): tp.offset
        for tp in answer.topic_partitions
        if tp.offset >= 0 and tp.error is None
    }
