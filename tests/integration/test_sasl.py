"""SASL as Kafka's clients expect it, on a 3-broker cluster whose brokers authenticate to
each other with PLAIN on their inter-broker listener: confluent-kafka, kafka-python and
aiokafka log in with PLAIN, SCRAM-SHA-512 and OAUTHBEARER (unsecured JWS) on the client
listener; SCRAM users are managed with AlterUserScramCredentials and seen by every broker;
a wrong password, an unknown mechanism and requests before authentication are refused and
the connection closed; a fuzz of pre-authentication frames leaves the broker serving."""

from __future__ import annotations

import asyncio
import socket
import struct
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.waiting import wait_for
from tierbroker.broker.security.sasl.scram import ScramMechanism as Scram
from tierbroker.broker.security.sasl.scram_client import ScramSaslClient
from tierbroker.broker.server.embedded import EmbeddedCluster
from tierbroker.protocol.client_codec import decode_response, encode_request, request_type

PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
PROPERTIES = {
    "listeners": "CLIENT://127.0.0.1:0,INTERNAL://127.0.0.1:0",
    "listener.security.protocol.map": "CLIENT:SASL_PLAINTEXT,INTERNAL:SASL_PLAINTEXT",
    "inter.broker.listener.name": "INTERNAL",
    "sasl.mechanism.inter.broker.protocol": "PLAIN",
    "listener.name.internal.sasl.enabled.mechanisms": "PLAIN",
    "listener.name.internal.plain.sasl.jaas.config": (
        f'{PLAIN_MODULE} required username="broker" password="broker-pw" user_broker="broker-pw";'
    ),
    "listener.name.client.sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512,OAUTHBEARER",
    "listener.name.client.plain.sasl.jaas.config": (
        f'{PLAIN_MODULE} required user_admin="admin-pw" user_alice="alice-pw";'
    ),
    "offsets.topic.num.partitions": "3",
    "log.dir.min.free.bytes": "0",
    "group.initial.rebalance.delay.ms": "0",
    "connection.failed.authentication.delay.ms": "100",
    # A client that stops mid-exchange is closed within this.
    "connections.max.idle.ms": "3000",
    # KIP-368: PLAIN sessions of the client listener last 3 s; clients re-authenticate.
    "listener.name.client.plain.connections.max.reauth.ms": "3000",
}
CLOSED_WITHIN_S = 10.0  # far above the failure delay: "quickly", on a loaded machine


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    directory: Path = tmp_path_factory.mktemp("sasl")
    with EmbeddedCluster(directory, brokers=3, properties=PROPERTIES) as cluster:
        yield cluster


def client_address(cluster: EmbeddedCluster, broker: int = 0) -> tuple[str, int]:
    endpoint = cluster.brokers[broker].endpoints.listener("CLIENT")
    return endpoint.host, endpoint.port


def bootstrap(cluster: EmbeddedCluster) -> str:
    return ",".join("{}:{}".format(*client_address(cluster, i)) for i in range(3))


def sasl(cluster: EmbeddedCluster, mechanism: str, user: str, password: str) -> dict[str, str]:
    return {
        "bootstrap.servers": bootstrap(cluster),
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": mechanism,
        "sasl.username": user,
        "sasl.password": password,
    }


def admin(cluster: EmbeddedCluster) -> AdminClient:
    return AdminClient(sasl(cluster, "PLAIN", "admin", "admin-pw"))


def create_topic(cluster: EmbeddedCluster, name: str, partitions: int) -> None:
    client = admin(cluster)  # held until the result comes: a dropped client cancels it
    client.create_topics([NewTopic(name, partitions, 3)])[name].result(30)


def failed_authentications(cluster: EmbeddedCluster) -> float:
    def read() -> float:
        return sum(
            b.registry.get_sample_value("failed_authentication_total", {"listener": "CLIENT"})
            or 0.0
            for b in cluster.brokers
        )

    return cluster.read(read)


