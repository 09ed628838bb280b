"""Spark's own Kafka source (`spark-sql-kafka-0-10`) reading through tierbroker as through
Apache Kafka: the anchor the `tierbroker` Spark source is measured against.

The same records (pipeline_topic.produce: five codecs, keys, headers, null values) go to
a fresh topic on each broker; on each, Spark's Kafka source must return exactly what
confluent-kafka reads (offsets, timestamps and all), and the two brokers' rows must be
the same but for offsets and timestamps (five producers interleave differently).
The connector is the newest Maven Central serves (4.2.0) on the installed PySpark (4.3).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.apache_kafka import ApacheKafka
from tests.integration.pipeline_topic import produce, read_with_confluent
from tests.integration.spark_rows import assert_same_rows
from tests.spark_kafka import read_all, read_kafka
from tests.spark_session import spark_session
from tierbroker.testing import TierbrokerCluster

pytestmark = pytest.mark.slow
MESSAGES = 3000
PARTITIONS = 2


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    with spark_session("tierbroker-spark-kafka-source") as session:
        yield session


def ends_of(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"ends-{uuid.uuid4()}"})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(PARTITIONS)
        }
    finally:
        consumer.close()


def test_spark_kafka_source_reads_the_same_rows_through_tierbroker_as_through_apache_kafka(
    spark: Any, shared_tierbroker: TierbrokerCluster, apache_kafka: ApacheKafka
) -> None:
    topic = f"spark-kafka-{uuid.uuid4().hex[:8]}"
    frames = []
    for bootstrap in (shared_tierbroker.bootstrap_servers, apache_kafka.bootstrap_servers):
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(15)
        produce(bootstrap, topic, MESSAGES, PARTITIONS)
        ends = ends_of(bootstrap, topic)
        assert sum(ends.values()) == MESSAGES
        rows = read_with_confluent(bootstrap, topic, ends)
        frame = read_kafka(spark, bootstrap, topic, ends)
        assert_same_rows(spark, frame, rows)
        assert read_all(spark, bootstrap, topic, ends) == (
            MESSAGES,
            sum(len(r[3] or b"") for r in rows),
        )
        frames.append(frame.select("topic", "partition", "key", "value", "headers"))
    through_tierbroker, through_kafka = frames
    assert through_tierbroker.count() == through_kafka.count() == MESSAGES
    assert through_tierbroker.exceptAll(through_kafka).isEmpty()
