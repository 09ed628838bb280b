"""Fetching from the closest replica (KIP-392) with stock clients: three brokers in one
process, in racks a, b and c, with Kafka's `RackAwareReplicaSelector`.

- A consumer whose rack is a follower's reads every record from that follower, one with
  no rack from the leader: confluent-kafka (its own statistics name the broker it fetches
  from), aiokafka and kafka-python, shown by each broker's `ConsumerBytesOut`.
- A follower whose replica fetcher is held: consumers sent to it see only committed
  records, and hand-built Fetch v11 requests at each boundary of its log get the answers
  Kafka's follower gives; ListOffsets and OffsetsForLeaderEpoch as Kafka answers them.
- A consumer in a follower's rack reads a tiered partition from offset 0 through that
  follower, whose own local retention has deleted what the remote tier holds.
"""

from __future__ import annotations

import asyncio
import json
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as ConfluentTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.held_fetcher import hold_fetcher
from tests.integration.waiting import wait_for
from tests.integration.wire import (
    WireClient,
    fetch_request,
    list_offsets,
    request_module,
    split_batches,
)
from tierbroker.broker.server.embedded import EmbeddedCluster
from tierbroker.protocol.errors import ErrorCode
from tierbroker.protocol.records import BatchView
from tierbroker.storage.topic_partition import TopicPartition

LEGACY_RESOURCES = r"(read|open)_text is deprecated"
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", LEGACY_RESOURCES, DeprecationWarning)
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KafkaPythonTopicPartition

pytestmark = pytest.mark.filterwarnings(f"ignore:{LEGACY_RESOURCES}:DeprecationWarning")

RACKS = ["a", "b", "c"]
RECORDS = 3_000
LAG_MS = 8_000  # replica.lag.time.max.ms: how long a held follower stays in the ISR


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    directory = tmp_path_factory.mktemp("follower-fetching")
    with EmbeddedCluster(
        directory / "brokers",
        brokers=3,
        racks=RACKS,
        properties={
            "replica.selector.class": "org.apache.kafka.common.replica.RackAwareReplicaSelector",
            "replica.lag.time.max.ms": str(LAG_MS),
            "zookeeper.session.timeout.ms": "3000",
            "remote.log.storage.system.enable": "true",
            "rsm.config.dir": str(directory / "remote"),
            "remote.log.manager.task.interval.ms": "200",
            "log.retention.check.interval.ms": "200",
        },
    ) as running:
        yield running


# The cluster's side ---------------------------------------------------------------------


def create_topic(cluster: EmbeddedCluster, topic: str, **configs: str) -> tuple[int, list[int]]:
    """A topic of one partition on all three brokers; (leader, followers) once all are in
    the ISR."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    admin.create_topics([NewTopic(topic, 1, 3, config=configs)])[topic].result(30)
    tp = TopicPartition(topic, 0)
    wait_for(
        lambda: (
            all(tp in b.replicas.partitions for b in cluster.brokers)
            and (s := cluster.brokers[0].cache.states.get(tp)) is not None
            and set(s.isr) == {0, 1, 2}
        ),
        f"{topic} on every broker, all in the ISR",
    )
    leader = cluster.brokers[0].cache.states[tp].leader
    return leader, [b for b in range(3) if b != leader]


def isr(cluster: EmbeddedCluster, topic: str) -> set[int]:
    return set(cluster.brokers[0].cache.states[TopicPartition(topic, 0)].isr)


def log_of(cluster: EmbeddedCluster, broker_id: int, topic: str) -> Any:
    return cluster.broker(broker_id).replicas.partitions[TopicPartition(topic, 0)].log


def consumer_bytes(cluster: EmbeddedCluster, broker_id: int, topic: str) -> dict[str, float]:
    """`ConsumerBytesOut` of the broker for the topic's partition 0, by locality."""
    registry = cluster.broker(broker_id).registry
    return {
        locality: value
        for locality in ("same-rack", "cross-rack", "unknown")
        if (
            value := registry.get_sample_value(
                "ConsumerBytesOut_total",
                {"topic": topic, "partition": "0", "locality": locality},
            )
        )
    }


def produce(cluster: EmbeddedCluster, topic: str, count: int, start: int = 0) -> None:
    producer = Producer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "acks": "all",
            "linger.ms": 5,
            "batch.size": 16384,  # batches smaller than a tiered topic's segments
            "enable.idempotence": True,  # in order, even when a batch is retried
        }
    )
    errors = []
    for i in range(start, start + count):
        producer.produce(topic, b"%d" % i + b"." * 100, on_delivery=lambda e, _m: errors.append(e))
    producer.flush(30)
    assert errors == [None] * count


