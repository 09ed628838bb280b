"""Record-level validation of a client's batch, as Kafka's LogValidator does it.

A batch with a valid CRC can still lie about its records: a lastOffsetDelta that
moves the log end offset past its records, a record length that does not match
the record, bytes after the last record, offset deltas out of order. Stored, such
a batch stalls every consumer that reaches it. `validate_records` walks the
records section and refuses these with INVALID_RECORD, and timestamps outside the
topic's bounds with INVALID_TIMESTAMP. On a compacted topic it also refuses records
without a key, which the cleaner could not keep (INVALID_RECORD, `RecordValidationError`).

The walk reads varints only (lengths, deltas, counts) and never copies or decodes
keys, values or headers (a key's length says whether it is null). An uncompressed
batch is walked where it lies in the request buffer; a compressed one is
decompressed first, as Kafka does, into a buffer of bounded size
(`max_uncompressed_bytes`), because its offsets and timestamps are inside the
compressed stream.

Record layout (after the 61-byte batch header, see `decoder`): length varint,
attributes int8, timestampDelta varlong, offsetDelta varint, key (varint length,
-1 for null), value (likewise), header count varint, then per header a key
(length >= 0) and a value (length >= -1).
"""

from __future__ import annotations

import functools
import logging
import struct
from collections.abc import Callable

import cramjam

from tierbroker.protocol.errors import ErrorCode
from tierbroker.protocol.records.batch import (
    BATCH_HEADER_SIZE,
    LOG_OVERHEAD,
    BatchView,
    Compression,
    InvalidRecordError,
    TimestampType,
)
from tierbroker.protocol.records.codecs import XERIAL_MAGIC

log = logging.getLogger(__name__)

NO_TIMESTAMP = -1
MIN_RECORD_BODY_BYTES = 6  # attributes, timestampDelta, offsetDelta, key, value, header count
_VARINT_BYTES = 5
_VARLONG_BYTES = 10
_FIRST_GUESS_RATIO = 4.0  # the first decompression's buffer, in times the input
_MARGIN = 1.25  # later ones: the previous batch's expansion and this much more
_KEEP_SCRATCH_BYTES = 16 << 20
_XERIAL_HEADER_BYTES = 16
_INT32 = struct.Struct(">i")
_UINT32_LE = struct.Struct("<I")
_LZ4_MAGIC = b"\x04\x22\x4d\x18"
_LZ4_CLIENT_FLAGS = (0x60, 0x68)  # version 1, independent blocks, maybe a content size
_LZ4_BLOCK_BYTES = {4: 64 << 10, 5: 256 << 10, 6: 1 << 20, 7: 4 << 20}  # by BD bits 6-4
_LZ4_STORED = 0x80000000  # a block size's high bit: the block is not compressed
_XXH32_PRIMES = (2654435761, 2246822519, 3266489917, 668265263, 374761393)


class MalformedRecords(ValueError):
    """The records section does not hold what the batch header says; the message says where."""


class RecordValidationError(InvalidRecordError):
    """A batch refused for what some of its records hold, as Kafka's RecordValidationException:
    INVALID_RECORD with Kafka's summary as the message, and `record_errors`, the (index in
    the batch, message) of each record at fault, which Produce v8+ answers per record."""

    def __init__(self, record_errors: list[tuple[int, str]]) -> None:
        shown = ", ".join(
            f"RecordError(batchIndex={index}, message='{message}')"
            for index, message in record_errors[:3]
        )
        super().__init__(
            ErrorCode.invalid_record,
            f"One or more records have been rejected due to {len(record_errors)} record "
            f"errors in total, and only showing the first three errors at most: [{shown}]",
        )
        self.record_errors = tuple(record_errors)


def _varint(data: bytes | bytearray | memoryview, position: int, max_bytes: int) -> tuple[int, int]:
    """One zig-zag varint of more than one byte: its value and the position after it."""
    raw = shift = 0
    for index in range(position, position + max_bytes):
        byte = data[index]
        raw |= (byte & 0x7F) << shift
        if byte < 0x80:
            if raw >> (32 if max_bytes == _VARINT_BYTES else 64):
                raise MalformedRecords(f"varint at byte {position} overflows")
            return (raw >> 1) ^ -(raw & 1), index + 1
        shift += 7
    raise MalformedRecords(f"varint at byte {position} is longer than {max_bytes} bytes")


