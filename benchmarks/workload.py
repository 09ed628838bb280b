"""The workload: produce N equal values with confluent-kafka, then consume them all back.

Both brokers get exactly these client settings, so the numbers compare the brokers.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from benchmarks.phase import Phase

PRODUCER_SETTINGS: dict[str, Any] = {
    "acks": 1,
    "linger.ms": 5,
    "batch.size": 1_000_000,
    "compression.type": "none",
    # Only to learn the average Produce request size (for the ceiling); cheap at 1/s.
    "statistics.interval.ms": 1000,
}
CONSUMER_SETTINGS: dict[str, Any] = {
    "group.id": "tierbroker-bench",
    "enable.auto.commit": False,
    "fetch.max.bytes": 50 * 1024 * 1024,
    "max.partition.fetch.bytes": 16 * 1024 * 1024,
    # When its 64 MiB prefetch queue is full, librdkafka stops fetching for this long
    # (default 1000 ms): that idles whichever broker is fast enough to fill it.
    "fetch.queue.backoff.ms": 10,
}
STALL_TIMEOUT_S = 30.0

CpuClock = Callable[[], float]  # CPU seconds used so far by the broker process


def create_topic(bootstrap: str, topic: str, timeout_s: float = 15.0) -> str:
    """Create a 1-partition topic with AdminClient; wait until it has a leader.

    Returns how it was created ("create_topics", or "auto-create" when the broker
    refused CreateTopics and the producer's first metadata request has to create it).
    """
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        futures = admin.create_topics([NewTopic(topic, 1, 1)], operation_timeout=timeout_s)
        futures[topic].result(timeout_s)
    except KafkaException as e:
        print(f"    create_topics({topic}) failed ({e}); relying on auto-create")
        return "auto-create"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        partitions = admin.list_topics(topic, timeout=timeout_s).topics[topic].partitions
        if 0 in partitions and partitions[0].leader >= 0:
            return "create_topics"
        time.sleep(0.05)
    raise RuntimeError(f"topic {topic} has no leader after {timeout_s}s")


def produce(
    bootstrap: str,
    topic: str,
    value: bytes,
    count: int,
    broker_cpu: CpuClock,
    client: dict[str, Any] | None = None,
) -> Phase:
    """Produce `count` copies of `value`; timed from the first produce() to the end of flush().

    `broker_cpu()` is read around the timed part; the client's CPU is this process's.
    `client`: more settings (security.protocol, ssl.ca.location, ...).
    """
    stats: list[dict[str, Any]] = []
    errors: list[str] = []
    producer = Producer({
        "bootstrap.servers": bootstrap,
        **PRODUCER_SETTINGS,
        **(client or {}),
        "stats_cb": lambda s: stats.append(json.loads(s)),
        "error_cb": lambda e: errors.append(str(e)),
    })  # fmt: skip
    producer.list_topics(topic, timeout=10)  # connect and learn the leader before timing
    cpu, broker_cpu_before = time.process_time(), broker_cpu()
    started = time.perf_counter()
    for _ in range(count):
        while True:
            try:
                producer.produce(topic, value)
                break
            except BufferError:  # local queue full: let librdkafka send some
                producer.poll(0.001)
    deadline = time.monotonic() + STALL_TIMEOUT_S * 4
    left = producer.flush(0.5)  # in short waits: signals are only handled between them
    while left and time.monotonic() < deadline:
        left = producer.flush(0.5)
    seconds = time.perf_counter() - started
    cpu, broker_cpu_used = time.process_time() - cpu, broker_cpu() - broker_cpu_before
    if left:
        raise RuntimeError(f"{left} messages still undelivered after flush; errors: {errors[-3:]}")
    seen = len(stats)
    deadline = time.monotonic() + 2.5
    while len(stats) == seen and time.monotonic() < deadline:  # one more stats after flush
        producer.poll(0.05)
    phase = Phase(count, count * len(value), seconds, broker_cpu_used, cpu)
    phase.extra.update(produce_request_stats(stats[-1] if stats else {}))
    if errors:
        phase.extra["client_errors"] = errors[:5]
    return phase


def produce_request_stats(stats: dict[str, Any]) -> dict[str, Any]:
    """Number and average size of the Produce requests, from librdkafka statistics."""
    requests = 0
    tx_bytes = 0
    for broker in stats.get("brokers", {}).values():
        if broker.get("nodeid", -1) < 0:  # the bootstrap connection only sent metadata
            continue
        requests += broker.get("req", {}).get("Produce", 0)
        tx_bytes += broker.get("txbytes", 0)
    if requests == 0:
        return {}
    return {"produce_requests": requests, "avg_request_bytes": tx_bytes // requests}


def consume(
    bootstrap: str,
    topic: str,
    count: int,
    value_size: int,
    broker_cpu: CpuClock,
    client: dict[str, Any] | None = None,
) -> Phase:
    """Read `count` messages from partition 0, offset 0; timed from assign() to the last one.
    `client`: more settings, as `produce`'s."""
    consumer = Consumer({"bootstrap.servers": bootstrap, **CONSUMER_SETTINGS, **(client or {})})
    try:
        cpu, broker_cpu_before = time.process_time(), broker_cpu()
        started = time.perf_counter()
        consumer.assign([TopicPartition(topic, 0, 0)])
        messages = 0
        payload = 0
        last_progress = time.monotonic()
        while messages < count:
            # consume() waits for all it asks for (or the timeout): never ask for more than is left
            batch = consumer.consume(min(10_000, count - messages), 1.0)
            if batch:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > STALL_TIMEOUT_S:
                raise RuntimeError(f"consumer stalled at {messages} of {count} messages")
            for message in batch:
                error = message.error()
                if error is not None:
                    raise KafkaException(error)
                messages += 1
                payload += len(message)
        seconds = time.perf_counter() - started
        cpu, broker_cpu_used = time.process_time() - cpu, broker_cpu() - broker_cpu_before
    finally:
        consumer.close()
    if messages != count or payload != count * value_size:
        expected = f"{count} / {count * value_size}"
        raise RuntimeError(f"read {messages} messages / {payload} bytes, expected {expected}")
    return Phase(messages, payload, seconds, broker_cpu_used, cpu)