def produce_and_consume(config: dict[str, str], topic: str, count: int = 10) -> list[bytes]:
    producer = Producer({**config, "acks": "all"})
    for i in range(count):
        producer.produce(topic, f"m{i}".encode())
    assert producer.flush(30) == 0
    consumer = Consumer(
        {**config, "group.id": f"g-{uuid.uuid4()}", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    values: list[bytes] = []
    try:
        wait_for(
            lambda: (
                (m := consumer.poll(1)) is not None
                and not m.error()
                and values.append(m.value() or b"") is None
                and len(values) >= count
            ),
            f"{count} records of {topic}",
            timeout_s=60,
        )
    finally:
        consumer.close()
    return values


def test_plain_produce_and_consume_replicated_over_sasl_between_brokers(
    cluster: EmbeddedCluster,
) -> None:
    create_topic(cluster, "plain", 3)
    config = sasl(cluster, "PLAIN", "alice", "alice-pw")
    assert sorted(produce_and_consume(config, "plain")) == [f"m{i}".encode() for i in range(10)]

    def in_sync() -> bool:
        return all(
            len(cluster.brokers[0].cache.states[tp].isr) == 3
            for tp in cluster.brokers[0].cache.states
            if tp.topic == "plain"
        )

    wait_for(lambda: cluster.read(in_sync), "every replica of 'plain' in sync over SASL")


def refusal(config: dict[str, Any]) -> str:
    """The authentication error librdkafka reports for `config`'s login."""
    errors: list[KafkaError] = []
    producer = Producer({**config, "error_cb": errors.append})

    def refused() -> str | None:
        producer.poll(0.2)
        found = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
        return found[0].str() if found else None

    return wait_for(refused, "an authentication error", timeout_s=CLOSED_WITHIN_S)


def reauthentications(cluster: EmbeddedCluster) -> float:
    def read() -> float:
        return sum(
            b.registry.get_sample_value("successful_reauthentication_total", {"listener": "CLIENT"})
            or 0.0
            for b in cluster.brokers
        )

    return cluster.read(read)


def test_sessions_are_reauthenticated_on_the_same_connection(cluster: EmbeddedCluster) -> None:
    """KIP-368: a producer keeps its connections past the 3 s session lifetime by logging
    in again on them; none of its records fails."""
    create_topic(cluster, "reauth", 1)
    failures: list[object] = []
    producer = Producer(
        {**sasl(cluster, "PLAIN", "alice", "alice-pw"), "acks": "all", "linger.ms": 0}
    )
    before = reauthentications(cluster)

    def reauthenticated() -> bool:
        producer.produce("reauth", b"x", on_delivery=lambda e, _m: e and failures.append(e))
        producer.poll(0.2)
        return reauthentications(cluster) > before

    wait_for(reauthenticated, "a re-authentication", timeout_s=60)
    assert producer.flush(30) == 0
    assert failures == []


def test_wrong_password_is_refused_quickly(cluster: EmbeddedCluster) -> None:
    before = failed_authentications(cluster)
    reason = refusal(sasl(cluster, "PLAIN", "alice", "wrong"))
    assert "Authentication failed: Invalid username or password" in reason
    wait_for(lambda: failed_authentications(cluster) > before, "the failure counted")


def test_scram_lifecycle_with_confluent_kafka(cluster: EmbeddedCluster) -> None:
    client = admin(cluster)
    sha512 = ScramMechanism.SCRAM_SHA_512
    futures = client.alter_user_scram_credentials(
        [
            UserScramCredentialUpsertion("bob", ScramCredentialInfo(sha512, 8192), b"bob-pw"),
            UserScramCredentialUpsertion("weak", ScramCredentialInfo(sha512, 1000), b"pw"),
        ]
    )
    futures["bob"].result(30)
    with pytest.raises(KafkaException) as weak:
        futures["weak"].result(30)
    assert weak.value.args[0].code() == 93  # UNACCEPTABLE_CREDENTIAL: too few iterations
    duplicate = client.alter_user_scram_credentials(
        [
            UserScramCredentialUpsertion("carol", ScramCredentialInfo(sha512, 4096), b"pw"),
            UserScramCredentialUpsertion("carol", ScramCredentialInfo(sha512, 8192), b"pw"),
        ]
    )
    with pytest.raises(KafkaException) as twice:
        duplicate["carol"].result(30)
    assert twice.value.args[0].code() == 92  # DUPLICATE_RESOURCE
    described = client.describe_user_scram_credentials(["bob"])["bob"].result(30)
    assert [(i.mechanism, i.iterations) for i in described.scram_credential_infos] == [
        (sha512, 8192)
    ]
    # Every broker holds it: a login to each one works.
    client.create_topics([NewTopic("scram", 3, 3)])["scram"].result(30)
    bob = sasl(cluster, "SCRAM-SHA-512", "bob", "bob-pw")
    assert len(produce_and_consume(bob, "scram")) == 10
    assert "invalid credentials" in refusal({**bob, "sasl.password": "nope"})
    client.alter_user_scram_credentials([UserScramCredentialDeletion("bob", sha512)])["bob"].result(
        30
    )
    with pytest.raises(KafkaException):
        client.describe_user_scram_credentials(["bob"])["bob"].result(30)
    wait_for(
        lambda: cluster.read(
            lambda: all(
                b.scram_credentials.lookup(Scram.SCRAM_SHA_512, "bob") is None
                for b in cluster.brokers
            )
        ),
        "every broker forgot bob",
        timeout_s=10,
    )
    assert "invalid credentials" in refusal(bob)


def test_oauthbearer_unsecured_jws(cluster: EmbeddedCluster) -> None:
    create_topic(cluster, "oauth", 1)
    config = {
        "bootstrap.servers": bootstrap(cluster),
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "OAUTHBEARER",
        "enable.sasl.oauthbearer.unsecure.jwt": "true",
        "sasl.oauthbearer.config": "principal=svc lifeSeconds=600",
    }
    assert len(produce_and_consume(config, "oauth", 3)) == 3


# kafka-python loads its schemas with importlib.resources' deprecated read_text: the
# library's warning, not the broker's (as in test_kafka_python).
@pytest.mark.filterwarnings("ignore:(read|open)_text is deprecated:DeprecationWarning")
def test_kafka_python_and_aiokafka_log_in(cluster: EmbeddedCluster) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from kafka import KafkaProducer

    create_topic(cluster, "python-clients", 1)
    client = admin(cluster)
    sha512 = ScramMechanism.SCRAM_SHA_512
    client.alter_user_scram_credentials(
        [UserScramCredentialUpsertion("py", ScramCredentialInfo(sha512, 4096), b"py-pw")]
    )["py"].result(30)
    producer = KafkaProducer(
        bootstrap_servers=bootstrap(cluster).split(","),
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_plain_username="py",
        sasl_plain_password="py-pw",
        acks="all",
    )
    producer.send("python-clients", b"from kafka-python").get(timeout=30)
    producer.close()

    async def aiokafka_round_trip() -> list[bytes]:
        options: dict[str, Any] = {
            "bootstrap_servers": bootstrap(cluster),
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "PLAIN",
            "sasl_plain_username": "alice",
            "sasl_plain_password": "alice-pw",
        }
        aio_producer = AIOKafkaProducer(**options)
        await aio_producer.start()
        try:
            await aio_producer.send_and_wait("python-clients", b"from aiokafka")
        finally:
            await aio_producer.stop()
        consumer = AIOKafkaConsumer(
            "python-clients", auto_offset_reset="earliest", group_id=None, **options
        )
        await consumer.start()
        try:
            async with asyncio.timeout(60):
                values = []
                async for message in consumer:
                    values.append(message.value)
                    if len(values) == 2:
                        return values
        finally:
            await consumer.stop()
        return []

    assert sorted(asyncio.run(aiokafka_round_trip())) == [b"from aiokafka", b"from kafka-python"]


# The wire, before authentication. -----------------------------------------------------


class Wire:
    """A raw connection to the client listener."""

    def __init__(self, cluster: EmbeddedCluster) -> None:
        self.sock = socket.create_connection(client_address(cluster), timeout=CLOSED_WITHIN_S)
        self.correlation_id = 0

    def __enter__(self) -> Wire:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.sock.close()

    def send_frame(self, payload: bytes) -> None:
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)

    def read_frame(self) -> bytes | None:
        """A frame, or None when the broker closed the connection."""
        header = self._read(4)
        if header is None:
            return None
        return self._read(struct.unpack(">i", header)[0])

    def _read(self, size: int) -> bytes | None:
        data = b""
        while len(data) < size:
            chunk = self.sock.recv(size - len(data))
            if not chunk:
                return None
            data += chunk
        return data

    def request(self, api_key: int, version: int, **fields: Any) -> Any:
        self.correlation_id += 1
        body = request_type(api_key, version)(**fields)
        self.sock.sendall(encode_request(self.correlation_id, "wire", body))
        frame = self.read_frame()
        assert frame is not None, f"closed instead of answering api {api_key}"
        return decode_response(api_key, version, frame)

    def closed(self) -> bool:
        try:
            return self.read_frame() is None
        except ConnectionResetError:
            return True


def test_unknown_mechanism_is_answered_with_the_enabled_ones_then_closed(
    cluster: EmbeddedCluster,
) -> None:
    with Wire(cluster) as wire:
        response = wire.request(17, 1, mechanism="SCRAM-SHA-256")
        assert response.error_code.value == 33  # UNSUPPORTED_SASL_MECHANISM
        assert list(response.mechanisms) == ["PLAIN", "SCRAM-SHA-512", "OAUTHBEARER"]
        assert wire.closed()


def test_a_request_before_authentication_closes(cluster: EmbeddedCluster) -> None:
    with Wire(cluster) as wire:
        wire.request(18, 0)
        wire.sock.sendall(encode_request(9, "wire", request_type(3, 1)(topics=None)))
        assert wire.closed()


def test_a_token_over_the_pre_authentication_limit_closes(cluster: EmbeddedCluster) -> None:
    with Wire(cluster) as wire:
        assert wire.request(17, 1, mechanism="PLAIN").error_code.value == 0
        try:
            wire.send_frame(bytes(600 * 1024))
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed while the frame was still being sent
        assert wire.closed()


def test_a_scram_exchange_with_a_wrong_nonce_fails_with_58_and_closes(
    cluster: EmbeddedCluster,
) -> None:
    client = admin(cluster)
    sha512 = ScramMechanism.SCRAM_SHA_512
    client.alter_user_scram_credentials(
        [UserScramCredentialUpsertion("nonce", ScramCredentialInfo(sha512, 4096), b"pw")]
    )["nonce"].result(30)
    with Wire(cluster) as wire:
        assert wire.request(17, 1, mechanism="SCRAM-SHA-512").error_code.value == 0
        exchange = ScramSaslClient(Scram.SCRAM_SHA_512, "nonce", "pw")
        first = wire.request(36, 1, auth_bytes=exchange.first_message())
        final = exchange.final_message(bytes(first.auth_bytes)).replace(b",p=", b"x,p=", 1)
        answer = wire.request(36, 1, auth_bytes=final)
        assert answer.error_code.value == 58
        assert answer.error_message == (
            "Authentication failed during authentication due to invalid credentials with "
            "SASL mechanism SCRAM-SHA-512"
        )
        assert wire.closed()


def test_a_client_that_stops_mid_exchange_is_closed(cluster: EmbeddedCluster) -> None:
    with Wire(cluster) as wire:
        assert wire.request(17, 1, mechanism="SCRAM-SHA-512").error_code.value == 0
        exchange = ScramSaslClient(Scram.SCRAM_SHA_512, "nobody", "pw")
        wire.request(36, 1, auth_bytes=exchange.first_message())
        assert wire.closed()  # by connections.max.idle.ms, before the socket's timeout


def test_handshake_v0_raw_tokens(cluster: EmbeddedCluster) -> None:
    """aiokafka's path when SaslAuthenticate is not advertised: tokens without headers."""
    with Wire(cluster) as wire:
        assert wire.request(17, 0, mechanism="PLAIN").error_code.value == 0
        wire.send_frame(b"\0alice\0alice-pw")
        assert wire.read_frame() == b""
        metadata = wire.request(3, 1, topics=None)
        assert len(metadata.brokers) == 3


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(frames=st.lists(st.binary(max_size=256), min_size=1, max_size=4))
def test_fuzzed_pre_authentication_frames(cluster: EmbeddedCluster, frames: list[bytes]) -> None:
    """Whatever comes before authentication is answered or closed, never left hanging
    (the client's end of input closes the connection once answered), and the broker goes
    on serving."""
    with Wire(cluster) as wire:
        try:
            for frame in frames:
                wire.send_frame(frame)
            wire.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the broker closed it already
        while not wire.closed():
            pass
    with Wire(cluster) as wire:
        assert wire.request(18, 0).error_code.value == 0
