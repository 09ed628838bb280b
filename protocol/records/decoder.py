"""Decode whole records out of RecordBatch v2 batches, for the readers that need them.

After the 61-byte batch header (see `batch`), the records section holds recordsCount
records, compressed as one stream when attributes & 7 != 0. Each record::

    length varint            bytes after this field
    attributes int8          unused
    timestampDelta varlong   from baseTimestamp
    offsetDelta varint       from baseOffset
    keyLength varint, key    -1: null key
    valueLength varint, value  -1: null value
    headersCount varint, then per header:
        keyLength varint, key (UTF-8, never null)
        valueLength varint, value  -1: null value

Varints are zig-zag encoded little-endian base-128, at most 5 bytes (varint) or
10 (varlong).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from tierbroker.protocol.errors import ErrorCode
from tierbroker.protocol.records.batch import (
    BATCH_HEADER_SIZE,
    LOG_OVERHEAD,
    BatchView,
    Compression,
    InvalidRecordError,
    TimestampType,
    iter_batches,
    magic_error,
)
from tierbroker.protocol.records.codecs import decompress

_VARINT_BYTES = 5
_VARLONG_BYTES = 10


@dataclass(frozen=True, slots=True)
class Header:
    key: str
    value: bytes | None


@dataclass(frozen=True, slots=True)
class Record:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]


@dataclass(frozen=True, slots=True)
class DecodedBatch:
    base_offset: int
    partition_leader_epoch: int
    timestamp_type: TimestampType
    compression: Compression
    producer_id: int
    producer_epoch: int
    base_sequence: int
    is_transactional: bool
    is_control: bool
    records: tuple[Record, ...]


def decode_batch(view: BatchView) -> DecodedBatch:
    """Decompress and parse every record of one batch.

    Checks structure (sizes, lengths, record count), not the CRC: call
    `view.validate()` first for bytes that have not been validated already.
    """
    where = f"batch at position {view.position} (baseOffset {view.base_offset})"
    if view.magic != 2:
        raise InvalidRecordError(magic_error(view.magic), f"{where}: magic {view.magic}, not 2")
    if view.record_count < 0:
        raise InvalidRecordError(
            ErrorCode.corrupt_message, f"{where}: negative recordsCount {view.record_count}"
        )
    if view.size_in_bytes < BATCH_HEADER_SIZE or len(view.payload()) != view.size_in_bytes:
        raise InvalidRecordError(
            ErrorCode.corrupt_message,
            f"{where}: batchLength {view.batch_length} does not fit the buffer",
        )
    compression = view.compression
    try:
        data = decompress(compression, view.records_payload())
    except InvalidRecordError as exc:
        raise InvalidRecordError(exc.code, f"{where}: {exc.args[0]}") from exc
    timestamp_type = view.timestamp_type
    records = _decode_records(
        data,
        view.record_count,
        view.base_offset,
        view.base_timestamp,
        view.max_timestamp if timestamp_type is TimestampType.LOG_APPEND_TIME else None,
        where,
    )
    return DecodedBatch(
        base_offset=view.base_offset,
        partition_leader_epoch=view.partition_leader_epoch,
        timestamp_type=timestamp_type,
        compression=compression,
        producer_id=view.producer_id,
        producer_epoch=view.producer_epoch,
        base_sequence=view.base_sequence,
        is_transactional=view.is_transactional,
        is_control=view.is_control,
        records=records,
    )


def decode_records(buf: bytes | bytearray | memoryview) -> Iterator[Record]:
    """Validate and decode every whole batch in `buf`, yielding their records in order.

    A partial batch at the end, as a fetch response may carry, is ignored.
    """
    for view in iter_batches(memoryview(buf)[: _whole_batches_end(buf)]):
        view.validate()
        yield from decode_batch(view).records


def _whole_batches_end(buf: bytes | bytearray | memoryview) -> int:
    """The end of the last whole batch; a batchLength too small to be real is left in,
    so that `iter_batches` refuses it rather than it being mistaken for a partial batch."""
    position, end = 0, len(buf)
    while end - position >= LOG_OVERHEAD:
        size = int.from_bytes(buf[position + 8 : position + 12], "big", signed=True) + LOG_OVERHEAD
        if size < BATCH_HEADER_SIZE:
            return end
        if position + size > end:
            break
        position += size
    return position


def _read_varint(data: bytes, position: int, max_bytes: int) -> tuple[int, int]:
    """Read one zig-zag varint; return its value and the position after it."""
    raw = data[position]
    if raw < 0x80:  # most lengths and deltas fit one byte
        return (raw >> 1) ^ -(raw & 1), position + 1
    raw = shift = 0
    for index in range(position, position + max_bytes):
        byte = data[index]
        raw |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (raw >> 1) ^ -(raw & 1), index + 1
        shift += 7
    raise ValueError(f"varint longer than {max_bytes} bytes")


def _read_bytes(data: bytes, position: int, end: int, what: str) -> tuple[bytes | None, int]:
    """Read a varint length then that many bytes (-1: null), not past `end`."""
    length, position = _read_varint(data, position, _VARINT_BYTES)
    if length == -1:
        return None, position
    if length < 0 or position + length > end:
        raise ValueError(f"{what} length {length} overruns the record")
    return data[position : position + length], position + length


def _decode_records(
    data: bytes,
    count: int,
    base_offset: int,
    base_timestamp: int,
    log_append_time: int | None,
    where: str,
) -> tuple[Record, ...]:
    """Parse `count` records filling `data` exactly; `log_append_time` overrides timestamps."""
    read_varint, read_bytes, size = _read_varint, _read_bytes, len(data)
    records = []
    position = 0
    for index in range(count):
        start = position
        try:
            length, position = read_varint(data, position, _VARINT_BYTES)
            end = position + length
            if length <= 0 or end > size:
                raise ValueError(f"length {length} overruns the {size}-byte records section")
            position += 1  # attributes: unused
            timestamp_delta, position = read_varint(data, position, _VARLONG_BYTES)
            offset_delta, position = read_varint(data, position, _VARINT_BYTES)
            key, position = read_bytes(data, position, end, "key")
            value, position = read_bytes(data, position, end, "value")
            header_count, position = read_varint(data, position, _VARINT_BYTES)
            if header_count < 0 or 2 * header_count > end - position:
                raise ValueError(f"header count {header_count} does not fit the record")
            headers = []
            for _ in range(header_count):
                header_key, position = read_bytes(data, position, end, "header key")
                if header_key is None:
                    raise ValueError("null header key")
                header_value, position = read_bytes(data, position, end, "header value")
                headers.append(Header(header_key.decode(), header_value))
            if position != end:
                raise ValueError(f"record ends at byte {position}, its length says {end}")
        except (ValueError, IndexError) as exc:
            reason = "runs past the records section" if isinstance(exc, IndexError) else exc
            raise InvalidRecordError(
                ErrorCode.corrupt_message,
                f"{where}: record {index} at byte {start} of the records section: {reason}",
            ) from exc
        records.append(
            Record(
                base_offset + offset_delta,
                base_timestamp + timestamp_delta if log_append_time is None else log_append_time,
                key,
                value,
                tuple(headers),
            )
        )
    if position != size:
        raise InvalidRecordError(
            ErrorCode.corrupt_message,
            f"{where}: {size - position} bytes left after recordsCount {count} records",
        )
    return tuple(records)
