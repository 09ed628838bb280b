"""Kafka's Java client against tierbroker, as against Apache Kafka (tests/java)."""

from __future__ import annotations

import uuid

from tests.apache_kafka import run_java


def results(output: str) -> dict[str, int]:
    return {name: int(value) for name, value in (line.split() for line in output.splitlines())}


def test_the_idempotent_producer_and_a_group_consumer_see_every_record(kafka_broker: str) -> None:
    topic = f"java-{uuid.uuid4().hex[:8]}"
    output = run_java("ProduceConsume.java", kafka_broker, topic, "3", "500", f"{topic}-group")
    assert results(output) == {
        "acked": 500,
        "assigned": 3,
        "committed": 500,
        "received": 500,
        "distinct": 500,
    }
