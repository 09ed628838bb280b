"""The differential suite: each scenario sends the same requests to Apache Kafka (one
KRaft node) and to tierbroker (one in-process broker) and compares the answers field by
field (`tests.integration.differential` says what is normalised).

Every difference tierbroker keeps on purpose is in `ACCEPTED`, with its reason; any other
difference fails the scenario, and so does an accepted one that no longer appears.
"""

from __future__ import annotations

import dataclasses
import datetime
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.apache_kafka import ApacheKafka
from tests.integration.differential import Side, comparable, differences, matches
from tests.integration.differential_requests import (
    BROKER_RESOURCE,
    DEFAULT_CONFIG,
    DYNAMIC_TOPIC_CONFIG,
    TOPIC_RESOURCE,
    all_list_offsets,
    alter,
    batch,
    create_topics,
    delete_records,
    describe_configs,
    fetch,
    incremental_alter,
    metadata,
    topic_config,
    with_magic,
)
from tests.integration.waiting import wait_for
from tests.integration.wire import fetch_request, request_module
from tierbroker.testing.cluster import TierbrokerCluster

SET, DELETE = 0, 1
# Apache Kafka's node.id in tests.apache_kafka.
KAFKA_NODE_ID = 1

KAFKA_3_CONFIGS = (
    "tierbroker keeps Kafka 3.9's topic configs that Kafka 4 removed (message.format.version, "
    "message.downconversion.enable, message.timestamp.difference.max.ms), so that clients and "
    "scripts written for 3.9 still work (storage/topic_configs.py)"
)
KAFKA_4_4_CONFIGS = (
    "tierbroker has Kafka 4.4's delayed upload (KIP-1241: remote.copy.lag.ms and "
    "remote.copy.lag.bytes, default 0, copy at once), which Kafka 4.3.1 does not know"
)
CLUSTER_MIN_ISR = (
    "Apache Kafka 4 writes a cluster-wide min.insync.replicas default into its KRaft metadata "
    "when the log dir is formatted (source DYNAMIC_DEFAULT_BROKER_CONFIG); tierbroker, without "
    "KRaft or ELR, writes no dynamic default at start, so its value is the static broker default"
)


def _topic_config_differences(scenario: str, prefix: str) -> dict[tuple[str, str], str]:
    removed = ("message.format.version", "message.downconversion.enable",
               "message.timestamp.difference.max.ms")  # fmt: skip
    added = ("remote.copy.lag.ms", "remote.copy.lag.bytes")
    return {
        **{(scenario, f"{prefix}configs.{name}"): KAFKA_3_CONFIGS for name in removed},
        **{(scenario, f"{prefix}configs.{name}"): KAFKA_4_4_CONFIGS for name in added},
        (scenario, f"{prefix}configs.min.insync.replicas.config_source"): CLUSTER_MIN_ISR,
    }


# (scenario, pattern of a path, `*` for any characters) -> why tierbroker answers differently there.
ACCEPTED: dict[tuple[str, str], str] = {
    **_topic_config_differences("create_topics_validate_only", "answer[0]."),
    **_topic_config_differences("create_topics_created", "[0]."),
    **_topic_config_differences("describe_configs_topic", ""),
    ("describe_configs_topic", "configs.min.insync.replicas.synonyms"): CLUSTER_MIN_ISR,
    ("describe_configs_broker", "configs.min.insync.replicas.config_source"): CLUSTER_MIN_ISR,
    ("describe_configs_broker", "configs.min.insync.replicas.synonyms"): CLUSTER_MIN_ISR,
    ("describe_configs_broker", "configs.*.read_only"): (
        "tierbroker's dynamic broker configs are the topic defaults (log.*, as Kafka's "
        "DynamicLogConfig); Kafka also changes others at run time (thread pools, connection "
        "limits, ...), which tierbroker reports read-only"
    ),
    ("produce_corrupt", "magic_1.error_code"): (
        "a magic 0 or 1 batch gets UNSUPPORTED_FOR_MESSAGE_FORMAT, as the project's bad-input "
        "requirement asks (tests/integration/test_bad_input.py); Kafka refuses it earlier, in "
        "ProduceRequest.validateRecords, with INVALID_RECORD; both are final, nothing is stored"
    ),
    # test_differential_cluster.py
    ("offline_and_under_replicated", "diff-offline.partitions[0].isr_nodes"): (
        "Kafka 4 formats with eligible leader replicas on (KIP-966): the last replica of a "
        "partition that lost it leaves the ISR for the ELR; tierbroker keeps ZooKeeper-mode "
        "Kafka's rule, the last replica stays in the ISR, so it alone can lead cleanly again"
    ),
}

