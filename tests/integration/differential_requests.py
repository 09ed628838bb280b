"""The requests of the differential suite's scenarios, sent the same way to both brokers
(`tests.integration.differential.Side`), their answers made comparable."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

from tests.integration.differential import Side, by_name, comparable
from tests.integration.waiting import wait_for
from tests.integration.wire import fetch_request, make, request_module
from tierbroker.protocol.records import build_batch

TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4
DYNAMIC_TOPIC_CONFIG, DEFAULT_CONFIG = 1, 5


TIMESTAMP_MS = 1_700_000_000_000


def batch(count: int, value_bytes: int = 10) -> bytes:
    return build_batch([(None, b"v" * value_bytes, (), TIMESTAMP_MS + i) for i in range(count)])


def create_topics(
    side: Side, topics: list[tuple[str, int, int, dict[str, str]]], validate_only: bool = False
) -> Any:
    m = request_module(19, 7)
    response = side.request(
        m.CreateTopicsRequest(
            topics=tuple(
                m.CreatableTopic(
                    name=name,
                    num_partitions=partitions,
                    replication_factor=replication,
                    assignments=(),
                    configs=tuple(
                        m.CreatableTopicConfig(name=k, value=v) for k, v in configs.items()
                    ),
                )
                for name, partitions, replication, configs in topics
            ),
            timeout=datetime.timedelta(seconds=10),
            validate_only=validate_only,
        )
    )
    return [
        {**comparable(t, side), "configs": comparable(by_name(t.configs), side)}
        for t in response.topics
    ]


def describe_configs(
    side: Side, resource_type: int, name: str, keys: tuple[str, ...] | None = None
) -> Any:
    m = request_module(32, 4)
    response = side.request(
        m.DescribeConfigsRequest(
            resources=(
                m.DescribeConfigsResource(
                    resource_type=resource_type, resource_name=name, configuration_keys=keys
                ),
            ),
            include_synonyms=True,
            include_documentation=False,
        )
    )
    (result,) = response.results
    described = {**comparable(result, side), "configs": comparable(by_name(result.configs), side)}
    if resource_type == BROKER_RESOURCE:
        described["resource_name"] = "self" if name == str(side.node_id) else name
    return described


def incremental_alter(side: Side, topic: str, changes: list[tuple[str, int, str | None]]) -> Any:
    m = request_module(44, 1)
    response = side.request(
        m.IncrementalAlterConfigsRequest(
            resources=(
                m.AlterConfigsResource(
                    resource_type=TOPIC_RESOURCE,
                    resource_name=topic,
                    configs=tuple(
                        m.AlterableConfig(name=name, config_operation=op, value=value)
                        for name, op, value in changes
                    ),
                ),
            ),
            validate_only=False,
        )
    )
    return comparable(response, side)


def topic_config(side: Side, topic: str, name: str, source: int) -> Any:
    """`name` of `topic` as described once its source is `source`, or after 10 s.

    Apache Kafka applies an altered config once its broker has the controller's record, a
    moment after the answer: wait for it rather than compare a half-applied state."""
    described: dict[str, Any] = {}

    def applied() -> bool:
        described.update(describe_configs(side, TOPIC_RESOURCE, topic, (name,))["configs"])
        return bool(described[name]["config_source"] == source)

    try:
        wait_for(applied, f"{name} of {topic} from source {source}", timeout_s=10)
    except AssertionError:
        pass  # the comparison shows what was described
    return described


def alter(side: Side, topic: str, configs: dict[str, str]) -> Any:
    m = request_module(33, 2)
    response = side.request(
        m.AlterConfigsRequest(
            resources=(
                m.AlterConfigsResource(
                    resource_type=TOPIC_RESOURCE,
                    resource_name=topic,
                    configs=tuple(m.AlterableConfig(name=k, value=v) for k, v in configs.items()),
                ),
            ),
            validate_only=False,
        )
    )
    return comparable(response, side)


SPECIAL_TIMESTAMPS = {"latest": -1, "earliest": -2, "max_timestamp": -3, "earliest_local": -4,
                      "latest_tiered": -5}  # fmt: skip


def all_list_offsets(side: Side, topic: str) -> dict[str, Any]:
    return {
        name: comparable(side.list_offsets(topic, timestamp), side)
        for name, timestamp in SPECIAL_TIMESTAMPS.items()
    }


def delete_records(side: Side, topic: str, offset: int, partition: int = 0) -> Any:
    m = request_module(21, 2)
    response = side.request(
        m.DeleteRecordsRequest(
            topics=(
                m.DeleteRecordsTopic(
                    name=topic,
                    partitions=(
                        m.DeleteRecordsPartition(partition_index=partition, offset=offset),
                    ),
                ),
            ),
            timeout=datetime.timedelta(seconds=10),
        )
    )
    return comparable(response, side)


def fetch(side: Side, topic: str, offset: int, partition: int = 0) -> Any:
    """Fetch v12 (by name) of one partition, without waiting."""
    return comparable(side.request(fetch_request(12, [(topic, [(partition, offset)])])), side)


def with_magic(records: bytes, magic: int) -> bytes:
    data = bytearray(records)
    data[16] = magic
    return bytes(data)


def metadata(side: Side, topics: list[str]) -> Any:
    m = request_module(3, 12)
    response = side.request(
        make(
            m.MetadataRequest,
            topics=tuple(m.MetadataRequestTopic(topic_id=uuid.UUID(int=0), name=t) for t in topics),
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
    )
    return comparable(by_name(response.topics), side)
