"""Partition reassignment on four brokers in one process, driven by kafka-python's
KafkaAdminClient (alter_partition_reassignments, list_partition_reassignments) while
confluent-kafka produces with acks=all.

A partition moves from brokers {0,1,2} to {1,2,3}: while the new replica is held back
(its fetches wait), the move is listed in progress with broker 3 adding and broker 0
removing; once let through, it completes, leadership leaves broker 0, every
acknowledged record is readable and broker 0's log of the partition is deleted. A
cancelled move drops the added replica; a move the controller started is completed by
the next one when it stops; partitions cannot be added to a topic while one
of its partitions moves. Kafka's per-partition errors, and NOT_CONTROLLER from a broker
that is not the controller. `tierbroker partition reassign` starts, verifies and cancels
moves as kafka-python sees them.
"""

from __future__ import annotations

import datetime
import json
import logging
import subprocess
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicCollection
from confluent_kafka import TopicPartition as CkTopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from tests.integration.broker_process import executable
from tests.integration.held_fetcher import HeldFetcher, hold_fetcher
from tests.integration.waiting import wait_for
from tests.integration.wire import WireClient, request_module
from tierbroker.broker.server.embedded import EmbeddedCluster
from tierbroker.protocol.errors import ErrorCode
from tierbroker.storage.topic_partition import TopicPartition

# kafka-python 3 loads its protocol schemas with a deprecated importlib.resources call, at
# import and lazily: the library's warning, not the broker's (filterwarnings=error).
LEGACY_RESOURCES = r"(read|open)_text is deprecated"
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", LEGACY_RESOURCES, DeprecationWarning)
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KpTopicPartition

pytestmark = pytest.mark.filterwarnings(f"ignore:{LEGACY_RESOURCES}:DeprecationWarning")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    running = EmbeddedCluster(
        tmp_path_factory.mktemp("reassignment"),
        brokers=4,
        properties={"auto.leader.rebalance.enable": "false", "replica.lag.time.max.ms": "5000"},
    ).start()
    yield running
    running.stop()


@pytest.fixture
def admin(cluster: EmbeddedCluster) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers)
    yield client
    client.close()


def create(
    cluster: EmbeddedCluster,
    topic: str,
    assignment: list[list[int]],
    configs: dict[str, str] | None = None,
) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    new = NewTopic(
        topic, num_partitions=len(assignment), replica_assignment=assignment, config=configs or {}
    )
    admin.create_topics([new])[topic].result(30)
    wait_for(lambda: all(b.cache.has_leaders(topic) for b in cluster.brokers), "leaders")


def state(
    cluster: EmbeddedCluster, topic: str, via: int = 0
) -> tuple[tuple[int, ...], int, set[int]]:
    """(replicas, leader, ISR) of partition 0, as broker `via`'s metadata says."""
    tp = TopicPartition(topic, 0)
    cache = cluster.broker(via).cache
    s = cache.states[tp]
    return cache.replicas(tp), s.leader, set(s.isr)


def log_dir(cluster: EmbeddedCluster, broker: int, topic: str) -> Path:
    return cluster.broker(broker).config.log_dir_paths[0] / f"{topic}-0"


def new_replica_held(cluster: EmbeddedCluster, topic: str) -> HeldFetcher:
    """Broker 3's fetches from broker 0 held: an anchor partition led by 0 and followed by 3
    gives 3 a fetcher to 0, which the moved partition joins."""
    create(cluster, f"{topic}-anchor", [[0, 3]])
    return hold_fetcher(cluster, follower=3, leader=0)


class BackgroundProducer:
    """confluent-kafka producing with acks=all until stopped; keeps what was acknowledged."""

    def __init__(self, cluster: EmbeddedCluster, topic: str) -> None:
        self.producer = Producer(
            {
                "bootstrap.servers": cluster.bootstrap_servers,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
            }
        )
        self.topic = topic
        self.acked: list[int] = []
        self.failed: list[str] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="producer")
        self.thread.start()

    def _delivered(self, err: object, msg: object) -> None:
        if err is None:
            self.acked.append(int(msg.value()))  # type: ignore[attr-defined]
        else:
            self.failed.append(str(err))

    def _run(self) -> None:
        i = 0
        while not self.stopping.is_set():
            self.producer.produce(self.topic, b"%d" % i, partition=0, on_delivery=self._delivered)
            i += 1
            self.producer.poll(0.002)
        self.producer.flush(60)

    def stop(self) -> list[int]:
        self.stopping.set()
        self.thread.join(90)
        return self.acked