Scenario = Callable[[Side], Any]
SCENARIOS: dict[str, Scenario] = {}


def scenario(function: Scenario) -> Scenario:
    SCENARIOS[function.__name__] = function
    return function


# Admin: CreateTopics ---------------------------------------------------------------------------


@scenario
def create_topics_bad_names(side: Side) -> Any:
    names = ["bad/name", "..", ".", "x" * 250, "", "with space"]
    return create_topics(side, [(name, 1, 1, {}) for name in names])


@scenario
def create_topics_bad_partition_counts(side: Side) -> Any:
    return create_topics(side, [("diff-zero-partitions", 0, 1, {}), ("diff-minus-two", -2, 1, {})])


@scenario
def create_topics_bad_replication_factors(side: Side) -> Any:
    return create_topics(side, [("diff-rf-above-brokers", 1, 3, {}), ("diff-rf-zero", 1, 0, {})])


@scenario
def create_topics_unknown_config(side: Side) -> Any:
    return create_topics(side, [("diff-unknown-config", 1, 1, {"no.such.config": "1"})])


@scenario
def create_topics_invalid_config_values(side: Side) -> Any:
    return create_topics(
        side,
        [
            ("diff-bad-retention", 1, 1, {"retention.ms": "soon"}),
            ("diff-bad-min-isr", 1, 1, {"min.insync.replicas": "0"}),
            ("diff-bad-timestamp-type", 1, 1, {"message.timestamp.type": "WallClock"}),
        ],
    )


@scenario
def create_topics_validate_only(side: Side) -> Any:
    name = "diff-validate-only"
    answer = create_topics(side, [(name, 2, 1, {"retention.ms": "1000"})], validate_only=True)
    return {"answer": answer, "metadata": metadata(side, [name])}


@scenario
def create_topics_created(side: Side) -> Any:
    """A topic created with an override: what the answer reports of every config."""
    return create_topics(side, [("diff-created", 3, 1, {"retention.ms": "1000"})])


@scenario
def create_topics_duplicate(side: Side) -> Any:
    side.create_topic("diff-duplicate")
    again = create_topics(side, [("diff-duplicate", 1, 1, {})])
    twice = create_topics(side, [("diff-twice", 1, 1, {}), ("diff-twice", 1, 1, {})])
    return {"again": again, "twice_in_one_request": twice}


# Admin: DeleteTopics, CreatePartitions -----------------------------------------------------------


@scenario
def delete_topics_unknown(side: Side) -> Any:
    m = request_module(20, 6)
    response = side.request(
        m.DeleteTopicsRequest(
            topics=(
                m.DeleteTopicState(name="diff-never-created", topic_id=uuid.UUID(int=0)),
                m.DeleteTopicState(name=None, topic_id=uuid.uuid4()),
            ),
            timeout=datetime.timedelta(seconds=10),
        )
    )
    # Kafka answers the topics named by id first: the order of results means nothing.
    return comparable({r.name or "by id": r for r in response.responses}, side)


