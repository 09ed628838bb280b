"""Reading one input partition (`plan.Task`) into Arrow record batches of Spark's Kafka schema.

Remote slices are read through the chunk layer (`pipeline.chunk_reader`, one per store in
a worker: parallel ranged GETs of whole chunks, prefetched past the slice into the task's
next slices); each batch's
records become Arrow buffers in C (`protocol.records._columns`), or, with headers,
records parsed by aiokafka's C parser. Broker ranges come from a librdkafka
consumer (`kafka_client.read_range`). Either way the rows gather in `Columns`,
which yields an Arrow batch every `ROWS_PER_BATCH` rows; `DataSourceReader.read`
may yield those since PySpark 4.0.

A Python worker runs many tasks, one after another: the object store (its S3
client) is opened once per worker and kept (`_store`), and once the first task
has imported everything, `gc.freeze()` moves the worker's long-lived objects out
of the collector's sight. PySpark's daemon collects garbage after every task of
a reused worker, and without the freeze that walk over every object imported
costs several milliseconds a task.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tierbroker.pipeline.chunk_reader import ChunkReader
from tierbroker.pipeline.discovery import RemoteSegment
from tierbroker.pipeline.segments import iter_batches_from, parse_batch, start_position
from tierbroker.pipeline.spark.plan import Access, BrokerRange, RemoteSlice, Task
from tierbroker.pipeline.storage import ObjectNotFoundError, ObjectStore, open_store
from tierbroker.protocol.records.batch import BatchView, Compression, TimestampType
from tierbroker.protocol.records.codecs import decompress
from tierbroker.storage.remote.chunk_cache import ChunkCacheConfig

record_columns: Callable[..., tuple[Any, ...]] | None
try:
    from tierbroker.protocol.records._columns import record_columns
except ImportError:  # not built (or a big-endian host): columns from decoded records
    record_columns = None

log = logging.getLogger(__name__)

ROWS_PER_BATCH = 8192
CHUNK_BYTES = 8 * 1024 * 1024
# A worker's chunk layer: four ranged GETs at once, 32 MiB ahead, 64 MiB kept.
READ_CHUNKS = ChunkCacheConfig(cache_bytes=64 << 20, prefetch_bytes=32 << 20)
READ_THREADS = 4
_MAX_MS = (2**63 - 1) // 1000
# librdkafka's timestamp types (0 none, 1 create, 2 log append) as Kafka's ids (-1, 0, 1).
_LIBRDKAFKA_TIMESTAMP_TYPE = {0: -1, 1: 0, 2: 1}

_stores: dict[tuple[str, tuple[tuple[str, str], ...]], ObjectStore] = {}
_readers: dict[tuple[str, tuple[tuple[str, str], ...]], ChunkReader] = {}
_stores_lock = threading.RLock()
_frozen = False


def _store(access: Access) -> ObjectStore:
    """One store (one S3 client) per URL and options in a Python worker, reused across tasks."""
    key = (access.storage, access.store_options)
    with _stores_lock:
        store = _stores.get(key)
        if store is None:
            store = _stores[key] = open_store(access.storage, dict(access.store_options))
        return store


def _chunk_reader(access: Access) -> ChunkReader:
    """One chunk layer per store in a Python worker, shared by its tasks."""
    key = (access.storage, access.store_options)
    with _stores_lock:
        reader = _readers.get(key)
        if reader is None:
            reader = _readers[key] = ChunkReader(_store(access), READ_CHUNKS, READ_THREADS)
        return reader


def set_up_worker() -> None:
    """Freeze what the worker holds once its first task has imported everything (see above)."""
    global _frozen
    if not _frozen:
        _frozen = True
        gc.freeze()


def read_task(task: Task, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The task's records, in offset order, as Arrow batches of `schema`."""
    columns = Columns(task.topic, task.partition, schema)
    for piece in task.pieces:
        if isinstance(piece, RemoteSlice):
            records = _remote(task, piece, columns)
        else:
            records = _through_broker(task, piece, columns)
        for _ in records:
            if columns.rows >= ROWS_PER_BATCH:
                yield columns.take()
        set_up_worker()
    if columns.rows:
        yield columns.take()


