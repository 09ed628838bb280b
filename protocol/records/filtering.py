"""Keep some records of a batch and drop the rest, as Kafka's `MemoryRecords.filterTo`
does for the log cleaner.

`keyed_records` decompresses a batch and finds each record's key and whether its
value is null (a tombstone); `retain` writes a batch holding only the records it is
given. Offsets never change: the new batch keeps the base offset and lastOffsetDelta
of the old one (so a batch may span offsets it no longer holds), its producer id,
epoch and base sequence (so an idempotent producer goes on where it was) and its
partition leader epoch. Kept records are copied byte for byte, but for their
timestampDelta when the batch gets a delete horizon (KIP-534): attribute bit 6 set
and baseTimestamp = the horizon, the time after which the cleaner may drop the
batch's tombstones; each record's delta is rebased so its timestamp is unchanged.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple

from crc32c import crc32c

from tierbroker.protocol.errors import ErrorCode
from tierbroker.protocol.records.batch import (
    ATTRIBUTES_OFFSET,
    BATCH_HEADER_SIZE,
    CRC_OFFSET,
    DELETE_HORIZON_FLAG,
    LOG_OVERHEAD,
    BatchView,
    Compression,
    InvalidRecordError,
)
from tierbroker.protocol.records.builder import _write_varint
from tierbroker.protocol.records.codecs import compress, decompress
from tierbroker.protocol.records.decoder import _read_varint

_VARINT_BYTES = 5
_VARLONG_BYTES = 10
_CODEC_BITS = 0x07
_BATCH_LENGTH = struct.Struct(">i")
_RECORD_COUNT_OFFSET = 57
_BASE_TIMESTAMP_OFFSET = 27
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_INT16 = struct.Struct(">h")
_UINT32 = struct.Struct(">I")


class KeyedRecord(NamedTuple):
    """One record of a decompressed records section: where it lies, and what decides it."""

    offset_delta: int
    key: bytes | None
    is_tombstone: bool
    start: int  # its length varint
    end: int


def keyed_records(view: BatchView) -> tuple[bytes, list[KeyedRecord]]:
    """The batch's records section, decompressed, and each of its records.

    Raises InvalidRecordError (CORRUPT_MESSAGE) if a record does not parse.
    """
    data = view.records_payload()
    raw = bytes(
        data if view.compression is Compression.NONE else decompress(view.compression, data)
    )
    records: list[KeyedRecord] = []
    position, size = 0, len(raw)
    read = _read_varint
    try:
        for _ in range(view.record_count):
            start = position
            length, position = read(raw, position, _VARINT_BYTES)
            end = position + length
            if length <= 0 or end > size:
                raise ValueError(f"record length {length} overruns the records section")
            position += 1  # attributes
            _, position = read(raw, position, _VARLONG_BYTES)  # timestampDelta
            offset_delta, position = read(raw, position, _VARINT_BYTES)
            key_length, position = read(raw, position, _VARINT_BYTES)
            key = None if key_length < 0 else raw[position : position + key_length]
            position += max(key_length, 0)
            value_length, _ = read(raw, position, _VARINT_BYTES)
            if position > end:
                raise ValueError("key overruns its record")
            records.append(KeyedRecord(offset_delta, key, value_length < 0, start, end))
            position = end
    except (ValueError, IndexError) as e:
        raise InvalidRecordError(
            ErrorCode.corrupt_message,
            f"batch at offset {view.base_offset}: record {len(records)}: {e}",
        ) from e
    if position != size:
        raise InvalidRecordError(
            ErrorCode.corrupt_message,
            f"batch at offset {view.base_offset}: {size - position} bytes after its records",
        )
    return raw, records


def retain(
    view: BatchView,
    raw: bytes,
    kept: Sequence[KeyedRecord],
    delete_horizon_ms: int | None = None,
) -> bytearray:
    """The batch holding only `kept` (records of `raw`, in order); with
    `delete_horizon_ms`, the batch carries it as its delete horizon.

    An empty batch is written uncompressed, as Kafka writes one."""
    base_timestamp = view.base_timestamp
    body = bytearray()
    if delete_horizon_ms is not None and delete_horizon_ms != base_timestamp:
        shift = base_timestamp - delete_horizon_ms
        for record in kept:
            body += _rebased(raw, record, shift)
        base_timestamp = delete_horizon_ms
    else:
        for record in kept:
            body += raw[record.start : record.end]
    codec = view.compression if kept else Compression.NONE
    payload = body if codec is Compression.NONE else compress(codec, bytes(body))
    batch = bytearray(BATCH_HEADER_SIZE + len(payload))
    batch[:BATCH_HEADER_SIZE] = view.payload()[:BATCH_HEADER_SIZE]
    batch[BATCH_HEADER_SIZE:] = payload
    attributes = view.attributes & ~_CODEC_BITS | codec
    if delete_horizon_ms is not None:
        attributes |= DELETE_HORIZON_FLAG
    _BATCH_LENGTH.pack_into(batch, 8, len(batch) - LOG_OVERHEAD)
    _INT16.pack_into(batch, ATTRIBUTES_OFFSET, attributes)
    _INT64.pack_into(batch, _BASE_TIMESTAMP_OFFSET, base_timestamp)
    _INT32.pack_into(batch, _RECORD_COUNT_OFFSET, len(kept))
    _UINT32.pack_into(batch, CRC_OFFSET, crc32c(memoryview(batch)[ATTRIBUTES_OFFSET:]))
    return batch


def _rebased(raw: bytes, record: KeyedRecord, shift: int) -> bytearray:
    """`record` with `shift` added to its timestampDelta, its length varint rewritten."""
    _, body_start = _read_varint(raw, record.start, _VARINT_BYTES)
    delta, rest = _read_varint(raw, body_start + 1, _VARLONG_BYTES)
    body = bytearray(raw[body_start : body_start + 1])
    _write_varint(body, delta + shift)
    body += raw[rest : record.end]
    out = bytearray()
    _write_varint(out, len(body))
    out += body
    return out
