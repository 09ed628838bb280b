"""The `tierbroker` source as a stream, and reads through the closest replica.

- A streaming query started mid-topic (LocalFs, and S3 on moto's server) reads
  tiered history from the object store and the live tail through the broker,
  at most `maxOffsetsPerTrigger` offsets a micro-batch, into Spark's file sink; it
  is stopped, more records are produced, and restarted from its checkpoint with
  Trigger.AvailableNow: the sink then holds every record of the range exactly
  once, equal to what confluent-kafka reads.
- Three brokers in racks a, b and c (Kafka's RackAwareReplicaSelector): the Spark
  source with `kafka.client.rack`, and `TieredConsumer` with `client_rack`, read
  the untiered tail from the follower in their rack, the tiered part from the
  object store, and never a record from the leader.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as ConfluentPartition

from tests.integration.broker_process import BrokerProcess
from tests.integration.moto_server import CREDENTIALS, MotoServer
from tests.integration.pipeline_topic import (
    BROKER_OVERRIDES,
    TieredTopic,
    produce,
    read_with_confluent,
    tiered_topic_on,
)
from tests.integration.spark_rows import assert_same_rows
from tests.integration.test_follower_fetching import (
    RACKS,
    consumer_bytes,
    create_topic,
    log_of,
    wait_for,
)
from tests.integration.test_follower_fetching import produce as produce_values
from tests.spark_session import spark_session
from tierbroker.broker.server.embedded import EmbeddedCluster

pytestmark = pytest.mark.slow

STREAM_TOPIC = "stream"
MAX_OFFSETS_PER_TRIGGER = 1500


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    with spark_session("tierbroker-stream-tests") as session:
        yield session


@pytest.fixture(scope="module")
def s3_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, str]]:
    """A broker tiering to S3 (moto), and the storage URL of its remote tier."""
    server = MotoServer().start()
    try:
        server.create_bucket("stream")
        overrides = {**BROKER_OVERRIDES, **server.rsm_overrides("stream")}
        broker = BrokerProcess(tmp_path_factory.mktemp("s3-stream"), overrides).start()
        try:
            yield broker, f"s3://stream/?endpoint={server.endpoint}&path_style=true"
        finally:
            broker.stop()
    finally:
        server.stop()


def log_ends(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "ends"})
    try:
        return {
            p: consumer.get_watermark_offsets(ConfluentPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        }
    finally:
        consumer.close()


@pytest.mark.parametrize("store", ["local", "s3"])
def test_a_stream_restarted_from_its_checkpoint_writes_every_record_once(
    spark: Any, store: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if store == "local":
        tiered: TieredTopic = request.getfixturevalue("tiered_topic")
        broker, storage, secrets = tiered.broker, tiered.storage, {}
    else:
        broker, storage = request.getfixturevalue("s3_broker")
        secrets = {
            "storage.aws.access.key.id": CREDENTIALS["aws_access_key_id"],
            "storage.aws.secret.access.key": CREDENTIALS["aws_secret_access_key"],
        }
    status = tiered_topic_on(broker, STREAM_TOPIC, 2, 12_000)
    start = {0: 1000, 1: 500}  # mid-topic
    assert all(r["remote_log_end_offset"] > start[p] for p, r in status.items())
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def query(**trigger: Any) -> Any:
        frame = (
            spark.readStream.format("tierbroker")
            .options(
                storage=storage,
                subscribe=STREAM_TOPIC,
                startingOffsets=json.dumps({STREAM_TOPIC: {str(p): o for p, o in start.items()}}),
                maxOffsetsPerTrigger=str(MAX_OFFSETS_PER_TRIGGER),
                includeHeaders="true",
                **{"kafka.bootstrap.servers": broker.bootstrap},
                **secrets,
            )
            .load()
        )
        return (
            frame.writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(**trigger)
            .start()
        )

    first = query(processingTime="500 milliseconds")
    deadline = time.monotonic() + 120
    while sum(1 for p in first.recentProgress if p["numInputRows"] > 0) < 2:
        assert first.exception() is None, first.exception()
        assert time.monotonic() < deadline, first.recentProgress
        time.sleep(0.2)
    first.stop()
    written = spark.read.parquet(str(out)).count()
    assert 0 < written < 12_000 - sum(start.values())  # stopped mid-way

    produce(broker.bootstrap, STREAM_TOPIC, 3000, 2)  # a tail the remote tier lacks
    ends = log_ends(broker.bootstrap, STREAM_TOPIC, 2)
    second = query(availableNow=True)
    assert second.awaitTermination(180) and second.exception() is None
    batches = [p["numInputRows"] for q in (first, second) for p in q.recentProgress]
    assert max(batches) <= MAX_OFFSETS_PER_TRIGGER

    expected = [
        r for r in read_with_confluent(broker.bootstrap, STREAM_TOPIC, ends) if r[1] >= start[r[0]]
    ]
    assert_same_rows(spark, spark.read.parquet(str(out)), expected)  # each exactly once


# The closest replica --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def racks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EmbeddedCluster, Path]]:
    directory = tmp_path_factory.mktemp("racks")
    with EmbeddedCluster(
        directory / "brokers",
        brokers=3,
        racks=RACKS,
        properties={
            "replica.selector.class": "org.apache.kafka.common.replica.RackAwareReplicaSelector",
            "remote.log.storage.system.enable": "true",
            "rsm.config.dir": str(directory / "remote"),
            "remote.log.manager.task.interval.ms": "200",
            "log.retention.check.interval.ms": "200",
        },
    ) as running:
        yield running, directory / "remote"


async def test_the_tail_comes_from_the_follower_in_the_readers_rack(
    spark: Any, racks: tuple[EmbeddedCluster, Path]
) -> None:
    from tierbroker.pipeline import TieredConsumer

    cluster, remote = racks
    topic, records = "racked", 4000
    leader, (follower, other) = create_topic(
        cluster, topic, **{"remote.storage.enable": "true", "segment.bytes": "65536"}
    )
    produce_values(cluster, topic, records)
    leader_log = log_of(cluster, leader, topic)
    wait_for(lambda: leader_log.highest_offset_in_remote_storage > records // 2, "tiering")
    tiered_end = leader_log.highest_offset_in_remote_storage + 1
    rack = RACKS[follower]

    frame = (
        spark.read.format("tierbroker")
        .options(
            storage=remote.as_uri(),
            subscribe=topic,
            **{"kafka.bootstrap.servers": cluster.bootstrap_servers, "kafka.client.rack": rack},
        )
        .load()
    )
    values = [bytes(r[0]) for r in frame.orderBy("offset").select("value").collect()]
    assert [int(v.split(b".", 1)[0]) for v in values] == list(range(records))
    near = consumer_bytes(cluster, follower, topic)
    assert set(near) == {"same-rack"}  # the tail, from the follower in the reader's rack
    assert consumer_bytes(cluster, leader, topic) == {} == consumer_bytes(cluster, other, topic)

    consumer = TieredConsumer(
        topic,
        mode="REMOTE_PREFERRED",
        storage=remote.as_uri(),
        bootstrap_servers=cluster.bootstrap_servers,
        client_rack=rack,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        offsets: list[int] = []
        tp = AioTopicPartition(topic, 0)
        while len(offsets) < records:
            for batch in (await consumer.getmany(timeout_ms=1000)).values():
                offsets += [r.offset for r in batch]
        assert offsets == list(range(records))
        assert consumer.stats.remote_records[tp] >= tiered_end
        assert consumer.stats.broker_records[tp] > 0
    finally:
        await consumer.stop()
    after = consumer_bytes(cluster, follower, topic)
    assert set(after) == {"same-rack"} and after["same-rack"] > near["same-rack"]
    assert consumer_bytes(cluster, leader, topic) == {} == consumer_bytes(cluster, other, topic)