def _remote(task: Task, piece: RemoteSlice, columns: Columns) -> Iterator[None]:
    """Adds the slice's records to `columns`, yielding after each batch of records."""
    segment = piece.segment
    store = _store(task.access)
    reader = _chunk_reader(task.access)
    later = task.pieces[task.pieces.index(piece) + 1 :]
    following = [(p.segment, p.byte_start) for p in later if isinstance(p, RemoteSlice)]

    def read(s: RemoteSegment, start: int, end: int) -> memoryview:
        return reader.read(s, start, end, following)

    try:
        position = start_position(store, piece.range, piece.first_offset) if piece.seek else 0
        position = max(position, piece.byte_start)
        for batch in iter_batches_from(read, segment, position, piece.byte_end, CHUNK_BYTES):
            if batch.base_offset > piece.last_offset:
                break
            if batch.last_offset < piece.first_offset or batch.is_control:
                continue
            if batch.is_transactional and task.is_aborted(batch.producer_id, batch.base_offset):
                continue
            columns.extend_batch(batch, piece.first_offset, piece.last_offset)
            yield None
    except ObjectNotFoundError as e:
        where = f"{segment.topic}-{segment.partition}"
        if task.access.fail_on_data_loss:
            raise RuntimeError(
                f"{where}: segment {segment.segment_id} "
                f"(offsets {piece.first_offset}..{piece.last_offset}) is gone"
                f" (deleted by retention?): {e}; set failOnDataLoss=false to skip it"
            ) from e
        log.warning("%s: skipping segment %s: %s", where, segment.segment_id, e)


def _through_broker(task: Task, piece: BrokerRange, columns: Columns) -> Iterator[None]:
    from tierbroker.pipeline.spark.kafka_client import DataLossError, read_range

    access = task.access
    try:
        for messages in read_range(
            dict(access.kafka),
            task.topic,
            task.partition,
            piece.first_offset,
            piece.end_offset,
            access.poll_timeout_ms,
            access.fail_on_data_loss,
        ):
            columns.extend_messages(messages)
            yield None
    except DataLossError as e:
        raise RuntimeError(str(e)) from None


