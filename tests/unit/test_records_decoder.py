"""Cross-checks of our batch builder and decoder against independent implementations.

kafka-python checks the record and batch framing: it only has gzip built in (for snappy,
lz4 and zstd it wants python-snappy, lz4 and zstandard, which are not installed), so
`kafka_python_codecs` plugs cramjam in underneath it; its batch header, CRC and xerial
snappy framing (what the Java client writes) stay its own. librdkafka, through
confluent-kafka's mock cluster, checks the codecs themselves.
"""

from __future__ import annotations

import random
import socket
import struct
import time
import warnings
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import confluent_kafka
import cramjam
import pytest

from tierbroker.protocol.errors import ErrorCode
from tierbroker.protocol.records import (
    BatchView,
    Compression,
    Header,
    InvalidRecordError,
    Record,
    TimestampType,
    build_batch,
    decode_batch,
    decode_records,
    decompress,
    iter_batches,
)
from tierbroker.protocol.records.builder import RecordInput
from tierbroker.protocol.records.codecs import XERIAL_MAGIC

with warnings.catch_warnings():  # kafka-python loads its schemas with a deprecated API
    warnings.simplefilter("ignore", DeprecationWarning)
    import kafka.codec
    from kafka.record import default_records
    from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder


def _zstd_stream(data: bytes) -> bytes:
    """A zstd frame without a content size, as the Java client's streaming writer makes."""
    compressor = cramjam.zstd.Compressor()
    compressor.compress(data)
    return bytes(compressor.finish())


@pytest.fixture
def kafka_python_codecs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        kafka.codec,
        "snappy",
        SimpleNamespace(
            compress=lambda data: bytes(cramjam.snappy.compress_raw(data)),
            decompress=lambda data: bytes(cramjam.snappy.decompress_raw(data)),
        ),
    )
    monkeypatch.setattr(kafka.codec, "has_lz4", lambda: True)
    monkeypatch.setattr(kafka.codec, "has_zstd", lambda: True)
    # cramjam's own frame defaults: linked blocks and checksums, unlike ours
    monkeypatch.setattr(default_records, "lz4_encode", lambda d: bytes(cramjam.lz4.compress(d)))
    monkeypatch.setattr(default_records, "lz4_decode", lambda d: bytes(cramjam.lz4.decompress(d)))
    monkeypatch.setattr(default_records, "zstd_encode", _zstd_stream)
    monkeypatch.setattr(default_records, "zstd_decode", lambda d: bytes(cramjam.zstd.decompress(d)))


def sample_records(seed: int, count: int = 40) -> list[RecordInput]:
    """Null and empty keys and values, headers, unicode, timestamps out of order, and values
    big enough to span several 32 KiB xerial blocks."""
    rng = random.Random(seed)
    base = 1_700_000_000_000
    records: list[RecordInput] = []
    for index in range(count):
        key = rng.choice([None, b"", f"key-{index % 7}".encode()])
        value = rng.choice(
            [
                None,
                b"",
                rng.randbytes(rng.randint(1, 50)),
                b"payload %d " % index * rng.randint(1, 9000),
            ]
        )
        headers = [
            (rng.choice(["trace", "ünï", ""]), rng.choice([None, b"", b"h" * 300]))
            for _ in range(rng.randint(0, 3))
        ]
        records.append((key, value, headers, base + rng.randint(-5_000, 5_000)))
    return records


def as_records(inputs: list[RecordInput], base_offset: int) -> tuple[Record, ...]:
    return tuple(
        Record(base_offset + i, ts, key, value, tuple(Header(k, v) for k, v in headers))
        for i, (key, value, headers, ts) in enumerate(inputs)
    )


def kafka_python_batch(inputs: list[RecordInput], codec: Compression, **producer: Any) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=int(codec),
        is_transactional=producer.get("transactional", False),
        producer_id=producer.get("producer_id", -1),
        producer_epoch=producer.get("epoch", -1),
        base_sequence=producer.get("sequence", -1),
        batch_size=1 << 30,
    )
    for offset, (key, value, headers, ts) in enumerate(inputs):
        assert builder.append(offset, ts, key, value, list(headers)) is not None
    return bytes(builder.build())


