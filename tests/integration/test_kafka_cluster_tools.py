"""Kafka's tools against a three-broker tierbroker cluster: kafka-reassign-partitions
moves replicas, kafka-leader-election gives a partition back to its preferred leader,
and kafka-verifiable-producer / -consumer (Kafka's system-test correctness tools) lose
no acknowledged record while the leader is killed and restarted. Apache Kafka runs one
node here, so the expected lines are those Kafka's tools print (their sources)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.apache_kafka import run_tool, tool_command
from tests.integration.kafka_tools import reassign, unique, write
from tests.integration.waiting import wait_for
from tierbroker.testing import cluster_fixture
from tierbroker.testing.cluster import TierbrokerCluster

cluster = cluster_fixture("module", brokers=3)


def test_kafka_reassign_partitions_moves_replicas(
    cluster: TierbrokerCluster, tmp_path: Path
) -> None:
    topic = unique("move")
    cluster.create_topic(topic, partitions=1, replication_factor=1)
    cluster.produce(topic, [b"before"] * 5)
    source = cluster.leader(topic)
    target = [(source + 1) % 3, (source + 2) % 3]

    topics = write(tmp_path / "topics.json", json.dumps({"topics": [{"topic": topic}]}))
    generated = reassign(
        cluster.bootstrap_servers,
        *("--generate", "--topics-to-move-json-file", topics, "--broker-list", "0,1,2"),
    ).splitlines()
    assert generated[0] == "Current partition replica assignment"
    assert generated[3] == "Proposed partition reassignment configuration"
    (proposed,) = json.loads(generated[4])["partitions"]
    assert proposed["replicas"][0] in (0, 1, 2) and len(proposed["replicas"]) == 1

    plan = {
        "version": 1,
        "partitions": [{"topic": topic, "partition": 0, "replicas": target}],
    }
    plan_file = write(tmp_path / "plan.json", json.dumps(plan))
    executed = reassign(
        cluster.bootstrap_servers, "--execute", "--reassignment-json-file", plan_file
    )
    assert executed.splitlines()[-1] == f"Successfully started partition reassignment for {topic}-0"
    cluster.wait_for(
        lambda: cluster.isr(topic) == set(target) and cluster.leader(topic) in target,
        f"{topic}-0 moved to brokers {target}",
    )
    verified = reassign(
        cluster.bootstrap_servers, "--verify", "--reassignment-json-file", plan_file
    )
    assert verified.splitlines() == [
        "Status of partition reassignment:",
        f"Reassignment of partition {topic}-0 is completed.",
        "",
        "Clearing broker-level throttles on brokers 0,1,2",
        f"Clearing topic-level throttles on topic {topic}",
    ]
    assert [r.value for r in cluster.records(topic)] == [b"before"] * 5

    # The new replicas hold the whole log, the old one is gone.
    log_dirs = run_tool(
        "LogDirsCommand",
        *("--bootstrap-server", cluster.bootstrap_servers, "--describe", "--topic-list", topic),
    ).splitlines()
    assert log_dirs[1] == "Received log directory information from brokers 0,1,2"
    sizes = {
        broker["broker"]: [(p["partition"], p["size"]) for p in log_dir["partitions"]]
        for broker in json.loads(log_dirs[2])["brokers"]
        for log_dir in broker["logDirs"]
    }
    (size,) = {size for _, size in sizes[target[0]]}
    assert size > 0
    assert sizes == {source: [], **{b: [(f"{topic}-0", size)] for b in target}}


def test_kafka_leader_election_restores_preferred_leaders(cluster: TierbrokerCluster) -> None:
    topic = unique("preferred")
    cluster.create_topic(topic, partitions=6, replication_factor=3)
    preferred = {p: cluster.leader(topic, p) for p in range(6)}  # a new topic's leaders
    crashed = preferred[0]
    first, second = [p for p, leader in preferred.items() if leader == crashed]
    cluster.kill_broker(crashed)
    cluster.start_broker(crashed)
    cluster.wait_for(
        lambda: all(crashed in cluster.isr(topic, p) for p in range(6)),
        f"broker {crashed} back in every ISR",
    )
    assert cluster.leader(topic, first) != crashed and cluster.leader(topic, second) != crashed

    def elect(*which: str) -> list[str]:
        return run_tool(
            "LeaderElectionCommand",
            *("--bootstrap-server", cluster.bootstrap_servers, "--election-type", "preferred"),
            *which,
        ).splitlines()

    success = "Successfully completed leader election (PREFERRED) for partitions "
    assert elect("--topic", topic, "--partition", str(first)) == [f"{success}{topic}-{first}"]
    assert cluster.leader(topic, first) == crashed
    # Every partition: the controller answers for those it elected (the crash also moved
    # leaders of internal topics), and the tool names them.
    (elected,) = elect("--all-topic-partitions")
    assert elected.startswith(success)
    assert f"{topic}-{second}" in elected.removeprefix(success).split(", ")
    assert f"{topic}-{first}" not in elected.removeprefix(success).split(", ")
    assert cluster.leader(topic, second) == crashed
    assert elect("--all-topic-partitions") == []


def events(path: Path, name: str) -> list[dict[str, Any]]:
    """The JSON events called `name` a verifiable tool wrote to `path`."""
    lines = path.read_text().split("\n")[:-1]  # the last line may be half written yet
    return [e for e in map(json.loads, lines) if e["name"] == name]


def test_verifiable_producer_and_consumer_lose_nothing_acked_when_the_leader_dies(
    cluster: TierbrokerCluster, tmp_path: Path
) -> None:
    topic = unique("verifiable")
    cluster.create_topic(
        topic, partitions=1, replication_factor=3, config={"min.insync.replicas": 2}
    )
    produced, consumed = tmp_path / "producer.jsonl", tmp_path / "consumer.jsonl"
    consumer = background(
        consumed,
        "VerifiableConsumer",
        *("--bootstrap-server", cluster.bootstrap_servers, "--topic", topic),
        *("--group-id", f"{topic}-group", "--reset-policy", "earliest", "--verbose"),
    )
    producer = background(
        produced,
        "VerifiableProducer",
        *("--bootstrap-server", cluster.bootstrap_servers, "--topic", topic),
        *("--max-messages", "-1", "--throughput", "1000", "--acks", "-1"),
    )

    def acked_at_least(count: int) -> bool:
        return len(events(produced, "producer_send_success")) >= count

    try:
        wait_for(lambda: acked_at_least(1000), "a thousand records acknowledged")
        leader = cluster.leader(topic)
        cluster.kill_broker(leader)
        cluster.start_broker(leader)
        restarted = len(events(produced, "producer_send_success"))
        wait_for(lambda: acked_at_least(restarted + 1000), "a thousand more acknowledged")
        producer.terminate()  # it stops sending, flushes and prints its summary
        producer.wait(timeout=60)
        # The tool does not retry (its producer has retries=0, as in Kafka's system
        # tests): records in flight when the leader dies fail; every one acked must stay.
        (summary,) = events(produced, "tool_data")
        acked = {
            (e["partition"], e["offset"], e["value"])
            for e in events(produced, "producer_send_success")
        }
        assert len(acked) == summary["acked"]

        def missing() -> set[tuple[int, int, str]]:
            read = {
                (e["partition"], e["offset"], e["value"]) for e in events(consumed, "record_data")
            }
            return acked - read

        wait_for(
            lambda: not missing(),
            "every acknowledged record consumed",
            show=lambda: f"{len(missing())} missing, first {sorted(missing())[:5]}",
        )
    finally:
        for tool in (producer, consumer):
            tool.kill()
            tool.wait()


def background(output: Path, tool: str, *args: str) -> subprocess.Popen[bytes]:
    """Kafka's tool `tool` running, its standard output going to `output`."""
    with open(output, "wb") as out:
        return subprocess.Popen(tool_command(tool, *args), stdout=out)