@scenario
def create_partitions_not_more(side: Side) -> Any:
    side.create_topic("diff-three-partitions", partitions=3)
    m = request_module(37, 3)
    response = side.request(
        m.CreatePartitionsRequest(
            topics=tuple(
                m.CreatePartitionsTopic(name=name, count=count, assignments=None)
                for name, count in [
                    ("diff-three-partitions", 2),
                    ("diff-three-partitions-b", 3),
                    ("diff-no-such-topic", 4),
                ]
            ),
            timeout=datetime.timedelta(seconds=10),
            validate_only=False,
        )
    )
    return comparable(response, side)


@scenario
def create_partitions_same_count(side: Side) -> Any:
    side.create_topic("diff-same-count", partitions=2)
    m = request_module(37, 3)
    response = side.request(
        m.CreatePartitionsRequest(
            topics=(m.CreatePartitionsTopic(name="diff-same-count", count=2, assignments=None),),
            timeout=datetime.timedelta(seconds=10),
            validate_only=False,
        )
    )
    return comparable(response, side)


@scenario
def create_partitions_more(side: Side) -> Any:
    side.create_topic("diff-grown", partitions=1)
    m = request_module(37, 3)

    def grow(count: int, validate_only: bool, assignments: Any = None) -> Any:
        request = m.CreatePartitionsRequest(
            topics=(
                m.CreatePartitionsTopic(name="diff-grown", count=count, assignments=assignments),
            ),
            timeout=datetime.timedelta(seconds=10),
            validate_only=validate_only,
        )
        return comparable(side.request(request), side)

    unknown_broker = (m.CreatePartitionsAssignment(broker_ids=(77,)),)
    answers = {
        "validate_only": grow(3, True),
        "unknown_broker": grow(2, False, unknown_broker),
        "grown": grow(3, False),
    }
    # Kafka's broker learns of the new partitions a moment after its controller answers.
    answers["metadata"] = wait_for(
        lambda: (
            (grown := metadata(side, ["diff-grown"]))
            and len(grown["diff-grown"]["partitions"]) == 3
            and grown
        ),
        "the new partitions in the metadata",
        timeout_s=10,
    )
    return answers


@scenario
def delete_topics_deleted(side: Side) -> Any:
    topic_id = side.create_topic("diff-deleted")
    m = request_module(20, 6)
    response = side.request(
        m.DeleteTopicsRequest(
            topics=(m.DeleteTopicState(name=None, topic_id=topic_id),),
            timeout=datetime.timedelta(seconds=10),
        )
    )
    gone = wait_for(
        lambda: metadata(side, ["diff-deleted"])["diff-deleted"]["error_code"] != 0,
        "the deleted topic to leave the metadata",
        timeout_s=10,
    )
    return {"answer": comparable(response, side), "gone": gone}


# Admin: configs ---------------------------------------------------------------------------------


@scenario
def describe_configs_topic(side: Side) -> Any:
    side.create_topic(
        "diff-described", configs={"retention.ms": "1000", "segment.bytes": "1048576"}
    )
    return describe_configs(side, TOPIC_RESOURCE, "diff-described")


@scenario
def describe_configs_unknown_topic(side: Side) -> Any:
    return describe_configs(side, TOPIC_RESOURCE, "diff-not-there")


BROKER_KEYS = (
    "num.partitions",
    "default.replication.factor",
    "log.retention.hours",
    "log.retention.ms",
    "log.segment.bytes",
    "message.max.bytes",
    "offsets.topic.num.partitions",
    "group.initial.rebalance.delay.ms",
    "auto.create.topics.enable",
    "log.retention.minutes",
    "log.roll.hours",
    "log.roll.ms",
    "log.cleanup.policy",
    "compression.type",
    "min.insync.replicas",
    "socket.request.max.bytes",
    "connections.max.idle.ms",
    "delete.topic.enable",
    "replica.lag.time.max.ms",
    "max.connections.per.ip",
)


@scenario
def describe_configs_broker(side: Side) -> Any:
    return describe_configs(side, BROKER_RESOURCE, str(side.node_id), BROKER_KEYS)


