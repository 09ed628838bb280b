"""Dynamic broker configs, through confluent-kafka's AdminClient, on two brokers in one
process: the topic defaults (`log.*`) set for the cluster or for one broker, in Kafka's
order of precedence, reported with Kafka's sources and synonyms, applied at once to the
topics without an override (old segments go when `log.retention.ms` shrinks), kept
across a restart, and refused with Kafka's errors where they are not dynamic or not valid.
The cluster's defaults, which librdkafka cannot name, are set and read with
`tierbroker cluster config --default`; `test_kafka_tools` sets them with Kafka's
kafka-configs on tierbroker and on Apache Kafka and compares what each describes.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
)

from tests.integration.broker_process import executable
from tests.integration.waiting import wait_for
from tierbroker.broker.server.embedded import EmbeddedCluster

TIMEOUT_S = 15.0
BROKER = ConfigResource.Type.BROKER
TOPIC = ConfigResource.Type.TOPIC


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    running = EmbeddedCluster(
        tmp_path_factory.mktemp("dynamic-configs"),
        brokers=2,
        properties={"log.retention.check.interval.ms": "200", "log.segment.bytes": "1048576"},
    ).start()
    yield running
    running.stop()


@pytest.fixture
def admin(cluster: EmbeddedCluster) -> AdminClient:
    client = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    client.bootstrap = cluster.bootstrap_servers  # for the command line's calls
    return client


def alter(admin: AdminClient, broker: str, *changes: tuple[str, str | None]) -> None:
    """Set (a value) or delete (None) dynamic configs of `broker`; "" for the cluster's
    defaults, which librdkafka cannot name, goes through `tierbroker cluster config`."""
    if broker == "":
        sets = [f"--config={n}={v}" for n, v in changes if v is not None]
        deletes = [f"--delete-config={n}" for n, v in changes if v is None]
        done = cli(admin.bootstrap, "alter", "--default", *sets, *deletes)
        if done.returncode != 0:
            raise CommandFailed(done.stderr)
        return
    entries = [
        ConfigEntry(
            name,
            value,
            incremental_operation=AlterConfigOpType.DELETE
            if value is None
            else AlterConfigOpType.SET,
        )
        for name, value in changes
    ]
    resource = ConfigResource(BROKER, broker, incremental_configs=entries)
    [future] = admin.incremental_alter_configs([resource], request_timeout=TIMEOUT_S).values()
    future.result(TIMEOUT_S)


def refused(admin: AdminClient, broker: str, name: str, value: str) -> str:
    """The name of the error a SET of `name` on `broker` is refused with."""
    with pytest.raises((KafkaException, CommandFailed)) as failed:
        alter(admin, broker, (name, value))
    if isinstance(failed.value, CommandFailed):  # error: alter configs of ...: NAME: why
        return str(failed.value).split(": ")[2]
    return str(failed.value.args[0].name())


class CommandFailed(Exception):
    """`tierbroker cluster config` exited non-zero; its stderr."""


def cli(bootstrap: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`tierbroker cluster config ARGS` against `bootstrap`."""
    return subprocess.run(
        [executable("tierbroker", "pip install -e ."), "cluster", "config", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "TIERBROKER_BOOTSTRAP": bootstrap, "COLUMNS": "80"},
        timeout=60,
    )


def cluster_defaults(bootstrap: str) -> dict[str, str]:
    """The cluster's dynamic defaults, as `tierbroker cluster config describe --default`."""
    done = cli(bootstrap, "describe", "--default", "-o", "json")
    assert done.returncode == 0, done.stderr
    return {c["name"]: c["value"] for c in json.loads(done.stdout)["configs"]}


def described(admin: AdminClient, kind: Any, name: str) -> dict[str, Any]:
    resource = ConfigResource(kind, name)
    [future] = admin.describe_configs([resource], request_timeout=TIMEOUT_S).values()
    return dict(future.result(TIMEOUT_S))


