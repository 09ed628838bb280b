"""kafka-python against the broker: 5,000 records (keys, headers, a null value, explicit
timestamps) come back identical through assign() + seek_to_beginning(); offsets are those
Apache Kafka would report; KafkaAdminClient creates, lists, describes and deletes topics."""

from __future__ import annotations

import time
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.broker_process import BrokerProcess

# kafka-python 3 loads its protocol schemas with importlib.resources.read_text/open_text,
# deprecated since Python 3.11: the library's warning, not the broker's (filterwarnings=error).
# Schemas load at import and lazily, so the filter holds for the import and the tests.
LEGACY_RESOURCES = r"(read|open)_text is deprecated"
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", LEGACY_RESOURCES, DeprecationWarning)
    import kafka.errors as errors
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

pytestmark = pytest.mark.filterwarnings(f"ignore:{LEGACY_RESOURCES}:DeprecationWarning")

COUNT = 5_000
PARTITIONS = 3
NULL_VALUE_AT = 42

Headers = list[tuple[str, bytes]]
Row = tuple[int, bytes | None, bytes | None, Headers, int]


@pytest.fixture
def admin(broker: BrokerProcess) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    yield client
    client.close()


def create_topic(admin: KafkaAdminClient, topic: str, partitions: int = PARTITIONS) -> None:
    admin.create_topics(
        {topic: {"num_partitions": partitions, "replication_factor": 1}},
        wait_for_metadata=True,
    )


def make_records(base_ts: int) -> list[tuple[int, bytes, bytes | None, Headers, int]]:
    return [
        (
            i % PARTITIONS,
            b"key-%d" % i,
            None if i == NULL_VALUE_AT else b"value-%d-" % i * 6,
            # kafka-python refuses null header values (only (str, bytes)): an empty one.
            [("seq", b"%d" % i), ("maybe-empty", b"" if i % 5 == 0 else b"set")],
            base_ts + i * 10 + (i * 7919) % 23,  # not monotonic within a partition
        )
        for i in range(COUNT)
    ]