@scenario
def incremental_alter_configs(side: Side) -> Any:
    topic = "diff-incremental"
    side.create_topic(topic, configs={"retention.ms": "1000"})
    return {
        "unknown_key": incremental_alter(side, topic, [("no.such.config", SET, "1")]),
        "bad_value": incremental_alter(side, topic, [("retention.ms", SET, "soon")]),
        "unknown_topic": incremental_alter(side, "diff-not-there", [("retention.ms", SET, "1")]),
        "set": incremental_alter(side, topic, [("segment.bytes", SET, "1048576")]),
        "delete": incremental_alter(side, topic, [("retention.ms", DELETE, None)]),
        "retention.ms": topic_config(side, topic, "retention.ms", DEFAULT_CONFIG),
        "segment.bytes": topic_config(side, topic, "segment.bytes", DYNAMIC_TOPIC_CONFIG),
    }


@scenario
def alter_broker_configs_validate_only(side: Side) -> Any:
    """Checked, not applied: the brokers stay as the other scenarios expect. A dynamic
    config, a static one, a synonym of a dynamic one, a bad value, for this broker and for
    the cluster's defaults."""
    m = request_module(44, 1)

    def validated(resource_name: str, name: str, value: str) -> Any:
        response = side.request(
            m.IncrementalAlterConfigsRequest(
                resources=(
                    m.AlterConfigsResource(
                        resource_type=BROKER_RESOURCE,
                        resource_name=resource_name,
                        configs=(m.AlterableConfig(name=name, config_operation=SET, value=value),),
                    ),
                ),
                validate_only=True,
            )
        )
        (result,) = response.responses
        return {**comparable(result, side), "resource_name": resource_name and "self"}

    this = str(side.node_id)
    return {
        "dynamic": validated(this, "log.retention.ms", "3600000"),
        "dynamic_default": validated("", "log.cleanup.policy", "delete"),
        "static": validated(this, "log.dirs", "/elsewhere"),
        "synonym": validated("", "log.retention.hours", "2"),
        "bad_value": validated(this, "log.segment.bytes", "big"),
    }


@scenario
def alter_configs(side: Side) -> Any:
    topic = "diff-altered"
    side.create_topic(topic, configs={"retention.ms": "1000"})
    return {
        "unknown_key": alter(side, topic, {"no.such.config": "1"}),
        "bad_value": alter(side, topic, {"retention.ms": "soon"}),
        "replace": alter(side, topic, {"segment.bytes": "1048576"}),
        "retention.ms": topic_config(side, topic, "retention.ms", DEFAULT_CONFIG),
        "segment.bytes": topic_config(side, topic, "segment.bytes", DYNAMIC_TOPIC_CONFIG),
    }


# Offsets after truncation and deletion ----------------------------------------------------------


@scenario
def list_offsets_empty_topic(side: Side) -> Any:
    side.create_topic("diff-empty")
    return all_list_offsets(side, "diff-empty")


@scenario
def offsets_after_delete_records(side: Side) -> Any:
    topic = "diff-truncated"
    side.create_topic(topic)
    side.produce(topic, batch(4))
    side.produce(topic, batch(6))
    return {
        "delete_records": delete_records(side, topic, 5),
        "list_offsets": all_list_offsets(side, topic),
        "fetch_below_log_start": fetch(side, topic, 2),
        "fetch_at_log_start": fetch(side, topic, 5),
        "fetch_at_high_watermark": fetch(side, topic, 10),
        "fetch_above_high_watermark": fetch(side, topic, 11),
        "delete_records_to_high_watermark": delete_records(side, topic, -1),
        "after_all_deleted": all_list_offsets(side, topic),
    }


@scenario
def delete_records_edges(side: Side) -> Any:
    topic = "diff-delete-edges"
    side.create_topic(topic)
    side.produce(topic, batch(3))
    return {
        "beyond_high_watermark": delete_records(side, topic, 100),
        "below_log_start": delete_records(side, topic, -7),
        "unknown_partition": delete_records(side, topic, 1, partition=5),
        "unknown_topic": delete_records(side, "diff-not-there", 1),
        "backwards": [delete_records(side, topic, 2), delete_records(side, topic, 1)],
    }


