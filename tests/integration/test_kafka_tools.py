"""Kafka's command-line tools, run as their classes, against tierbroker and Apache Kafka:
each works and prints the same, but for ids (topic ids, node ids)."""

from __future__ import annotations

import re
import uuid

from tests.apache_kafka import run_java, run_tool
from tierbroker.testing.clients import produce


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def kafka_topics(bootstrap: str, *args: str) -> str:
    return run_tool("TopicCommand", "--bootstrap-server", bootstrap, *args)


def test_kafka_topics_creates_lists_and_describes(kafka_broker: str) -> None:
    topic = unique("topics")
    created = kafka_topics(
        kafka_broker,
        *("--create", "--topic", topic, "--partitions", "2", "--replication-factor", "1"),
        *("--config", "retention.ms=1234"),
    )
    assert created == f"Created topic {topic}.\n"
    assert topic in kafka_topics(kafka_broker, "--list").splitlines()

    described = kafka_topics(kafka_broker, "--describe", "--topic", topic)
    # Accepted difference: Kafka 4.x formats its storage with ELR (KIP-966) on, which
    # stores a cluster-wide min.insync.replicas that tierbroker, without ELR, lacks.
    described = described.replace("Configs: min.insync.replicas=1,", "Configs: ")
    described = re.sub(r"TopicId: \S+", "TopicId: ID", described)
    described = re.sub(r"(Leader|Replicas|Isr): \d+", r"\1: N", described)
    row = f"\tTopic: {topic}\tPartition: %d\tLeader: N\tReplicas: N\tIsr: N\tElr: \tLastKnownElr: "
    assert described.splitlines() == [
        f"Topic: {topic}\tTopicId: ID\tPartitionCount: 2\tReplicationFactor: 1\t"
        "Configs: retention.ms=1234",
        row % 0,
        row % 1,
    ]


def test_kafka_configs_describes_a_topic_with_sources(kafka_broker: str) -> None:
    topic = unique("configs")
    kafka_topics(
        kafka_broker,
        *("--create", "--topic", topic, "--partitions", "1", "--replication-factor", "1"),
        *("--config", "retention.ms=1234"),
    )
    described = run_tool(
        "ConfigCommand",
        *("--bootstrap-server", kafka_broker, "--describe"),
        *("--entity-type", "topics", "--entity-name", topic),
    )
    assert described.splitlines() == [
        f"Dynamic configs for topic {topic} are:",
        "  retention.ms=1234 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:retention.ms=1234}",
    ]


def test_kafka_get_offsets_prints_latest_earliest_and_tiered(kafka_broker: str) -> None:
    topic = unique("offsets")
    kafka_topics(
        kafka_broker,
        *("--create", "--topic", topic, "--partitions", "2", "--replication-factor", "1"),
    )
    produce(kafka_broker, topic, [b"a"] * 7, partition=0)
    produce(kafka_broker, topic, [b"b"] * 3, partition=1)

    def offsets(time: str) -> list[str]:
        out = run_tool(
            "GetOffsetShell", "--bootstrap-server", kafka_broker, "--topic", topic, "--time", time
        )
        return out.splitlines()

    assert offsets("-1") == [f"{topic}:0:7", f"{topic}:1:3"]
    assert offsets("-2") == [f"{topic}:0:0", f"{topic}:1:0"]
    assert offsets("-4") == [f"{topic}:0:0", f"{topic}:1:0"]  # earliest local
    assert offsets("-5") == []  # latest tiered: none without a remote tier, so no line


def test_kafka_consumer_groups_describes_and_resets_offsets(kafka_broker: str) -> None:
    topic = unique("groups")
    group = f"{topic}-group"
    run_java("ProduceConsume.java", kafka_broker, topic, "2", "20", group)

    def consumer_groups(*args: str) -> list[list[str]]:
        out = run_tool(
            "consumer.group.ConsumerGroupCommand", "--bootstrap-server", kafka_broker, *args
        )
        return sorted(line.split() for line in out.splitlines() if line.strip())

    header = "GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID"
    # Records keyed k0..k19 partition as Kafka's default partitioner puts them: 11 and 9.
    assert consumer_groups("--describe", "--group", group) == [
        header.split(),
        [group, topic, "0", "11", "11", "0", "-", "-", "-"],
        [group, topic, "1", "9", "9", "0", "-", "-", "-"],
    ]
    reset = ("--reset-offsets", "--group", group, "--topic", topic, "--to-earliest", "--execute")
    assert consumer_groups(*reset) == [
        "GROUP TOPIC PARTITION NEW-OFFSET".split(),
        [group, topic, "0", "0"],
        [group, topic, "1", "0"],
    ]
    assert consumer_groups("--describe", "--group", group)[1:] == [
        [group, topic, "0", "0", "11", "11", "-", "-", "-"],
        [group, topic, "1", "0", "9", "9", "-", "-", "-"],
    ]