def walk_records(
    data: bytes | bytearray | memoryview,
    start: int,
    end: int,
    count: int,
    keyless: list[int] | None = None,
) -> tuple[int, int]:
    """Check that `data[start:end]` holds exactly `count` well-formed records whose offset
    deltas are 0, 1, ..., count - 1; return their smallest and largest timestampDelta.
    If `keyless` is a list, append to it the index of each record with a null key (for a
    compacted topic, which refuses them), once that record is known well-formed.

    Raises `MalformedRecords` naming the record and the byte (from `start`) at fault,
    or `IndexError` if a record runs past the end of `data`. Lengths are checked
    against the end of their record before they are skipped; a field that runs past
    its record only ever leads to a refusal, as each record must end exactly where
    its length says. Single-byte varints (most deltas and short lengths) are decoded
    inline.
    """
    if count == 0:
        if start != end:
            raise MalformedRecords(f"{end - start} bytes in the records section of 0 records")
        return 0, 0
    varint = _varint
    position = start
    min_delta, max_delta = 1 << 63, -(1 << 63)
    for expected_offset_delta in range(count):
        record_start = position
        if position >= end:
            raise MalformedRecords(
                f"record {expected_offset_delta} at byte {position - start}: "
                f"the records section ends after {expected_offset_delta} of {count} records"
            )
        byte = data[position]
        if byte < 0x80:
            length, position = (byte >> 1) ^ -(byte & 1), position + 1
        else:
            length, position = varint(data, position, _VARINT_BYTES)
        record_end = position + length
        if length < MIN_RECORD_BODY_BYTES or record_end > end:
            raise MalformedRecords(
                f"record {expected_offset_delta} at byte {record_start - start}: length "
                f"{length} does not fit the {end - start}-byte records section"
            )
        position += 1  # attributes: unused in magic 2
        byte = data[position]
        if byte < 0x80:
            timestamp_delta, position = (byte >> 1) ^ -(byte & 1), position + 1
        else:
            timestamp_delta, position = varint(data, position, _VARLONG_BYTES)
        if timestamp_delta < min_delta:
            min_delta = timestamp_delta
        if timestamp_delta > max_delta:
            max_delta = timestamp_delta
        byte = data[position]
        if byte < 0x80:
            offset_delta, position = (byte >> 1) ^ -(byte & 1), position + 1
        else:
            offset_delta, position = varint(data, position, _VARINT_BYTES)
        if offset_delta != expected_offset_delta:
            raise MalformedRecords(
                f"record {expected_offset_delta} at byte {record_start - start}: "
                f"offsetDelta {offset_delta}, expected {expected_offset_delta}"
            )
        null_key = False
        for what in ("key", "value"):
            byte = data[position]
            if byte < 0x80:
                size, position = (byte >> 1) ^ -(byte & 1), position + 1
            else:
                size, position = varint(data, position, _VARINT_BYTES)
            if size < -1 or position + size > record_end:
                raise MalformedRecords(
                    f"record {expected_offset_delta} at byte {record_start - start}: "
                    f"{what} length {size} does not fit the record"
                )
            if size > 0:
                position += size
            elif size and what == "key":
                null_key = True
        byte = data[position]
        if byte < 0x80:
            header_count, position = (byte >> 1) ^ -(byte & 1), position + 1
        else:
            header_count, position = varint(data, position, _VARINT_BYTES)
        if header_count:
            position = _walk_headers(data, position, record_end, header_count)
        if position != record_end:
            raise MalformedRecords(
                f"record {expected_offset_delta} at byte {record_start - start}: its fields "
                f"end at byte {position - start}, its length says {record_end - start}"
            )
        if null_key and keyless is not None:
            keyless.append(expected_offset_delta)
    if position != end:
        raise MalformedRecords(
            f"{end - position} bytes left in the records section after {count} records"
        )
    return min_delta, max_delta


Walker = Callable[
    [bytes | bytearray | memoryview, int, int, int, list[int] | None], tuple[int, int]
]


