"""More stock clients over SASL_PLAINTEXT: kcat (librdkafka 2.0) with SCRAM-SHA-512,
kafkajs with PLAIN and SCRAM-SHA-512 (and a wrong password refused), and Apache Kafka's
console producer and consumer (the Java client) with SCRAM-SHA-512 and PLAIN."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.apache_kafka import run_tool, tool_command
from tierbroker.broker.security.sasl.scram import ScramMechanism
from tierbroker.broker.server.embedded import EmbeddedCluster

ROOT = Path(__file__).resolve().parents[2]
KAFKAJS_PROGRAM = ROOT / "tests" / "js" / "sasl.js"
TIMEOUT_S = 90.0
PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    properties = {
        "listeners": "CLIENT://127.0.0.1:0,INTERNAL://127.0.0.1:0",
        "listener.security.protocol.map": "CLIENT:SASL_PLAINTEXT,INTERNAL:PLAINTEXT",
        "inter.broker.listener.name": "INTERNAL",
        "listener.name.client.sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
        "listener.name.client.plain.sasl.jaas.config": (
            f'{PLAIN_MODULE} required user_alice="alice-pw";'
        ),
        "log.dir.min.free.bytes": "0",
        "offsets.topic.num.partitions": "1",
        "group.initial.rebalance.delay.ms": "0",
    }
    with EmbeddedCluster(tmp_path_factory.mktemp("sasl-clients"), properties=properties) as c:
        broker = c.brokers[0]
        sha512 = ScramMechanism.SCRAM_SHA_512
        c.call(broker.scram_credentials.alter("scram", {sha512: sha512.new_credential("s-pw")}))
        yield c


def addresses(cluster: EmbeddedCluster, listener: str) -> str:
    endpoint = cluster.brokers[0].endpoints.listener(listener)
    return f"{endpoint.host}:{endpoint.port}"


def create_topic(cluster: EmbeddedCluster, topic: str) -> str:
    admin = AdminClient({"bootstrap.servers": addresses(cluster, "INTERNAL")})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    return topic


def values(cluster: EmbeddedCluster, topic: str, count: int) -> list[str]:
    """The first `count` values of `topic`, read on the PLAINTEXT listener."""
    consumer = Consumer(
        {
            "bootstrap.servers": addresses(cluster, "INTERNAL"),
            "group.id": uuid.uuid4().hex,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    try:
        messages = consumer.consume(count, timeout=30)
    finally:
        consumer.close()
    return [(m.value() or b"").decode() for m in messages if not m.error()]


def test_kcat_with_scram(cluster: EmbeddedCluster) -> None:
    topic = create_topic(cluster, "kcat-sasl")
    kcat = shutil.which("kcat")
    assert kcat is not None, "kcat is not installed: apt-get install -y kcat"
    sasl = ["-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.mechanisms=SCRAM-SHA-512"]
    sasl += ["-X", "sasl.username=scram", "-X", "sasl.password=s-pw"]
    bootstrap = ["-b", addresses(cluster, "CLIENT")]
    produced = subprocess.run(
        [kcat, *bootstrap, *sasl, "-P", "-t", topic],
        input="one\ntwo\n",
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert produced.returncode == 0, produced.stderr
    consumed = subprocess.run(
        [kcat, *bootstrap, *sasl, "-C", "-t", topic, "-e", "-o", "beginning"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout.splitlines() == ["one", "two"]


def kafkajs(cluster: EmbeddedCluster, mechanism: str, user: str, password: str) -> Any:
    node = shutil.which("node")
    assert node is not None, "node is missing: apt-get install -y nodejs npm"
    topic = "kafkajs-sasl"
    program = [str(KAFKAJS_PROGRAM), addresses(cluster, "CLIENT"), mechanism, user, password]
    done = subprocess.run(
        [node, *program, topic, f"{mechanism} as {user}"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 0, f"sasl.js exited {done.returncode}: {done.stderr[-3000:]}"
    return json.loads(done.stdout.splitlines()[-1])


def test_kafkajs_with_plain_and_scram(cluster: EmbeddedCluster) -> None:
    create_topic(cluster, "kafkajs-sasl")
    assert kafkajs(cluster, "plain", "alice", "alice-pw") == {"sent": True}
    assert kafkajs(cluster, "scram-sha-512", "scram", "s-pw") == {"sent": True}
    refused = kafkajs(cluster, "scram-sha-512", "scram", "wrong")
    assert refused["error"]["name"] == "KafkaJSSASLAuthenticationError"
    assert "invalid credentials" in refused["error"]["message"]
    assert values(cluster, "kafkajs-sasl", 2) == [
        "plain as alice",
        "scram-sha-512 as scram",
    ]


@pytest.mark.parametrize(
    ("mechanism", "jaas"),
    [
        ("SCRAM-SHA-512", f'{SCRAM_MODULE} required username="scram" password="s-pw";'),
        ("PLAIN", f'{PLAIN_MODULE} required username="alice" password="alice-pw";'),
    ],
)
def test_java_console_clients(
    cluster: EmbeddedCluster, tmp_path: Path, mechanism: str, jaas: str
) -> None:
    topic = create_topic(cluster, f"java-{mechanism.lower()}")
    config = tmp_path / "client.properties"
    config.write_text(
        f"security.protocol=SASL_PLAINTEXT\nsasl.mechanism={mechanism}\nsasl.jaas.config={jaas}\n"
    )
    bootstrap = ("--bootstrap-server", addresses(cluster, "CLIENT"), "--topic", topic)
    produced = subprocess.run(
        tool_command("ConsoleProducer", *bootstrap, "--producer.config", str(config)),
        input="java-1\njava-2\n",
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert produced.returncode == 0, produced.stderr[-3000:]
    out = run_tool(
        "consumer.ConsoleConsumer",
        *bootstrap,
        *("--from-beginning", "--max-messages", "2", "--timeout-ms", "30000"),
        *("--consumer.config", str(config)),
        timeout_s=TIMEOUT_S,
    )
    assert out.splitlines()[-2:] == ["java-1", "java-2"]