def kafka_python_read(batch: bytes) -> tuple[DefaultRecordBatch, list[Record]]:
    reader = DefaultRecordBatch(batch)
    assert reader.validate_crc()
    records = [
        Record(r.offset, r.timestamp, r.key, r.value, tuple(Header(k, v) for k, v in r.headers))
        for r in reader
    ]
    return reader, records


CODECS = list(Compression)


@pytest.mark.usefixtures("kafka_python_codecs")
@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
@pytest.mark.parametrize("seed", [1, 2])
def test_kafka_python_batches_decode_identically(codec: Compression, seed: int) -> None:
    inputs = sample_records(seed)
    batch = kafka_python_batch(
        inputs, codec, transactional=True, producer_id=4242, epoch=3, sequence=77
    )
    view = BatchView(batch)
    view.validate()
    assert view.compression is codec  # kafka-python falls back to NONE if it doesn't shrink

    decoded = decode_batch(view)

    assert decoded.records == as_records(inputs, 0)
    assert decoded.records == tuple(kafka_python_read(batch)[1])
    assert (decoded.producer_id, decoded.producer_epoch, decoded.base_sequence) == (4242, 3, 77)
    assert decoded.is_transactional and not decoded.is_control


@pytest.mark.usefixtures("kafka_python_codecs")
@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
@pytest.mark.parametrize("seed", [1, 2])
def test_our_batches_parse_identically_with_kafka_python(codec: Compression, seed: int) -> None:
    inputs = sample_records(seed)
    batch = build_batch(
        inputs,
        base_offset=1000,
        compression=codec,
        producer_id=9,
        producer_epoch=1,
        base_sequence=5,
        partition_leader_epoch=12,
    )

    reader, records = kafka_python_read(batch)

    assert records == list(as_records(inputs, 1000))
    assert (reader.base_offset, reader.leader_epoch, reader.compression_type) == (1000, 12, codec)
    assert (reader.producer_id, reader.producer_epoch, reader.base_sequence) == (9, 1, 5)
    assert reader.last_offset_delta == len(inputs) - 1
    assert reader.first_timestamp == inputs[0][3]
    assert reader.max_timestamp == max(ts for *_, ts in inputs)


@pytest.mark.usefixtures("kafka_python_codecs")
@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_log_append_time_reads_the_same_in_both(codec: Compression) -> None:
    inputs = sample_records(3, count=5)
    batch = bytearray(build_batch(inputs, compression=codec))
    BatchView(batch).set_log_append_time(1_234_567)

    _, theirs = kafka_python_read(bytes(batch))
    ours = decode_batch(BatchView(batch))

    assert ours.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert ours.records == tuple(theirs)
    assert {r.timestamp for r in ours.records} == {1_234_567}


def test_extreme_varints_agree() -> None:
    """int64-wide timestamp deltas and int32 offsets, both signs, through both codecs."""
    inputs: list[RecordInput] = [
        (None, b"a", [], 0),
        (None, b"b", [], 2**62),
        (None, b"c", [], -(2**62)),
        (None, b"d", [], 63),
        (None, b"e", [], -64),
        (None, b"f", [], 64),
    ]
    ours = build_batch(inputs)
    theirs = kafka_python_batch(inputs, Compression.NONE)
    assert ours[21:] == theirs[21:]  # only the partition leader epoch differs: -1 vs 0
    assert decode_batch(BatchView(theirs)).records == as_records(inputs, 0)


@pytest.mark.usefixtures("kafka_python_codecs")
def test_xerial_snappy_is_what_kafka_python_writes_and_we_read() -> None:
    payload = b"".join(b"record %d;" % i for i in range(20_000))  # several 32 KiB blocks
    framed = kafka.codec.snappy_encode(payload)  # xerial_compatible=True, as the Java client

    assert framed.startswith(XERIAL_MAGIC)
    assert struct.unpack_from(">ii", framed, 8) == (1, 1)
    assert decompress(Compression.SNAPPY, framed) == payload
    assert decompress(Compression.SNAPPY, kafka.codec.snappy_encode(b"")) == b""