def sequence(values: list[bytes]) -> list[int]:
    return [int(v.split(b".", 1)[0]) for v in values]


# Stock consumers ------------------------------------------------------------------------


def consume_confluent(
    cluster: EmbeddedCluster, topic: str, count: int, rack: str | None
) -> tuple[list[bytes], set[int]]:
    """The values read, and the brokers the client's last statistics say it fetches from."""
    fetching: list[set[int]] = []

    def on_stats(raw: str) -> None:
        brokers = json.loads(raw)["brokers"].values()
        fetching.append(
            {
                b["nodeid"]
                for b in brokers
                if any(tp["topic"] == topic for tp in b.get("toppars", {}).values())
            }
        )

    config: dict[str, Any] = {
        "bootstrap.servers": cluster.bootstrap_servers,
        "group.id": f"reader-{time.monotonic_ns()}",
        "enable.auto.commit": False,
        "statistics.interval.ms": 100,
        "stats_cb": on_stats,
    }
    if rack is not None:
        config["client.rack"] = rack
    consumer = Consumer(config)
    consumer.assign([ConfluentTopicPartition(topic, 0, OFFSET_BEGINNING)])
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        while len(values) < count and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                continue
            error = message.error()
            if error is not None and error.code() == KafkaError.REQUEST_TIMED_OUT:
                continue  # a remote read outlived remote.fetch.max.wait.ms: the client retries
            assert error is None, error
            values.append(message.value())
        seen = len(fetching)
        while len(fetching) == seen and time.monotonic() < deadline:
            consumer.poll(0.1)  # statistics taken after the last record
    finally:
        consumer.close()
    return values, fetching[-1]


def consume_aiokafka(
    cluster: EmbeddedCluster, topic: str, count: int, rack: str | None
) -> list[bytes]:
    async def run() -> list[bytes]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=cluster.bootstrap_servers,
            client_rack=rack,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        await consumer.start()
        values: list[bytes] = []
        try:
            consumer.assign([AioTopicPartition(topic, 0)])
            async with asyncio.timeout(60):
                while len(values) < count:
                    for records in (await consumer.getmany(timeout_ms=200)).values():
                        values += [r.value for r in records]
        finally:
            await consumer.stop()
        return values

    return asyncio.run(run())


