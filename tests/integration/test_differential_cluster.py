"""The differential suite's cluster scenario: metadata for an offline and an
under-replicated partition, from three Apache Kafka nodes and three tierbroker brokers
after the third of each crashed.

Each side creates two topics with explicit replicas: `diff-offline` on the third node
alone, `diff-under` on all three (the first leading), then the third node is killed. Once
its controller has taken it out (its leadership gone, the ISR shrunk), the first node's
Metadata answer for both topics is compared field by field, node ids renumbered by rank.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.apache_kafka import ApacheKafkaCluster
from tests.integration.differential import Side, differences, matches
from tests.integration.differential_requests import metadata
from tests.integration.test_differential import ACCEPTED
from tests.integration.waiting import wait_for
from tests.integration.wire import create_topic
from tierbroker.testing import TierbrokerCluster, cluster_fixture

pytestmark = pytest.mark.slow

SCENARIO = "offline_and_under_replicated"  # its accepted differences: test_differential.py
TOPICS = ["diff-offline", "diff-under"]
NODE_FIELDS = {"leader_id", "replica_nodes", "isr_nodes", "offline_replicas"}
NO_SELF = -1000

three_tierbrokers = cluster_fixture("module", brokers=3)


@pytest.fixture(scope="module")
def three_kafkas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApacheKafkaCluster]:
    # A crashed node is fenced after broker.session.timeout.ms (9 s by default).
    fencing = {"broker.session.timeout.ms": "3000", "broker.heartbeat.interval.ms": "500"}
    cluster = ApacheKafkaCluster(Path(tmp_path_factory.mktemp("kafka-3")), properties=fencing)
    yield cluster.start()
    cluster.stop()


def renumbered(value: Any, ranks: dict[int, str], field: str = "") -> Any:
    """Node ids as their rank ("node-0" is the first node); -1 (none) stays."""
    if isinstance(value, dict):
        return {k: renumbered(v, ranks, k) for k, v in value.items()}
    if isinstance(value, list):
        return [renumbered(v, ranks, field) for v in value]
    if field in NODE_FIELDS and isinstance(value, int) and value >= 0:
        return ranks[value]
    return value


def after_a_crash(side: Side, nodes: list[int], crash: Callable[[int], None]) -> Any:
    """Both topics' metadata from the first node once the third has crashed."""
    third = nodes[-1]
    create_topic(side.client, "diff-offline", replicas=[third])
    create_topic(side.client, "diff-under", replicas=nodes)

    def shows(leader: int, isr_size: int) -> dict[str, Any] | None:
        """The metadata, once the node asked shows diff-offline led by `leader` and
        diff-under with an ISR of `isr_size`; a topic just created may reach it later."""
        answer = metadata(side, TOPICS)
        offline = (answer or {}).get("diff-offline", {}).get("partitions") or [{}]
        under = (answer or {}).get("diff-under", {}).get("partitions") or [{}]
        if offline[0].get("leader_id") == leader and len(under[0].get("isr_nodes", ())) == isr_size:
            return answer
        return None

    wait_for(lambda: shows(third, 3), "both topics led and in sync", timeout_s=30)
    crash(third)
    answer = wait_for(
        lambda: shows(-1, 2),
        "the crashed node out of the leaders and the ISR",
        timeout_s=60,
        show=lambda: metadata(side, TOPICS),
    )
    return renumbered(answer, {node: f"node-{rank}" for rank, node in enumerate(nodes)})


def test_offline_and_under_replicated_partitions_are_described_as_kafka_does(
    three_kafkas: ApacheKafkaCluster, three_tierbrokers: TierbrokerCluster
) -> None:
    kafka_nodes = [node.node_id for node in three_kafkas.nodes]
    ours = sorted(broker.broker_id for broker in three_tierbrokers.brokers)
    # No node is "self" (NO_SELF is no node's id): every id is renumbered instead.
    kafka = Side("Apache Kafka", three_kafkas.nodes[0].port, NO_SELF)
    tierbroker = Side("tierbroker", three_tierbrokers.broker(ours[0]).port, NO_SELF)
    try:
        expected = after_a_crash(kafka, kafka_nodes, lambda n: three_kafkas.nodes[n - 1].stop())
        answered = after_a_crash(tierbroker, ours, three_tierbrokers.kill_broker)
    finally:
        kafka.close()
        tierbroker.close()
    accepted = [pattern for (where, pattern) in ACCEPTED if where == SCENARIO]
    found = {path: (k, o) for path, k, o in differences(expected, answered)}
    unexplained = [
        f"{path}: Apache Kafka {k!r}, tierbroker {o!r}"
        for path, (k, o) in found.items()
        if not any(matches(path, pattern) for pattern in accepted)
    ]
    stale = [p for p in accepted if not any(matches(path, p) for path in found)]
    assert not unexplained, "\n".join(unexplained)
    assert not stale, f"accepted differences that no longer appear: {stale}"