def test_xerial_version_fields_are_not_checked() -> None:
    """Some producers write version and compat little-endian; Kafka reads them anyway."""
    block = bytes(cramjam.snappy.compress_raw(b"hello"))
    framed = XERIAL_MAGIC + struct.pack("<ii", 1, 1) + struct.pack(">i", len(block)) + block
    assert decompress(Compression.SNAPPY, framed) == b"hello"


@pytest.mark.parametrize(
    "tail", [b"\x00\x00", struct.pack(">i", 99) + b"xyz", struct.pack(">i", -1)]
)
def test_truncated_xerial_streams_are_corrupt(tail: bytes) -> None:
    framed = XERIAL_MAGIC + struct.pack(">ii", 1, 1) + tail
    with pytest.raises(InvalidRecordError) as refused:
        decompress(Compression.SNAPPY, framed)
    assert refused.value.code == ErrorCode.corrupt_message


def test_our_lz4_frames_are_what_the_java_client_accepts() -> None:
    """Java's Lz4BlockInputStream refuses linked blocks; FLG bit 5 must be set."""
    batch = build_batch(sample_records(4, count=5), compression=Compression.LZ4)
    frame = batch[61:]
    assert frame[:4] == b"\x04\x22\x4d\x18"
    assert frame[4] & 0x20, "blocks must be independent"
    assert frame[4] >> 6 == 1


def test_our_snappy_is_raw_like_librdkafka() -> None:
    batch = build_batch(sample_records(5, count=5), compression=Compression.SNAPPY)
    raw = batch[61:]
    assert not raw.startswith(XERIAL_MAGIC)
    assert bytes(cramjam.snappy.decompress_raw(raw))  # one raw block, no framing


@pytest.fixture
def many_batches() -> Iterator[tuple[bytes, list[Record]]]:
    chunks: list[bytes] = []
    expected: list[Record] = []
    offset = 0
    for seed, codec in enumerate(CODECS):
        inputs = sample_records(seed, count=4)
        chunks.append(build_batch(inputs, base_offset=offset, compression=codec))
        expected.extend(as_records(inputs, offset))
        offset += len(inputs)
    yield b"".join(chunks), expected


def test_decode_records_reads_a_fetch_response_worth(
    many_batches: tuple[bytes, list[Record]],
) -> None:
    buf, expected = many_batches
    assert list(decode_records(buf)) == expected
    assert list(decode_records(buf + buf[:30])) == expected
    assert list(decode_records(memoryview(buf))) == expected


def test_decode_records_refuses_a_corrupt_batch_with_its_position(
    many_batches: tuple[bytes, list[Record]],
) -> None:
    buf = bytearray(many_batches[0])
    second = BatchView(buf).size_in_bytes
    buf[second + 70] ^= 0xFF
    with pytest.raises(InvalidRecordError, match=f"position {second}") as refused:
        list(decode_records(buf))
    assert refused.value.code == ErrorCode.corrupt_message


def test_record_errors_name_the_batch_and_record() -> None:
    batch = bytearray(build_batch([(b"k", b"v", [], 0), (b"k", b"v", [], 0)], base_offset=7))
    batch[61 + 9] = 0x7F  # second record's length varint, overrunning the section
    with pytest.raises(InvalidRecordError, match=r"baseOffset 7\): record 1 at byte 9") as err:
        decode_batch(BatchView(batch))
    assert err.value.code == ErrorCode.corrupt_message


def test_trailing_bytes_after_the_records_are_corrupt() -> None:
    batch = bytearray(build_batch([(b"k", b"v", [], 0)]) + b"\x00")
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    with pytest.raises(InvalidRecordError, match="1 bytes left after recordsCount 1"):
        decode_batch(BatchView(batch))


def test_build_batch_needs_a_record() -> None:
    with pytest.raises(ValueError, match="at least one record"):
        build_batch([])


def _request(address: tuple[str, int], api_key: int, version: int, body: bytes) -> bytes:
    """One request (header v1, null client id) on a fresh connection; the response body."""
    request = struct.pack(">hhih", api_key, version, 1, -1) + body
    with socket.create_connection(address, timeout=10) as conn:
        conn.sendall(struct.pack(">i", len(request)) + request)
        with conn.makefile("rb") as stream:
            (size,) = struct.unpack(">i", stream.read(4))
            response = stream.read(size)
    assert len(response) == size
    return response[4:]  # correlation id


