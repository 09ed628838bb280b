"""Apache Kafka KRaft nodes on this machine for the benchmarks: one alone, or several in
a static quorum, each node broker and controller, started as `tests/apache_kafka.py`
starts one, with the JVM options of `kafka-server-start.sh`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from confluent_kafka.admin import AdminClient

from benchmarks.targets import KAFKA_JVM_OPTIONS
from tests.apache_kafka import ApacheKafka


@contextmanager
def kafka_nodes(workdir: Path, count: int) -> Iterator[list[ApacheKafka]]:
    """`count` nodes with ids 1..count, all up (a node answers once a majority of the
    quorum runs, so they start at once); killed afterwards."""
    nodes = [
        ApacheKafka(workdir / f"kafka-{i}", KAFKA_JVM_OPTIONS, node_id=i)
        for i in range(1, count + 1)
    ]
    if count > 1:
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in nodes)
        for node in nodes:
            node.quorum = voters
            node.cluster_id = nodes[0].cluster_id
    try:
        with ThreadPoolExecutor(count) as pool:
            for started in [pool.submit(node.start) for node in nodes]:
                started.result()
        yield nodes
    finally:
        for node in nodes:
            node.stop()


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