# Produce and fetch edges -------------------------------------------------------------------------


@scenario
def produce_unknown(side: Side) -> Any:
    side.create_topic("diff-produce-unknown")
    return {
        "unknown_topic": comparable(side.produce("diff-not-there", batch(1)), side),
        "unknown_partition": comparable(
            side.produce("diff-produce-unknown", batch(1), partition=5), side
        ),
    }


@scenario
def produce_acks(side: Side) -> Any:
    topic = "diff-acks"
    side.create_topic(topic)
    m = request_module(0, 11)
    # acks=0 has no answer: the next request's answer comes next.
    side.client.send(
        m.ProduceRequest(
            transactional_id=None,
            acks=0,
            timeout=datetime.timedelta(seconds=10),
            topic_data=(
                m.TopicProduceData(
                    name=topic, partition_data=(m.PartitionProduceData(index=0, records=batch(2)),)
                ),
            ),
        )
    )
    return {
        "acks_1": comparable(side.produce(topic, batch(1), acks=1), side),
        "acks_all": comparable(side.produce(topic, batch(1), acks=-1), side),
        "acks_2": comparable(side.produce(topic, batch(1), acks=2), side),
        "acks_minus_2": comparable(side.produce(topic, batch(1), acks=-2), side),
        "latest": comparable(side.list_offsets(topic, -1), side),
    }


@scenario
def produce_too_large(side: Side) -> Any:
    topic = "diff-too-large"
    side.create_topic(topic, configs={"max.message.bytes": "1000"})
    return {
        "one_large_record": comparable(side.produce(topic, batch(1, value_bytes=2000)), side),
        "fits": comparable(side.produce(topic, batch(1, value_bytes=100)), side),
    }


@scenario
def produce_corrupt(side: Side) -> Any:
    topic = "diff-corrupt"
    side.create_topic(topic)
    flipped = bytearray(batch(2))
    flipped[-1] ^= 0xFF
    return {
        "bad_crc": comparable(side.produce(topic, bytes(flipped)), side),
        "magic_1": comparable(side.produce(topic, with_magic(batch(1), 1)), side),
        "magic_3": comparable(side.produce(topic, with_magic(batch(1), 3)), side),
        "truncated": comparable(side.produce(topic, batch(2)[:-5]), side),
        "latest": comparable(side.list_offsets(topic, -1), side),
    }


@scenario
def produce_two_batches(side: Side) -> Any:
    topic = "diff-two-batches"
    side.create_topic(topic)
    return {
        "two_batches": comparable(side.produce(topic, batch(1) + batch(1)), side),
        "empty": comparable(side.produce(topic, b""), side),
        "latest": comparable(side.list_offsets(topic, -1), side),
    }


@scenario
def leader_epochs(side: Side) -> Any:
    """A request naming a leader epoch newer or older than the partition's."""
    topic = "diff-epochs"
    side.create_topic(topic)
    side.produce(topic, batch(2))

    def list_offsets(epoch: int) -> Any:
        return comparable(side.list_offsets(topic, -1, current_leader_epoch=epoch), side)

    def fetch_at(epoch: int) -> Any:
        request = fetch_request(12, [(topic, [(0, 0)])])
        (fetch_topic,) = request.topics
        (partition,) = fetch_topic.partitions
        partition = dataclasses.replace(partition, current_leader_epoch=epoch)
        fetch_topic = dataclasses.replace(fetch_topic, partitions=(partition,))
        return comparable(side.request(dataclasses.replace(request, topics=(fetch_topic,))), side)

    return {
        "list_offsets_future_epoch": list_offsets(5),
        "list_offsets_current_epoch": list_offsets(0),
        "fetch_future_epoch": fetch_at(5),
        "fetch_current_epoch": fetch_at(0),
    }


