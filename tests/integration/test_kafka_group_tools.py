"""kafka-consumer-groups against tierbroker and Apache Kafka: describe, reset offsets
(dry run and execute) and delete print the same."""

from __future__ import annotations

from tests.apache_kafka import run_java
from tests.integration.kafka_tools import consumer_groups, unique

HEADER = "GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID"


def test_kafka_consumer_groups_describes_resets_and_deletes(kafka_broker: str) -> None:
    topic = unique("groups")
    group = f"{topic}-group"
    run_java("ProduceConsume.java", kafka_broker, topic, "2", "20", group)

    def groups(*args: str) -> list[list[str]]:
        return consumer_groups(kafka_broker, *args)

    def reset(*how: str) -> list[list[str]]:
        return groups("--reset-offsets", "--group", group, "--topic", topic, *how)

    def new_offsets(first: int, second: int) -> list[list[str]]:
        return [
            "GROUP TOPIC PARTITION NEW-OFFSET".split(),
            [group, topic, "0", str(first)],
            [group, topic, "1", str(second)],
        ]

    # Records keyed k0..k19 partition as Kafka's default partitioner puts them: 11 and 9.
    assert groups("--describe", "--group", group) == [
        HEADER.split(),
        [group, topic, "0", "11", "11", "0", "-", "-", "-"],
        [group, topic, "1", "9", "9", "0", "-", "-", "-"],
    ]
    assert reset("--to-offset", "5", "--dry-run") == new_offsets(5, 5)
    # ListOffsets by timestamp: the first record at or after it, else the log end.
    assert reset("--to-datetime", "2000-01-01T00:00:00.000", "--dry-run") == new_offsets(0, 0)
    warnings = [
        f"Warn: Partition {p} from topic {topic} is empty. Falling back to latest known offset."
        for p in (0, 1)
    ]
    assert reset("--to-datetime", "2100-01-01T00:00:00.000", "--dry-run") == sorted(
        new_offsets(11, 9) + [w.split() for w in warnings]
    )
    assert reset("--to-earliest", "--execute") == new_offsets(0, 0)
    assert reset("--shift-by", "3", "--execute") == new_offsets(3, 3)
    assert groups("--describe", "--group", group)[1:] == [
        [group, topic, "0", "3", "11", "8", "-", "-", "-"],
        [group, topic, "1", "3", "9", "6", "-", "-", "-"],
    ]
    state = groups("--describe", "--group", group, "--state")
    # The coordinator: "host:port (id)", which differs by broker.
    assert [row[:1] + row[3:] for row in state] == [
        "GROUP ASSIGNMENT-STRATEGY STATE #MEMBERS".split(),
        [group, "-", "Empty", "0"],
    ]
    assert groups("--delete", "--group", group) == [
        f"Deletion of requested consumer groups ('{group}') was successful.".split()
    ]
    assert [group] not in groups("--list")
