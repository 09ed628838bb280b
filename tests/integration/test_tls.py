"""TLS and mutual TLS with stock clients, on a 3-broker cluster whose brokers talk over
mutual TLS, certificates made by openssl (`tests.certs`).

Listeners: CLIENT (one-way TLS), MTLS (`ssl.client.auth=required`), INTERNAL (the
inter-broker listener, mutual TLS). Records come back byte-identical from a fetch of
more than 1 MiB of a segment file (what sendfile would have sent under the TLS layer); a
client that does not trust the CA, or has no certificate where one is required, is
refused; a mutual TLS connection's principal is its certificate's subject; a key store
changed with IncrementalAlterConfigs serves new connections while existing ones go on.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import ssl
import struct
import subprocess
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError
from aiokafka.helpers import create_ssl_context
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from tests.apache_kafka import run_java
from tests.certs import BROKER_SAN, STORE_PASSWORD, Certificates
from tests.integration.test_kafkajs import node
from tests.integration.test_kcat import kcat
from tests.integration.waiting import wait_for
from tierbroker.broker.server.embedded import EmbeddedCluster

# kafka-python loads its schemas with importlib.resources' deprecated calls (its warning).
LEGACY_RESOURCES = "read_text is deprecated|open_text is deprecated"
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", LEGACY_RESOURCES, DeprecationWarning)
    import kafka

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 30.0
RECORD_BYTES = 64 * 1024
RECORDS = 64  # 4 MiB in one segment, fetched in responses of more than 1 MiB
CLIENT_KEYSTORE = "listener.name.client.ssl.keystore.location"


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, certs: Certificates
) -> Iterator[EmbeddedCluster]:
    directory: Path = tmp_path_factory.mktemp("tls")
    keystore = directory / "client-listener.p12"  # replaced by the reload test
    shutil.copy(certs.broker.p12, keystore)
    properties = {
        "listeners": "CLIENT://127.0.0.1:0,MTLS://127.0.0.1:0,INTERNAL://127.0.0.1:0",
        "listener.security.protocol.map": "CLIENT:SSL,MTLS:SSL,INTERNAL:SSL",
        "inter.broker.listener.name": "INTERNAL",
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": str(certs.broker.p12),
        "ssl.keystore.password": STORE_PASSWORD,
        CLIENT_KEYSTORE: str(keystore),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(certs.ca.cert),
        "listener.name.mtls.ssl.client.auth": "required",
        # Only this organisation's clients have a principal on MTLS.
        "listener.name.mtls.ssl.principal.mapping.rules": "RULE:^(.*,O=tierbroker-tests)$/$1/",
        "listener.name.internal.ssl.client.auth": "required",
        # A client that stops mid-handshake is closed within this.
        "connections.max.idle.ms": "5000",
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


def librdkafka_tls(certs: Certificates, listener: str) -> dict[str, Any]:
    settings: dict[str, Any] = {"security.protocol": "SSL", "ssl.ca.location": str(certs.ca.cert)}
    if listener == "MTLS":
        settings |= {
            "ssl.certificate.location": str(certs.client.cert),
            "ssl.key.location": str(certs.client.key),
        }
    return settings


def create_topic(
    cluster: EmbeddedCluster, certs: Certificates, topic: str, replicas: int = 1
) -> None:
    admin = AdminClient(
        {"bootstrap.servers": bootstrap(cluster, "CLIENT"), **librdkafka_tls(certs, "CLIENT")}
    )
    admin.create_topics([NewTopic(topic, 1, replicas)])[topic].result(TIMEOUT_S)


def topic_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("listener", ["CLIENT", "MTLS"])
def test_confluent_kafka_reads_back_a_large_fetch_byte_for_byte(
    cluster: EmbeddedCluster, certs: Certificates, listener: str
) -> None:
    topic = topic_name(f"large-{listener.lower()}")
    create_topic(cluster, certs, topic)
    settings = {
        "bootstrap.servers": bootstrap(cluster, listener),
        **librdkafka_tls(certs, listener),
    }
    values = [os.urandom(RECORD_BYTES) for _ in range(RECORDS)]
    producer = Producer({**settings, "linger.ms": 50, "batch.size": 1_000_000})
    for value in values:
        producer.produce(topic, value, partition=0)
    assert producer.flush(TIMEOUT_S) == 0
    consumer = Consumer(
        {
            **settings,
            "group.id": topic,
            "fetch.max.bytes": 8 * 1024 * 1024,
            "max.partition.fetch.bytes": 8 * 1024 * 1024,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    try:
        while len(got) < RECORDS:
            message = consumer.poll(TIMEOUT_S)
            assert message is not None, f"{len(got)} of {RECORDS} records read"
            if message.error() is not None:
                raise KafkaException(message.error())
            got.append(message.value())
    finally:
        consumer.close()
    assert got == values


def test_mutual_tls_principal_is_the_certificate_subject(
    cluster: EmbeddedCluster, certs: Certificates
) -> None:
    admins = [  # kept, so are their connections
        AdminClient({"bootstrap.servers": bootstrap(cluster, x), **librdkafka_tls(certs, x)})
        for x in ("CLIENT", "MTLS")
    ]
    for admin in admins:
        admin.list_topics(timeout=TIMEOUT_S)

    def principals(listener: str) -> set[str]:
        return cluster.read(
            lambda: {
                str(c.principal)
                for b in cluster.brokers
                for c in b.socket_server.connections
                if c.listener.name == listener
            }
        )

    assert principals("MTLS") == {"User:CN=client,O=tierbroker-tests"}
    assert principals("CLIENT") == {"User:ANONYMOUS"}
    # Brokers authenticate each other with their own certificate.
    create_topic(cluster, certs, topic_name("replicated"), replicas=3)
    wait_for(lambda: principals("INTERNAL"), "a follower's connection")
    assert principals("INTERNAL") == {"User:CN=localhost,O=tierbroker-tests"}


def test_replication_over_the_mutual_tls_inter_broker_listener(
    cluster: EmbeddedCluster, certs: Certificates
) -> None:
    topic = topic_name("replicated")
    create_topic(cluster, certs, topic, replicas=3)
    settings = {
        "bootstrap.servers": bootstrap(cluster, "CLIENT"),
        **librdkafka_tls(certs, "CLIENT"),
    }
    producer = Producer({**settings, "acks": "all"})
    for i in range(200):
        producer.produce(topic, str(i).encode(), partition=0)
    assert producer.flush(TIMEOUT_S) == 0

    def in_sync() -> bool:
        return cluster.read(
            lambda: all(
                b.replicas.log_manager.logs[tp].log_end_offset == 200
                for b in cluster.brokers
                for tp in b.replicas.log_manager.logs
                if tp.topic == topic
            )
        )

    wait_for(in_sync, "every replica at offset 200")


@pytest.mark.parametrize(
    ("listener", "change"),
    [
        ("CLIENT", {"ssl.ca.location": "OTHER_CA"}),  # the client does not trust the broker
        ("MTLS", {"ssl.certificate.location": None, "ssl.key.location": None}),  # no cert
        # a client certificate of a CA the broker does not trust
        ("MTLS", {"ssl.certificate.location": "OTHER_CERT", "ssl.key.location": "OTHER_KEY"}),
        # a certificate of the trusted CA that no ssl.principal.mapping.rules rule maps
        ("MTLS", {"ssl.certificate.location": "STRANGER_CERT", "ssl.key.location": "STRANGER_KEY"}),
    ],
)
def test_untrusted_clients_are_refused(
    cluster: EmbeddedCluster, certs: Certificates, listener: str, change: dict[str, str | None]
) -> None:
    """The client gets no metadata; the brokers count failed authentications (Kafka's
    failed-authentication-total of the listener)."""
    stranger = certs.client_cert("stranger", "/O=strangers/CN=stranger")
    stand_ins = {
        "OTHER_CA": str(certs.other_ca.cert),
        "OTHER_CERT": str(certs.other_client.cert),
        "OTHER_KEY": str(certs.other_client.key),
        "STRANGER_CERT": str(stranger.cert),
        "STRANGER_KEY": str(stranger.key),
    }
    settings = librdkafka_tls(certs, listener)
    for key, value in change.items():
        if value is None:
            settings.pop(key, None)
        else:
            settings[key] = stand_ins[value]
    before = failed_authentications(cluster, listener)
    admin = AdminClient({"bootstrap.servers": bootstrap(cluster, listener), **settings})
    with pytest.raises(KafkaException):  # (it never gets an answer: any wait ends refused)
        admin.list_topics(timeout=2)
    wait_for(
        lambda: failed_authentications(cluster, listener) > before,
        f"a failed authentication counted on {listener}",
        timeout_s=TIMEOUT_S,
    )


def test_kcat_and_aiokafka_without_a_certificate_are_refused_by_mutual_tls(
    cluster: EmbeddedCluster, certs: Certificates
) -> None:
    """ssl.client.auth=required: a client that trusts the CA but shows no certificate is
    refused within seconds, each as it reports a TLS failure."""
    before = failed_authentications(cluster, "MTLS")
    exe = shutil.which("kcat")
    assert exe is not None, "kcat is not installed: `apt-get install -y kcat`"
    only_ca = ["-X", "security.protocol=SSL", "-X", f"ssl.ca.location={certs.ca.cert}"]
    listed = subprocess.run(
        [exe, "-b", bootstrap(cluster, "MTLS"), *only_ca, "-L", "-m", "5"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert listed.returncode != 0 and "SSL" in listed.stderr, listed.stderr

    async def aiokafka_start() -> None:
        context = create_ssl_context(cafile=str(certs.ca.cert))
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap(cluster, "MTLS"),
            security_protocol="SSL",
            ssl_context=context,
        )
        try:
            async with asyncio.timeout(TIMEOUT_S):
                await producer.start()
        finally:
            await producer.stop()

    with pytest.raises(KafkaConnectionError):
        asyncio.run(aiokafka_start())
    wait_for(
        lambda: failed_authentications(cluster, "MTLS") >= before + 2,
        "both refusals counted as failed authentications",
        timeout_s=TIMEOUT_S,
    )


def failed_authentications(cluster: EmbeddedCluster, listener: str) -> float:
    return cluster.read(
        lambda: sum(
            b.registry.get_sample_value("failed_authentication_total", {"listener": listener})
            or 0.0
            for b in cluster.brokers
        )
    )


@pytest.mark.filterwarnings(f"ignore:{LEGACY_RESOURCES}:DeprecationWarning")
def test_kafka_python_one_way_and_mutual(cluster: EmbeddedCluster, certs: Certificates) -> None:
    topic = topic_name("kafka-python")
    create_topic(cluster, certs, topic)
    tls = {"security_protocol": "SSL", "ssl_cafile": str(certs.ca.cert)}
    producer = kafka.KafkaProducer(bootstrap_servers=bootstrap(cluster, "CLIENT"), **tls)
    for i in range(20):
        producer.send(topic, f"v{i}".encode(), partition=0)
    producer.flush(TIMEOUT_S)
    producer.close()
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=bootstrap(cluster, "MTLS"),
        auto_offset_reset="earliest",
        consumer_timeout_ms=int(TIMEOUT_S * 1000),
        ssl_certfile=str(certs.client.cert),
        ssl_keyfile=str(certs.client.key),
        **tls,
    )
    consumer.assign([kafka.TopicPartition(topic, 0)])
    values = [m.value.decode() for _, m in zip(range(20), consumer, strict=False)]
    consumer.close()
    assert values == [f"v{i}" for i in range(20)]


def test_aiokafka_mutual_tls(cluster: EmbeddedCluster, certs: Certificates) -> None:
    topic = topic_name("aiokafka")
    create_topic(cluster, certs, topic)
    servers = bootstrap(cluster, "MTLS")

    async def run() -> list[str]:
        context = create_ssl_context(
            cafile=str(certs.ca.cert),
            certfile=str(certs.client.cert),
            keyfile=str(certs.client.key),
        )
        producer = AIOKafkaProducer(
            bootstrap_servers=servers, security_protocol="SSL", ssl_context=context
        )
        await producer.start()
        try:
            for i in range(20):
                await producer.send_and_wait(topic, f"v{i}".encode(), partition=0)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=servers,
            security_protocol="SSL",
            ssl_context=context,
            auto_offset_reset="earliest",
        )
        await consumer.start()
        try:
            values = []
            async with asyncio.timeout(TIMEOUT_S):
                async for message in consumer:
                    values.append(message.value.decode())
                    if len(values) == 20:
                        return values
        finally:
            await consumer.stop()
        return values

    assert asyncio.run(run()) == [f"v{i}" for i in range(20)]


@pytest.mark.parametrize("listener", ["CLIENT", "MTLS"])
def test_kcat(cluster: EmbeddedCluster, certs: Certificates, listener: str) -> None:
    topic = topic_name(f"kcat-{listener.lower()}")
    create_topic(cluster, certs, topic)
    options = [f"{k}={v}" for k, v in librdkafka_tls(certs, listener).items()]
    tls = [arg for option in options for arg in ("-X", option)]
    lines = [f"line-{i}" for i in range(10)]
    kcat(bootstrap(cluster, listener), *tls, "-P", "-t", topic, "-p", "0", stdin="\n".join(lines))
    out = kcat(
        bootstrap(cluster, listener),
        *tls,
        "-C",
        "-t",
        topic,
        "-p",
        "0",
        "-o",
        "beginning",
        "-e",
        "-q",
    )
    assert out.splitlines() == lines


@pytest.mark.parametrize("listener", ["CLIENT", "MTLS"])
def test_kafkajs(cluster: EmbeddedCluster, certs: Certificates, listener: str) -> None:
    topic = topic_name(f"kafkajs-{listener.lower()}")
    mutual = [str(certs.client.cert), str(certs.client.key)] if listener == "MTLS" else []
    command = [
        node(), str(ROOT / "tests" / "js" / "ssl_produce_consume.js"),
        bootstrap(cluster, listener), topic, "25", str(certs.ca.cert), *mutual,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["values"] == [f"v{i}" for i in range(25)]


@pytest.mark.parametrize("listener", ["CLIENT", "MTLS"])
def test_java_client(
    cluster: EmbeddedCluster, certs: Certificates, listener: str, tmp_path: Path
) -> None:
    properties = {
        "security.protocol": "SSL",
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(certs.ca.cert),
    }
    if listener == "MTLS":
        properties |= {
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": str(certs.client.p12),
            "ssl.keystore.password": STORE_PASSWORD,
        }
    client = tmp_path / "client.properties"
    client.write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
    topic = topic_name(f"java-{listener.lower()}")
    output = run_java(
        "ProduceConsume.java",
        bootstrap(cluster, listener),
        topic,
        "2",
        "200",
        f"{topic}-g",
        str(client),
    )
    results = dict(line.split(" ", 1) for line in output.splitlines() if " " in line)
    assert (results["acked"], results["received"], results["distinct"]) == ("200", "200", "200")


def api_versions_over(sock: socket.socket | ssl.SSLSocket) -> bool:
    """An ApiVersions v0 request answered on `sock`."""
    request = struct.pack(">hhih", 18, 0, 7, 4) + b"test"
    sock.sendall(struct.pack(">i", len(request)) + request)
    return len(sock.recv(4)) == 4 and bool(sock.recv(65536))


def test_key_store_reload_serves_new_connections(
    cluster: EmbeddedCluster, certs: Certificates
) -> None:
    broker = cluster.brokers[0]
    address = broker.endpoints.listener("CLIENT")
    client = ssl.create_default_context(cafile=str(certs.ca.cert))

    def served_certificate() -> bytes:
        with socket.create_connection((address.host, address.port), TIMEOUT_S) as raw:
            with client.wrap_socket(raw, server_hostname="localhost") as tls:
                der = tls.getpeercert(binary_form=True)
                assert der is not None
                return der

    before = served_certificate()
    existing = client.wrap_socket(
        socket.create_connection((address.host, address.port), TIMEOUT_S),
        server_hostname="localhost",
    )
    renewed = certs.ca.issue("renewed-client-listener", certs.broker.subject, BROKER_SAN)
    other = certs.ca.issue("renamed-client-listener", "/O=renamed/CN=localhost", BROKER_SAN)
    admin = AdminClient(
        {"bootstrap.servers": bootstrap(cluster, "CLIENT"), **librdkafka_tls(certs, "CLIENT")}
    )

    def alter(path: Path) -> None:
        resource = ConfigResource(
            ConfigResource.Type.BROKER,
            str(broker.broker_id),
            incremental_configs=[
                ConfigEntry(CLIENT_KEYSTORE, str(path), incremental_operation=AlterConfigOpType.SET)
            ],
        )
        admin.incremental_alter_configs([resource])[resource].result(TIMEOUT_S)

    with pytest.raises(KafkaException, match=r"ssl\.allow\.dn\.changes"):
        alter(other.p12)  # another subject: refused before it is stored
    assert served_certificate() == before
    alter(renewed.p12)
    expected = ssl.PEM_cert_to_DER_cert(renewed.cert.read_text())
    wait_for(lambda: served_certificate() == expected, "the renewed certificate served")
    try:
        assert api_versions_over(existing)  # accepted before the reload: still served
    finally:
        existing.close()


@pytest.mark.parametrize(
    "garbage",
    [
        b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",  # not TLS at all
        b"\x16\x03\x01\x00\xff\x01\x00\x00\xfb\x03\x03" + b"\x00" * 64,  # a cut ClientHello
    ],
)
def test_bad_handshakes_are_closed(cluster: EmbeddedCluster, garbage: bytes) -> None:
    """A client that sends no TLS, or stops in the middle of its handshake, is closed (the
    latter once the handshake timeout, here connections.max.idle.ms, has passed)."""
    address = cluster.brokers[0].endpoints.listener("CLIENT")
    with socket.create_connection((address.host, address.port), TIMEOUT_S) as sock:
        sock.sendall(garbage)
        sock.settimeout(TIMEOUT_S)
        received = b""
        while chunk := _recv(sock):
            received += chunk
    assert len(received) < 1024  # at most a TLS alert


def test_bad_handshakes_leave_the_listener_serving(
    cluster: EmbeddedCluster, certs: Certificates
) -> None:
    address = cluster.brokers[0].endpoints.listener("CLIENT")
    for _ in range(20):
        with socket.create_connection((address.host, address.port), TIMEOUT_S) as sock:
            sock.sendall(os.urandom(512))
    client = ssl.create_default_context(cafile=str(certs.ca.cert))
    with socket.create_connection((address.host, address.port), TIMEOUT_S) as raw:
        with client.wrap_socket(raw, server_hostname="localhost") as tls:
            assert api_versions_over(tls)


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(4096)
    except ConnectionResetError:
        return b""
