"""The data set the pipeline tests read: 200k records through a real broker into its remote tier.

One broker tiers a 2-partition topic to LocalFs with 1 MiB segments. Five producers,
one per codec, send keyed and unkeyed records with headers (some with null values)
and some null values. Once the copy lag is 0 and local retention has trimmed the
log, everything is read back through the broker with a plain aiokafka consumer
and checked against what was sent: that read is the reference every pipeline
reader is compared with. The topic is never changed afterwards.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition
from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    Producer,
)
from confluent_kafka import TopicPartition as ConfluentPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.broker_process import BrokerProcess
from tests.integration.tiering_helpers import all_status, metric, metrics

TOPIC = "pipeline"
PARTITIONS = 2
MESSAGES = 200_000
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
BROKER_OVERRIDES = {
    "remote.log.manager.task.interval.ms": "500",
    "log.retention.check.interval.ms": "500",
}
TOPIC_CONFIG = {
    "remote.storage.enable": "true",
    "segment.bytes": str(1 << 20),
    "local.retention.bytes": str(1 << 20),
}

Headers = tuple[tuple[str, bytes | None], ...]
Sent = tuple[bytes | None, bytes | None, Headers]  # (key, value, headers)
Row = tuple[int, int, bytes | None, bytes | None, Headers, int, int]
"""(partition, offset, key, value, headers, timestamp ms, timestamp type)"""


@dataclass(frozen=True)
class TieredTopic:
    broker: BrokerProcess
    topic: str
    storage: str  # file:// URL of the broker's remote tier
    rows: list[Row]  # every record, by partition then offset
    ends: dict[int, int]  # log end offset per partition
    remote_ends: dict[int, int]  # first offset past the remote tier, per partition

    def remote_rows(self) -> list[Row]:
        return [r for r in self.rows if r[1] < self.remote_ends[r[0]]]


def status_rows(broker: BrokerProcess, topic: str) -> dict[int, dict[str, Any]]:
    return {r["partition"]: r for r in all_status(broker) if r["topic"] == topic}


def broker_counter(broker: BrokerProcess, name: str, topic: str) -> float:
    """A per-topic counter from the broker's /metrics (0 if not yet counted)."""
    return metric(metrics(broker), f"{name}_total", topic=topic) or 0.0


def wait_tiered(broker: BrokerProcess, topic: str, partitions: int) -> dict[int, dict[str, Any]]:
    """The tier status once every rolled segment is copied and local retention has run."""
    deadline = time.monotonic() + 180
    while True:
        rows = status_rows(broker, topic)
        if len(rows) == partitions and all(
            r["copy_lag_segments"] == 0 and r["local_log_start_offset"] > 0 for r in rows.values()
        ):
            return rows
        assert time.monotonic() < deadline, f"{topic} not tiered: {rows}"
        time.sleep(0.3)


def sent_record(i: int, rng: random.Random) -> Sent:
    key = None if i % 11 == 0 else b"key-%d" % i
    value = None if i % 13 == 0 else rng.randbytes(rng.randint(20, 300))
    headers: Headers = (("i", b"%d" % i), ("codec", CODECS[i % len(CODECS)].encode()))
    if i % 17 == 0:
        headers += (("empty", None),)
    return key, value, headers


def produce(bootstrap: str, topic: str, messages: int, partitions: int) -> dict[int, Sent]:
    """`messages` records, one producer per codec; what was sent, by index (header "i")."""
    rng = random.Random(7)
    # Batches of at most 16 KiB keep every rolled segment just under segment.bytes; the
    # default 1 MB batches made segment sizes depend on how the load batched them.
    producers = [
        Producer(
            {
                "bootstrap.servers": bootstrap,
                "compression.type": c,
                "linger.ms": 5,
                "batch.size": 16 * 1024,
            }
        )
        for c in CODECS
    ]
    sent = {}
    for i in range(messages):
        key, value, headers = sent_record(i, rng)
        producer = producers[i % len(producers)]
        while True:
            try:
                producer.produce(topic, value, key, partition=i % partitions, headers=list(headers))
                break
            except BufferError:
                producer.poll(0.05)
        if i % 1000 == 0:
            producer.poll(0)
        sent[i] = (key, value, headers)
    assert all(p.flush(60) == 0 for p in producers)
    return sent


