"""kafka-reassign-partitions, kafka-leader-election and kafka-log-dirs against one
tierbroker and one Apache Kafka node: each works and prints the same, but for node ids
and log directories (normalised to N and DIR)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from tests.apache_kafka import run_tool
from tests.integration.kafka_tools import create_topic, leaders, reassign, unique, write
from tierbroker.testing.clients import produce


def test_kafka_reassign_partitions_generates_executes_and_verifies(
    kafka_broker: str, tmp_path: Path
) -> None:
    topic = unique("reassign")
    create_topic(kafka_broker, topic, partitions=2, replication_factor=1)
    node = leaders(kafka_broker, topic)[0]

    def normalised(out: str) -> list[str]:
        out = re.sub(r'"log_dirs":\["/[^"]+"\]', '"log_dirs":["DIR"]', out)
        out = out.replace(f'"replicas":[{node}]', '"replicas":[N]')
        return out.replace(f"on broker {node}\n", "on broker N\n").splitlines()

    def assignment(log_dir: str) -> str:
        partitions = ",".join(
            f'{{"topic":"{topic}","partition":{p},"replicas":[N],"log_dirs":["{log_dir}"]}}'
            for p in (0, 1)
        )
        return f'{{"version":1,"partitions":[{partitions}]}}'

    topics = write(tmp_path / "topics.json", json.dumps({"topics": [{"topic": topic}]}))
    generated = reassign(
        kafka_broker, "--generate", "--topics-to-move-json-file", topics, "--broker-list", str(node)
    )
    assert normalised(generated) == [
        "Current partition replica assignment",
        assignment("DIR"),
        "",
        "Proposed partition reassignment configuration",
        assignment("any"),
    ]

    plan = write(tmp_path / "plan.json", generated.splitlines()[-1])
    executed = reassign(kafka_broker, "--execute", "--reassignment-json-file", plan)
    assert normalised(executed) == [
        "Current partition replica assignment",
        "",
        assignment("DIR"),
        "",
        "Save this to use as the --reassignment-json-file option during rollback",
        f"Successfully started partition reassignments for {topic}-0,{topic}-1",
    ]
    verified = reassign(kafka_broker, "--verify", "--reassignment-json-file", plan)
    assert normalised(verified) == [
        "Status of partition reassignment:",
        f"Reassignment of partition {topic}-0 is completed.",
        f"Reassignment of partition {topic}-1 is completed.",
        "",
        "Clearing broker-level throttles on broker N",
        f"Clearing topic-level throttles on topic {topic}",
    ]


def test_kafka_leader_election_finds_preferred_leaders_elected(kafka_broker: str) -> None:
    topic = unique("election")
    create_topic(kafka_broker, topic, partitions=1, replication_factor=1)

    def elect(*which: str) -> str:
        return run_tool(
            "LeaderElectionCommand",
            *("--bootstrap-server", kafka_broker, "--election-type", "preferred", *which),
        )

    assert elect("--topic", topic, "--partition", "0") == (
        f"Valid replica already elected for partitions {topic}-0\n"
    )
    # Every partition has its preferred leader: the controller names none.
    assert elect("--all-topic-partitions") == ""


def test_kafka_log_dirs_describes_each_replica(kafka_broker: str) -> None:
    topic = unique("logdirs")
    create_topic(kafka_broker, topic, partitions=2, replication_factor=1)
    produce(kafka_broker, topic, [b"x" * 100], partition=0)
    out = run_tool(
        "LogDirsCommand",
        *("--bootstrap-server", kafka_broker, "--describe", "--topic-list", topic),
    ).splitlines()
    node = leaders(kafka_broker, topic)[0]
    assert out[:2] == [
        "Querying brokers for log directories information",
        f"Received log directory information from brokers {node}",
    ]
    described = json.loads(out[2])
    (broker,) = described["brokers"]
    (log_dir,) = broker["logDirs"]
    assert (described["version"], broker["broker"], log_dir["error"]) == (1, node, None)
    # One batch holding one 100-byte value: a 61-byte batch header and a 109-byte record.
    assert sorted(log_dir["partitions"], key=lambda p: p["partition"]) == [
        {"partition": f"{topic}-0", "size": 170, "offsetLag": 0, "isFuture": False},
        {"partition": f"{topic}-1", "size": 0, "offsetLag": 0, "isFuture": False},
    ]


def test_deleting_unset_broker_configs_succeeds(kafka_broker: str) -> None:
    """What kafka-reassign-partitions --verify does to clear replication throttles."""
    admin = AdminClient({"bootstrap.servers": kafka_broker})
    (node,) = admin.list_topics(timeout=10).brokers
    throttles = [
        ConfigEntry(name, None, incremental_operation=AlterConfigOpType.DELETE)
        for name in ("leader.replication.throttled.rate", "follower.replication.throttled.rate")
    ]
    resource = ConfigResource(ResourceType.BROKER, str(node), incremental_configs=throttles)
    (future,) = admin.incremental_alter_configs([resource]).values()
    assert future.result(timeout=10) is None
