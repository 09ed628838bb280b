"""Produce to a compacted topic through stock clients, on one broker process: a record
without a key is refused as Apache Kafka refuses it (LogValidator.validateKey), with
INVALID_RECORD for its whole batch, so a consumer reading from the beginning gets only
the keyed records produced beside it. confluent-kafka reports the delivery error, kcat
(`-P` without `-K`) fails, and the ProduceResponse carries Kafka's message."""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.broker_process import BrokerProcess
from tests.integration.test_kcat import KCAT_TIMEOUT_S, kcat
from tests.integration.wire import WireClient, produce_batch
from tierbroker.protocol.errors import ErrorCode
from tierbroker.protocol.records import build_batch

TIMEOUT_S = 20.0
NO_KEY = "Compacted topic cannot accept message without key in topic partition {}-0"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path_factory.mktemp("compaction-produce")).start()
    yield process
    process.stop()
    assert "Traceback" not in process.log(), process.log()


@pytest.fixture
def topic(broker: BrokerProcess) -> str:
    """A new topic of one partition with cleanup.policy=compact."""
    name = f"compacted-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    new = NewTopic(name, 1, 1, config={"cleanup.policy": "compact"})
    admin.create_topics([new])[name].result(TIMEOUT_S)
    return name


def read_from_beginning(bootstrap: str, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    """Every (key, value) up to the partition's end, as confluent-kafka delivers them."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    rows: list[tuple[bytes | None, bytes | None]] = []
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while True:
            assert time.monotonic() < deadline, f"no end of partition after {rows!r}"
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                return rows
            rows.append((message.key(), message.value()))
    finally:
        consumer.close()


def test_confluent_kafka_gets_invalid_record_for_a_keyless_record(
    broker: BrokerProcess, topic: str
) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    reports: list[tuple[bytes | None, KafkaError | None]] = []
    for key, value in ((b"k1", b"first"), (None, b"keyless"), (b"k2", b"second")):
        producer.produce(
            topic, value, key, on_delivery=lambda err, msg: reports.append((msg.key(), err))
        )
        assert producer.flush(TIMEOUT_S) == 0  # one record, one batch
    assert [(key, err and err.code()) for key, err in reports] == [
        (b"k1", None),
        (None, KafkaError.INVALID_RECORD),
        (b"k2", None),
    ]
    refusal = reports[1][1]
    assert refusal is not None and not refusal.retriable()
    assert refusal.str() == "Broker: Broker failed to validate record"  # librdkafka's words
    assert read_from_beginning(broker.bootstrap, topic) == [(b"k1", b"first"), (b"k2", b"second")]


def test_a_keyless_record_takes_the_keyed_records_of_its_batch_with_it(
    broker: BrokerProcess, topic: str
) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 500})
    errors: list[KafkaError | None] = []
    for key, value in ((b"k1", b"same batch"), (None, b"keyless"), (b"k2", b"same batch")):
        producer.produce(topic, value, key, on_delivery=lambda err, _msg: errors.append(err))
    assert producer.flush(TIMEOUT_S) == 0
    assert [err and err.code() for err in errors] == [KafkaError.INVALID_RECORD] * 3
    producer.produce(topic, b"after", b"k3")
    assert producer.flush(TIMEOUT_S) == 0
    assert read_from_beginning(broker.bootstrap, topic) == [(b"k3", b"after")]


def test_kcat_without_keys_fails_and_stores_nothing(broker: BrokerProcess, topic: str) -> None:
    kcat(broker.bootstrap, "-P", "-t", topic, "-K:", stdin="k1:keyed before\n")
    exe = shutil.which("kcat")
    assert exe is not None, "kcat is not installed: apt-get install -y kcat"
    done = subprocess.run(
        [exe, "-b", broker.bootstrap, "-P", "-t", topic],
        input="no key\nnor here\n",
        capture_output=True,
        text=True,
        timeout=KCAT_TIMEOUT_S,
    )
    assert done.returncode != 0
    assert "Delivery failed for message: Broker: Broker failed to validate record" in done.stderr
    kcat(broker.bootstrap, "-P", "-t", topic, "-K:", stdin="k2:keyed after\n")
    out = kcat(broker.bootstrap, "-C", "-t", topic, "-e", "-o", "beginning", "-f", "%o %k %s\n")
    assert out.splitlines() == ["0 k1 keyed before", "1 k2 keyed after"]
    assert read_from_beginning(broker.bootstrap, topic) == [
        (b"k1", b"keyed before"),
        (b"k2", b"keyed after"),
    ]


def test_the_produce_response_carries_kafkas_message(broker: BrokerProcess, topic: str) -> None:
    now_ms = time.time_ns() // 1_000_000
    batch = build_batch([(b"k", b"v", [], now_ms), (None, b"v", [], now_ms)])
    with WireClient(broker.port) as client:
        answer = produce_batch(client, topic, batch, version=12)
    assert (answer.error_code, answer.base_offset) == (ErrorCode.invalid_record, -1)
    assert answer.error_message == (
        "One or more records have been rejected due to 1 record errors in total, and only "
        f"showing the first three errors at most: [RecordError(batchIndex=1, "
        f"message='{NO_KEY.format(topic)}')]"
    )
    assert [(e.batch_index, e.batch_index_error_message) for e in answer.record_errors] == [
        (1, NO_KEY.format(topic))
    ]
