"""Malformed batches with a valid CRC, produced over the wire: each is refused with Kafka's
error code and nothing of it is stored, so confluent-kafka and `kcat -C -e` read the topic
to its end and finish, with exactly the valid records.

Before record-level validation, one such batch (a lastOffsetDelta of 99,999 on one
record) moved the high watermark past records that do not exist: confluent-kafka stopped
delivering without an error and `kcat -e` never exited.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.forged_batches import encode_record, forge_batch
from tests.integration.broker_process import BrokerProcess
from tests.integration.test_kcat import kcat
from tests.integration.wire import WireClient, produce_batch
from tierbroker.protocol.errors import ErrorCode
from tierbroker.protocol.records import Compression, build_batch

TOPIC = "malformed"
HOUR_MS = 3_600_000


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def valid(value: bytes) -> bytes:
    return build_batch([(None, value, [], now_ms())])


def records(*deltas: int, length_error: int = 0) -> bytes:
    """Records with these offset deltas; the last one's length lies by `length_error`."""
    encoded = [encode_record(d, value=b"never stored") for d in deltas[:-1]]
    encoded.append(encode_record(deltas[-1], value=b"never stored", length_error=length_error))
    return b"".join(encoded)


# (name, batch factory, Kafka's error code)
MALFORMED: list[tuple[str, Callable[[], bytes], ErrorCode]] = [
    (
        "lastOffsetDelta far past its one record",
        lambda: forge_batch(records(0), count=1, last_offset_delta=99_999, timestamp_ms=now_ms()),
        ErrorCode.invalid_record,
    ),
    (
        "recordsCount above the records present",
        lambda: forge_batch(records(0), count=2, timestamp_ms=now_ms()),
        ErrorCode.invalid_record,
    ),
    (
        "a record length one byte too long",
        lambda: forge_batch(records(0, 1, length_error=1), count=2, timestamp_ms=now_ms()),
        ErrorCode.invalid_record,
    ),
    (
        "a record length one byte too short",
        lambda: forge_batch(records(0, 1, length_error=-1), count=2, timestamp_ms=now_ms()),
        ErrorCode.invalid_record,
    ),
    (
        "bytes after the last record",
        lambda: forge_batch(records(0) + b"\x00\x00", count=1, timestamp_ms=now_ms()),
        ErrorCode.invalid_record,
    ),
    (
        "offset deltas out of sequence",
        lambda: forge_batch(records(0, 7), count=2, timestamp_ms=now_ms()),
        ErrorCode.invalid_record,
    ),
    (
        "the control bit set by a client",
        lambda: forge_batch(records(0), count=1, attributes=0x20, timestamp_ms=now_ms()),
        ErrorCode.invalid_record,
    ),
    (
        "gzip: lastOffsetDelta past its records",
        lambda: forge_batch(
            records(0, 1),
            count=2,
            last_offset_delta=50_000,
            compression=Compression.GZIP,
            timestamp_ms=now_ms(),
        ),
        ErrorCode.invalid_record,
    ),
    (
        "zstd: a record length that lies",
        lambda: forge_batch(
            records(0, 1, length_error=3),
            count=2,
            compression=Compression.ZSTD,
            timestamp_ms=now_ms(),
        ),
        ErrorCode.invalid_record,
    ),
    (
        "a timestamp two hours ahead (message.timestamp.after.max.ms is one hour)",
        lambda: forge_batch(records(0), count=1, timestamp_ms=now_ms() + 2 * HOUR_MS),
        ErrorCode.invalid_timestamp,
    ),
    (
        "a valid batch followed by a malformed one in the same request",
        lambda: (
            valid(b"never stored either")
            + forge_batch(records(0), count=1, last_offset_delta=9, timestamp_ms=now_ms())
        ),
        ErrorCode.invalid_record,
    ),
]


def read_to_end(bootstrap: str, timeout_s: float = 20.0) -> list[bytes]:
    """Every value from offset 0 up to the partition's end, as confluent-kafka delivers them."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "malformed-check",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            assert time.monotonic() < deadline, f"no end of partition after {values!r}"
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                return values
            values.append(message.value())
    finally:
        consumer.close()


def test_malformed_batches_are_refused_and_consumers_reach_the_end(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(15)
    expected: list[bytes] = []
    with WireClient(broker.port) as client:
        for i, (name, malformed, code) in enumerate(MALFORMED):
            good = f"valid-{i}".encode()
            answer = produce_batch(client, TOPIC, valid(good), version=12)
            assert (answer.error_code, answer.base_offset) == (ErrorCode.none, len(expected))
            expected.append(good)
            refusal = produce_batch(client, TOPIC, bytes(malformed()), version=12)
            assert (refusal.error_code, refusal.base_offset) == (code, -1), name
        last = produce_batch(client, TOPIC, valid(b"last"), version=12)
        assert (last.error_code, last.base_offset) == (ErrorCode.none, len(expected)), (
            "a refusal moved the log end offset"
        )
        expected.append(b"last")

    assert read_to_end(broker.bootstrap) == expected
    out = kcat(broker.bootstrap, "-C", "-t", TOPIC, "-e", "-o", "beginning", "-f", "%o:%s\n")
    assert out.splitlines() == [f"{i}:{v.decode()}" for i, v in enumerate(expected)]
    assert broker.log().count(f"produce to {TOPIC}-0 refused") == len(MALFORMED)


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_stock_producers_pass_validation(broker: BrokerProcess, codec: str) -> None:
    """kcat (librdkafka) batches, compressed or not, with keys and headers, all go in."""
    topic = f"valid-{codec}"
    lines = [f"key{i}:value{i}" for i in range(500)]
    kcat(
        broker.bootstrap,
        "-P",
        "-t",
        topic,
        "-K:",
        "-H",
        "h=1",
        "-X",
        f"compression.codec={codec}",
        stdin="\n".join(lines) + "\n",
    )
    out = kcat(broker.bootstrap, "-C", "-t", topic, "-e", "-o", "beginning", "-f", "%k:%s\n")
    assert out.splitlines() == lines
    assert "refused" not in broker.log()
