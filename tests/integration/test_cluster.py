"""Three brokers in one process, in racks a, b and c: every stock client produces with
acks=all to a topic of replication factor 3 and min.insync.replicas=2 and reads it back;
every replica then holds the same batches (offset, leader epoch, CRC). With one broker
stopped the ISR shrinks and acks=all goes on; with two, produce gets NOT_ENOUGH_REPLICAS;
they come back, catch up and rejoin the ISR."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.broker_process import executable
from tests.integration.waiting import wait_for
from tests.integration.wire import WireClient, produce_batch
from tierbroker.broker.server.embedded import EmbeddedCluster
from tierbroker.protocol.errors import ErrorCode
from tierbroker.protocol.records import build_batch, iter_batches
from tierbroker.storage.topic_partition import TopicPartition

LEGACY_RESOURCES = r"(read|open)_text is deprecated"
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", LEGACY_RESOURCES, DeprecationWarning)
    from kafka import KafkaProducer

pytestmark = pytest.mark.filterwarnings(f"ignore:{LEGACY_RESOURCES}:DeprecationWarning")

TOPIC = "replicated"
PARTITIONS = 3
PER_CLIENT = 2_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    directory = tmp_path_factory.mktemp("cluster")
    with EmbeddedCluster(
        directory / "brokers",
        brokers=3,
        racks=["a", "b", "c"],
        properties={
            "replica.lag.time.max.ms": "3000",
            "zookeeper.session.timeout.ms": "3000",
            "metrics.port": "-1",
            "remote.log.storage.system.enable": "true",
            "rsm.config.dir": str(directory / "remote"),  # the object store all brokers share
            "remote.log.manager.task.interval.ms": "200",
            "log.retention.check.interval.ms": "200",
        },
    ) as running:
        admin = AdminClient({"bootstrap.servers": running.bootstrap_servers})
        topic = NewTopic(TOPIC, PARTITIONS, 3, config={"min.insync.replicas": "2"})
        admin.create_topics([topic])[TOPIC].result(30)
        yield running


def isr(cluster: EmbeddedCluster, partition: int) -> set[int]:
    state = cluster.brokers[0].cache.states.get(TopicPartition(TOPIC, partition))
    return set(state.isr) if state is not None else set()


def produce_confluent(
    bootstrap: str, values: list[bytes], retries: int = 2**31 - 1
) -> list[KafkaError | None]:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "message.timeout.ms": 15_000,
            "retries": retries,
        }
    )
    errors: list[KafkaError | None] = []
    for i, value in enumerate(values):
        producer.produce(
            TOPIC, value, partition=i % PARTITIONS, on_delivery=lambda e, _m: errors.append(e)
        )
    producer.flush(30)
    return errors


def produce_aiokafka(bootstrap: str, values: list[bytes]) -> None:
    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        try:
            for i, value in enumerate(values):
                await producer.send(TOPIC, value, partition=i % PARTITIONS)
            await producer.flush()
        finally:
            await producer.stop()

    asyncio.run(run())


def produce_kafka_python(bootstrap: str, values: list[bytes]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    for i, value in enumerate(values):
        producer.send(TOPIC, value, partition=i % PARTITIONS)
    producer.flush(30)
    producer.close()


def produce_kcat(bootstrap: str, values: list[bytes]) -> None:
    kcat = executable("kcat", "apt-get install -y kcat")
    subprocess.run(
        [kcat, "-b", bootstrap, "-P", "-t", TOPIC, "-X", "acks=all", "-p", "0"],
        input=b"\n".join(values) + b"\n",
        check=True,
        timeout=60,
    )


def consume_all(bootstrap: str, expected: int) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{time.monotonic_ns()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([TOPIC])
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(values) < expected and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            values.append(message.value())
    consumer.close()
    return values


def under_replicated(cluster: EmbeddedCluster, brokers: tuple[int, ...]) -> float:
    """UnderReplicatedPartitions summed over `brokers`, as Prometheus reads it."""
    total = 0.0
    for b in brokers:
        value = cluster.broker(b).registry.get_sample_value("UnderReplicatedPartitions")
        assert value is not None
        total += value
    return total


def replica_batches(cluster: EmbeddedCluster, broker_id: int, partition: int) -> list[tuple]:
    """(base offset, last offset, partition leader epoch, CRC) of each batch on disk."""
    log_dir = Path(cluster.broker(broker_id).config.log_dir_paths[0]) / f"{TOPIC}-{partition}"
    found = []
    for segment in sorted(log_dir.glob("*.log")):
        for batch in iter_batches(segment.read_bytes()):
            found.append(
                (batch.base_offset, batch.last_offset, batch.partition_leader_epoch, batch.crc)
            )
    return found


def assert_replicas_identical(cluster: EmbeddedCluster) -> None:
    for p in range(PARTITIONS):
        wait_for(lambda p=p: isr(cluster, p) == {0, 1, 2}, f"the ISR of partition {p}")
        leader = cluster.brokers[0].cache.states[TopicPartition(TOPIC, p)].leader
        end = cluster.broker(leader).replicas.partitions[TopicPartition(TOPIC, p)].log
        wait_for(
            lambda p=p, end=end: all(
                cluster.broker(b).replicas.partitions[TopicPartition(TOPIC, p)].log.log_end_offset
                == end.log_end_offset
                for b in (0, 1, 2)
            ),
            f"every replica of partition {p} at the leader's log end",
        )
        batches = [replica_batches(cluster, b, p) for b in (0, 1, 2)]
        assert batches[0] and batches[0] == batches[1] == batches[2]


def test_every_client_produces_with_acks_all_and_the_replicas_are_identical(
    cluster: EmbeddedCluster,
) -> None:
    bootstrap = cluster.bootstrap_servers
    sent: list[bytes] = []
    for name, produce in (
        ("confluent", produce_confluent),
        ("aiokafka", produce_aiokafka),
        ("kafka-python", produce_kafka_python),
        ("kcat", produce_kcat),
    ):
        values = [b"%s-%d" % (name.encode(), i) for i in range(PER_CLIENT)]
        outcome = produce(bootstrap, values)
        if outcome is not None:
            assert outcome == [None] * PER_CLIENT
        sent += values
    received = consume_all(bootstrap, len(sent))
    assert sorted(received) == sorted(sent)
    assert_replicas_identical(cluster)
    racks = {b.broker_id: b.config.broker_rack for b in cluster.brokers}
    assert racks == {0: "a", 1: "b", 2: "c"}


def test_the_isr_follows_brokers_that_stop_and_return(cluster: EmbeddedCluster) -> None:
    bootstrap = cluster.bootstrap_servers
    cluster.stop_broker(2)
    for p in range(PARTITIONS):
        wait_for(lambda p=p: 2 not in isr(cluster, p), f"broker 2 out of the ISR of {p}")
    live = cluster.address(0)
    assert produce_confluent(live, [b"two-left-%d" % i for i in range(300)]) == [None] * 300
    cache = cluster.broker(0).cache
    on_broker_2 = sum(2 in r for t in cache.topics.values() for r in t.partitions.values())
    assert on_broker_2 >= PARTITIONS
    # The group's offsets partitions too: their leaders learn of the stop on their own.
    wait_for(
        lambda: under_replicated(cluster, (0, 1)) == on_broker_2,
        f"UnderReplicatedPartitions {on_broker_2}",
        show=lambda: under_replicated(cluster, (0, 1)),
    )

    cluster.stop_broker(1)
    wait_for(lambda: all(isr(cluster, p) == {0} for p in range(PARTITIONS)), "an ISR of {0}")
    refused = produce_confluent(live, [b"one-left"], retries=0)
    assert len(refused) == 1 and refused[0] is not None
    assert refused[0].code() == KafkaError.NOT_ENOUGH_REPLICAS

    cluster.start_broker(1)
    cluster.start_broker(2)
    assert_replicas_identical(cluster)
    wait_for(
        lambda: under_replicated(cluster, (0, 1, 2)) == 0,
        "UnderReplicatedPartitions 0",
        show=lambda: under_replicated(cluster, (0, 1, 2)),
    )
    assert produce_confluent(bootstrap, [b"all-back-%d" % i for i in range(300)]) == [None] * 300


def test_a_zombie_leader_acknowledges_nothing_once_a_successor_leads(
    cluster: EmbeddedCluster,
) -> None:
    """Broker 0 leads alone (its follower stopped), then loses the metadata store while its
    clients still reach it; the follower returns and is elected (unclean election). The
    zombie answers acks=all with NOT_LEADER_OR_FOLLOWER: it acknowledges nothing the new
    leader lacks. Back in touch, it follows the new leader and drops its divergent tail."""
    topic = "zombie"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    config = {"unclean.leader.election.enable": "true", "min.insync.replicas": "1"}
    admin.create_topics(
        [NewTopic(topic, num_partitions=1, replica_assignment=[[0, 1]], config=config)]
    )[topic].result(30)
    tp = TopicPartition(topic, 0)
    zombie = cluster.address(0)
    cluster.stop_broker(1)
    wait_for(lambda: cluster.broker(2).cache.states[tp].isr == (0,), "an ISR of broker 0 alone")
    cluster.suspend_session(0)
    try:
        wait_for(lambda: 0 not in cluster.broker(2).cache.brokers, "broker 0's session to expire")
        cluster.start_broker(1)
        wait_for(lambda: cluster.broker(2).cache.states[tp].leader == 1, "broker 1 to lead")

        # On the wire, to the zombie alone: refused.
        with WireClient(int(zombie.rsplit(":", 1)[1])) as client:
            answer = produce_batch(client, topic, build_batch([(None, b"to the zombie", [], 0)]))
        assert answer.error_code == ErrorCode.not_leader_or_follower
        # A stock client bootstrapped at the zombie: one attempt. It may learn the new leader
        # from another broker and be acknowledged there; never by the zombie alone.
        producer = Producer(
            {"bootstrap.servers": zombie, "acks": "all", "message.timeout.ms": 3000, "retries": 0}
        )
        outcome: list[KafkaError | None] = []
        producer.produce(topic, b"via the zombie", on_delivery=lambda e, _m: outcome.append(e))
        producer.flush(30)
        assert len(outcome) == 1
    finally:
        cluster.resume_session(0)  # the module's other tests share the cluster
    wait_for(lambda: 0 in cluster.broker(2).cache.brokers, "broker 0 to register again")
    wait_for(lambda: set(cluster.broker(2).cache.states[tp].isr) == {0, 1}, "broker 0 in the ISR")
    logs = [cluster.broker(b).replicas.partitions[tp].log for b in (0, 1)]
    wait_for(lambda: logs[0].log_end_offset == logs[1].log_end_offset, "equal log ends")
    held = [(Path(log_.dir) / "00000000000000000000.log").read_bytes() for log_ in logs]
    assert all(b"to the zombie" not in h for h in held)
    if outcome[0] is None:  # acknowledged: by the new leader, so every replica has it
        assert all(b"via the zombie" in h for h in held)


def test_a_tiered_topic_keeps_tiering_across_a_failover(cluster: EmbeddedCluster) -> None:
    """The leader copies rolled segments; after it stops, the new leader copies on from
    where the remote tier ends (no segment twice) and serves every offset, remote ones
    included, to a consumer reading from the beginning."""
    topic = "tiered"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    config = {
        "remote.storage.enable": "true",
        "segment.bytes": str(64 * 1024),
        "local.retention.bytes": str(128 * 1024),
        "min.insync.replicas": "2",
    }
    admin.create_topics([NewTopic(topic, 1, 3, config=config)])[topic].result(30)
    tp = TopicPartition(topic, 0)
    values = [b"%06d" % i + b"x" * 1000 for i in range(1000)]

    def produce_all(batch: list[bytes]) -> None:
        # Idempotence keeps the order: without it, a retried batch may land after later ones.
        producer = Producer(
            {
                "bootstrap.servers": cluster.bootstrap_servers,
                "acks": "all",
                "batch.size": 16384,
                "enable.idempotence": True,
            }
        )
        for value in batch:
            producer.produce(topic, value)
        assert producer.flush(30) == 0

    def remote_end(broker_id: int) -> int:
        remote = cluster.broker(broker_id).remote
        assert remote is not None

        rows = [r for r in cluster.read(remote.status) if r["topic"] == topic]
        return int(rows[0]["remote_log_end_offset"]) if rows else -1

    produce_all(values[:500])
    first_leader = cluster.broker(0).cache.states[tp].leader
    wait_for(lambda: remote_end(first_leader) > 200, "the first leader to tier segments")
    cluster.stop_broker(first_leader)
    wait_for(
        lambda: cluster.broker((first_leader + 1) % 3).cache.states[tp].leader != first_leader,
        "a new leader",
    )
    new_leader = cluster.broker((first_leader + 1) % 3).cache.states[tp].leader
    tiered_before = remote_end(new_leader)
    produce_all(values[500:])
    wait_for(lambda: remote_end(new_leader) > max(tiered_before, 700), "the new leader to tier")
    rlmm = cluster.broker(new_leader).remote.rlmm  # type: ignore[union-attr]

    def readable() -> list[tuple[int, int]]:
        partition = next(t for t in rlmm.partitions() if t.topic_partition.topic == topic)
        return [(m.start_offset, m.end_offset) for m in rlmm.readable_segments(partition)]

    segments = cluster.read(readable)
    assert segments == sorted(segments)
    assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(segments))  # no gap, no overlap
    cluster.start_broker(first_leader)
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "group.id": "tiered-reader",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    received: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(received) < len(values) and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            received.append(message.value())
    consumer.close()
    assert received == values
