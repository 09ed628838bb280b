"""Consumer groups against the `tierbroker` fixture: a sync application with
confluent-kafka, an asyncio one with aiokafka (pytest-asyncio), checked with the
fixture's helpers only."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from confluent_kafka import Consumer

from tierbroker.testing import TierbrokerCluster


def consume_and_commit(bootstrap: str, topic: str, group: str, count: int) -> list[bytes]:
    """The application under test: reads `count` records in a group and commits them."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    values: list[bytes] = []
    try:
        while len(values) < count:
            message = consumer.poll(1.0)
            if message is None:
                continue
            assert message.error() is None, message.error()
            values.append(message.value())
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return values


def test_a_group_consumer_commits_what_it_read(tierbroker: TierbrokerCluster) -> None:
    tierbroker.create_topic("orders", partitions=3)
    placed = [f"order-{i}".encode() for i in range(30)]
    tierbroker.produce("orders", [(v, v) for v in placed])

    read = consume_and_commit(tierbroker.bootstrap_servers, "orders", "billing", len(placed))

    assert sorted(read) == sorted(placed)
    ends = tierbroker.end_offsets("orders")
    assert tierbroker.committed("billing") == {("orders", p): end for p, end in ends.items()}
    assert sum(ends.values()) == len(placed)


def test_a_group_resumes_from_its_commit(tierbroker: TierbrokerCluster) -> None:
    tierbroker.create_topic("events")
    tierbroker.produce("events", [b"1", b"2", b"3"])
    consume_and_commit(tierbroker.bootstrap_servers, "events", "audit", 3)
    tierbroker.produce("events", [b"4", b"5"])

    assert consume_and_commit(tierbroker.bootstrap_servers, "events", "audit", 2) == [b"4", b"5"]
    assert tierbroker.committed("audit") == {("events", 0): 5}
    assert [r.value for r in tierbroker.records("events", from_offset=3)] == [b"4", b"5"]


async def test_an_asyncio_application_in_a_group(tierbroker: TierbrokerCluster) -> None:
    """The application runs on the test's event loop while the helpers wait."""
    await tierbroker.aio.create_topic("payments", partitions=2)
    bootstrap = tierbroker.bootstrap_servers

    async def forward(count: int) -> None:
        """The application: reads `payments` in a group, writes each to `receipts`."""
        consumer = AIOKafkaConsumer(
            "payments",
            bootstrap_servers=bootstrap,
            group_id="receipts-writer",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await consumer.start()
        await producer.start()
        try:
            done = 0
            while done < count:
                batches = await consumer.getmany(timeout_ms=500)
                for records in batches.values():
                    for record in records:
                        await producer.send_and_wait("receipts", b"receipt:" + record.value)
                        done += 1
                await consumer.commit()
        finally:
            await producer.stop()
            await consumer.stop()

    await tierbroker.aio.create_topic("receipts")
    await tierbroker.aio.produce("payments", [b"p1", b"p2", b"p3", b"p4"])
    async with tierbroker.aio.assert_produces("receipts", 4, timeout_s=30) as receipts:
        app = asyncio.create_task(forward(4))
    await app

    assert sorted(receipts.values) == [b"receipt:p1", b"receipt:p2", b"receipt:p3", b"receipt:p4"]
    committed = await tierbroker.aio.committed("receipts-writer")
    assert sum(committed.values()) == 4
    assert set(committed) <= {("payments", 0), ("payments", 1)}
