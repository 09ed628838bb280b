from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.apache_kafka import ApacheKafka, ApacheKafkaCluster
from tests.certs import Certificates, session_certs
from tests.integration.broker_process import BrokerProcess
from tests.integration.pipeline_topic import TieredTopic, create_tiered_topic
from tierbroker.testing import cluster_fixture

RACKS = ("a", "b", "c")


@pytest.fixture(scope="session")
def certs() -> Certificates:
    """The CA, broker and client certificates of the TLS tests, made once per session."""
    return session_certs()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A fresh broker with the shipped config, on a free port, in a temp dir."""
    process = BrokerProcess(tmp_path).start()
    yield process
    process.stop()
    assert "Traceback" not in process.log(), process.log()


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[type[BrokerProcess]]:
    """For tests that restart or configure the broker themselves; stops what they start."""
    started: list[BrokerProcess] = []

    class Factory(BrokerProcess):
        def start(self, timeout_s: float = 60.0) -> BrokerProcess:
            started.append(self)
            return super().start(timeout_s)

    yield Factory
    for process in started:
        process.kill()


@pytest.fixture(scope="session")
def tiered_topic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TieredTopic]:
    """200k records in a broker's remote tier, shared read-only by the pipeline tests."""
    topic = create_tiered_topic(tmp_path_factory.mktemp("pipeline"))
    yield topic
    topic.broker.stop()


@pytest.fixture(scope="session")
def apache_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApacheKafka]:
    """Apache Kafka, one KRaft node, shared by the tests that compare tierbroker with it."""
    kafka = ApacheKafka(tmp_path_factory.mktemp("apache-kafka")).start()
    yield kafka
    kafka.stop()


@pytest.fixture(scope="session")
def apache_kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApacheKafkaCluster]:
    """Apache Kafka, three KRaft nodes in racks a, b and c with Kafka's rack-aware replica
    selector, shared by the tests that compare a tierbroker cluster with it."""
    cluster = ApacheKafkaCluster(tmp_path_factory.mktemp("apache-kafka-cluster"), RACKS).start()
    yield cluster
    cluster.stop()


shared_tierbroker = cluster_fixture("session")
# The counterpart of `apache_kafka_cluster`: three brokers, racks a, b, c, follower fetching.
shared_tierbroker_cluster = cluster_fixture(
    "session", brokers=3, racks=RACKS, follower_fetching=True
)


@pytest.fixture(params=["tierbroker", "apache-kafka"])
def kafka_broker(request: pytest.FixtureRequest) -> str:
    """The bootstrap servers of tierbroker, then of Apache Kafka: a test using it asserts
    what both do, so tierbroker behaves as Apache Kafka. Topic names must be unique."""
    fixture = "shared_tierbroker" if request.param == "tierbroker" else "apache_kafka"
    return str(request.getfixturevalue(fixture).bootstrap_servers)
