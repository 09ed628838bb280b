"""SCRAM over ZooKeeper as a Kafka operator runs it: the brokers' own SCRAM user is written
into ZooKeeper before the first broker starts (`tierbroker user scram set --zookeeper`),
two `tierbroker serve` processes log in to each other with SCRAM-SHA-512 on their SASL
inter-broker listener and replicate, and `tierbroker user scram` manages a client's user
through a broker."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from typer.testing import CliRunner

from tests.integration.broker_process import BrokerProcess
from tests.integration.waiting import wait_for
from tests.integration.zk_cluster import zookeeper
from tests.zookeeper import ZooKeeperServer
from tierbroker.broker.cli.main import app

__all__ = ["zookeeper"]

SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
CHROOT = "/sasl"


def broker_properties(zookeeper: ZooKeeperServer, broker_id: int) -> dict[str, str]:
    return {
        "broker.id": str(broker_id),
        "metadata.store": "zookeeper",
        "zookeeper.connect": zookeeper.connect + CHROOT,
        "listeners": "CLIENT://127.0.0.1:0,INTERNAL://127.0.0.1:0",
        "listener.security.protocol.map": "CLIENT:SASL_PLAINTEXT,INTERNAL:SASL_PLAINTEXT",
        "inter.broker.listener.name": "INTERNAL",
        "sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
        "listener.name.internal.scram-sha-512.sasl.jaas.config": (
            f'{SCRAM_MODULE} required username="broker" password="broker-pw";'
        ),
        "offsets.topic.replication.factor": "2",
        "offsets.topic.num.partitions": "2",
        "log.dir.min.free.bytes": "0",
        "group.initial.rebalance.delay.ms": "0",
    }


def cli(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.fixture(scope="module")
def brokers(
    zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[BrokerProcess]]:
    cli(
        "user", "scram", "set", "broker", "--password", "broker-pw",
        "--zookeeper", zookeeper.connect + CHROOT,
    )  # fmt: skip
    started: list[BrokerProcess] = []
    try:
        for broker_id in (1, 2):
            directory: Path = tmp_path_factory.mktemp(f"broker{broker_id}")
            process = BrokerProcess(directory, broker_properties(zookeeper, broker_id))
            started.append(process.start())
        yield started
    finally:
        for process in started:
            process.stop()


def as_user(brokers: list[BrokerProcess], user: str, password: str) -> dict[str, str]:
    return {
        "bootstrap.servers": ",".join(b.bootstrap for b in brokers),
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": user,
        "sasl.password": password,
    }


def test_brokers_replicate_over_scram_and_the_cli_manages_users(
    brokers: list[BrokerProcess], tmp_path: Path
) -> None:
    broker = as_user(brokers, "broker", "broker-pw")
    client_properties = tmp_path / "client.properties"
    client_properties.write_text(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-512\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="broker" password="broker-pw";\n'
    )
    connection = ["--command-config", str(client_properties)]
    bootstrap = ["-b", broker["bootstrap.servers"]]
    cli(*connection, "user", "scram", "set", "app", "--password", "app-pw",
        "--iterations", "8192", *bootstrap)  # fmt: skip
    described = json.loads(cli(*connection, "user", "scram", "describe", "-o", "json", *bootstrap))
    assert {"user": "app", "mechanism": "SCRAM-SHA-512", "iterations": 8192} in described
    assert {"user": "broker", "mechanism": "SCRAM-SHA-512", "iterations": 4096} in described

    admin = AdminClient(broker)
    admin.create_topics([NewTopic("scram-zk", 2, 2)])["scram-zk"].result(30)
    app_config = as_user(brokers, "app", "app-pw")
    producer = Producer({**app_config, "acks": "all"})
    for i in range(20):
        producer.produce("scram-zk", b"%d" % i)
    assert producer.flush(60) == 0
    consumer = Consumer({**app_config, "group.id": "scram-zk", "auto.offset.reset": "earliest"})
    consumer.subscribe(["scram-zk"])
    seen: set[bytes] = set()

    def consumed() -> bool:
        for message in consumer.consume(20, 1):
            if not message.error():
                seen.add(message.value() or b"")
        return len(seen) == 20

    try:
        wait_for(consumed, "20 records read back as app", timeout_s=60)
    finally:
        consumer.close()
    metadata = admin.list_topics("scram-zk", timeout=10)
    isr = [len(p.isrs) for p in metadata.topics["scram-zk"].partitions.values()]
    assert isr == [2, 2]  # followers fetch over the SCRAM inter-broker listener
    cli(*connection, "user", "scram", "delete", "app", *bootstrap)
    described = json.loads(cli(*connection, "user", "scram", "describe", "-o", "json", *bootstrap))
    assert [d["user"] for d in described] == ["broker"]