def _compiled_walker() -> Walker:
    """The compiled walk (`_walk.c`), or `walk_records` where it was not built."""
    try:
        from tierbroker.protocol.records._walk import walk_records as compiled
    except ImportError:
        log.warning(
            "record validation runs in pure Python, several times slower on produce: "
            "build the extension with `pip install -e .`"
        )
        return walk_records
    return compiled


def _walk_headers(
    data: bytes | bytearray | memoryview, position: int, record_end: int, count: int
) -> int:
    """Skip `count` headers (key length >= 0, value length >= -1) within the record."""
    if count < 0 or 2 * count > record_end - position:
        raise MalformedRecords(f"header count {count} does not fit the record")
    for _ in range(count):
        for minimum in (0, -1):  # the key, then the value
            size, position = _varint(data, position, _VARINT_BYTES)
            if size < minimum or position + size > record_end:
                raise MalformedRecords(f"header length {size} does not fit the record")
            if size > 0:
                position += size
    return position


def max_uncompressed_bytes(batch_bytes: int) -> int:
    """The most a compressed batch may expand to: 64 times its size, at least 64 MiB.

    Kafka streams decompression; here the records section is decompressed into one
    buffer, so a small batch of zeros must not become gigabytes of memory.
    """
    return 64 * max(batch_bytes, 1 << 20)


def _snappy_blocks(data: memoryview) -> list[memoryview]:
    """The raw snappy blocks of a records section: itself, or the blocks of xerial framing."""
    if bytes(data[:8]) != XERIAL_MAGIC:
        return [data]
    position, end, blocks = _XERIAL_HEADER_BYTES, len(data), []
    while position < end:
        (length,) = _INT32.unpack_from(data, position) if end - position >= 4 else (-1,)
        if length < 0 or position + 4 + length > end:
            raise cramjam.DecompressionError(f"xerial block at byte {position} overruns")
        blocks.append(data[position + 4 : position + 4 + length])
        position += 4 + length
    return blocks


def _lz4_client_frame(data: memoryview) -> tuple[int, list[tuple[memoryview, bool]]] | None:
    """The blocks of an LZ4 frame as Kafka's clients write it, else None.

    The Java client and librdkafka write one frame of independent blocks without
    block or content checksums (the batch's CRC32C covers the bytes). Such a frame
    is returned as its maximum block size and its (block, compressed) pairs; any
    other frame, or one that does not parse, is left to the frame decoder, which
    checks whatever checksums it carries.
    """
    if len(data) < 7 or data[:4] != _LZ4_MAGIC or data[4] not in _LZ4_CLIENT_FLAGS:
        return None
    descriptor_end = 14 if data[4] & 0x08 else 6
    block_bytes = _LZ4_BLOCK_BYTES.get(data[5] >> 4) if not data[5] & 0x8F else None
    if (
        block_bytes is None
        or len(data) <= descriptor_end
        or data[descriptor_end] != _lz4_header_checksum(bytes(data[4:descriptor_end]))
    ):
        return None
    position, end = descriptor_end + 1, len(data)
    blocks: list[tuple[memoryview, bool]] = []
    while position + 4 <= end:
        (size,) = _UINT32_LE.unpack_from(data, position)
        position += 4
        if size == 0:  # the end mark: the frame must end the records section
            return (block_bytes, blocks) if position == end else None
        length = size & ~_LZ4_STORED
        if length > block_bytes or position + length > end:
            return None
        blocks.append((data[position : position + length], not size & _LZ4_STORED))
        position += length
    return None


@functools.cache
def _lz4_header_checksum(descriptor: bytes) -> int:
    """The frame descriptor's check byte: the second byte of its XXH32 (seed 0).

    Descriptors are at most 14 bytes, and nearly always the same few (cached).
    """
    p1, p2, p3, p4, p5 = _XXH32_PRIMES
    mask = 0xFFFFFFFF
    value = (p5 + len(descriptor)) & mask
    whole = len(descriptor) & ~3
    for (word,) in struct.iter_unpack("<I", descriptor[:whole]):
        value = (value + word * p3) & mask
        value = (((value << 17) | (value >> 15)) & mask) * p4 & mask
    for byte in descriptor[whole:]:
        value = (value + byte * p5) & mask
        value = (((value << 11) | (value >> 21)) & mask) * p1 & mask
    value = ((value ^ (value >> 15)) * p2) & mask
    value = ((value ^ (value >> 13)) * p3) & mask
    return ((value ^ (value >> 16)) >> 8) & 0xFF


