"""Exactly-once consume-transform-produce across broker failures, three brokers in one
process: a confluent-kafka worker reads `in` (read_committed), writes each record
transformed to `out` and sends its offsets in the same transaction, while the broker
coordinating its transactional id and the leader of `out` are killed (no flush, no
controlled shutdown) and restarted, in turn. Afterwards `out`, read committed, holds
every input record exactly once and in order, and the group's committed offset is the
end of `in`. The worker handles errors as the client's documentation asks: retriable
ones retried, abortable ones aborted, fatal ones (fenced by a timed-out transaction's
abort) with a new producer; each failed transaction is read again from the committed
offset.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.waiting import wait_for
from tierbroker.broker.coordinator.group.records import partition_for
from tierbroker.broker.metadata.zk_data import PartitionState
from tierbroker.broker.server.embedded import EmbeddedCluster
from tierbroker.storage.topic_partition import TopicPartition as Tp

RECORDS = 400
KILLS = 5  # in turn: the coordinator's broker, the leader of `out`, the coordinator's, ...
TRANSACTIONAL_ID = "eos-worker"
# Kills brokers on a timer the machine's load stretches: run with nothing beside it.
pytestmark = [pytest.mark.slow, pytest.mark.alone]
GROUP = "eos-group"
TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(
        tmp_path_factory.mktemp("eos") / "brokers",
        brokers=3,
        properties={
            "replica.lag.time.max.ms": "3000",
            "zookeeper.session.timeout.ms": "3000",
            "metrics.port": "-1",
            "offsets.topic.num.partitions": "3",
            "transaction.state.log.num.partitions": "3",
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500",
        },
    ) as running:
        admin = AdminClient({"bootstrap.servers": running.bootstrap_servers})
        topics = [NewTopic(t, 1, 3, config={"min.insync.replicas": "2"}) for t in ("in", "out")]
        for future in admin.create_topics(topics).values():
            future.result(30)
        yield running


class Worker(threading.Thread):
    """The consume-transform-produce loop, with the error handling Kafka prescribes: an
    abortable error aborts and rewinds to the committed offsets, a fatal one (fenced)
    starts a new producer."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap = bootstrap
        self.stop = threading.Event()
        self.committed_transactions = 0
        self.step = "starting"  # what it is doing, for a failure's message
        self.consumer_errors: list[str] = []
        self.failures: list[str] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as e:  # seen by the test
            self.error = e

    def _producer(self) -> Producer:
        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "transactional.id": TRANSACTIONAL_ID,
                "transaction.timeout.ms": 10_000,
                "log_level": 0,
            }
        )
        producer.init_transactions(TIMEOUT_S)
        return producer

    def _run(self) -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": GROUP,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "log_level": 0,
            }
        )
        consumer.assign([TopicPartition("in", 0)])
        producer = self._producer()
        try:
            while not self.stop.is_set():
                self.step = "consuming"
                messages = []
                for m in consumer.consume(20, 0.5):
                    if m.error() is None:
                        messages.append(m)
                    elif len(self.consumer_errors) < 100:
                        self.consumer_errors.append(m.error().str())
                if not messages:
                    continue
                try:
                    self.step = "producing"
                    producer.begin_transaction()
                    for m in messages:
                        producer.produce("out", m.value().replace(b"in-", b"out-"))
                    end = TopicPartition("in", 0, messages[-1].offset() + 1)
                    metadata = consumer.consumer_group_metadata()
                    self.step = "sending offsets"
                    _retrying(
                        partial(producer.send_offsets_to_transaction, [end], metadata, TIMEOUT_S)
                    )
                    self.step = "committing"
                    _retrying(partial(producer.commit_transaction, TIMEOUT_S))
                    self.committed_transactions += 1
                except KafkaException as e:
                    error: KafkaError = e.args[0]
                    self.failures.append(f"{error.name()}: {error.str()}")
                    producer = self._recover(producer, error)
                    self._rewind(consumer)
        finally:
            consumer.close()

    def _recover(self, producer: Producer, error: KafkaError) -> Producer:
        """Abort an abortable transaction; after a fatal error (this instance fenced, or
        its state lost), a new producer, whose init aborts what the old one left open."""
        if not error.fatal():
            try:
                _retrying(partial(producer.abort_transaction, TIMEOUT_S))
                return producer
            except KafkaException as e:
                if not e.args[0].fatal():
                    raise
                self.failures.append(f"{e.args[0].name()}: {e.args[0].str()}")
        return self._producer()

    @staticmethod
    def _rewind(consumer: Consumer) -> None:
        """Back to the committed offset: what the aborted transaction read is read again."""
        while True:
            try:
                (committed,) = consumer.committed([TopicPartition("in", 0)], TIMEOUT_S)
                break
            except KafkaException:
                time.sleep(0.2)  # the group coordinator is moving
        consumer.seek(TopicPartition("in", 0, max(committed.offset, 0)))


