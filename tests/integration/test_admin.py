"""Topic administration through confluent-kafka's AdminClient, answered as Apache Kafka answers.

Also automatic topic creation: a Metadata request for an unknown topic creates it when
`auto.create.topics.enable` is on and the client allows it, and never otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    ResourceType,
)
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic

from tests.integration.broker_process import BrokerProcess
from tests.integration.wire import WireClient
from tierbroker.protocol.errors import ErrorCode

TIMEOUT_S = 10.0


@pytest.fixture
def admin(broker: BrokerProcess) -> Iterator[AdminClient]:
    yield AdminClient({"bootstrap.servers": broker.bootstrap})


def result(future: Future[Any]) -> Any:
    return future.result(timeout=TIMEOUT_S)


def error_of(future: Future[Any]) -> int:
    """The Kafka error code a failed admin future carries."""
    with pytest.raises(KafkaException) as raised:
        future.result(timeout=TIMEOUT_S)
    error = raised.value.args[0]
    assert isinstance(error, KafkaError)
    return int(error.code())


def create(
    admin: AdminClient, *topics: NewTopic, validate_only: bool = False
) -> dict[str, Future[Any]]:
    return admin.create_topics(
        list(topics), operation_timeout=TIMEOUT_S, validate_only=validate_only
    )


def topic_names(broker: BrokerProcess) -> set[str]:
    """Every topic, from a Metadata v12 request for all topics (null topics).

    Not `admin.list_topics()`: `test_list_topics` covers that on its own, so that one
    failure there does not hide what the other tests check.
    """
    with WireClient(broker.port) as client:
        response = client.request(
            MetadataRequest(
                topics=None,
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            )
        )
    return {t.name for t in response.topics}


def partition_count(admin: AdminClient, topic: str) -> int:
    metadata = admin.list_topics(topic, timeout=TIMEOUT_S).topics[topic]
    assert metadata.error is None
    return len(metadata.partitions)


def describe(admin: AdminClient, topic: str) -> dict[str, ConfigEntry]:
    resource = ConfigResource(ResourceType.TOPIC, topic)
    return dict(result(admin.describe_configs([resource])[resource]))


def incremental_alter(admin: AdminClient, topic: str, *entries: ConfigEntry) -> Future[Any]:
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=list(entries))
    (future,) = admin.incremental_alter_configs([resource]).values()
    return future


# CreateTopics and DeleteTopics ------------------------------------------------------------


def test_create_topics_with_partitions_and_configs(
    admin: AdminClient, broker: BrokerProcess
) -> None:
    futures = create(
        admin,
        NewTopic("three", num_partitions=3, replication_factor=1),
        NewTopic(
            "configured",
            num_partitions=2,
            replication_factor=1,
            config={"retention.ms": "3600000", "max.message.bytes": "2048"},
        ),
        NewTopic("defaults"),  # -1 partitions and replication factor: the broker's defaults
    )
    for future in futures.values():
        assert result(future) is None
    assert {"three", "configured", "defaults"} <= topic_names(broker)
    assert partition_count(admin, "three") == 3
    assert partition_count(admin, "configured") == 2
    assert partition_count(admin, "defaults") == 1  # num.partitions=1
    configs = describe(admin, "configured")
    assert configs["retention.ms"].value == "3600000"
    assert configs["max.message.bytes"].value == "2048"


def test_create_topics_validate_only_creates_nothing(
    admin: AdminClient, broker: BrokerProcess
) -> None:
    futures = create(
        admin, NewTopic("dry-run", num_partitions=4, replication_factor=1), validate_only=True
    )
    assert result(futures["dry-run"]) is None
    assert "dry-run" not in topic_names(broker)
    invalid = create(
        admin, NewTopic("dry-run", num_partitions=1, replication_factor=2), validate_only=True
    )
    assert error_of(invalid["dry-run"]) == KafkaError.INVALID_REPLICATION_FACTOR
    # A real create of the same name afterwards succeeds: validation reserved nothing.
    assert (
        result(
            create(admin, NewTopic("dry-run", num_partitions=4, replication_factor=1))["dry-run"]
        )
        is None
    )
    assert partition_count(admin, "dry-run") == 4


def test_replication_factor_above_broker_count_is_refused(
    admin: AdminClient, broker: BrokerProcess
) -> None:
    futures = create(admin, NewTopic("replicated", num_partitions=1, replication_factor=2))
    assert error_of(futures["replicated"]) == KafkaError.INVALID_REPLICATION_FACTOR
    assert "replicated" not in topic_names(broker)


def test_duplicate_topic_is_refused(admin: AdminClient) -> None:
    assert (
        result(create(admin, NewTopic("twice", num_partitions=2, replication_factor=1))["twice"])
        is None
    )
    again = create(admin, NewTopic("twice", num_partitions=5, replication_factor=1))
    assert error_of(again["twice"]) == KafkaError.TOPIC_ALREADY_EXISTS
    assert partition_count(admin, "twice") == 2


def test_delete_topics(admin: AdminClient, broker: BrokerProcess) -> None:
    assert (
        result(create(admin, NewTopic("doomed", num_partitions=2, replication_factor=1))["doomed"])
        is None
    )
    assert "doomed" in topic_names(broker)
    assert result(admin.delete_topics(["doomed"], operation_timeout=TIMEOUT_S)["doomed"]) is None
    assert "doomed" not in topic_names(broker)
    assert error_of(admin.delete_topics(["doomed"])["doomed"]) == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_create_partitions(admin: AdminClient) -> None:
    assert (
        result(
            create(admin, NewTopic("growing", num_partitions=2, replication_factor=1))["growing"]
        )
        is None
    )
    grown = admin.create_partitions([NewPartitions("growing", 5)], operation_timeout=TIMEOUT_S)
    assert result(grown["growing"]) is None
    assert partition_count(admin, "growing") == 5
    for count in (3, 5):  # smaller than, or equal to, the current count
        refused = admin.create_partitions([NewPartitions("growing", count)])
        assert error_of(refused["growing"]) == KafkaError.INVALID_PARTITIONS
    assert partition_count(admin, "growing") == 5
    dry = admin.create_partitions([NewPartitions("growing", 8)], validate_only=True)
    assert result(dry["growing"]) is None
    assert partition_count(admin, "growing") == 5


# Configs --------------------------------------------------------------------------------


def test_describe_configs_shows_overrides_and_defaults(admin: AdminClient) -> None:
    topic = NewTopic(
        "described", num_partitions=1, replication_factor=1, config={"retention.bytes": "123456"}
    )
    assert result(create(admin, topic)["described"]) is None
    configs = describe(admin, "described")
    override = configs["retention.bytes"]
    assert (override.value, override.source) == ("123456", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert not override.is_default
    # log.segment.bytes is in server.properties; max.message.bytes is nowhere: Kafka's default.
    assert configs["segment.bytes"].value == "1073741824"
    assert configs["segment.bytes"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert configs["max.message.bytes"].value == "1048588"
    assert configs["max.message.bytes"].source == ConfigSource.DEFAULT_CONFIG.value
    assert configs["retention.ms"].value == str(168 * 3_600_000)  # log.retention.hours=168
    assert configs["cleanup.policy"].value == "delete"
    unknown = ConfigResource(ResourceType.TOPIC, "no-such-topic")
    assert error_of(admin.describe_configs([unknown])[unknown]) == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_incremental_alter_configs_set_and_delete(admin: AdminClient) -> None:
    assert (
        result(
            create(admin, NewTopic("altered", num_partitions=1, replication_factor=1))["altered"]
        )
        is None
    )
    assert (
        result(
            incremental_alter(
                admin,
                "altered",
                ConfigEntry("retention.ms", "60000", incremental_operation=AlterConfigOpType.SET),
                ConfigEntry(
                    "segment.bytes", "1048576", incremental_operation=AlterConfigOpType.SET
                ),
            )
        )
        is None
    )
    configs = describe(admin, "altered")
    assert (configs["retention.ms"].value, configs["retention.ms"].source) == (
        "60000",
        ConfigSource.DYNAMIC_TOPIC_CONFIG.value,
    )
    assert configs["segment.bytes"].value == "1048576"

    assert (
        result(
            incremental_alter(
                admin,
                "altered",
                ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
            )
        )
        is None
    )
    configs = describe(admin, "altered")
    assert configs["retention.ms"].value == str(168 * 3_600_000)
    assert configs["retention.ms"].source != ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert (configs["segment.bytes"].value, configs["segment.bytes"].source) == (
        "1048576",
        ConfigSource.DYNAMIC_TOPIC_CONFIG.value,
    ), "DELETE of one config leaves the others"


def test_alter_configs_replaces_every_override(admin: AdminClient) -> None:
    topic = NewTopic(
        "replaced",
        num_partitions=1,
        replication_factor=1,
        config={"retention.ms": "60000", "segment.bytes": "1048576"},
    )
    assert result(create(admin, topic)["replaced"]) is None
    resource = ConfigResource(
        ResourceType.TOPIC, "replaced", set_config={"retention.bytes": "999999"}
    )
    with pytest.deprecated_call():
        futures = admin.alter_configs([resource])
    assert result(futures[resource]) is None
    configs = describe(admin, "replaced")
    assert (configs["retention.bytes"].value, configs["retention.bytes"].source) == (
        "999999",
        ConfigSource.DYNAMIC_TOPIC_CONFIG.value,
    )
    for name in ("retention.ms", "segment.bytes"):  # not in the new set: back to defaults
        assert configs[name].source != ConfigSource.DYNAMIC_TOPIC_CONFIG.value, name


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("no.such.config", "1"),
        ("cleanup.policy", "shred"),
        ("retention.ms", "soon"),
        ("segment.bytes", "1"),
    ],
)
def test_invalid_topic_configs_are_refused(
    admin: AdminClient, name: str, value: str, broker: BrokerProcess
) -> None:
    created = create(
        admin,
        NewTopic("invalid-config", num_partitions=1, replication_factor=1, config={name: value}),
    )
    assert error_of(created["invalid-config"]) == KafkaError.INVALID_CONFIG
    assert "invalid-config" not in topic_names(broker)

    assert (
        result(create(admin, NewTopic("valid", num_partitions=1, replication_factor=1))["valid"])
        is None
    )
    altered = incremental_alter(
        admin, "valid", ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
    )
    assert error_of(altered) == KafkaError.INVALID_CONFIG
    assert (
        describe(admin, "valid").get(name, ConfigEntry(name, None)).source
        != ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    )


def test_describe_cluster(admin: AdminClient, broker: BrokerProcess) -> None:
    cluster = result(admin.describe_cluster(request_timeout=TIMEOUT_S))
    assert isinstance(cluster.cluster_id, str) and len(cluster.cluster_id) >= 16
    assert [(n.id, n.host, n.port) for n in cluster.nodes] == [(0, "127.0.0.1", broker.port)]
    assert cluster.controller is not None and cluster.controller.id == 0


def test_list_topics(admin: AdminClient) -> None:
    """librdkafka's all-topics Metadata v13 request ends with 3 bytes its schema does not
    read; Kafka ignores unread bytes at the end of a request."""
    assert (
        result(create(admin, NewTopic("listed", num_partitions=3, replication_factor=1))["listed"])
        is None
    )
    metadata = admin.list_topics(timeout=TIMEOUT_S)
    assert "listed" in metadata.topics
    assert len(metadata.topics["listed"].partitions) == 3
    assert [b.id for b in metadata.brokers.values()] == [0]
    cluster = result(admin.describe_cluster(request_timeout=TIMEOUT_S))
    assert metadata.cluster_id == cluster.cluster_id
    assert result(admin.delete_topics(["listed"], operation_timeout=TIMEOUT_S)["listed"]) is None
    assert "listed" not in admin.list_topics(timeout=TIMEOUT_S).topics


# Automatic topic creation -------------------------------------------------------------------


def metadata_for(port: int, topic: str, allow_auto_topic_creation: bool) -> ErrorCode:
    with WireClient(port) as client:
        response = client.request(
            MetadataRequest(
                topics=(MetadataRequestTopic(name=topic, topic_id=None),),
                allow_auto_topic_creation=allow_auto_topic_creation,
                include_topic_authorized_operations=False,
            )
        )
    (found,) = response.topics
    assert found.name == topic
    return found.error_code


def produce_one(bootstrap: str, topic: str, timeout_ms: int = 10_000) -> KafkaError | None:
    producer = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": timeout_ms})
    reports: list[KafkaError | None] = []
    producer.produce(topic, value=b"hello", on_delivery=lambda err, _msg: reports.append(err))
    producer.flush(timeout_ms / 1000 + 5)
    assert len(reports) == 1
    return reports[0]


def test_auto_create_topics_on_metadata(broker: BrokerProcess, admin: AdminClient) -> None:
    assert metadata_for(broker.port, "not-allowed", allow_auto_topic_creation=False) == (
        ErrorCode.unknown_topic_or_partition
    )
    assert "not-allowed" not in topic_names(broker)
    assert metadata_for(broker.port, "allowed", allow_auto_topic_creation=True) == ErrorCode.none
    assert "allowed" in topic_names(broker)
    assert partition_count(admin, "allowed") == 1  # num.partitions

    assert produce_one(broker.bootstrap, "produced-to") is None
    assert "produced-to" in topic_names(broker)


def test_auto_create_topics_disabled(broker_factory: type[BrokerProcess], tmp_path: Path) -> None:
    broker = broker_factory(tmp_path, {"auto.create.topics.enable": "false"}).start()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    assert metadata_for(broker.port, "allowed", allow_auto_topic_creation=True) == (
        ErrorCode.unknown_topic_or_partition
    )
    error = produce_one(broker.bootstrap, "produced-to", timeout_ms=2000)
    assert error is not None
    assert error.code() in (
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._MSG_TIMED_OUT,
        KafkaError._UNKNOWN_TOPIC,
    )
    assert not {"allowed", "produced-to"} & topic_names(broker)
    # Explicit creation still works.
    assert (
        result(
            create(admin, NewTopic("explicit", num_partitions=1, replication_factor=1))["explicit"]
        )
        is None
    )
    assert broker.stop() == 0
    assert "Traceback" not in broker.log()