class _Scratch:
    """One reusable buffer that compressed records sections are decompressed into.

    Reused so a decompression neither allocates nor zero-fills its output. Snappy
    states its size up front, and an LZ4 frame as clients write it bounds its size by
    its block count; both are decompressed block by block into place. For the others
    the first try is sized by the expansion of the previous batch (producers' data
    changes slowly), and a try that fills the buffer is repeated in one four times
    larger, up to the bound. A buffer above `_KEEP_SCRATCH_BYTES` is kept only while
    batches need it (`maybe_release`). Not shared between threads: appends run on
    the event loop.
    """

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.expansion = _FIRST_GUESS_RATIO
        self.needed = 0  # bytes the last decompression wrote; 0 if it failed

    def decompress(self, codec: Compression, data: memoryview, limit: int) -> memoryview:
        """The records section, at most `limit` bytes (else MESSAGE_TOO_LARGE), as a view
        valid until the next call."""
        self.needed = 0
        records = self._decompress(codec, data, limit)
        self.needed = len(records)
        return records

    def maybe_release(self) -> None:
        """Drop a buffer above `_KEEP_SCRATCH_BYTES` unless the last batch needed it: a
        run of large batches keeps it (zero-filling 60 MiB takes longer than
        decompressing into it), one among small ones or a refused one does not."""
        if len(self.buffer) > _KEEP_SCRATCH_BYTES >= self.needed:
            self.buffer = bytearray()

    def _decompress(self, codec: Compression, data: memoryview, limit: int) -> memoryview:
        try:
            if codec is Compression.SNAPPY:
                return self._snappy(data, limit)
            if codec is Compression.LZ4 and (frame := _lz4_client_frame(data)) is not None:
                records = self._lz4_blocks(*frame, limit)
                if records is not None:
                    return records
            module = _CODECS[codec]
            size = min(limit, max(int(len(data) * self.expansion), len(self.buffer)))
            while True:
                self._reserve(size)
                try:
                    with memoryview(self.buffer) as whole:
                        written = int(module.decompress_into(data, whole[:size]))
                    self.expansion = _MARGIN * written / max(len(data), 1)
                    return memoryview(self.buffer)[:written]
                except cramjam.DecompressionError as exc:
                    if "whole buffer" not in str(exc):  # cramjam's words for a full output
                        raise
                    if size >= limit:
                        raise _too_large(codec, limit) from exc
                    size = min(limit, size * 4)
        except cramjam.DecompressionError as exc:
            raise InvalidRecordError(
                ErrorCode.corrupt_message,
                f"{codec.name.lower()} payload does not decompress: {exc}",
            ) from exc

    def _snappy(self, data: memoryview, limit: int) -> memoryview:
        blocks = _snappy_blocks(data)
        sizes = [int(cramjam.snappy.decompress_raw_len(block)) for block in blocks]
        if sum(sizes) > limit:
            raise _too_large(Compression.SNAPPY, limit)
        self._reserve(sum(sizes))
        position = 0
        with memoryview(self.buffer) as whole:
            for block, size in zip(blocks, sizes, strict=True):
                position += int(
                    cramjam.snappy.decompress_raw_into(block, whole[position : position + size])
                )
        return memoryview(self.buffer)[:position]

    def _lz4_blocks(
        self, block_bytes: int, blocks: list[tuple[memoryview, bool]], limit: int
    ) -> memoryview | None:
        """Each block decompressed in place, as the frame decoder would but without its
        copy through a block buffer (about 4 times faster); None if a block does not
        decompress or the records pass `limit`: the frame decoder then says why."""
        size = min(limit, block_bytes * len(blocks))
        self._reserve(size)
        position = 0
        with memoryview(self.buffer)[:size] as whole:  # slices of it stop at the bound
            try:
                for block, compressed in blocks:
                    room = whole[position : position + block_bytes]
                    if compressed:
                        position += int(cramjam.lz4.decompress_block_into(block, room))
                    elif len(block) <= len(room):
                        room[: len(block)] = block
                        position += len(block)
                    else:
                        return None
            except cramjam.DecompressionError:
                return None
        return memoryview(self.buffer)[:position]

    def _reserve(self, size: int) -> None:
        if len(self.buffer) < size:
            self.buffer = bytearray(size)