@pytest.mark.parametrize("codec", [None, "gzip"])  # kafka-python has only gzip built in
def test_round_trip(broker: BrokerProcess, admin: KafkaAdminClient, codec: str | None) -> None:
    topic = f"kp-{codec or 'none'}"
    create_topic(admin, topic)
    base_ts = int(time.time() * 1000) - 3_600_000
    records = make_records(base_ts)

    producer = KafkaProducer(
        bootstrap_servers=broker.bootstrap,
        enable_idempotence=False,
        acks=1,
        compression_type=codec,
        linger_ms=5,
    )
    try:
        futures = [
            producer.send(topic, value, key=key, headers=headers, partition=p, timestamp_ms=ts)
            for p, key, value, headers, ts in records
        ]
        producer.flush(30)
        metadata = [f.get(timeout=30) for f in futures]
    finally:
        producer.close(timeout=10)
    expected: dict[int, list[Row]] = {p: [] for p in range(PARTITIONS)}
    for (p, key, value, headers, ts), md in zip(records, metadata, strict=True):
        # Each send was acknowledged with the next offset of its partition.
        assert (md.topic, md.partition, md.offset) == (topic, p, len(expected[p]))
        expected[p].append((md.offset, key, value, headers, ts))

    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    consumer = KafkaConsumer(
        bootstrap_servers=broker.bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="none",
    )
    try:
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        got: dict[int, list[Row]] = {p: [] for p in range(PARTITIONS)}
        total = 0
        deadline = time.monotonic() + 30
        while total < COUNT:
            assert time.monotonic() < deadline, f"only {total} of {COUNT} records in 30 s"
            batch = consumer.poll(timeout_ms=1000, max_records=500)
            assert sum(len(rs) for rs in batch.values()) <= 500
            for tp, rs in batch.items():
                for r in rs:
                    assert r.timestamp_type == 0  # CreateTime
                    got[tp.partition].append(
                        (r.offset, r.key, r.value, list(r.headers), r.timestamp)
                    )
                total += len(rs)
        assert got == expected
        assert consumer.poll(timeout_ms=300) == {}, "records beyond those produced"
        sizes = {tp: len(expected[tp.partition]) for tp in tps}
        assert {tp: consumer.position(tp) for tp in tps} == sizes
        assert consumer.end_offsets(tps) == sizes
        assert consumer.beginning_offsets(tps) == dict.fromkeys(tps, 0)

        def first_at_or_after(partition: int, ts: int) -> int:
            return next(r[0] for r in expected[partition] if r[4] >= ts)

        middle = {tp: expected[tp.partition][len(expected[tp.partition]) // 2][4] for tp in tps}
        found = consumer.offsets_for_times(middle)
        for tp in tps:
            offset = first_at_or_after(tp.partition, middle[tp])
            assert found[tp] is not None, tp
            assert (found[tp].offset, found[tp].timestamp) == (
                offset,
                expected[tp.partition][offset][4],
            ), tp
        before = consumer.offsets_for_times(dict.fromkeys(tps, base_ts - 1000))
        assert {tp: o.offset for tp, o in before.items() if o is not None} == dict.fromkeys(tps, 0)
        # After the last timestamp Kafka answers offset -1: kafka-python reports None.
        last = max(r[4] for rows in expected.values() for r in rows)
        assert consumer.offsets_for_times(dict.fromkeys(tps, last + 1)) == dict.fromkeys(tps, None)
    finally:
        consumer.close()


def topic_named(admin: KafkaAdminClient, name: str) -> dict[str, Any]:
    [topic] = admin.describe_topics([name])
    return topic  # type: ignore[no-any-return]


def test_admin_create_list_describe_delete(admin: KafkaAdminClient) -> None:
    result = admin.create_topics(
        {
            "kp-admin-a": {"num_partitions": 4, "replication_factor": 1},
            # num_partitions / replication_factor -1: the broker's defaults (KIP-464).
            "kp-admin-b": {"configs": {"retention.ms": "3600000"}},
        },
        wait_for_metadata=True,
    )
    assert {t["name"]: t["error_code"] for t in result["topics"]} == {
        "kp-admin-a": 0,
        "kp-admin-b": 0,
    }
    by_name = {t["name"]: t for t in result["topics"]}
    assert by_name["kp-admin-a"]["num_partitions"] == 4
    assert by_name["kp-admin-b"]["num_partitions"] == 1  # num.partitions=1
    assert by_name["kp-admin-b"]["replication_factor"] == 1

    assert {"kp-admin-a", "kp-admin-b"} <= set(admin.list_topics())
    a = topic_named(admin, "kp-admin-a")
    assert a["error_code"] == 0
    assert sorted(
        (p["partition_index"], p["leader_id"], list(p["replica_nodes"]), list(p["isr_nodes"]))
        for p in a["partitions"]
    ) == [(p, 0, [0], [0]) for p in range(4)]

    # Creating an existing topic is refused with TOPIC_ALREADY_EXISTS.
    with pytest.raises(errors.TopicAlreadyExistsError):
        admin.create_topics({"kp-admin-a": {"num_partitions": 1, "replication_factor": 1}})

    # Delete one by name and the other by topic id (DeleteTopics v6+, KIP-516).
    b_id = uuid.UUID(str(topic_named(admin, "kp-admin-b")["topic_id"]))
    assert b_id.int != 0
    # Metadata names the id CreateTopics (v7) answered.
    assert uuid.UUID(str(by_name["kp-admin-b"]["topic_id"])) == b_id
    deleted = admin.delete_topics(["kp-admin-a"])
    assert [t["error_code"] for t in deleted["topics"]] == [0]
    deleted = admin.delete_topics([b_id])
    assert [t["error_code"] for t in deleted["topics"]] == [0]

    deadline = time.monotonic() + 10
    while {"kp-admin-a", "kp-admin-b"} & set(admin.list_topics()):
        assert time.monotonic() < deadline, admin.list_topics()
        time.sleep(0.1)
    # Deleting it again: UNKNOWN_TOPIC_OR_PARTITION.
    with pytest.raises(errors.UnknownTopicOrPartitionError):
        admin.delete_topics(["kp-admin-a"])


def topic_configs(admin: KafkaAdminClient, topic: str) -> dict[str, dict[str, Any]]:
    described = admin.describe_configs(
        [ConfigResource(ConfigResourceType.TOPIC, topic)], config_filter="all"
    )
    return described["topic"][topic]  # type: ignore[no-any-return]


def test_admin_describe_configs_values(admin: KafkaAdminClient) -> None:
    """An override reads back as set; defaults read back as Kafka spells them."""
    admin.create_topics({"kp-configs": {"configs": {"retention.ms": "3600000"}}})
    configs = topic_configs(admin, "kp-configs")
    assert (configs["retention.ms"]["value"], configs["retention.ms"]["config_source"]) == (
        "3600000",
        "DYNAMIC_TOPIC_CONFIG",
    )
    assert configs["cleanup.policy"]["value"] == "delete"
    assert configs["message.timestamp.type"]["value"] == "CreateTime"
    # Kafka prints booleans as Java does: "false", never Python's "False".
    booleans = {
        name: configs[name]["value"]
        for name in ["remote.storage.enable", "remote.log.copy.disable"]
        if name in configs
    }
    assert booleans == dict.fromkeys(booleans, "false")


def test_admin_describe_configs_types(admin: KafkaAdminClient) -> None:
    """DescribeConfigs v3+ carries each config's type (KIP-569); Kafka fills it in."""
    admin.create_topics({"kp-config-types": {}})
    configs = topic_configs(admin, "kp-config-types")
    kafka_types = {
        "retention.ms": "LONG",
        "segment.bytes": "INT",
        "cleanup.policy": "LIST",
        "message.timestamp.type": "STRING",
        "remote.storage.enable": "BOOLEAN",
    }
    assert {name: configs[name]["config_type"] for name in kafka_types} == kafka_types