@scenario
def list_offsets_unknown(side: Side) -> Any:
    side.create_topic("diff-list-unknown")
    return {
        "unknown_topic": comparable(side.list_offsets("diff-not-there", -1), side),
        "unknown_partition": comparable(side.list_offsets("diff-list-unknown", -1, 5), side),
        "unknown_timestamp": comparable(side.list_offsets("diff-list-unknown", -7), side),
        "pending_upload_before_v11": comparable(side.list_offsets("diff-list-unknown", -6), side),
    }


@scenario
def describe_configs_other_broker(side: Side) -> Any:
    return {
        "unknown_id": describe_configs(side, BROKER_RESOURCE, "99", ("num.partitions",)),
        "not_a_number": describe_configs(side, BROKER_RESOURCE, "x", ("num.partitions",)),
    }


@scenario
def fetch_unknown(side: Side) -> Any:
    topic = "diff-fetch-unknown"
    side.create_topic(topic)
    return {
        "unknown_partition": fetch(side, topic, 0, partition=5),
        "unknown_topic": fetch(side, "diff-not-there", 0),
        "unknown_topic_id": comparable(
            side.request(fetch_request(16, [(uuid.uuid4(), [(0, 0)])])), side
        ),
    }


@scenario
def offset_for_leader_epoch(side: Side) -> Any:
    topic = "diff-epoch-ends"
    side.create_topic(topic)
    side.produce(topic, batch(3))
    m = request_module(23, 4)

    def ask(partition: int, current: int, epoch: int, name: str = topic) -> Any:
        request = m.OffsetForLeaderEpochRequest(
            replica_id=-1,
            topics=(
                m.OffsetForLeaderTopic(
                    topic=name,
                    partitions=(
                        m.OffsetForLeaderPartition(
                            partition=partition, current_leader_epoch=current, leader_epoch=epoch
                        ),
                    ),
                ),
            ),
        )
        return comparable(side.request(request).topics[0].partitions[0], side)

    return {
        "epoch_0": ask(0, -1, 0),
        "epoch_after": ask(0, -1, 3),
        "fenced": ask(0, 7, 0),
        "unknown_partition": ask(4, -1, 0),
        "unknown_topic": ask(0, -1, 0, "diff-not-there"),
    }


# Metadata ---------------------------------------------------------------------------------------


@scenario
def metadata_topics(side: Side) -> Any:
    side.create_topic("diff-metadata", partitions=2)
    return metadata(side, ["diff-metadata", "diff-not-there", "bad/name"])


# The test ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sides(
    apache_kafka: ApacheKafka, shared_tierbroker: TierbrokerCluster
) -> Iterator[tuple[Side, Side]]:
    (ours,) = shared_tierbroker.brokers
    kafka = Side("Apache Kafka", apache_kafka.port, KAFKA_NODE_ID)
    tierbroker = Side("tierbroker", ours.port, ours.broker_id)
    yield kafka, tierbroker
    kafka.close()
    tierbroker.close()


@pytest.mark.parametrize("name", SCENARIOS)
def test_same_answer(sides: tuple[Side, Side], name: str) -> None:
    kafka, tierbroker = sides
    expected = SCENARIOS[name](kafka)
    answered = SCENARIOS[name](tierbroker)
    found = {path: (k, o) for path, k, o in differences(expected, answered)}
    accepted = [pattern for (where, pattern) in ACCEPTED if where == name]
    unexplained = {
        path: f"Apache Kafka {k!r}, tierbroker {o!r}"
        for path, (k, o) in found.items()
        if not any(matches(path, pattern) for pattern in accepted)
    }
    stale = [p for p in accepted if not any(matches(path, p) for path in found)]
    assert not unexplained, "\n".join(f"{p}: {d}" for p, d in unexplained.items())
    assert not stale, f"accepted differences that no longer appear: {stale}"
