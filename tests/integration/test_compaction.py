"""Log compaction through stock clients, on one broker process, and as Apache Kafka does it.

20 keys overwritten 50 times each and 5 of them deleted (tombstones, kcat `-Z`), on a
topic with small segments: once the cleaner has run, every client reading from offset
0 gets the 15 last values, at their original offsets, and the tombstones until
`delete.retention.ms` after their first cleaning, then not. A tiered topic cannot be
compacted, in either order of setting the two configs, as Kafka refuses it; the
cleaner's metrics and log lines say what it did. The same records on Apache Kafka
and on tierbroker read back the same once both cleaned (Kafka 4.x rolls segments of
1 MiB at the least, so there a segment rolls by time, between the three writes).
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
import uuid
import warnings
from collections.abc import Iterator

import pytest
from aiokafka import AIOKafkaConsumer
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from tests.apache_kafka import run_tool
from tests.integration.broker_process import BrokerProcess
from tests.integration.test_kcat import kcat
from tests.integration.waiting import wait_for

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", r"(read|open)_text is deprecated", DeprecationWarning)
    from kafka import KafkaConsumer

TIMEOUT_S = 20.0
KEYS, ROUNDS, DELETED = 20, 50, 5
HORIZON_MS = 1500
COMPACTED = {
    "cleanup.policy": "compact",
    "segment.bytes": "2048",
    "segment.ms": "400",
    "min.cleanable.dirty.ratio": "0.01",
    "delete.retention.ms": str(HORIZON_MS),
}

Row = tuple[int, str, str | None]  # offset, key, value (None: a tombstone)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(
        tmp_path_factory.mktemp("compaction"), {"log.cleaner.backoff.ms": "100"}
    ).start()
    yield process
    process.stop()
    assert "Traceback" not in process.log(), process.log()


@pytest.fixture(scope="module")
def admin(broker: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def create(admin: AdminClient, topic: str, config: dict[str, str]) -> None:
    admin.create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result(TIMEOUT_S)


def produce_rounds(bootstrap: str, topic: str) -> dict[str, str | None]:
    """Every key overwritten ROUNDS times, then the first DELETED keys deleted; the last
    value of each key."""
    lines = [f"k{k}:r{r}-k{k}" for r in range(ROUNDS) for k in range(KEYS)]
    kcat(bootstrap, "-P", "-t", topic, "-K:", stdin="\n".join(lines) + "\n")
    tombstones = "".join(f"k{k}:\n" for k in range(DELETED))
    kcat(bootstrap, "-P", "-t", topic, "-K:", "-Z", stdin=tombstones)
    return {f"k{k}": None if k < DELETED else f"r{ROUNDS - 1}-k{k}" for k in range(KEYS)}


def roll(bootstrap: str, topic: str, n: int) -> None:
    """One record more after segment.ms, so that everything before it is in rolled
    segments, which the cleaner may take (the active segment it never takes)."""
    time.sleep(int(COMPACTED["segment.ms"]) / 1000 + 0.1)
    kcat(bootstrap, "-P", "-t", topic, "-K:", stdin=f"roll:{n}\n")


def kcat_rows(bootstrap: str, topic: str) -> list[Row]:
    out = kcat(bootstrap, "-C", "-t", topic, "-o", "beginning", "-e", "-Z", "-f", "%o %k %s\\n")
    rows = []
    for line in out.splitlines():
        offset, key, value = line.split(" ", 2)
        rows.append((int(offset), key, None if value == "NULL" else value))
    return rows


def confluent_rows(bootstrap: str, topic: str) -> list[Row]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4()}"})
    _, end = consumer.get_watermark_offsets(TopicPartition(topic, 0), TIMEOUT_S)
    consumer.assign([TopicPartition(topic, 0, 0)])
    rows: list[Row] = []
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while (not rows or rows[-1][0] < end - 1) and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                raise KafkaException(message.error())
            value = message.value()
            rows.append((message.offset(), message.key().decode(), value and value.decode()))
    finally:
        consumer.close()
    return rows


def kafka_python_rows(bootstrap: str, topic: str) -> list[Row]:
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        consumer_timeout_ms=2000,
        enable_auto_commit=False,
    )
    try:
        return [(m.offset, m.key.decode(), m.value and m.value.decode()) for m in consumer]
    finally:
        consumer.close()


def aiokafka_rows(bootstrap: str, topic: str) -> list[Row]:
    async def read() -> list[Row]:
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest"
        )
        await consumer.start()
        try:
            rows: list[Row] = []
            while batch := await consumer.getmany(timeout_ms=2000):
                for messages in batch.values():
                    rows += [
                        (m.offset, m.key.decode(), m.value and m.value.decode()) for m in messages
                    ]
            return rows
        finally:
            await consumer.stop()

    return asyncio.run(read())


def java_rows(bootstrap: str, topic: str) -> list[Row]:
    out = run_tool(
        "consumer.ConsoleConsumer",
        *("--bootstrap-server", bootstrap, "--topic", topic, "--from-beginning"),
        *("--timeout-ms", "3000", "--property", "print.key=true"),
        *("--property", "print.offset=true", "--property", "print.partition=false"),
    )
    rows = []
    for line in out.splitlines():
        if not line.startswith("Offset:"):
            continue
        offset, key, value = line.split("\t", 2)
        rows.append((int(offset.removeprefix("Offset:")), key, None if value == "null" else value))
    return rows


def last_values(rows: list[Row]) -> dict[str, str | None]:
    return {key: value for _, key, value in rows}


def test_every_client_reads_the_last_values_then_no_tombstones(
    broker: BrokerProcess, admin: AdminClient
) -> None:
    topic = "compacted"
    create(admin, topic, COMPACTED)
    bootstrap = broker.bootstrap
    expected = produce_rounds(bootstrap, topic)
    written = KEYS * ROUNDS + DELETED
    roll(bootstrap, topic, 1)

    def cleaned() -> list[Row] | None:
        rows = kcat_rows(bootstrap, topic)
        return rows if len(rows) == KEYS + 1 else None

    rows = wait_for(
        cleaned,
        "the cleaner to keep one record a key",
        show=lambda: len(kcat_rows(bootstrap, topic)),
    )
    assert last_values(rows) == {**expected, "roll": "1"}
    offsets = [offset for offset, _, _ in rows]
    assert offsets == sorted(offsets) and offsets[-1] == written  # offsets kept, gaps between
    # The earliest offset does not move: the log still starts at 0.
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks"})
    assert consumer.get_watermark_offsets(TopicPartition(topic, 0), TIMEOUT_S) == (0, written + 1)
    consumer.close()
    for read in (confluent_rows, kafka_python_rows, aiokafka_rows, java_rows):
        assert read(bootstrap, topic) == rows, read.__name__

    # Past the horizon, the next pass drops the tombstones.
    time.sleep(HORIZON_MS / 1000)
    roll(bootstrap, topic, 2)
    live = {key: value for key, value in expected.items() if value is not None}
    final = wait_for(
        lambda: (r := kcat_rows(bootstrap, topic)) and len(r) == len(live) + 2 and r,
        "the tombstones to go",
        show=lambda: kcat_rows(bootstrap, topic),
    )
    assert last_values(final) == {**live, "roll": "2"}
    assert [value for _, key, value in final if key == "roll"] == ["1", "2"]  # 2 is active
    for read in (confluent_rows, kafka_python_rows, aiokafka_rows, java_rows):
        assert read(bootstrap, topic) == final, read.__name__
    assert "compacted-0: cleaned up to offset" in broker.log()


def test_the_cleaner_reports_its_passes(broker: BrokerProcess, admin: AdminClient) -> None:
    topic = "reported"
    create(admin, topic, COMPACTED)
    produce_rounds(broker.bootstrap, topic)
    roll(broker.bootstrap, topic, 1)
    wait_for(lambda: f"{topic}-0: cleaned up to offset" in broker.log(), "a pass over it")
    metrics = (
        urllib.request.urlopen(f"http://127.0.0.1:{broker.metrics_port}/metrics", timeout=TIMEOUT_S)
        .read()
        .decode()
    )
    values = {
        line.split(" ")[0].split("{")[0]: float(line.split(" ")[1])
        for line in metrics.splitlines()
        if line and not line.startswith("#")
    }
    assert 0 < values["max_buffer_utilization_percent"] < 100
    assert 0 < values["cleaner_recopy_percent"] < 100
    assert values["uncleanable_partitions_count"] == 0
    assert values["DeadThreadCount"] == 0
    assert "max_dirty_percent" in values and "max_clean_time_secs" in values


def alter(
    admin: AdminClient, name: str, config: str, value: str, kind: ResourceType = ResourceType.TOPIC
) -> None:
    """Set one config of a topic (or of another `kind` of resource) incrementally."""
    entry = ConfigEntry(config, value, incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(kind, name, incremental_configs=[entry])
    (future,) = admin.incremental_alter_configs([resource]).values()
    future.result(timeout=TIMEOUT_S)


KAFKAS_WORDS = (
    "Remote log storage only supports topics with cleanup.policy=delete or cleanup.policy "
    "being an empty list."
)


def test_a_tiered_topic_cannot_be_compacted_in_either_order(admin: AdminClient) -> None:
    with pytest.raises(KafkaException) as both:
        create(
            admin,
            "tiered-compacted",
            {"remote.storage.enable": "true", "cleanup.policy": "compact"},
        )
    assert both.value.args[0].code() == KafkaError.INVALID_CONFIG
    assert KAFKAS_WORDS in both.value.args[0].str()
    create(admin, "tiered-first", {"remote.storage.enable": "true"})
    with pytest.raises(KafkaException) as tiered_first:
        alter(admin, "tiered-first", "cleanup.policy", "compact,delete")
    assert tiered_first.value.args[0].code() == KafkaError.INVALID_CONFIG
    create(admin, "compacted-first", {"cleanup.policy": "compact"})
    with pytest.raises(KafkaException) as compacted_first:
        alter(admin, "compacted-first", "remote.storage.enable", "true")
    assert compacted_first.value.args[0].code() == KafkaError.INVALID_CONFIG
    assert KAFKAS_WORDS in compacted_first.value.args[0].str()


def test_the_same_records_clean_to_the_same_log_as_on_apache_kafka(
    kafka_broker: str, request: pytest.FixtureRequest
) -> None:
    if request.node.callspec.params["kafka_broker"] == "apache-kafka":
        clean_often(kafka_broker)
    topic = f"as-kafka-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_broker})
    create(admin, topic, {**COMPACTED, "segment.bytes": str(1 << 20)})
    roll(kafka_broker, topic, 0)  # the first write: the segment's clock starts
    expected = produce_rounds(kafka_broker, topic)
    roll(kafka_broker, topic, 1)
    rows = wait_for(
        lambda: (r := kcat_rows(kafka_broker, topic)) and len(r) == KEYS + 2 and r,
        "one record a key",
        show=lambda: len(kcat_rows(kafka_broker, topic)),
    )
    last_round = 1 + KEYS * (ROUNDS - 1)  # roll:0 came first
    tombstones = 1 + KEYS * ROUNDS
    assert rows == [
        (0, "roll", "0"),
        *[(last_round + k, f"k{k}", expected[f"k{k}"]) for k in range(DELETED, KEYS)],
        *[(tombstones + k, f"k{k}", None) for k in range(DELETED)],
        (tombstones + DELETED, "roll", "1"),
    ]


def clean_often(bootstrap: str) -> None:
    """Apache Kafka's cleaner backoff, 100 ms (a dynamic broker config there)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    alter(admin, "1", "log.cleaner.backoff.ms", "100", ResourceType.BROKER)
