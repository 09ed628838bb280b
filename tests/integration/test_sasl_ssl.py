"""SASL_SSL: a 3-broker cluster whose every listener is SASL over TLS (certificates made
with openssl by tests/certs.py), its brokers logging in to each other with PLAIN on the
inter-broker listener. confluent-kafka produces and consumes with SCRAM-SHA-512 and
OAUTHBEARER over TLS; replication keeps every replica in sync; a wrong password and a
client that does not trust the CA are refused."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from tests.certs import STORE_PASSWORD, Certificates
from tests.integration.waiting import wait_for
from tierbroker.broker.server.embedded import EmbeddedCluster

PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, certs: Certificates
) -> Iterator[EmbeddedCluster]:
    directory: Path = tmp_path_factory.mktemp("sasl-ssl")
    properties = {
        "listeners": "CLIENT://127.0.0.1:0,INTERNAL://127.0.0.1:0",
        "listener.security.protocol.map": "CLIENT:SASL_SSL,INTERNAL:SASL_SSL",
        "inter.broker.listener.name": "INTERNAL",
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": str(certs.broker.p12),
        "ssl.keystore.password": STORE_PASSWORD,
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(certs.ca.cert),
        "sasl.mechanism.inter.broker.protocol": "PLAIN",
        "listener.name.internal.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.internal.plain.sasl.jaas.config": (
            f'{PLAIN_MODULE} required username="broker" password="broker-pw" '
            'user_broker="broker-pw" user_admin="admin-pw";'
        ),
        "listener.name.client.sasl.enabled.mechanisms": "SCRAM-SHA-512,OAUTHBEARER",
        "offsets.topic.num.partitions": "3",
        "log.dir.min.free.bytes": "0",
        "group.initial.rebalance.delay.ms": "0",
    }
    with EmbeddedCluster(directory / "data", brokers=3, properties=properties) as cluster:
        yield cluster


def bootstrap(cluster: EmbeddedCluster, listener: str) -> str:
    return ",".join(
        f"{x.host}:{x.port}" for b in cluster.brokers for x in [b.endpoints.listener(listener)]
    )


def tls(certs: Certificates) -> dict[str, Any]:
    return {"security.protocol": "SASL_SSL", "ssl.ca.location": str(certs.ca.cert)}


def admin_config(cluster: EmbeddedCluster, certs: Certificates) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap(cluster, "INTERNAL"),
        **tls(certs),
        "sasl.mechanisms": "PLAIN",
        "sasl.username": "admin",
        "sasl.password": "admin-pw",
    }


@pytest.fixture(scope="module")
def scram_user(cluster: EmbeddedCluster, certs: Certificates) -> dict[str, Any]:
    admin = AdminClient(admin_config(cluster, certs))
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
    admin.alter_user_scram_credentials([UserScramCredentialUpsertion("app", info, b"app-pw")])[
        "app"
    ].result(30)
    admin.create_topics([NewTopic("secured", 3, 3)])["secured"].result(30)
    return {
        "bootstrap.servers": bootstrap(cluster, "CLIENT"),
        **tls(certs),
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "app",
        "sasl.password": "app-pw",
    }


def round_trip(config: dict[str, Any], count: int) -> set[bytes]:
    producer = Producer({**config, "acks": "all"})
    sent = {uuid.uuid4().hex.encode() for _ in range(count)}
    for value in sent:
        producer.produce("secured", value)
    assert producer.flush(60) == 0
    consumer = Consumer({**config, "group.id": uuid.uuid4().hex, "auto.offset.reset": "earliest"})
    consumer.subscribe(["secured"])
    seen: set[bytes] = set()

    def consumed() -> bool:
        for message in consumer.consume(500, 1):
            if not message.error():
                seen.add(message.value() or b"")
        return sent <= seen

    try:
        wait_for(consumed, "the records read back over SASL_SSL", timeout_s=60)
    finally:
        consumer.close()
    return sent


def test_scram_over_tls_and_replication_over_sasl_ssl(
    cluster: EmbeddedCluster, scram_user: dict[str, Any]
) -> None:
    round_trip(scram_user, 30)

    def in_sync() -> bool:
        states = cluster.brokers[0].cache.states
        return all(len(s.isr) == 3 for tp, s in states.items() if tp.topic == "secured")

    wait_for(lambda: cluster.read(in_sync), "every replica in sync over SASL_SSL")


def test_oauthbearer_over_tls(
    cluster: EmbeddedCluster, certs: Certificates, scram_user: Any
) -> None:
    config = {
        "bootstrap.servers": bootstrap(cluster, "CLIENT"),
        **tls(certs),
        "sasl.mechanisms": "OAUTHBEARER",
        "enable.sasl.oauthbearer.unsecure.jwt": "true",
        "sasl.oauthbearer.config": "principal=svc",
    }
    round_trip(config, 5)


def refusal(config: dict[str, Any], code: int) -> str:
    errors: list[KafkaError] = []
    producer = Producer({**config, "error_cb": errors.append})

    def refused() -> str | None:
        producer.poll(0.2)
        found = [e for e in errors if e.code() == code]
        return found[0].str() if found else None

    return wait_for(refused, f"error {code}", timeout_s=15)


def test_wrong_password_and_untrusted_ca_are_refused(
    scram_user: dict[str, Any], certs: Certificates
) -> None:
    reason = refusal({**scram_user, "sasl.password": "nope"}, KafkaError._AUTHENTICATION)
    assert "invalid credentials with SASL mechanism SCRAM-SHA-512" in reason
    untrusted = {**scram_user, "ssl.ca.location": str(certs.other_ca.cert)}
    assert "certificate verify failed" in refusal(untrusted, KafkaError._SSL)