def _too_large(codec: Compression, limit: int) -> InvalidRecordError:
    return InvalidRecordError(
        ErrorCode.message_too_large,
        f"{codec.name.lower()} records section expands past {limit} bytes",
    )


_SCRATCH = _Scratch()
_CODECS = {
    Compression.GZIP: cramjam.gzip,
    Compression.LZ4: cramjam.lz4,
    Compression.ZSTD: cramjam.zstd,
}


def validate_records(
    view: BatchView,
    *,
    now_ms: int,
    log_append_time: bool,
    timestamp_before_max_ms: int,
    timestamp_after_max_ms: int,
    compacted_partition: str | None = None,
) -> int:
    """Walk a validated batch header's records; return their largest timestamp.

    Structure and offsets: INVALID_RECORD. If the topic is compacted
    (`compacted_partition` names the partition, `topic-0`), records without a key:
    `RecordValidationError`, one record error each, as Kafka's validateKey; this is
    checked before timestamps. Timestamps, as Kafka's LogValidator:
    with CreateTime (`log_append_time` false) every record's timestamp must lie in
    [now - before.max.ms, now + after.max.ms] (records without one, -1, are exempt);
    a producer may not set LogAppendTime on a batch: INVALID_TIMESTAMP. Call
    `view.validate(from_client=True)` first: it checks the header, sizes and CRC.
    """
    compression = view.compression
    start = view.position + BATCH_HEADER_SIZE
    end = view.position + LOG_OVERHEAD + view.batch_length  # batchLength counts from byte 12
    keyless: list[int] | None = None if compacted_partition is None else []
    try:
        if compression is Compression.NONE:
            min_delta, max_delta = _WALK(view.buffer, start, end, view.record_count, keyless)
        else:
            try:
                records = _SCRATCH.decompress(
                    compression,
                    memoryview(view.buffer)[start:end],
                    max_uncompressed_bytes(end - view.position),
                )
                with records:
                    min_delta, max_delta = _WALK(
                        records, 0, len(records), view.record_count, keyless
                    )
            finally:
                _SCRATCH.maybe_release()
    except (ValueError, IndexError) as exc:  # the C walk raises ValueError, ours a subclass
        reason = "a record runs past the records section" if isinstance(exc, IndexError) else exc
        raise InvalidRecordError(
            ErrorCode.invalid_record, f"batch at position {view.position}: {reason}"
        ) from exc
    if keyless:
        message = (
            "Compacted topic cannot accept message without key in topic partition "
            f"{compacted_partition}"
        )
        raise RecordValidationError([(index, message) for index in keyless])
    producer_set_log_append_time = view.timestamp_type is TimestampType.LOG_APPEND_TIME
    if producer_set_log_append_time:
        lowest = highest = view.max_timestamp  # every record's timestamp
    else:
        lowest, highest = view.base_timestamp + min_delta, view.base_timestamp + max_delta
    if log_append_time or highest == lowest == NO_TIMESTAMP:
        if producer_set_log_append_time:
            raise InvalidRecordError(
                ErrorCode.invalid_timestamp,
                f"batch at position {view.position}: a producer may not set LogAppendTime",
            )
        return highest
    if lowest < now_ms - timestamp_before_max_ms or highest > now_ms + timestamp_after_max_ms:
        raise InvalidRecordError(
            ErrorCode.invalid_timestamp,
            f"batch at position {view.position}: timestamps [{lowest}, {highest}] are out of "
            f"range: they must lie within [{now_ms - timestamp_before_max_ms}, "
            f"{now_ms + timestamp_after_max_ms}]",
        )
    return highest


_WALK = _compiled_walker()
