"""Reading remote segments with range reads: index lookups, whole batches, timestamps.

A segment's `.log` object holds RecordBatch v2 batches back to back, exactly as the
broker wrote them. Its `.indexes` object holds its offset index, which maps offsets
to byte positions (8-byte entries: offset - segment start int32, position int32;
tierbroker indexes a batch's base offset), and its time index, which maps largest
timestamps so far to offsets (12-byte entries: timestamp int64, offset - segment
start int32). Readers fetch that small object, then only the byte range they
need, a chunk at a time, and cut each chunk at the last whole batch (the rest is
read again with the next chunk).

Every batch is CRC-checked before its records are used, as Kafka's consumers do.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable, Iterator

from aiokafka.record.default_records import DefaultRecordBatch

from tierbroker.pipeline.discovery import RemoteSegment, SegmentRange
from tierbroker.pipeline.storage import ObjectStore
from tierbroker.protocol.records import BATCH_HEADER_SIZE, BatchView
from tierbroker.storage.indexes import OffsetEntries, TimeEntries
from tierbroker.storage.remote.index_bundle import unpack_indexes
from tierbroker.storage.remote.segment_codec import (
    SegmentTransform,
    decode_indexes,
    decode_range,
)
from tierbroker.storage.remote.storage_manager import IndexType

log = logging.getLogger(__name__)

LOG_OVERHEAD = 12  # baseOffset + batchLength
DEFAULT_CHUNK_BYTES = 1 << 20


def whole_batches_end(buf: bytes | memoryview) -> int:
    """The end of the last whole batch at the start of `buf` (0 if the first is partial)."""
    position, end = 0, len(buf)
    while end - position >= LOG_OVERHEAD:
        size = int.from_bytes(buf[position + 8 : position + 12], "big", signed=True) + LOG_OVERHEAD
        if size < BATCH_HEADER_SIZE or position + size > end:
            break
        position += size
    return position


def parse_batch(batch: BatchView) -> DefaultRecordBatch:
    """The batch's records, decompressed, through aiokafka's C parser (the records
    aiokafka's own fetcher builds); iterate it, or read its `timestamp_type`."""
    return DefaultRecordBatch(bytes(batch.payload()))


def read_log(store: ObjectStore, segment: RemoteSegment, start: int, end: int) -> bytes:
    """Bytes [start, end) of a segment's plain log (fewer at its end): one ranged GET, of the
    stored chunks holding them if the segment is stored transformed, decoded."""
    stored = segment.log_format
    if stored.plain:
        return store.get(segment.log_key, start, end)
    end = min(end, segment.size)
    if start >= end:
        return b""
    stored_start, stored_end = stored.stored_range(start, end)
    data = store.get(segment.log_key, stored_start, stored_end)
    return decode_range(_transform(store, segment), stored, start, end, data)


def _transform(store: ObjectStore, segment: RemoteSegment) -> SegmentTransform:
    return SegmentTransform.for_read(uuid.UUID(segment.segment_id), segment.log_format, store.keys)


LogReader = Callable[[RemoteSegment, int, int], bytes | memoryview]
"""Plain bytes [start, end) of a segment's log: `read_log` on a store, or a `ChunkReader`."""


def read_chunk(
    read: LogReader, segment: RemoteSegment, position: int, max_bytes: int = DEFAULT_CHUNK_BYTES
) -> tuple[list[BatchView], int]:
    """The whole, CRC-checked batches of about `max_bytes` from `position`, and the next position.

    At least one batch however large, unless the log ends; no batches and the same
    position at its end (or at a torn tail).
    """
    data = read(segment, position, position + max_bytes)
    size = first_batch_size(data)
    if size > len(data):  # one batch larger than a chunk
        data = read(segment, position, position + size)
    return checked_batches(data), position + whole_batches_end(data)


def first_batch_size(data: bytes | memoryview) -> int:
    """The size of the batch `data` starts with, if `data` holds its header; else 0."""
    if len(data) < LOG_OVERHEAD:
        return 0
    size = int.from_bytes(data[8:12], "big", signed=True) + LOG_OVERHEAD
    return size if size >= BATCH_HEADER_SIZE else 0


def checked_batches(data: bytes | memoryview) -> list[BatchView]:
    """The whole batches at the start of `data`, each CRC-checked."""
    view = memoryview(data)[: whole_batches_end(data)]
    batches = []
    at = 0
    while at < len(view):
        batch = BatchView(view, at)
        batch.validate()
        batches.append(batch)
        at += batch.size_in_bytes
    return batches


def iter_batches_from(
    read: LogReader,
    segment: RemoteSegment,
    start: int,
    end: int | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> Iterator[BatchView]:
    """Every batch that starts in bytes [start, end) of a segment's log (end None: to its end)."""
    position = start
    while end is None or position < end:
        # Up to `end` only: a batch straddling it is then read whole, by itself.
        want = chunk_bytes if end is None else max(min(chunk_bytes, end - position), LOG_OVERHEAD)
        batches, next_position = read_chunk(read, segment, position, want)
        if not batches:
            return
        for batch in batches:
            if end is not None and position + batch.position >= end:
                return
            yield batch
        position = next_position


def load_indexes(store: ObjectStore, segment: RemoteSegment) -> dict[IndexType, bytes]:
    """The segment's indexes, with one GET.

    Empty if the manifest lists none or the object is damaged: the indexes only
    save reading, so the segment is then read from its start.
    """
    if segment.indexes_key is None:
        return {}
    try:
        stored = store.get(segment.indexes_key)
        if not segment.log_format.plain:  # stored as the log is
            stored = decode_indexes(_transform(store, segment), stored)
        return unpack_indexes(stored)
    except ValueError as e:
        log.warning("%s: %s; reading the segment without its indexes", segment.indexes_key, e)
        return {}


def offset_index(indexes: dict[IndexType, bytes], segment: RemoteSegment) -> OffsetEntries | None:
    """The segment's offset index, up to its first entry that does not increase."""
    data = indexes.get(IndexType.OFFSET)
    return None if data is None else OffsetEntries(data, segment.start_offset).increasing()


def load_offset_index(store: ObjectStore, range_: SegmentRange) -> OffsetEntries | None:
    return offset_index(load_indexes(store, range_.segment), range_.segment)


def start_position(store: ObjectStore, range_: SegmentRange, offset: int) -> int:
    """Where to start reading the segment for records at or after `offset`."""
    if offset <= range_.segment.start_offset:
        return 0
    index = load_offset_index(store, range_)
    return 0 if index is None else index.position_for(offset)


def offset_for_timestamp(
    store: ObjectStore,
    ranges: list[SegmentRange],
    timestamp_ms: int,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> int | None:
    """The first offset whose record timestamp is >= `timestamp_ms` (ListOffsets' answer).

    Segments whose largest timestamp is smaller are skipped from their manifest;
    in the first other one, the time index gives a lower bound (every record up to
    an entry whose timestamp is below the target is below it too), and batches are
    scanned from there, decoding only those whose maxTimestamp reaches the target.
    None if no record qualifies.
    """
    for range_ in ranges:
        segment = range_.segment
        if segment.max_timestamp_ms < timestamp_ms:
            continue
        lower = range_.first_offset
        indexes = load_indexes(store, segment)  # both indexes, one GET
        time_index = indexes.get(IndexType.TIMESTAMP)
        if time_index is not None:
            entries = TimeEntries(time_index, segment.start_offset).increasing()
            i = entries.count_keys_below(timestamp_ms) - 1
            if i >= 0:
                lower = max(lower, entries.value(i) + 1)
        index = offset_index(indexes, segment)
        position = 0 if index is None else index.position_for(lower)
        log_reader = functools.partial(read_log, store)
        for batch in iter_batches_from(log_reader, segment, position, None, chunk_bytes):
            if batch.base_offset > range_.last_offset:
                break
            if batch.last_offset < lower or batch.is_control or batch.max_timestamp < timestamp_ms:
                continue
            for record in parse_batch(batch):
                in_range = lower <= record.offset <= range_.last_offset
                if in_range and record.timestamp >= timestamp_ms:
                    return int(record.offset)
    return None
