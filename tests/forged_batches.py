"""Batches a client could send: any records section, any header fields, a correct CRC.

For tests of what the broker refuses: the builder (`protocol.records.build_batch`) only
writes well-formed batches.
"""

from __future__ import annotations

import struct

from crc32c import crc32c

from tierbroker.protocol.records import Compression, compress
from tierbroker.protocol.records.builder import _write_varint

_HEADER = struct.Struct(">qiibIhiqqqhii")


def forge_batch(
    body: bytes,
    *,
    count: int,
    timestamp_ms: int,
    last_offset_delta: int | None = None,
    compression: Compression = Compression.NONE,
    attributes: int = 0,
    max_timestamp_ms: int | None = None,
    producer: tuple[int, int, int] = (-1, -1, -1),
    raw_payload: bytes | None = None,
) -> bytearray:
    """A batch around `body` (compressed with `compression`, or `raw_payload` as it is),
    whatever it holds, with a correct batchLength and CRC32C."""
    payload = compress(compression, body) if raw_payload is None else raw_payload
    batch = bytearray(61) + payload
    _HEADER.pack_into(
        batch,
        0,
        0,  # baseOffset
        len(batch) - 12,
        -1,  # partitionLeaderEpoch
        2,  # magic
        0,  # crc, set below
        compression | attributes,
        count - 1 if last_offset_delta is None else last_offset_delta,
        timestamp_ms,
        timestamp_ms if max_timestamp_ms is None else max_timestamp_ms,
        *producer,  # producerId, producerEpoch, baseSequence
        count,
    )
    struct.pack_into(">I", batch, 17, crc32c(memoryview(batch)[21:]))
    return batch


def encode_record(
    offset_delta: int = 0,
    *,
    timestamp_delta: int = 0,
    key: bytes | None = b"k",
    value: bytes | None = b"value",
    headers: list[tuple[bytes, bytes | None]] | None = None,
    length_error: int = 0,
) -> bytes:
    """One encoded record; `length_error` makes its length varint lie by that much."""
    body = bytearray(b"\x00")  # attributes
    _write_varint(body, timestamp_delta)
    _write_varint(body, offset_delta)
    for data in (key, value):
        _write_varint(body, -1 if data is None else len(data))
        body += data or b""
    _write_varint(body, len(headers or []))
    for header_key, header_value in headers or []:
        _write_varint(body, len(header_key))
        body += header_key
        _write_varint(body, -1 if header_value is None else len(header_value))
        body += header_value or b""
    out = bytearray()
    _write_varint(out, len(body) + length_error)
    return bytes(out + body)