def read_all(cluster: EmbeddedCluster, topic: str, count: int) -> set[int]:
    consumer = Consumer(
        {"bootstrap.servers": cluster.bootstrap_servers, "group.id": "check", "log_level": 0}
    )
    consumer.assign([CkTopicPartition(topic, 0, OFFSET_BEGINNING)])
    values: set[int] = set()
    deadline = time.monotonic() + 60
    while len(values) < count and time.monotonic() < deadline:
        values |= {int(m.value()) for m in consumer.consume(1000, 0.5) if m.error() is None}
    consumer.close()
    return values


def test_a_partition_moves_to_other_brokers_while_producing(
    cluster: EmbeddedCluster, admin: KafkaAdminClient
) -> None:
    topic = "moving"
    create(cluster, topic, [[0, 1, 2]])
    held = new_replica_held(cluster, topic)
    producer = BackgroundProducer(cluster, topic)
    wait_for(lambda: len(producer.acked) > 200, "records acknowledged before the move")
    tp = KpTopicPartition(topic, 0)

    assert admin.alter_partition_reassignments({tp: [1, 2, 3]}) == {tp: None}
    in_progress = {tp: {"replicas": [1, 2, 3, 0], "adding_replicas": [3], "removing_replicas": [0]}}
    assert admin.list_partition_reassignments() == in_progress
    assert admin.list_partition_reassignments([tp]) == in_progress
    wait_for(lambda: state(cluster, topic)[0] == (1, 2, 3, 0), "the brokers to see the move")
    assert state(cluster, topic)[1] == 0  # the leader stays until the target is in sync
    acked_during = len(producer.acked)
    wait_for(lambda: len(producer.acked) > acked_during + 200, "records acknowledged meanwhile")

    cluster.call(held.release())
    wait_for(lambda: state(cluster, topic) == ((1, 2, 3), 1, {1, 2, 3}), "the move to complete")
    assert admin.list_partition_reassignments() == {}
    acked_after = len(producer.acked)
    wait_for(lambda: len(producer.acked) > acked_after + 200, "records acknowledged after")
    acked = producer.stop()
    assert producer.failed == []
    assert read_all(cluster, topic, len(set(acked))) >= set(acked)
    wait_for(lambda: not log_dir(cluster, 0, topic).exists(), "broker 0 to delete its log")
    for broker in (1, 2, 3):
        assert log_dir(cluster, broker, topic).exists()


def test_a_cancelled_move_drops_the_added_replica(
    cluster: EmbeddedCluster, admin: KafkaAdminClient
) -> None:
    topic = "cancelled"
    create(cluster, topic, [[0, 1, 2]])
    held = new_replica_held(cluster, topic)
    tp = KpTopicPartition(topic, 0)
    try:
        assert admin.alter_partition_reassignments({tp: [1, 2, 3]}) == {tp: None}
        wait_for(lambda: log_dir(cluster, 3, topic).exists(), "broker 3 to take a replica")
        grow = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
        with pytest.raises(KafkaException) as refused:
            grow.create_partitions([NewPartitions(topic, 2)])[topic].result(30)
        assert refused.value.args[0].code() == ErrorCode.reassignment_in_progress
        assert admin.alter_partition_reassignments({tp: None}) == {tp: None}
        assert admin.list_partition_reassignments() == {}
        # As in Kafka, the original replicas come back in the order they had during the
        # move (target first): the original order is not kept anywhere.
        wait_for(lambda: state(cluster, topic) == ((1, 2, 0), 0, {0, 1, 2}), "the cancel")
        wait_for(lambda: not log_dir(cluster, 3, topic).exists(), "broker 3 to delete its log")
    finally:
        cluster.call(held.release())
    [error] = admin.alter_partition_reassignments({tp: None}).values()
    assert error is not None and error.errno == ErrorCode.no_reassignment_in_progress