def test_a_cluster_default_and_a_brokers_own_in_kafkas_order(
    cluster: EmbeddedCluster, admin: AdminClient
) -> None:
    alter(admin, "", ("log.retention.ms", "7200000"))
    alter(admin, "1", ("log.retention.ms", "3600000"))
    try:
        zero = described(admin, BROKER, "0")["log.retention.ms"]
        assert (zero.value, ConfigSource(zero.source)) == (
            "7200000",
            ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG,
        )
        assert not zero.is_read_only
        one = described(admin, BROKER, "1")["log.retention.ms"]
        assert (one.value, ConfigSource(one.source)) == (
            "3600000",
            ConfigSource.DYNAMIC_BROKER_CONFIG,
        )
        # The cluster's resource shows its dynamic defaults alone, as Kafka's does.
        assert cluster_defaults(admin.bootstrap) == {"log.retention.ms": "7200000"}

        topic = "dyn-described"
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(TIMEOUT_S)
        # Described by whichever broker the client asks: each answers with its own.
        retention = described(admin, TOPIC, topic)["retention.ms"]
        assert (retention.value, ConfigSource(retention.source)) in {
            ("3600000", ConfigSource.DYNAMIC_BROKER_CONFIG),
            ("7200000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG),
        }
        # Each broker's log holds the default in force there.
        in_force = cluster.read(
            lambda: [b.admin.log_config(topic).retention_ms for b in cluster.brokers]
        )
        assert in_force == [7_200_000, 3_600_000]
    finally:
        alter(admin, "1", ("log.retention.ms", None))
        alter(admin, "", ("log.retention.ms", None))
    zero = described(admin, BROKER, "0")["log.retention.ms"]
    assert ConfigSource(zero.source) != ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG


def test_a_shorter_retention_deletes_old_segments_of_topics_without_an_override(
    cluster: EmbeddedCluster, admin: AdminClient
) -> None:
    kept, default = "dyn-kept", "dyn-defaulted"
    for topic, configs in ((kept, {"retention.ms": "-1"}), (default, {})):
        new = NewTopic(topic, 1, 2, config={"segment.bytes": "4096", **configs})
        admin.create_topics([new])[topic].result(TIMEOUT_S)
    # batches of 5 records (1 KiB): a segment of 4 KiB rolls every few batches
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "batch.num.messages": 5})
    for _ in range(200):
        for topic in (kept, default):
            producer.produce(topic, b"x" * 200, partition=0)
        producer.poll(0)
    assert producer.flush(TIMEOUT_S) == 0

    alter(admin, "", ("log.retention.ms", "1"))
    try:
        consumer = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": "dyn"})

        def log_start(topic: str) -> int:
            low, _high = consumer.get_watermark_offsets(TopicPartition(topic, 0), TIMEOUT_S)
            return int(low)

        wait_for(lambda: log_start(default) > 0, "retention to delete the old segments")
        assert log_start(kept) == 0  # its own retention.ms holds
        consumer.close()
    finally:
        alter(admin, "", ("log.retention.ms", None))


def test_only_dynamic_configs_with_valid_values_are_accepted(admin: AdminClient) -> None:
    assert refused(admin, "0", "log.dirs", "/elsewhere") == "INVALID_REQUEST"
    assert refused(admin, "", "log.retention.hours", "2") == "INVALID_REQUEST"
    # Kafka answers every broker config it cannot take so, bad values included.
    assert refused(admin, "0", "log.segment.bytes", "big") == "INVALID_REQUEST"
    assert refused(admin, "", "log.cleanup.policy", "shred") == "INVALID_REQUEST"
    # local retention beyond the log's retention, as Kafka's DynamicLogConfig refuses it
    assert refused(admin, "", "log.local.retention.ms", "10000000000000") == "INVALID_REQUEST"
    assert cluster_defaults(admin.bootstrap) == {}


def test_dynamic_configs_outlive_a_restart(cluster: EmbeddedCluster, admin: AdminClient) -> None:
    alter(admin, "", ("log.segment.bytes", "2097152"))
    try:
        cluster.stop_broker(0)
        cluster.start_broker(0)
        entry = described(admin, BROKER, "0")["log.segment.bytes"]
        assert entry.value == "2097152"
        wait_for(
            lambda: (
                cluster.read(lambda: cluster.broker(0).dynamic_config.log_defaults())[
                    "segment.bytes"
                ]
                == 2_097_152
            ),
            "the restarted broker to read its dynamic configs",
        )
    finally:
        alter(admin, "", ("log.segment.bytes", None))


def test_the_command_line_alters_and_describes_a_brokers_configs(
    cluster: EmbeddedCluster,
) -> None:
    bootstrap = cluster.bootstrap_servers
    done = cli(bootstrap, "alter", "--broker", "1", "--config", "log.roll.ms=600000")
    assert done.returncode == 0, done.stderr
    try:
        shown = cli(bootstrap, "describe", "--broker", "1")
        assert "log.roll.ms" in shown.stdout and "dynamic_broker_config" in shown.stdout
        assert "log.roll.ms" not in cli(bootstrap, "describe", "--broker", "0").stdout
        static = cli(bootstrap, "alter", "--broker", "0", "--config", "num.partitions=3")
        assert static.returncode == 1
        assert static.stderr.startswith("error: alter configs of broker 0: INVALID_REQUEST")
        assert "dynamically" in static.stderr and static.stderr.count("\n") == 1
        both = cli(bootstrap, "describe", "--broker", "0", "--default")
        assert both.returncode == 2 and "give --broker N or --default" in both.stderr
    finally:
        deleted = cli(bootstrap, "alter", "--broker", "1", "--delete-config", "log.roll.ms")
        assert deleted.returncode == 0
