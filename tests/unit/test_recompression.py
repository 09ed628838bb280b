"""compression.type: a batch whose codec is not the topic's is stored re-encoded with it,
records and header fields unchanged, as Kafka's LogValidator does; otherwise as produced."""

from __future__ import annotations

import itertools
import os
import uuid
from pathlib import Path

import pytest

from tierbroker.protocol.errors import ErrorCode
from tierbroker.protocol.records import (
    BatchView,
    Compression,
    InvalidRecordError,
    TimestampType,
    build_batch,
    decode_batch,
    iter_batches,
)
from tierbroker.protocol.records.recompress import recompress
from tierbroker.storage.log import Log, now_ms
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.log_validator import validate_batches
from tierbroker.storage.topic_partition import TopicPartition

TP = TopicPartition("t", 0)


def records(
    count: int = 50, value_bytes: int = 200
) -> list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]]:
    """Keys, values (half random, so codecs differ in size), headers and nulls."""
    now = now_ms()
    return [
        (
            None if i % 7 == 0 else f"key-{i}".encode(),
            None if i == 3 else os.urandom(value_bytes // 2).hex().encode()[: value_bytes // 2] * 2,
            [("h", b"v"), ("null", None)] if i % 5 == 0 else [],
            now + i,
        )
        for i in range(count)
    ]


CODECS = list(Compression)


@pytest.mark.parametrize(
    ("source", "target"),
    [(s, t) for s, t in itertools.product(CODECS, CODECS) if s is not t],
    ids=lambda c: c.name.lower(),
)
def test_recompress_changes_the_codec_and_nothing_else(
    source: Compression, target: Compression
) -> None:
    batch = bytearray(
        build_batch(
            records(),
            compression=source,
            producer_id=7,
            producer_epoch=2,
            base_sequence=40,
            partition_leader_epoch=5,
        )
    )
    before = BatchView(batch)
    after = BatchView(recompress(before, target))
    after.validate()  # size and CRC
    assert after.compression is target
    fields = ("base_offset", "partition_leader_epoch", "last_offset_delta", "base_timestamp",
              "max_timestamp", "producer_id", "producer_epoch", "base_sequence",
              "record_count")  # fmt: skip
    assert {f: getattr(after, f) for f in fields} == {f: getattr(before, f) for f in fields}
    assert after.attributes & ~0x07 == before.attributes & ~0x07
    assert decode_batch(after).records == decode_batch(before).records


def test_the_level_is_the_topics(tmp_path: Path) -> None:
    """A low zstd level stores a larger batch than a high one (KIP-390)."""
    batch = build_batch(records(count=400, value_bytes=1000))
    sizes = {}
    for level in (-50, 19):
        config = LogConfig(compression_type="zstd", compression_zstd_level=level)
        stored, _ = validate_batches(bytearray(batch), config, now_ms(), TP)
        sizes[level] = len(stored)
    assert sizes[-50] > sizes[19]


@pytest.mark.parametrize("compression_type", ["producer", "lz4"])
def test_batches_stored_as_produced_when_the_codec_matches(compression_type: str) -> None:
    request = bytearray(
        build_batch(records(), compression=Compression.LZ4)
        + build_batch(records(), compression=Compression.LZ4)
    )
    stored, batches = validate_batches(
        request, LogConfig(compression_type=compression_type), now_ms(), TP
    )
    assert stored is request, "the request's own buffer, nothing re-encoded"
    assert [b.compression for b in batches] == [Compression.LZ4, Compression.LZ4]


def test_only_the_batches_of_another_codec_are_re_encoded() -> None:
    zstd = build_batch(records(), compression=Compression.ZSTD)
    plain = build_batch(records())
    stored, batches = validate_batches(
        bytearray(zstd + plain), LogConfig(compression_type="zstd"), now_ms(), TP
    )
    assert [b.compression for b in batches] == [Compression.ZSTD, Compression.ZSTD]
    assert bytes(stored[: len(zstd)]) == zstd


def read_back(log: Log) -> list[BatchView]:
    log.update_high_watermark(log.log_end_offset)
    data = log.read(0, 1 << 24, log.high_watermark, True).records
    assert data is not None
    batches = list(iter_batches(data.read()))
    for batch in batches:
        batch.validate()
    return batches


def test_the_log_stores_the_topics_codec_with_offsets_and_log_append_time(
    tmp_path: Path,
) -> None:
    config = LogConfig(compression_type="gzip", message_timestamp_type="LogAppendTime")
    log = Log(tmp_path / "t-0", TP, config, uuid.uuid4())
    first, second = records(10), records(20)
    info = log.append_as_leader(
        bytearray(build_batch(first) + build_batch(second, compression=Compression.SNAPPY)), 3
    )
    assert (info.first_offset, info.last_offset) == (0, 29)
    stored = read_back(log)
    assert [(b.base_offset, b.compression, b.timestamp_type) for b in stored] == [
        (0, Compression.GZIP, TimestampType.LOG_APPEND_TIME),
        (10, Compression.GZIP, TimestampType.LOG_APPEND_TIME),
    ]
    assert {b.partition_leader_epoch for b in stored} == {3}
    assert {b.max_timestamp for b in stored} == {info.log_append_time_ms}
    values = [r.value for b in stored for r in decode_batch(b).records]
    assert values == [r[1] for r in first + second]
    log.close()


def test_a_batch_too_large_once_re_encoded_is_refused_whole(tmp_path: Path) -> None:
    """Kafka checks max.message.bytes again on what it stores: a zstd batch of zeros fits,
    uncompressed it does not."""
    config = LogConfig(compression_type="uncompressed", max_message_bytes=100_000)
    log = Log(tmp_path / "t-0", TP, config, uuid.uuid4())
    small = build_batch([(None, b"ok", [], now_ms())])
    zeros = build_batch([(None, bytes(50_000), [], now_ms())] * 4, compression=Compression.ZSTD)
    assert len(zeros) < 100_000
    with pytest.raises(InvalidRecordError) as refused:
        log.append_as_leader(bytearray(small + zeros), 0)
    assert refused.value.code == ErrorCode.message_too_large
    assert "once stored as none" in str(refused.value)
    assert (log.log_end_offset, log.active_segment.size) == (0, 0)
    log.close()


def test_a_retried_idempotent_batch_gets_its_first_offsets(tmp_path: Path) -> None:
    log = Log(tmp_path / "t-0", TP, LogConfig(compression_type="zstd"), uuid.uuid4())
    batch = build_batch(records(5), producer_id=11, producer_epoch=0, base_sequence=0)
    first = log.append_as_leader(bytearray(batch), 0)
    retried = log.append_as_leader(bytearray(batch), 0)
    assert (retried.first_offset, retried.last_offset) == (first.first_offset, first.last_offset)
    assert [b.compression for b in read_back(log)] == [Compression.ZSTD]
    log.close()
