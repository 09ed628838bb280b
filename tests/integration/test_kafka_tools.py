"""Kafka's command-line tools, run as their classes, against tierbroker and Apache Kafka:
each works and prints the same, but for ids (topic ids, node ids)."""

from __future__ import annotations

import re

from tests.apache_kafka import run_tool
from tests.integration.kafka_tools import kafka_topics, unique
from tierbroker.testing.clients import produce


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
        "kafka.admin.ConfigCommand",  # kafka-configs.sh's class in Kafka 4.3
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


def test_perf_tools_produce_and_consume_every_record(kafka_broker: str) -> None:
    topic = unique("perf")
    kafka_topics(
        kafka_broker,
        *("--create", "--topic", topic, "--partitions", "2", "--replication-factor", "1"),
    )
    produced = run_tool(
        "ProducerPerformance",
        *("--topic", topic, "--num-records", "20000", "--record-size", "100"),
        *("--throughput", "-1", "--command-property", f"bootstrap.servers={kafka_broker}"),
        "acks=all",
    )
    # The summary: "20000 records sent, R records/sec (M MB/sec), L ms avg latency, ...".
    assert re.fullmatch(r"20000 records sent, [\d.]+ records/sec .*", produced.splitlines()[-1])

    consumed = run_tool(
        "ConsumerPerformance",
        *("--bootstrap-server", kafka_broker, "--topic", topic, "--num-records", "20000"),
    ).splitlines()
    header = [name.strip() for name in consumed[0].split(",")]
    summary = dict(zip(header, (value.strip() for value in consumed[1].split(",")), strict=True))
    assert summary["data.consumed.in.nMsg"] == "20000"
    assert float(summary["data.consumed.in.MB"]) == round(20000 * 100 / 1024 / 1024, 4)


def test_kafka_configs_sets_the_cluster_wide_broker_defaults(kafka_broker: str) -> None:
    command = ("kafka.admin.ConfigCommand", "--bootstrap-server", kafka_broker)
    default = ("--entity-type", "brokers", "--entity-default")
    setting = ("--add-config", "log.index.interval.bytes=4096")  # its default: harmless
    altered = run_tool(*command, "--alter", *default, *setting)
    try:
        described = run_tool(*command, "--describe", *default)
    finally:
        run_tool(*command, "--alter", *default, "--delete-config", "log.index.interval.bytes")
    assert altered == "Completed updating default config for brokers in the cluster.\n"
    # Accepted difference: the cluster-wide min.insync.replicas Kafka 4.x stores (ELR).
    shown = [line for line in described.splitlines() if "min.insync.replicas" not in line]
    assert shown == [
        "Default configs for brokers in the cluster are:",
        "  log.index.interval.bytes=4096 sensitive=false synonyms="
        "{DYNAMIC_DEFAULT_BROKER_CONFIG:log.index.interval.bytes=4096}",
    ]
