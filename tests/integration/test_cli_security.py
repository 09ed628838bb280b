"""The command line against a secured listener: every command reaches a SASL_SSL listener
that asks for client certificates, with Kafka's client properties in `--command-config`
(PKCS12 stores, PLAIN through `sasl.jaas.config`), those on librdkafka and those speaking
the protocol themselves (`acl`) alike; without it, or with a wrong password, a command
fails with one line."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.certs import STORE_PASSWORD, Certificates
from tests.integration.broker_process import executable
from tierbroker.broker.server.embedded import EmbeddedCluster

PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, certs: Certificates
) -> Iterator[EmbeddedCluster]:
    properties = {
        "listeners": "SECURE://127.0.0.1:0,PLAINTEXT://127.0.0.1:0",
        "listener.security.protocol.map": "SECURE:SASL_SSL,PLAINTEXT:PLAINTEXT",
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": str(certs.broker.p12),
        "ssl.keystore.password": STORE_PASSWORD,
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(certs.ca.cert),
        "ssl.client.auth": "required",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.secure.plain.sasl.jaas.config": (
            f'{PLAIN_MODULE} required user_admin="admin-pw";'
        ),
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:admin;User:ANONYMOUS",
        "offsets.topic.num.partitions": "1",
        "log.dir.min.free.bytes": "0",
        "group.initial.rebalance.delay.ms": "0",
    }
    directory: Path = tmp_path_factory.mktemp("cli-security")
    with EmbeddedCluster(directory, properties=properties) as cluster:
        yield cluster


def command_config(directory: Path, certs: Certificates, password: str = "admin-pw") -> Path:
    path = directory / "client.properties"
    path.write_text(
        "security.protocol=SASL_SSL\n"
        "sasl.mechanism=PLAIN\n"
        f'sasl.jaas.config={PLAIN_MODULE} required username="admin" password="{password}";\n'
        "ssl.truststore.type=PKCS12\n"
        f"ssl.truststore.location={certs.truststore_p12}\n"
        f"ssl.truststore.password={STORE_PASSWORD}\n"
        "ssl.keystore.type=PKCS12\n"
        f"ssl.keystore.location={certs.client.p12}\n"
        f"ssl.keystore.password={STORE_PASSWORD}\n"
    )
    return path


def tierbroker(
    cluster: EmbeddedCluster, config: Path | None, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    secure = cluster.brokers[0].endpoints.listener("SECURE")
    options = ["--command-config", str(config)] if config is not None else []
    return subprocess.run(
        [executable("tierbroker", "pip install -e ."), *options, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env={"TIERBROKER_BOOTSTRAP": f"{secure.host}:{secure.port}", "PATH": "/usr/bin:/bin"},
    )


def test_every_kind_of_command_works_through_the_command_config(
    cluster: EmbeddedCluster, certs: Certificates, tmp_path: Path
) -> None:
    config = command_config(tmp_path, certs)
    created = tierbroker(cluster, config, "topic", "create", "secured", "-p", "2")
    assert created.returncode == 0, created.stderr
    produced = tierbroker(cluster, config, "produce", "secured", stdin="a\nb\nc\n")
    assert produced.returncode == 0, produced.stderr
    consumed = tierbroker(cluster, config, "consume", "secured", "--offset", "beginning", "-e")
    assert consumed.returncode == 0, consumed.stderr
    assert sorted(consumed.stdout.split()) == ["a", "b", "c"]
    added = tierbroker(
        cluster, config, "acl", "add", "--allow-principal", "User:alice", "--operation", "Read",
        "--topic", "secured",
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    listed = tierbroker(cluster, config, "acl", "list", "--topic", "secured", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    assert [(a["principal"], a["operation"]) for a in json.loads(listed.stdout)] == [
        ("User:alice", "READ")
    ]


def test_without_the_command_config_or_with_a_wrong_password_a_command_fails_in_a_line(
    cluster: EmbeddedCluster, certs: Certificates, tmp_path: Path
) -> None:
    for config in (None, command_config(tmp_path, certs, password="wrong")):
        done = tierbroker(cluster, config, "topic", "list", "--timeout", "2")
        assert done.returncode == 1
        assert done.stderr.startswith("error: list topics: ") and done.stderr.count("\n") == 1
    wrong = tierbroker(cluster, tmp_path / "missing.properties", "topic", "list")
    assert wrong.returncode == 2
    assert "--command-config" in wrong.stderr and "cannot read it" in wrong.stderr