def consume_kafka_python(
    cluster: EmbeddedCluster, topic: str, count: int, rack: str | None
) -> list[bytes]:
    consumer = KafkaConsumer(
        bootstrap_servers=cluster.bootstrap_servers,
        client_rack=rack or "",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    consumer.assign([KafkaPythonTopicPartition(topic, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        while len(values) < count and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                values += [r.value for r in records]
    finally:
        consumer.close()
    return values


CONSUMERS: dict[str, Callable[[EmbeddedCluster, str, int, str | None], list[bytes]]] = {
    "confluent": lambda *args: consume_confluent(*args)[0],
    "aiokafka": consume_aiokafka,
    "kafka-python": consume_kafka_python,
}


# A consumer in a follower's rack reads from the follower -----------------------------------


def test_confluent_in_a_followers_rack_fetches_from_that_follower(
    cluster: EmbeddedCluster,
) -> None:
    topic = "near-confluent"
    leader, (follower, other) = create_topic(cluster, topic)
    produce(cluster, topic, RECORDS)

    values, fetching = consume_confluent(cluster, topic, RECORDS, RACKS[follower])
    assert sequence(values) == list(range(RECORDS))
    assert fetching == {follower}  # librdkafka's own view
    stored = log_of(cluster, leader, topic).size_in_bytes
    assert consumer_bytes(cluster, leader, topic) == {}  # the redirect carried no records
    assert consumer_bytes(cluster, other, topic) == {}
    near = consumer_bytes(cluster, follower, topic)
    assert set(near) == {"same-rack"} and near["same-rack"] >= stored

    values, fetching = consume_confluent(cluster, topic, RECORDS, None)
    assert sequence(values) == list(range(RECORDS))
    assert fetching == {leader}
    assert set(consumer_bytes(cluster, leader, topic)) == {"unknown"}  # no rack: the leader
    assert consumer_bytes(cluster, follower, topic) == near


@pytest.mark.parametrize("client", ["aiokafka", "kafka-python"])
def test_python_clients_in_a_followers_rack_fetch_from_that_follower(
    cluster: EmbeddedCluster, client: str
) -> None:
    topic = f"near-{client}"
    leader, (follower, other) = create_topic(cluster, topic)
    produce(cluster, topic, RECORDS)
    consume = CONSUMERS[client]

    assert sequence(consume(cluster, topic, RECORDS, RACKS[follower])) == list(range(RECORDS))
    stored = log_of(cluster, leader, topic).size_in_bytes
    assert consumer_bytes(cluster, leader, topic) == {}
    assert consumer_bytes(cluster, other, topic) == {}
    near = consumer_bytes(cluster, follower, topic)
    assert set(near) == {"same-rack"} and near["same-rack"] >= stored

    assert sequence(consume(cluster, topic, RECORDS, None)) == list(range(RECORDS))
    assert consumer_bytes(cluster, leader, topic)["unknown"] >= stored
    assert consumer_bytes(cluster, follower, topic) == near


# A lagging follower ---------------------------------------------------------------------


def consumer_fetch(
    cluster: EmbeddedCluster, broker_id: int, topic: str, offset: int, max_wait_ms: int = 300
) -> tuple[Any, float]:
    """A consumer's Fetch v11 to one broker, and how long it waited (s)."""
    host, port = cluster.address(broker_id).rsplit(":", 1)
    with WireClient(int(port), host) as client:
        started = time.monotonic()
        response = client.request(
            fetch_request(11, [(topic, [(0, offset)])], max_wait_ms=max_wait_ms, rack_id="x")
        )
        waited = time.monotonic() - started
    assert response.error_code == ErrorCode.none
    [[partition]] = [t.partitions for t in response.responses]
    return partition, waited


def offsets_of(partition: Any) -> list[int]:
    batches, _ = split_batches(partition.records)
    return [
        o for b in batches for o in range(BatchView(b).base_offset, BatchView(b).last_offset + 1)
    ]


def list_offset(
    cluster: EmbeddedCluster, broker_id: int, topic: str, replica_id: int, timestamp: int
) -> tuple[int, int]:
    """(error, offset) of ListOffsets v7 for partition 0."""
    host, port = cluster.address(broker_id).rsplit(":", 1)
    with WireClient(int(port), host) as client:
        return list_offsets(client, topic, timestamp, version=7, replica_id=replica_id)[:2]


def offset_for_leader_epoch(cluster: EmbeddedCluster, broker_id: int, topic: str) -> int:
    """The error of a consumer's OffsetsForLeaderEpoch v3 for partition 0, epoch 0."""
    m = request_module(23, 3)
    host, port = cluster.address(broker_id).rsplit(":", 1)
    with WireClient(int(port), host) as client:
        response = client.request(
            m.OffsetForLeaderEpochRequest(
                replica_id=-1,
                topics=(
                    m.OffsetForLeaderTopic(
                        topic=topic,
                        partitions=(
                            m.OffsetForLeaderPartition(
                                partition=0, current_leader_epoch=-1, leader_epoch=0
                            ),
                        ),
                    ),
                ),
            )
        )
    [[answer]] = [t.partitions for t in response.topics]
    return int(answer.error_code)


def test_a_lagging_follower_serves_only_committed_records_with_kafkas_answers_at_each_boundary(
    cluster: EmbeddedCluster,
) -> None:
    topic = "lagging"
    leader, (ahead, behind) = create_topic(cluster, topic)
    produce(cluster, topic, 500)
    committed = 500
    wait_for(lambda: log_of(cluster, behind, topic).high_watermark == committed, "replication")
    held = hold_fetcher(cluster, behind, leader)
    try:
        # Five batches acknowledged by the leader alone: the held follower keeps the
        # high watermark at 500 until it leaves the ISR; the other follower has them all.
        produce_acks_1(cluster, topic, batches=5, start=committed)
        end = committed + 500
        wait_for(lambda: log_of(cluster, ahead, topic).log_end_offset == end, "the other follower")
        assert isr(cluster, topic) == {0, 1, 2}  # (within replica.lag.time.max.ms)
        ahead_log = log_of(cluster, ahead, topic)
        assert ahead_log.high_watermark == committed

        # Ahead of its high watermark: a consumer sees nothing past it, and waits.
        records, waited = consumer_fetch(cluster, ahead, topic, 0)
        assert records.error_code == ErrorCode.none and records.high_watermark == committed
        assert max(offsets_of(records)) == committed - 1
        for offset in (committed, end - 1, end):
            answer, waited = consumer_fetch(cluster, ahead, topic, offset)
            assert (answer.error_code, offsets_of(answer)) == (ErrorCode.none, [])
            assert waited >= 0.25  # parked for max_wait_ms, not answered at once

        # The held follower leaves the ISR; the high watermark moves, and the follower
        # ahead learns it at once (its parked fetch is completed by the leader).
        wait_for(lambda: isr(cluster, topic) == {leader, ahead}, "the ISR to shrink")
        wait_for(lambda: ahead_log.high_watermark == end, "the follower's high watermark")

        # The held follower fetches once: one batch, and the leader's high watermark.
        cluster.call(held.step())
        behind_log = log_of(cluster, behind, topic)
        log_end = behind_log.log_end_offset
        assert committed < log_end < end
        assert behind_log.high_watermark == log_end
        answer, _ = consumer_fetch(cluster, behind, topic, 0)
        assert answer.error_code == ErrorCode.none and offsets_of(answer)[0] == 0
        answer, waited = consumer_fetch(cluster, behind, topic, log_end)  # at its log end
        assert (answer.error_code, offsets_of(answer)) == (ErrorCode.none, [])
        for offset in (log_end + 1, end):  # known committed, not yet here
            answer, waited = consumer_fetch(cluster, behind, topic, offset)
            assert answer.error_code == ErrorCode.offset_not_available
            assert waited >= 0.25
        answer, _ = consumer_fetch(cluster, behind, topic, end + 1)  # beyond what it knows
        assert answer.error_code == ErrorCode.offset_out_of_range
        # As Kafka (ReplicaManager.createLogReadResult): a failed read reports no offsets.
        assert (answer.log_start_offset, answer.high_watermark) == (-1, -1)

        # Only the debugging consumer's ListOffsets is answered by a follower (its local
        # log start and high watermark); a consumer's OffsetsForLeaderEpoch is the leader's.
        assert list_offset(cluster, behind, topic, -2, -2) == (ErrorCode.none, 0)
        assert list_offset(cluster, behind, topic, -2, -1) == (ErrorCode.none, log_end)
        assert list_offset(cluster, behind, topic, -1, -1)[0] == ErrorCode.not_leader_or_follower
        assert offset_for_leader_epoch(cluster, behind, topic) == ErrorCode.not_leader_or_follower
        assert offset_for_leader_epoch(cluster, leader, topic) == ErrorCode.none
    finally:
        cluster.call(held.release())
    wait_for(lambda: isr(cluster, topic) == {0, 1, 2}, "the follower to rejoin the ISR")


def produce_acks_1(cluster: EmbeddedCluster, topic: str, batches: int, start: int) -> None:
    """`batches` batches of 100 records, acknowledged by the leader alone."""
    producer = Producer(
        {"bootstrap.servers": cluster.bootstrap_servers, "acks": 1, "linger.ms": 50}
    )
    for batch in range(batches):
        for i in range(start + 100 * batch, start + 100 * (batch + 1)):
            producer.produce(topic, b"%d" % i + b"." * 100)
        assert producer.flush(30) == 0


# Tiered partitions ----------------------------------------------------------------------


def test_a_consumer_in_a_followers_rack_reads_a_tiered_partition_through_that_follower(
    cluster: EmbeddedCluster,
) -> None:
    topic = "near-tiered"
    leader, (follower, _) = create_topic(
        cluster,
        topic,
        **{
            "remote.storage.enable": "true",
            "segment.bytes": "65536",
            "local.retention.ms": "100",
        },
    )
    produce(cluster, topic, RECORDS)
    follower_log = log_of(cluster, follower, topic)
    # The follower deletes locally what the leader tiered (its follower task).
    wait_for(
        lambda: follower_log.local_log_start_offset > RECORDS // 2,
        "the follower to delete its tiered segments",
    )
    assert follower_log.log_start_offset == 0
    values, fetching = consume_confluent(cluster, topic, RECORDS, RACKS[follower])
    assert sequence(values) == list(range(RECORDS))
    assert fetching == {follower}
    assert consumer_bytes(cluster, leader, topic) == {}
    remote = cluster.broker(follower).registry.get_sample_value(
        "RemoteFetchBytesPerSec_total", {"topic": topic}
    )
    assert remote is not None and remote > 0

    def remote_size(broker_id: int) -> float | None:
        labels = {"topic": topic, "partition": "0"}
        return cluster.broker(broker_id).registry.get_sample_value("RemoteLogSizeBytes", labels)

    # Every replica reports the size of the remote tier (KIP-852), followers included.
    wait_for(
        lambda: (
            (size := remote_size(leader)) is not None
            and size > 0
            and all(remote_size(b) == size for b in range(3))
        ),
        "every replica's RemoteLogSizeBytes",
    )
