"""Build RecordBatch v2 batches, for tests and the broker's internal topics.

The header layout is in `batch`, the record layout in `decoder`. Records get
offset deltas 0, 1, 2, ...; baseTimestamp is the first record's timestamp and
maxTimestamp the largest; the CRC32C covers bytes 21 to the end.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from crc32c import crc32c

from tierbroker.protocol.records.batch import (
    ATTRIBUTES_OFFSET,
    BATCH_HEADER_SIZE,
    CRC_OFFSET,
    LOG_OVERHEAD,
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_ID,
    Compression,
    TimestampType,
)
from tierbroker.protocol.records.codecs import compress

RecordHeaders = Sequence[tuple[str, bytes | None]]
RecordInput = tuple[bytes | None, bytes | None, RecordHeaders, int]
"""(key, value, headers, timestamp_ms) of one record to build."""

_HEADER = struct.Struct(">qiibIhiqqqhii")


def build_batch(
    records: Sequence[RecordInput],
    *,
    base_offset: int = 0,
    compression: Compression = Compression.NONE,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    is_transactional: bool = False,
    is_control: bool = False,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
) -> bytes:
    """One magic-2 batch holding `records`, compressed with `compression`.

    With LOG_APPEND_TIME, readers see maxTimestamp (the largest given timestamp) as
    every record's timestamp.
    """
    if not records:
        raise ValueError("a batch holds at least one record")
    base_timestamp = records[0][3]
    body = bytearray()
    for offset_delta, (key, value, headers, timestamp) in enumerate(records):
        record = bytearray(b"\x00")  # attributes
        _write_varint(record, timestamp - base_timestamp)
        _write_varint(record, offset_delta)
        _write_bytes(record, key)
        _write_bytes(record, value)
        _write_varint(record, len(headers))
        for header_key, header_value in headers:
            _write_bytes(record, header_key.encode())
            _write_bytes(record, header_value)
        _write_varint(body, len(record))
        body += record
    payload = compress(compression, bytes(body))
    attributes = (
        compression
        | timestamp_type << 3
        | (0x10 if is_transactional else 0)
        | (0x20 if is_control else 0)
    )
    batch = bytearray(BATCH_HEADER_SIZE) + payload
    _HEADER.pack_into(
        batch,
        0,
        base_offset,
        len(batch) - LOG_OVERHEAD,
        partition_leader_epoch,
        2,  # magic
        0,  # crc, set below
        attributes,
        len(records) - 1,
        base_timestamp,
        max(record[3] for record in records),
        producer_id,
        producer_epoch,
        base_sequence,
        len(records),
    )
    struct.pack_into(">I", batch, CRC_OFFSET, crc32c(memoryview(batch)[ATTRIBUTES_OFFSET:]))
    return bytes(batch)


def _write_varint(out: bytearray, value: int) -> None:
    """Append `value` zig-zag encoded as a base-128 varint (int32 and int64 alike)."""
    raw = (value << 1) ^ (value >> 63)
    while raw >= 0x80:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)


def _write_bytes(out: bytearray, data: bytes | None) -> None:
    """Append a varint length then `data`; None is length -1."""
    if data is None:
        _write_varint(out, -1)
    else:
        _write_varint(out, len(data))
        out += data