def _retrying(call: Callable[[], None]) -> None:
    """Call again while the error is retriable (the coordinator is moving), as the
    client's documentation asks of commit_transaction and abort_transaction."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            call()
            return
        except KafkaException as e:
            if not e.args[0].retriable() or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _state(cluster: EmbeddedCluster, topic: str, partition: int) -> PartitionState | None:
    """The partition's state as a running broker's metadata has it (a killed one's is stale)."""
    for broker in cluster.brokers:
        if broker.running:
            return broker.cache.states.get(Tp(topic, partition))
    return None


def leader(cluster: EmbeddedCluster, topic: str, partition: int) -> int:
    state = _state(cluster, topic, partition)
    return state.leader if state is not None else -1


def isr(cluster: EmbeddedCluster, topic: str, partition: int) -> set[int]:
    state = _state(cluster, topic, partition)
    return set(state.isr) if state is not None else set()


def read_committed(bootstrap: str, expected: int) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "checker",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition("out", 0, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(values) < expected and time.monotonic() < deadline:
        values += [m.value() for m in consumer.consume(500, 0.5) if m.error() is None]
    values += [m.value() for m in consumer.consume(500, 1.0) if m.error() is None]
    consumer.close()
    return values


def test_output_is_input_exactly_once_across_coordinator_and_leader_kills(
    cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    feeder = Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all"})
    for i in range(RECORDS):
        feeder.produce("in", b"in-%04d" % i)
    assert feeder.flush(TIMEOUT_S) == 0
    worker = Worker(cluster.bootstrap_servers)
    worker.start()
    try:
        coordinator_partition = partition_for(TRANSACTIONAL_ID, 3)
        watched = [("in", 0), ("out", 0), ("__transaction_state", coordinator_partition)]
        for kill in range(KILLS):
            wait_for(
                lambda: all(len(isr(cluster, t, p)) == 3 for t, p in watched),
                "every replica back in the ISR",
                timeout_s=TIMEOUT_S,
            )
            wait_for(
                lambda n=worker.committed_transactions: worker.committed_transactions > n,
                "the worker to commit a transaction",
                timeout_s=TIMEOUT_S,
                show=lambda: (worker.committed_transactions, worker.failures[-5:], worker.error),
            )
            victim = (
                leader(cluster, "__transaction_state", coordinator_partition)
                if kill % 2 == 0
                else leader(cluster, "out", 0)
            )
            assert victim >= 0
            cluster.kill_broker(victim)
            wait_for(
                lambda v=victim: all(leader(cluster, t, p) not in (v, -1) for t, p in watched),
                "other leaders",
                timeout_s=TIMEOUT_S,
            )
            cluster.start_broker(victim)
        wait_for(
            lambda: _committed(cluster) == RECORDS,
            "every input record's offset committed",
            timeout_s=TIMEOUT_S * 2,
            show=lambda: (
                _committed(cluster),
                worker.step,
                worker.failures[-5:],
                worker.consumer_errors[-5:],
                worker.error,
            ),
        )
    finally:
        worker.stop.set()
        worker.join(TIMEOUT_S)
    assert worker.error is None, worker.error
    values = read_committed(cluster.bootstrap_servers, RECORDS)
    assert values == [b"out-%04d" % i for i in range(RECORDS)], (len(values), worker.failures)


def _committed(cluster: EmbeddedCluster) -> int:
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": GROUP})
    try:
        (committed,) = consumer.committed([TopicPartition("in", 0)], 10)
        return int(committed.offset)
    except KafkaException:
        return -1
    finally:
        consumer.close()