def reassign(cluster: EmbeddedCluster, *args: str, exit_status: int = 0) -> list[dict[str, Any]]:
    """`tierbroker partition reassign ARGS -o json`, as a user runs it: its rows."""
    done = subprocess.run(
        [
            executable("tierbroker", "pip install -e ."),
            "partition",
            "reassign",
            *args,
            "-b",
            cluster.bootstrap_servers,
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == exit_status, done.stderr
    rows: list[dict[str, Any]] = json.loads(done.stdout)["partitions"]
    return rows


def test_the_command_line_moves_verifies_and_cancels(
    cluster: EmbeddedCluster, admin: KafkaAdminClient
) -> None:
    """`tierbroker partition reassign`, checked by kafka-python's view of the moves."""
    topic = "cli-moved"
    create(cluster, topic, [[0, 1, 2]])
    held = new_replica_held(cluster, topic)
    tp = KpTopicPartition(topic, 0)
    move = f"{topic}:0=1,2,3"
    try:
        [started] = reassign(cluster, move)
        assert started == {
            "partition": f"{topic}:0",
            "replicas": [0, 1, 2],
            "target": [1, 2, 3],
            "result": "started",
        }
        assert admin.list_partition_reassignments([tp]) == {
            tp: {"replicas": [1, 2, 3, 0], "adding_replicas": [3], "removing_replicas": [0]}
        }
        [progress] = reassign(cluster, "--verify", move, exit_status=1)
        assert progress["result"] == "in progress: adding 3, removing 0"
        [cancelled] = reassign(cluster, "--cancel", f"{topic}:0")
        assert cancelled["result"] == "cancelled"
        assert admin.list_partition_reassignments() == {}
        [again] = reassign(cluster, "--cancel", move, exit_status=1)
        assert again["result"].startswith("NO_REASSIGNMENT_IN_PROGRESS")
        wait_for(lambda: state(cluster, topic)[0] == (1, 2, 0), "the cancel")
        [not_done] = reassign(cluster, "--verify", move, exit_status=1)
        assert not_done["result"] == "not in progress, and the replicas differ"

        reassign(cluster, move)
    finally:
        cluster.call(held.release())
    wait_for(lambda: admin.list_partition_reassignments() == {}, "the move to complete")
    [complete] = reassign(cluster, "--verify", move)
    assert complete == {
        "partition": f"{topic}:0",
        "replicas": [1, 2, 3],
        "target": [1, 2, 3],
        "result": "complete",
    }
    describing = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    [described] = describing.describe_topics(TopicCollection([topic])).values()
    assert [r.id for r in described.result(30).partitions[0].replicas] == [1, 2, 3]
    [refused] = reassign(cluster, f"{topic}:0=1,9", exit_status=1)
    assert refused["result"].startswith("INVALID_REPLICA_ASSIGNMENT")


def test_bad_targets_get_kafkas_errors(cluster: EmbeddedCluster, admin: KafkaAdminClient) -> None:
    topic = "unmoved"
    create(cluster, topic, [[0, 1, 2]])
    tp = KpTopicPartition(topic, 0)
    cases = {
        (tp, (1, 1, 2)): ErrorCode.invalid_replica_assignment,
        (tp, (1, 2, 9)): ErrorCode.invalid_replica_assignment,  # no broker 9
        (KpTopicPartition("no-such-topic", 0), (1, 2, 3)): ErrorCode.unknown_topic_or_partition,
        (KpTopicPartition(topic, 5), (1, 2, 3)): ErrorCode.unknown_topic_or_partition,
    }
    for (partition, target), code in cases.items():
        [error] = admin.alter_partition_reassignments({partition: list(target)}).values()
        assert error is not None and error.errno == code, (partition, target)
    assert state(cluster, topic)[0] == (0, 1, 2)
    assert admin.list_partition_reassignments() == {}


def test_an_empty_target_and_a_broker_that_is_not_the_controller(
    cluster: EmbeddedCluster,
) -> None:
    create(cluster, "empty-target", [[0, 1, 2]])
    controller = next(b.broker_id for b in cluster.brokers if b.controller.is_active)
    other = next(b.broker_id for b in cluster.brokers if b.broker_id != controller)
    alter, listing = request_module(45, 0), request_module(46, 0)
    timeout = datetime.timedelta(seconds=5)
    empty = alter.AlterPartitionReassignmentsRequest(
        timeout=timeout,
        topics=(
            alter.ReassignableTopic(
                name="empty-target",
                partitions=(alter.ReassignablePartition(partition_index=0, replicas=()),),
            ),
        ),
    )
    host, port = cluster.address(controller).rsplit(":", 1)
    with WireClient(int(port), host) as client:
        response = client.request(empty)
    [[result]] = [t.partitions for t in response.responses]
    assert result.error_code == ErrorCode.invalid_replica_assignment

    host, port = cluster.address(other).rsplit(":", 1)
    with WireClient(int(port), host) as client:
        assert client.request(empty).error_code == ErrorCode.not_controller
        listed = client.request(
            listing.ListPartitionReassignmentsRequest(timeout=timeout, topics=None)
        )
        assert listed.error_code == ErrorCode.not_controller


def test_a_new_controller_resumes_a_move(cluster: EmbeddedCluster) -> None:
    controller = next(b.broker_id for b in cluster.brokers if b.controller.is_active)
    x, y, z = sorted(b.broker_id for b in cluster.brokers if b.broker_id != controller)
    topic = "failover"
    create(cluster, topic, [[x, y]])
    create(cluster, f"{topic}-anchor", [[x, z]])
    held = hold_fetcher(cluster, follower=z, leader=x)
    tp = KpTopicPartition(topic, 0)
    # Closed before the controller stops: kafka-python left a socket of it unclosed.
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers)
    try:
        assert admin.alter_partition_reassignments({tp: [y, z]}) == {tp: None}
        wait_for(lambda: state(cluster, topic, via=x)[0] == (y, z, x), "the brokers to see it")
        moving = {"replicas": [y, z, x], "adding_replicas": [z], "removing_replicas": [x]}
        assert admin.list_partition_reassignments([tp]) == {tp: moving}
    finally:
        admin.close()

    cluster.stop_broker(controller)
    try:
        wait_for(
            lambda: any(cluster.broker(b).controller.is_active for b in (x, y, z)),
            "another controller",
        )
        cluster.call(held.release())
        wait_for(
            lambda: state(cluster, topic, via=x) == ((y, z), y, {y, z}),
            "the new controller to complete the move",
            show=lambda: state(cluster, topic, via=x),
        )
        wait_for(lambda: not log_dir(cluster, x, topic).exists(), "the removed replica's log")
    finally:
        cluster.start_broker(controller)


def test_a_moved_tiered_partition_keeps_its_remote_data(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The replica a move removes deletes its local log only: the remote tier is the new
    replicas' too (Kafka deletes remote data only with the topic)."""
    caplog.set_level(logging.INFO, logger="tierbroker.rlm.remote_log_manager")
    remote = tmp_path / "remote"
    with EmbeddedCluster(
        tmp_path / "brokers",
        brokers=2,
        properties={
            "remote.log.storage.system.enable": "true",
            "rsm.config.dir": str(remote),
            "remote.log.manager.task.interval.ms": "200",
        },
    ) as tiered:
        topic = "tiered"
        create(tiered, topic, [[0]], {"remote.storage.enable": "true", "segment.bytes": "65536"})
        producer = Producer(
            {"bootstrap.servers": tiered.bootstrap_servers, "acks": "all", "batch.size": 16384}
        )
        for i in range(3000):
            producer.produce(topic, b"%d" % i + b"." * 100)
        assert producer.flush(30) == 0
        log = tiered.broker(0).log_manager.logs[TopicPartition(topic, 0)]
        wait_for(lambda: log.highest_offset_in_remote_storage > 1000, "segments copied")
        copied = set(remote.rglob("*.manifest.json"))  # a manifest commits a segment

        admin = KafkaAdminClient(bootstrap_servers=tiered.bootstrap_servers)
        tp = KpTopicPartition(topic, 0)
        try:
            assert admin.alter_partition_reassignments({tp: [1]}) == {tp: None}
            wait_for(lambda: state(tiered, topic, via=1)[:2] == ((1,), 1), "the move")
            wait_for(lambda: not log_dir(tiered, 0, topic).exists(), "broker 0 to drop its log")
            # Broker 0 stopped its replica, which is when a deletion would be scheduled.
            scheduled = "scheduling deletion of its remote data"
            assert scheduled not in caplog.text
            assert copied and copied <= set(remote.rglob("*.manifest.json"))

            admin.delete_topics([topic])  # the topic's deletion does take the remote data
            wait_for(lambda: scheduled in caplog.text, "the remote data of the deleted topic")
        finally:
            admin.close()


# Reads 1 GiB back from the remote tier within remote.fetch.max.wait.ms: run with nothing beside.
@pytest.mark.slow
@pytest.mark.alone
def test_a_tiered_partition_moves_with_its_untiered_tail_only(tmp_path: Path) -> None:
    """1 GiB in the remote tier, 16 MiB kept locally: moved to a broker that had no replica,
    the partition's new replica fetches only the records its leader has not tiered yet
    (KIP-1023; it rebuilds the rest of its state from the remote tier), not the leader's
    local segments the remote tier holds too, then serves every record from offset 0."""
    value_bytes, mib = 16 * 1024, 1 << 20
    count = 1024 * mib // value_bytes
    with EmbeddedCluster(
        tmp_path / "brokers",
        brokers=2,
        properties={
            "remote.log.storage.system.enable": "true",
            "rsm.config.dir": str(tmp_path / "remote"),
            "remote.log.manager.task.interval.ms": "200",
            "log.retention.check.interval.ms": "200",
            "metrics.port": "-1",
        },
    ) as tiered:
        topic = "big"
        local_retention = 16 * mib
        create(
            tiered,
            topic,
            [[0]],
            {
                "remote.storage.enable": "true",
                "segment.bytes": str(4 * mib),
                "local.retention.bytes": str(local_retention),
            },
        )
        producer = Producer(
            {"bootstrap.servers": tiered.bootstrap_servers, "acks": "all", "linger.ms": 5}
        )
        value = bytes(range(256)) * (value_bytes // 256)
        for i in range(count):
            while True:
                try:
                    producer.produce(topic, value, key=b"%d" % i)
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
        assert producer.flush(120) == 0
        leader_log = tiered.broker(0).log_manager.logs[TopicPartition(topic, 0)]
        wait_for(
            lambda: (
                leader_log.highest_offset_in_remote_storage + 1
                == leader_log.segments[-1].base_offset
                and leader_log.size_in_bytes - leader_log.segments[0].size < local_retention
            ),
            "every rolled segment tiered, and local retention done",
            timeout_s=180,
        )
        tail = leader_log.size_in_bytes
        not_tiered = leader_log.segments[-1].size
        pending_upload = leader_log.highest_offset_in_remote_storage + 1
        produced = count * value_bytes
        assert not_tiered < tail < produced // 32

        admin = KafkaAdminClient(bootstrap_servers=tiered.bootstrap_servers)
        try:
            tp = KpTopicPartition(topic, 0)
            assert admin.alter_partition_reassignments({tp: [1]}) == {tp: None}
            wait_for(lambda: state(tiered, topic, via=1)[:2] == ((1,), 1), "the move", 120)
        finally:
            admin.close()
        fetched = tiered.broker(1).replicas.fetchers.bytes_fetched[topic]
        moved = tiered.broker(1).log_manager.logs[TopicPartition(topic, 0)]
        assert moved.size_in_bytes == not_tiered
        assert moved.local_log_start_offset == pending_upload
        # What was not tiered, and batches a fetch's byte limit cut again in the next fetch
        # (counted as Kafka's ReplicationBytesIn counts them): nothing below crossed over.
        assert not_tiered <= fetched < 2 * not_tiered

        consumer = Consumer(
            {
                "bootstrap.servers": tiered.bootstrap_servers,
                "group.id": "after-the-move",
                "enable.auto.commit": False,
            }
        )
        consumer.assign([CkTopicPartition(topic, 0, OFFSET_BEGINNING)])
        seen = 0
        deadline = time.monotonic() + 120
        while seen < count and time.monotonic() < deadline:
            for message in consumer.consume(1000, timeout=1.0):
                assert message.error() is None, message.error()
                assert message.offset() == seen and message.key() == b"%d" % seen
                seen += 1
        consumer.close()
        assert seen == count
