"""Brokers as separate processes coordinated by a real ZooKeeper, each started as a user
starts one: `tierbroker serve` with `metadata.store=zookeeper`.

Fixture: `zookeeper` (one server per test module); import it into a test module to use it.
`AcknowledgedProducer` produces numbered records while brokers die; `read_all` reads them
back with confluent-kafka. Each takes the client settings of a secured listener (`client`,
librdkafka's names: security.protocol, sasl.*, ssl.*), as `ZooKeeperCluster` does for its
admin client."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.integration.broker_process import BrokerProcess
from tests.zookeeper import ZooKeeperServer

SESSION_TIMEOUT_MS = 4000
_chroots = itertools.count()


@pytest.fixture(scope="module")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    server = ZooKeeperServer(tmp_path_factory.mktemp("zk")).start()
    yield server
    server.stop()


class AcknowledgedProducer(threading.Thread):
    """Produces `count` sequence numbers from `first` idempotently with acks=all, each value
    padded with `padding` spaces; remembers which the brokers acknowledged."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        count: int,
        padding: int = 0,
        first: int = 0,
        client: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(daemon=True)
        self.topic = topic
        self.count = count
        self.first = first
        self.padding = b" " * padding
        self.producer = Producer(
            {
                **(client or {}),
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 120_000,
            }
        )
        self.acknowledged: list[int] = []
        self.failed: list[KafkaError] = []
        self.sent = 0

    def _delivered(self, error: KafkaError | None, message: Message) -> None:
        if error is None:
            self.acknowledged.append(int(message.value()))
        else:
            self.failed.append(error)

    def run(self) -> None:
        for i in range(self.count):
            while True:
                try:
                    self.producer.produce(
                        self.topic,
                        b"%d" % (self.first + i) + self.padding,
                        on_delivery=self._delivered,
                    )
                    break
                except BufferError:
                    self.producer.poll(0.1)
            self.sent = i + 1
            self.producer.poll(0)
            if i % 100 == 0:
                time.sleep(0.15)  # about 650 a second: the produce spans every kill
        self.producer.flush(180)


def read_all(
    bootstrap: str, topic: str, count: int, client: Mapping[str, str] | None = None
) -> list[int]:
    """The sequence numbers of partition 0 from offset 0, with confluent-kafka."""
    consumer = Consumer(
        {
            **(client or {}),
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{time.monotonic_ns()}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[int] = []
    deadline = time.monotonic() + 120
    while len(values) < count and time.monotonic() < deadline:
        for message in consumer.consume(1000, 0.5):
            if message.error() is None:
                values.append(int(message.value()))
    consumer.close()
    return values


class ZooKeeperCluster:
    def __init__(
        self,
        zookeeper: ZooKeeperServer,
        directory: Path,
        brokers: int = 3,
        overrides: dict[str, str] | None = None,
        client: Mapping[str, str] | None = None,
    ) -> None:
        """`client`: the settings the cluster's own admin client connects with."""
        self.zookeeper = zookeeper
        self.client = dict(client or {})
        self.chroot = f"/cluster-{next(_chroots)}"
        self.brokers: dict[int, BrokerProcess] = {}
        for broker_id in range(brokers):
            self.brokers[broker_id] = BrokerProcess(
                directory / f"broker-{broker_id}",
                {
                    "metadata.store": "zookeeper",
                    "zookeeper.connect": zookeeper.connect + self.chroot,
                    "zookeeper.session.timeout.ms": str(SESSION_TIMEOUT_MS),
                    "broker.id": str(broker_id),
                    "broker.rack": "abc"[broker_id % 3],
                    "replica.lag.time.max.ms": "3000",
                    **(overrides or {}),
                },
            )
            (directory / f"broker-{broker_id}").mkdir(parents=True, exist_ok=True)

    def start(self) -> ZooKeeperCluster:
        for broker in self.brokers.values():
            broker.start(timeout_s=30)
        return self

    def stop(self) -> None:
        for broker in self.brokers.values():
            broker.kill()

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers.values())

    def admin(self) -> AdminClient:
        return AdminClient({**self.client, "bootstrap.servers": self.bootstrap})

    def restart(self, broker_id: int) -> None:
        self.brokers[broker_id] = self.brokers[broker_id].restarted(timeout_s=60)

    def partition_state(self, topic: str, partition: int) -> tuple[int, list[int]]:
        """(leader, ISR) as the cluster's metadata says, from a live broker."""
        admin = self.admin()
        metadata = admin.list_topics(topic, timeout=10)
        found = metadata.topics[topic].partitions[partition]
        return found.leader, list(found.isrs)

    def replicas(self, topic: str, partition: int) -> list[int]:
        """The partition's replicas in their order (the first is the preferred leader)."""
        metadata = self.admin().list_topics(topic, timeout=10)
        return list(metadata.topics[topic].partitions[partition].replicas)

    def controller(self) -> int:
        admin = self.admin()
        return int(admin.describe_cluster().result(10).controller.id)


def wait_for(
    condition: Callable[[], bool],
    what: str,
    timeout_s: float = 60,
    show: Callable[[], object] | None = None,
) -> None:
    """Poll `condition` until true; at the deadline fail, with what `show` returns then."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if condition():
                return
        except Exception:  # a broker answering while it moves: ask again
            pass
        if time.monotonic() > deadline:
            try:
                seen = show() if show is not None else None
            except Exception as e:  # the cluster could not say: say why
                seen = repr(e)
            raise AssertionError(f"timed out waiting for {what}; last seen: {seen}")
        time.sleep(0.1)
