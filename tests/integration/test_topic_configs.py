"""Every topic config Kafka defines, through confluent-kafka's AdminClient, and a topic's
compression.type read back by every client.

The list below is Kafka's (3.9 to 4.4: `TopicConfig`, `QuotaConfig`), written out
here rather than taken from the broker's own table, with Kafka's documented defaults.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
    ResourceType,
)
from kio.schema.describe_configs.v4.request import DescribeConfigsRequest, DescribeConfigsResource
from kio.static.primitive import i8

from tests.integration.broker_process import BrokerProcess
from tests.integration.test_compaction import alter
from tests.integration.test_kcat import kcat
from tests.integration.wire import WireClient
from tierbroker.protocol.records import Compression, iter_batches

LEGACY_RESOURCES = r"(read|open)_text is deprecated"  # kafka-python 3's, not the broker's
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", LEGACY_RESOURCES, DeprecationWarning)
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KpTopicPartition

TIMEOUT_S = 15.0
LONG_MAX = str(2**63 - 1)
KAFKA_TOPIC_CONFIG_DEFAULTS = {
    "cleanup.policy": "delete",
    "compression.gzip.level": "-1",
    "compression.lz4.level": "9",
    "compression.type": "producer",
    "compression.zstd.level": "3",
    "delete.retention.ms": "86400000",
    "file.delete.delay.ms": "60000",
    "flush.messages": LONG_MAX,
    "flush.ms": LONG_MAX,
    "follower.replication.throttled.replicas": "",
    "index.interval.bytes": "4096",
    "leader.replication.throttled.replicas": "",
    "local.retention.bytes": "-2",
    "local.retention.ms": "-2",
    "max.compaction.lag.ms": LONG_MAX,
    "max.message.bytes": "1048588",
    "message.downconversion.enable": "true",
    "message.format.version": "3.0-IV1",  # 3.9 only
    "message.timestamp.after.max.ms": "3600000",  # 4.x (3.9: unbounded)
    "message.timestamp.before.max.ms": LONG_MAX,
    "message.timestamp.difference.max.ms": LONG_MAX,  # 3.9 only
    "message.timestamp.type": "CreateTime",
    "min.cleanable.dirty.ratio": "0.5",
    "min.compaction.lag.ms": "0",
    "min.insync.replicas": "1",
    "preallocate": "false",
    "remote.copy.lag.bytes": "0",  # 4.4 (KIP-1241)
    "remote.copy.lag.ms": "0",  # 4.4 (KIP-1241)
    "remote.log.copy.disable": "false",
    "remote.log.delete.on.disable": "false",
    "remote.storage.enable": "false",
    "retention.bytes": "-1",
    "retention.ms": "604800000",
    "segment.bytes": "1073741824",
    "segment.index.bytes": "10485760",
    "segment.jitter.ms": "0",
    "segment.ms": "604800000",
    "unclean.leader.election.enable": "false",
}
DYNAMIC = ConfigSource.DYNAMIC_TOPIC_CONFIG.value
STATIC = ConfigSource.STATIC_BROKER_CONFIG.value
DEFAULT = ConfigSource.DEFAULT_CONFIG.value


@pytest.fixture
def admin(broker: BrokerProcess) -> Iterator[AdminClient]:
    yield AdminClient({"bootstrap.servers": broker.bootstrap})


def create(admin: AdminClient, topic: str, config: dict[str, str]) -> None:
    futures = admin.create_topics([NewTopic(topic, 1, 1, config=config)])
    futures[topic].result(timeout=TIMEOUT_S)


def refused(admin: AdminClient, topic: str, config: dict[str, str]) -> KafkaError:
    with pytest.raises(KafkaException) as raised:
        create(admin, topic, config)
    error = raised.value.args[0]
    assert isinstance(error, KafkaError)
    return error


def describe(admin: AdminClient, topic: str) -> dict[str, ConfigEntry]:
    resource = ConfigResource(ResourceType.TOPIC, topic)
    return dict(admin.describe_configs([resource])[resource].result(timeout=TIMEOUT_S))


def wire_synonyms(broker: BrokerProcess, topic: str) -> dict[str, list[tuple[str, str, int]]]:
    """Each config's synonyms from a raw DescribeConfigs v4 (confluent-kafka keeps one
    synonym per name, and Kafka reports a broker property twice: as set and default)."""
    request = DescribeConfigsRequest(
        resources=(DescribeConfigsResource(resource_type=i8(2), resource_name=topic),),
        include_synonyms=True,
    )
    with WireClient(broker.port) as client:
        (result,) = client.request(request).results
    return {c.name: [(s.name, s.value, s.source) for s in c.synonyms] for c in result.configs}


# Every config ---------------------------------------------------------------------------


def test_a_topic_with_every_kafka_topic_config_at_its_default(
    admin: AdminClient, broker: BrokerProcess
) -> None:
    create(admin, "every-config", KAFKA_TOPIC_CONFIG_DEFAULTS)
    configs = describe(admin, "every-config")
    assert {name: (c.value, c.source) for name, c in configs.items()} == {
        name: (value, DYNAMIC) for name, value in KAFKA_TOPIC_CONFIG_DEFAULTS.items()
    }
    notes = [line for line in broker.log().splitlines() if "without effect" in line]
    assert len(notes) == 1, notes
    for name in ("preallocate", "flush.messages", "segment.jitter.ms"):
        assert f"{name}=" in notes[0] and "INFO" in notes[0]
    for applied in ("compression.type", "min.cleanable.dirty.ratio", "delete.retention.ms"):
        assert applied not in notes[0]


def test_defaults_name_their_source_and_broker_synonyms(
    admin: AdminClient, broker: BrokerProcess
) -> None:
    create(admin, "defaults", {})
    configs = describe(admin, "defaults")
    synonyms = wire_synonyms(broker, "defaults")
    assert set(configs) == set(KAFKA_TOPIC_CONFIG_DEFAULTS)
    assert {n: c.value for n, c in configs.items()} == KAFKA_TOPIC_CONFIG_DEFAULTS
    # The shipped server.properties sets log.segment.bytes.
    assert configs["segment.bytes"].source == STATIC
    assert synonyms["segment.bytes"] == [
        ("log.segment.bytes", "1073741824", STATIC),
        ("log.segment.bytes", "1073741824", DEFAULT),
    ]
    assert configs["compression.type"].source == DEFAULT
    assert synonyms["compression.type"] == [("compression.type", "producer", DEFAULT)]
    assert configs["compression.type"].synonyms["compression.type"].source == DEFAULT
    # No broker property: Kafka's own default, no synonym.
    assert configs["remote.storage.enable"].source == DEFAULT
    assert synonyms["remote.storage.enable"] == []
    # As Kafka: log.retention.hours is not log.retention.ms, the first synonym, so it is
    # not reported, and the source is DEFAULT_CONFIG though the broker sets it.
    assert (configs["retention.ms"].source, synonyms["retention.ms"]) == (DEFAULT, [])


def test_broker_properties_set_are_the_topics_defaults(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    overrides = {
        "compression.type": "lz4",
        "log.retention.ms": "3600000",
        "log.preallocate": "true",
    }
    broker = broker_factory(tmp_path, overrides).start()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    create(admin, "broker-defaults", {"compression.type": "gzip"})
    configs = describe(admin, "broker-defaults")
    synonyms = wire_synonyms(broker, "broker-defaults")
    assert (configs["compression.type"].value, configs["compression.type"].source) == (
        "gzip",
        DYNAMIC,
    )
    assert synonyms["compression.type"] == [
        ("compression.type", "gzip", DYNAMIC),
        ("compression.type", "lz4", STATIC),
        ("compression.type", "producer", DEFAULT),
    ]
    retention = configs["retention.ms"]
    assert (retention.value, retention.source) == ("3600000", STATIC)
    assert synonyms["retention.ms"] == [  # server.properties also sets log.retention.hours=168
        ("log.retention.ms", "3600000", STATIC),
        ("log.retention.hours", "168", STATIC),
        ("log.retention.hours", "168", DEFAULT),
    ]
    assert (configs["preallocate"].value, configs["preallocate"].source) == ("true", STATIC)
    # The broker's compression.type is the default of a topic that sets none.
    create(admin, "lz4-by-default", {})
    sent = produce_uncompressed(broker.bootstrap, "lz4-by-default")
    assert stored_codecs(broker, "lz4-by-default") == {Compression.LZ4}
    assert read_confluent(broker.bootstrap, "lz4-by-default") == sent


# Refusals -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config",
    [
        {"min.insync.replicas": "0"},
        {"compression.type": "brotli"},
        {"compression.zstd.level": "23"},
        {"min.cleanable.dirty.ratio": "1.5"},
        {"unclean.leader.election.enable": "maybe"},
        {"leader.replication.throttled.replicas": "7"},
        {"message.format.version": "0.7"},
        {"segment.bytes": "2147483648"},
        {"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"},
        {"retention.minutes": "5"},  # a broker property, not a topic config
    ],
    ids=lambda config: ",".join(config),
)
def test_invalid_configs_are_refused_with_invalid_config(
    admin: AdminClient, config: dict[str, str]
) -> None:
    assert refused(admin, "refused", config).code() == KafkaError.INVALID_CONFIG
    resource = ConfigResource(ResourceType.TOPIC, "refused")
    assert admin.describe_configs([resource])[resource].exception(timeout=TIMEOUT_S) is not None


def test_compaction_policies_are_taken_and_reported(admin: AdminClient) -> None:
    create(admin, "compacted", {"cleanup.policy": "compact"})
    assert describe(admin, "compacted")["cleanup.policy"].value == "compact"
    alter(admin, "compacted", "cleanup.policy", "compact,delete")
    assert describe(admin, "compacted")["cleanup.policy"].value == "compact,delete"
    assert refused(admin, "keep-all", {"cleanup.policy": ""}).code() == KafkaError.INVALID_CONFIG


# compression.type -----------------------------------------------------------------------

COUNT = 3000


def produce_uncompressed(bootstrap: str, topic: str) -> list[tuple[bytes, bytes]]:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "compression.type": "none", "linger.ms": 20}
    )
    sent = [(f"key-{i}".encode(), f"value {i} ".encode() * (1 + i % 20)) for i in range(COUNT)]
    for key, value in sent:
        producer.produce(topic, value, key)
    assert producer.flush(TIMEOUT_S) == 0
    return sent


def stored_codecs(broker: BrokerProcess, topic: str) -> set[Compression]:
    segment = broker.data_dir / "logs" / f"{topic}-0" / "00000000000000000000.log"
    batches = list(iter_batches(segment.read_bytes()))
    assert sum(b.record_count for b in batches) == COUNT
    return {b.compression for b in batches}


def read_confluent(bootstrap: str, topic: str) -> list[tuple[bytes, bytes]]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "c", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    got: list[tuple[bytes, bytes]] = []
    try:
        while len(got) < COUNT:
            messages = consumer.consume(COUNT - len(got), timeout=TIMEOUT_S)
            assert messages, f"only {len(got)} of {COUNT} records"
            for m in messages:
                assert m.error() is None, m.error()
                got.append((m.key(), m.value()))
    finally:
        consumer.close()
    return got


def read_kcat(bootstrap: str, topic: str) -> list[tuple[bytes, bytes]]:
    out = kcat(bootstrap, "-C", "-t", topic, "-e", "-o", "beginning", "-f", "%k\t%s\n")
    rows = [line.split("\t") for line in out.splitlines()]
    return [(key.encode(), value.encode()) for key, value in rows]


async def _read_aiokafka(bootstrap: str, topic: str) -> list[tuple[bytes, bytes]]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    got: list[tuple[bytes, bytes]] = []
    try:
        partition = AioTopicPartition(topic, 0)
        consumer.assign([partition])
        await consumer.seek_to_beginning(partition)
        while len(got) < COUNT:
            batch = await consumer.getmany(partition, timeout_ms=int(TIMEOUT_S * 1000))
            assert batch, f"only {len(got)} of {COUNT} records"
            got += [(r.key, r.value) for r in batch[partition]]
    finally:
        await consumer.stop()
    return got


def read_aiokafka(bootstrap: str, topic: str) -> list[tuple[bytes, bytes]]:
    return asyncio.run(_read_aiokafka(bootstrap, topic))


def read_kafka_python(bootstrap: str, topic: str) -> list[tuple[bytes, bytes]]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", LEGACY_RESOURCES, DeprecationWarning)
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        got: list[tuple[bytes, bytes]] = []
        try:
            partition = KpTopicPartition(topic, 0)
            consumer.assign([partition])
            consumer.seek_to_beginning(partition)
            while len(got) < COUNT:
                batch = consumer.poll(timeout_ms=int(TIMEOUT_S * 1000))
                assert batch, f"only {len(got)} of {COUNT} records"
                got += [(r.key, r.value) for r in batch[partition]]
        finally:
            consumer.close()
    return got


READERS: dict[str, Any] = {
    "confluent-kafka": read_confluent,
    "kcat": read_kcat,
    "aiokafka": read_aiokafka,
    "kafka-python": read_kafka_python,
}


def test_a_zstd_topic_stores_zstd_batches_that_every_client_reads(
    admin: AdminClient, broker: BrokerProcess
) -> None:
    create(admin, "zstd-topic", {"compression.type": "zstd"})
    sent = produce_uncompressed(broker.bootstrap, "zstd-topic")
    assert stored_codecs(broker, "zstd-topic") == {Compression.ZSTD}
    for name, read in READERS.items():
        assert read(broker.bootstrap, "zstd-topic") == sent, name


def test_producer_keeps_the_producers_codec(admin: AdminClient, broker: BrokerProcess) -> None:
    create(admin, "as-produced", {})
    sent = produce_uncompressed(broker.bootstrap, "as-produced")
    assert stored_codecs(broker, "as-produced") == {Compression.NONE}
    assert read_confluent(broker.bootstrap, "as-produced") == sent