def tiered_topic_on(
    broker: BrokerProcess, topic: str, partitions: int, messages: int
) -> dict[int, dict[str, Any]]:
    """A topic of `messages` records (as `produce` sends them) in 256 KiB segments,
    tiered and trimmed locally; its tier status by partition."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    config = {
        "remote.storage.enable": "true",
        "segment.bytes": "262144",
        "local.retention.bytes": "262144",
    }
    admin.create_topics([NewTopic(topic, partitions, 1, config=config)])[topic].result(15)
    produce(broker.bootstrap, topic, messages, partitions)
    return wait_tiered(broker, topic, partitions)


def read_with_confluent(bootstrap: str, topic: str, ends: dict[int, int]) -> list[Row]:
    """Every record below `ends`, as confluent-kafka (librdkafka) reads it from the broker."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reference-{uuid.uuid4()}",
            "enable.auto.commit": False,
        }
    )
    kinds = {TIMESTAMP_CREATE_TIME: 0, TIMESTAMP_LOG_APPEND_TIME: 1}
    rows: list[Row] = []
    left = {p for p, end in ends.items() if end > 0}
    deadline = time.monotonic() + 180
    try:
        consumer.assign([ConfluentPartition(topic, p, OFFSET_BEGINNING) for p in left])
        while left:
            assert time.monotonic() < deadline, f"{topic}: still reading {left}"
            for m in consumer.consume(10_000, timeout=1.0):
                assert m.error() is None, m.error()
                partition, offset = m.partition(), m.offset()
                kind, ms = m.timestamp()
                if offset < ends[partition]:
                    headers = tuple(m.headers() or ())
                    rows.append((partition, offset, m.key(), m.value(), headers, ms, kinds[kind]))
                if offset >= ends[partition] - 1:
                    left.discard(partition)
    finally:
        consumer.close()
    return sorted(rows, key=lambda r: (r[0], r[1]))


def small_tiered_topic(broker: BrokerProcess, topic: str) -> dict[str, Any]:
    """A 1-partition topic of 6000 records in 256 KiB segments, tiered and trimmed locally
    (more than three segments, so local retention deletes); its tier status."""
    return tiered_topic_on(broker, topic, 1, 6000)[0]


async def read_through_broker(bootstrap: str, topic: str, ends: dict[int, int]) -> list[Row]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    rows: list[Row] = []
    try:
        tps = [TopicPartition(topic, p) for p in ends]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        while any([await consumer.position(tp) < ends[tp.partition] for tp in tps]):
            for tp, records in (await consumer.getmany(timeout_ms=1000)).items():
                rows += [
                    (
                        tp.partition,
                        r.offset,
                        r.key,
                        r.value,
                        tuple(r.headers),
                        r.timestamp,
                        r.timestamp_type,
                    )
                    for r in records
                ]
    finally:
        await consumer.stop()
    return sorted(rows, key=lambda r: (r[0], r[1]))


def create_tiered_topic(data_dir: Path) -> TieredTopic:
    broker = BrokerProcess(data_dir, BROKER_OVERRIDES).start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1, config=TOPIC_CONFIG)])[TOPIC].result(15)
        sent = produce(broker.bootstrap, TOPIC, MESSAGES, PARTITIONS)
        status = wait_tiered(broker, TOPIC, PARTITIONS)
        ends = {p: r["log_end_offset"] for p, r in status.items()}
        assert sum(ends.values()) == MESSAGES
        rows = asyncio.run(read_through_broker(broker.bootstrap, TOPIC, ends))
        # The reference is exactly what was produced: every index once, bytes intact.
        by_index = {int(dict(r[4])["i"]): (r[2], r[3], r[4]) for r in rows}
        assert len(rows) == len(by_index) == MESSAGES
        assert by_index == sent
        return TieredTopic(
            broker,
            TOPIC,
            (data_dir / "logs" / "remote").as_uri(),
            rows,
            ends,
            {p: r["remote_log_end_offset"] + 1 for p, r in status.items()},
        )
    except BaseException:
        broker.kill()
        raise
