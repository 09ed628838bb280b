"""Apache Kafka KRaft nodes on this machine for the benchmarks: one alone, or three in a
static quorum (`tests/apache_kafka.py`'s `ApacheKafka` and `ApacheKafkaCluster`), each
node broker and controller, with the JVM options of `kafka-server-start.sh`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from confluent_kafka.admin import AdminClient

from benchmarks.targets import KAFKA_JVM_OPTIONS
from tests.apache_kafka import ApacheKafka, ApacheKafkaCluster


@contextmanager
def kafka_nodes(workdir: Path, count: int) -> Iterator[list[ApacheKafka]]:
    """`count` nodes (1 or 3) with ids 1..count, all up; killed afterwards."""
    if count == 1:
        node = ApacheKafka(workdir / "kafka-1", jvm_options=KAFKA_JVM_OPTIONS)
        try:
            yield [node.start()]
        finally:
            node.stop()
        return
    cluster = ApacheKafkaCluster(workdir, ("a", "b", "c")[:count], KAFKA_JVM_OPTIONS)
    try:
        yield cluster.start().nodes
    finally:
        cluster.stop()


def wait_for_leader(bootstrap: str, topic: str, leader: int, timeout_s: float = 30.0) -> None:
    """Until the metadata shows `leader` leading every partition of `topic`."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions
        if partitions and all(p.leader == leader for p in partitions.values()):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{topic}: node {leader} does not lead every partition after {timeout_s}s")
