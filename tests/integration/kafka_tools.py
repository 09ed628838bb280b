"""Helpers of the tests that run Kafka's command-line tools (tests/apache_kafka.py's
`run_tool`) against tierbroker and Apache Kafka."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

from tests.apache_kafka import run_tool


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def kafka_topics(bootstrap: str, *args: str) -> str:
    return run_tool("TopicCommand", "--bootstrap-server", bootstrap, *args)


def create_topic(bootstrap: str, topic: str, partitions: int, replication_factor: int) -> None:
    kafka_topics(
        bootstrap,
        *("--create", "--topic", topic, "--partitions", str(partitions)),
        *("--replication-factor", str(replication_factor)),
    )


def leaders(bootstrap: str, topic: str) -> list[int]:
    """Each partition's leader, as kafka-topics --describe prints it."""
    described = kafka_topics(bootstrap, "--describe", "--topic", topic)
    return [int(n) for n in re.findall(r"Leader: (\d+)", described)]


def consumer_groups(bootstrap: str, *args: str) -> list[list[str]]:
    """kafka-consumer-groups' output, as sorted rows of words."""
    out = run_tool("consumer.group.ConsumerGroupCommand", "--bootstrap-server", bootstrap, *args)
    return sorted(line.split() for line in out.splitlines() if line.strip())


def reassign(bootstrap: str, *args: str) -> str:
    return run_tool("reassign.ReassignPartitionsCommand", "--bootstrap-server", bootstrap, *args)


def describe_transaction(bootstrap: str, transactional_id: str) -> str:
    """kafka-transactions.sh describe: the transaction's state, epoch, partitions."""
    return run_tool(
        "TransactionsCommand",
        *("--bootstrap-server", bootstrap, "describe", "--transactional-id", transactional_id),
    )


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)
