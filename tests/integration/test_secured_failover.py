"""A secured 3-broker cluster fails over as a plaintext one does: every listener SASL_SSL
(certificates from tests/certs.py), the brokers logging in to each other on their
inter-broker listener, an authorizer on with the brokers' principal a super user and the
client's user granted what it needs by ACLs. An idempotent acks=all producer runs while
the partition's leader is killed a few times: every acknowledged record is read back
exactly once, in order, and each killed broker restarts and rejoins the ISR.

Over ZooKeeper: `tierbroker serve` processes killed with SIGKILL, the brokers' SCRAM-SHA-512
user written into ZooKeeper before the first one starts (`tierbroker user scram set
--zookeeper`, as Kafka's operators do). In process: an `EmbeddedCluster` whose brokers log in
to each other with PLAIN, crashed with `kill_broker`.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from typer.testing import CliRunner

from tests.certs import STORE_PASSWORD, Certificates
from tests.integration.zk_cluster import (
    AcknowledgedProducer,
    ZooKeeperCluster,
    read_all,
    wait_for,
    zookeeper,  # noqa: F401 (a fixture)
)
from tests.zookeeper import ZooKeeperServer
from tierbroker.broker.cli.main import app
from tierbroker.broker.server.embedded import EmbeddedCluster
from tierbroker.storage.topic_partition import TopicPartition

TOPIC = "secured-failover"
MESSAGES = 12_000
KILLS = 3
SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"


def secured(certs: Certificates, inter_broker_mechanism: str) -> dict[str, str]:
    """Two SASL_SSL listeners, CLIENT (SCRAM-SHA-512 for applications) and INTERNAL (the
    brokers' own, `inter_broker_mechanism`); ACLs on, User:broker a super user."""
    return {
        "listeners": "CLIENT://127.0.0.1:0,INTERNAL://127.0.0.1:0",
        "listener.security.protocol.map": "CLIENT:SASL_SSL,INTERNAL:SASL_SSL",
        "inter.broker.listener.name": "INTERNAL",
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": str(certs.broker.p12),
        "ssl.keystore.password": STORE_PASSWORD,
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(certs.ca.cert),
        "listener.name.client.sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "listener.name.internal.sasl.enabled.mechanisms": inter_broker_mechanism,
        "sasl.mechanism.inter.broker.protocol": inter_broker_mechanism,
        "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
        "super.users": "User:broker",
        "replica.lag.time.max.ms": "3000",
        "offsets.topic.num.partitions": "3",
        "log.dir.min.free.bytes": "0",
        "group.initial.rebalance.delay.ms": "0",
    }


def as_user(certs: Certificates, user: str, password: str) -> dict[str, str]:
    """librdkafka's settings for `user` over SASL_SSL with SCRAM-SHA-512."""
    return {
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(certs.ca.cert),
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": user,
        "sasl.password": password,
    }


def grant_app(admin: AdminClient) -> None:
    """User:app may write and read the topic (an idempotent producer needs no more, KIP-679)
    and use any group; nothing else."""

    def allow(kind: ResourceType, name: str, pattern: ResourcePatternType, op: AclOperation) -> Any:
        return AclBinding(kind, name, pattern, "User:app", "*", op, AclPermissionType.ALLOW)

    bindings = [
        allow(ResourceType.TOPIC, TOPIC, ResourcePatternType.LITERAL, AclOperation.WRITE),
        allow(ResourceType.TOPIC, TOPIC, ResourcePatternType.LITERAL, AclOperation.READ),
        allow(ResourceType.GROUP, "*", ResourcePatternType.LITERAL, AclOperation.READ),
    ]
    for future in admin.create_acls(bindings, request_timeout=10).values():
        future.result(10)


def produce_through_kills(
    bootstrap: str,
    client: Mapping[str, str],
    leader: Callable[[], int],
    kill: Callable[[int], None],
    restart_and_rejoin: Callable[[int], None],
) -> None:
    """Produce MESSAGES idempotently with acks=all while the leader is killed KILLS times;
    after each kill acknowledgements go on, then the victim restarts and rejoins the ISR.
    Every acknowledged record is then read back once, in order."""
    producer = AcknowledgedProducer(bootstrap, TOPIC, MESSAGES, client=client)
    producer.start()
    for round_ in range(KILLS):
        wait_for(lambda r=round_: producer.sent > (r + 1) * MESSAGES // (KILLS + 2), "progress")
        victim = leader()
        acknowledged = len(producer.acknowledged)
        kill(victim)
        wait_for(
            lambda a=acknowledged: len(producer.acknowledged) > min(a + 100, MESSAGES - 1),
            f"acks after killing {victim} (sent {producer.sent}, failed {producer.failed[:3]})",
        )
        restart_and_rejoin(victim)
    producer.join(120)
    assert not producer.is_alive()
    assert producer.failed == []
    assert read_all(bootstrap, TOPIC, MESSAGES, client=client) == list(range(MESSAGES))
    assert sorted(producer.acknowledged) == list(range(MESSAGES))


def cli(*args: str) -> None:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output


@pytest.fixture
def zk_cluster(
    zookeeper: ZooKeeperServer,  # noqa: F811 (the fixture)
    tmp_path: Path,
    certs: Certificates,
) -> Iterator[ZooKeeperCluster]:
    properties = {
        **secured(certs, "SCRAM-SHA-512"),
        "listener.name.internal.scram-sha-512.sasl.jaas.config": (
            f'{SCRAM_MODULE} required username="broker" password="broker-pw";'
        ),
    }
    broker = as_user(certs, "broker", "broker-pw")
    cluster = ZooKeeperCluster(zookeeper, tmp_path, overrides=properties, client=broker)
    store = zookeeper.connect + cluster.chroot
    for user in ("broker", "app"):  # before the first broker starts
        cli("user", "scram", "set", user, "--password", f"{user}-pw", "--zookeeper", store)
    cluster.start()
    yield cluster
    cluster.stop()


def test_over_zookeeper_a_sasl_ssl_cluster_fails_over_losing_nothing(
    zk_cluster: ZooKeeperCluster, certs: Certificates
) -> None:
    admin = zk_cluster.admin()
    grant_app(admin)
    config = {"min.insync.replicas": "2"}
    admin.create_topics([NewTopic(TOPIC, 1, 3, config=config)])[TOPIC].result(30)
    wait_for(lambda: sorted(zk_cluster.partition_state(TOPIC, 0)[1]) == [0, 1, 2], "ISR")

    def restart_and_rejoin(victim: int) -> None:
        zk_cluster.restart(victim)
        wait_for(lambda: sorted(zk_cluster.partition_state(TOPIC, 0)[1]) == [0, 1, 2], "ISR")

    produce_through_kills(
        zk_cluster.bootstrap,
        as_user(certs, "app", "app-pw"),
        leader=lambda: zk_cluster.partition_state(TOPIC, 0)[0],
        kill=lambda victim: zk_cluster.brokers[victim].stop(signal.SIGKILL),
        restart_and_rejoin=restart_and_rejoin,
    )


@pytest.fixture
def in_process(tmp_path: Path, certs: Certificates) -> Iterator[EmbeddedCluster]:
    properties = {
        **secured(certs, "PLAIN"),
        "listener.name.internal.plain.sasl.jaas.config": (
            f'{PLAIN_MODULE} required username="broker" password="broker-pw" '
            'user_broker="broker-pw";'
        ),
        "zookeeper.session.timeout.ms": "3000",  # a crashed broker's leadership moves soon
    }
    with EmbeddedCluster(tmp_path, brokers=3, properties=properties) as cluster:
        yield cluster


def test_in_process_a_sasl_ssl_cluster_fails_over_losing_nothing(
    in_process: EmbeddedCluster, certs: Certificates
) -> None:
    cluster = in_process

    def bootstrap(listener: str) -> str:
        endpoints = [b.endpoints.listener(listener) for b in cluster.brokers]
        return ",".join(f"{x.host}:{x.port}" for x in endpoints)

    def as_broker() -> AdminClient:
        return AdminClient(
            {
                "bootstrap.servers": bootstrap("INTERNAL"),
                **as_user(certs, "broker", "broker-pw"),
                "sasl.mechanisms": "PLAIN",
            }
        )

    admin = as_broker()
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
    upsert = UserScramCredentialUpsertion("app", info, b"app-pw")
    admin.alter_user_scram_credentials([upsert])["app"].result(30)
    grant_app(admin)
    config = {"min.insync.replicas": "2"}
    admin.create_topics([NewTopic(TOPIC, 1, 3, config=config)])[TOPIC].result(30)

    def state() -> tuple[int, list[int]]:
        """(leader, ISR) as a running broker sees them."""
        for broker in cluster.brokers:
            if broker.running:
                found = broker.cache.states[TopicPartition(TOPIC, 0)]
                return found.leader, sorted(found.isr)
        raise AssertionError("no broker running")

    def in_sync() -> bool:
        return cluster.read(state)[1] == [0, 1, 2]

    wait_for(in_sync, "ISR")

    def restart_and_rejoin(victim: int) -> None:
        cluster.start_broker(victim)
        wait_for(in_sync, f"broker {victim} back in the ISR", show=lambda: cluster.read(state))

    produce_through_kills(
        bootstrap("CLIENT"),
        as_user(certs, "app", "app-pw"),
        leader=lambda: cluster.read(state)[0],
        kill=cluster.kill_broker,
        restart_and_rejoin=restart_and_rejoin,
    )