class Columns:
    """The rows of the next Arrow record batch, as column chunks.

    Remote batches become Arrow buffers straight from their bytes (`record_columns`,
    compiled), without a Python object per record, unless headers are wanted or the
    extension is not built; then, as for librdkafka messages, records are gathered
    in lists first, which become a chunk before the next native one, so rows stay
    in offset order.
    """

    def __init__(self, topic: str, partition: int, schema: pa.Schema) -> None:
        self.topic = topic
        self.partition = partition
        self.schema = schema
        self.with_headers = "headers" in schema.names
        self.native = record_columns is not None and not self.with_headers
        self._chunks: list[list[pa.Array]] = []  # keys, values, offsets, ms, types[, headers]
        self._chunk_rows = 0
        self._reset_lists()

    def _reset_lists(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.timestamps: list[int] = []  # ms
        self.kinds: list[int] = []
        self.headers: list[list[dict[str, Any]]] = []

    @property
    def rows(self) -> int:
        return self._chunk_rows + len(self.offsets)

    def _flush_lists(self) -> None:
        if not self.offsets:
            return
        chunk = [
            pa.array(self.keys, pa.binary()),
            pa.array(self.values, pa.binary()),
            pa.array(self.offsets, pa.int64()),
            pa.array(self.timestamps, pa.int64()),
            pa.array(self.kinds, pa.int32()),
        ]
        if self.with_headers:
            chunk.append(pa.array(self.headers, self.schema.field("headers").type))
        self._chunks.append(chunk)
        self._chunk_rows += len(self.offsets)
        self._reset_lists()

    def extend_batch(self, batch: BatchView, first: int, last: int) -> None:
        """Add the records of a (CRC-checked, non-control) batch with offsets in [first, last]."""
        if not self.native:
            parsed = parse_batch(batch)
            records = list(parsed)
            if batch.base_offset < first or batch.last_offset > last:
                records = [r for r in records if first <= r.offset <= last]
            self.extend_parsed(records, parsed.timestamp_type)
            return
        assert record_columns is not None
        payload: bytes | memoryview = batch.records_payload()
        if batch.compression is not Compression.NONE:
            payload = decompress(batch.compression, payload)
        log_append = batch.timestamp_type is TimestampType.LOG_APPEND_TIME
        rows, offsets, stamps, kv, ko, kd, vv, vo, vd = record_columns(
            payload,
            batch.record_count,
            batch.base_offset,
            batch.base_timestamp,
            batch.max_timestamp if log_append else None,
            first,
            last,
        )
        if not rows:
            return
        self._flush_lists()
        self._chunks.append(
            [
                _binary(rows, kv, ko, kd),
                _binary(rows, vv, vo, vd),
                pa.Array.from_buffers(pa.int64(), rows, [None, pa.py_buffer(offsets)]),
                pa.Array.from_buffers(pa.int64(), rows, [None, pa.py_buffer(stamps)]),
                pa.repeat(pa.scalar(int(log_append), pa.int32()), rows),
            ]
        )
        self._chunk_rows += rows

    def extend_parsed(self, records: list[Any], kind: int) -> None:
        """Add records of one batch (aiokafka's parser), whose timestamp type is `kind`."""
        self.keys += [r.key for r in records]
        self.values += [r.value for r in records]
        self.offsets += [r.offset for r in records]
        self.timestamps += [r.timestamp for r in records]
        self.kinds += [kind] * len(records)
        if self.with_headers:
            self.headers += [[{"key": k, "value": v} for k, v in r.headers] for r in records]

    def extend_messages(self, messages: list[Any]) -> None:
        """Add librdkafka messages."""
        self.keys += [m.key() for m in messages]
        self.values += [m.value() for m in messages]
        self.offsets += [m.offset() for m in messages]
        stamps = [m.timestamp() for m in messages]
        self.timestamps += [ms for _, ms in stamps]
        self.kinds += [_LIBRDKAFKA_TIMESTAMP_TYPE.get(kind, -1) for kind, _ in stamps]
        if self.with_headers:
            self.headers += [
                [{"key": k, "value": v} for k, v in m.headers() or ()] for m in messages
            ]

    def take(self) -> pa.RecordBatch:
        """The buffered rows as a batch of the schema; the buffers start again empty."""
        self._flush_lists()
        columns = [pa.concat_arrays(parts) for parts in zip(*self._chunks, strict=True)]
        n = self._chunk_rows
        self._chunks, self._chunk_rows = [], 0
        keys, values, offsets, millis, kinds, *headers = columns
        # Spark's timestamps are microseconds; Kafka's are milliseconds. As in Spark's
        # Kafka source, one beyond Spark's range (about 292,000 years) fails the read.
        try:
            micros = pc.multiply_checked(millis, 1000)
        except pa.ArrowInvalid:
            bad = next(i for i, ms in enumerate(millis.to_pylist()) if abs(ms) > _MAX_MS)
            raise ValueError(
                f"{self.topic}-{self.partition}: the record at offset {offsets[bad]} has "
                f"timestamp {millis[bad]} ms, beyond Spark's timestamp range"
            ) from None
        data = [
            keys,
            values,
            pa.repeat(pa.scalar(self.topic, pa.string()), n),
            pa.repeat(pa.scalar(self.partition, pa.int32()), n),
            offsets,
            micros.cast(self.schema.field("timestamp").type),
            kinds,
            *headers,
        ]
        return pa.RecordBatch.from_arrays(data, schema=self.schema)


def _binary(rows: int, validity: bytes | None, offsets: bytes, data: bytes) -> pa.Array:
    bitmap = None if validity is None else pa.py_buffer(validity)
    return pa.Array.from_buffers(
        pa.binary(), rows, [bitmap, pa.py_buffer(offsets), pa.py_buffer(data)]
    )