def _topic_partition_0(topic: bytes) -> bytes:
    return struct.pack(">ih", 1, len(topic)) + topic + struct.pack(">ii", 1, 0)


def _fetch_v4(address: tuple[str, int], topic: bytes, offset: int) -> bytes:
    """The records bytes of partition 0 from `offset`."""
    body = (
        struct.pack(">iiiib", -1, 100, 1, 1 << 24, 0)
        + _topic_partition_0(topic)
        + struct.pack(">qi", offset, 1 << 24)
    )
    response = _request(address, 1, 4, body)
    position = 4 + 4 + 2 + len(topic) + 4  # throttle, topic count and name, partition count
    _, error, _, _, aborted = struct.unpack_from(">ihqqi", response, position)
    assert error == 0
    position += 26 + 16 * max(aborted, 0)
    (size,) = struct.unpack_from(">i", response, position)
    return response[position + 4 : position + 4 + size]


def _produce_v3(address: tuple[str, int], topic: bytes, batch: bytes) -> None:
    body = (
        struct.pack(">hhi", -1, 1, 5000)
        + _topic_partition_0(topic)
        + struct.pack(">i", len(batch))
        + batch
    )
    response = _request(address, 0, 3, body)
    (error,) = struct.unpack_from(">h", response, 4 + 2 + len(topic) + 4 + 4)
    assert error == 0


@pytest.mark.parametrize(
    "codec", [c for c in CODECS if c is not Compression.NONE], ids=lambda c: c.name
)
def test_librdkafka_batches_and_ours_interoperate(codec: Compression) -> None:
    """librdkafka writes raw snappy, independent-block lz4 and zstd without a content size;
    we decode its batches, and its consumer (CRC checks on) decodes ours."""
    big = b"".join(b"value %d " % i for i in range(20_000))
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": "unused:9092",
            "test.mock.num.brokers": 1,
            "compression.type": codec.name.lower(),
            "linger.ms": 1000,
        }
    )
    broker = next(iter(producer.list_topics(timeout=10).brokers.values()))
    address = (broker.host, broker.port)
    theirs: list[RecordInput] = [
        (
            None if i == 1 else b"k%d" % i,
            big if i == 2 else b"v%d" % i * 50,
            [("h", b"x"), ("n", None)],
            1000 + i,
        )
        for i in range(5)
    ]
    for key, value, headers, ts in theirs:
        producer.produce("t", value, key, partition=0, timestamp=ts, headers=list(headers))
    assert producer.flush(10) == 0

    fetched: list[Record] = []
    while len(fetched) < len(theirs):  # the mock broker may answer one batch at a time
        records = _fetch_v4(address, b"t", len(fetched))
        # librdkafka sends a batch uncompressed if compressing does not shrink it
        assert {view.compression for view in iter_batches(records)} == {codec}
        before = len(fetched)
        fetched.extend(decode_records(records))
        assert len(fetched) > before
    assert fetched == list(as_records(theirs, 0))

    ours: list[RecordInput] = [
        (b"ok%d" % i, big if i == 1 else b"mine%d" % i, [("a", b"b")], 2000 + i) for i in range(3)
    ]
    _produce_v3(address, b"t", build_batch(ours, compression=codec))
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": f"{broker.host}:{broker.port}",
            "group.id": "check",
            "check.crcs": True,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([confluent_kafka.TopicPartition("t", 0, len(theirs))])
    consumed: list[tuple[Any, ...]] = []
    deadline = time.monotonic() + 10
    while len(consumed) < len(ours) and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None:
            assert message.error() is None, message.error()
            consumed.append(
                (
                    message.offset(),
                    message.timestamp()[1],
                    message.key(),
                    message.value(),
                    message.headers(),
                )
            )
    consumer.close()
    assert consumed == [
        (r.offset, r.timestamp, r.key, r.value, [(h.key, h.value) for h in r.headers])
        for r in as_records(ours, len(theirs))
    ]
