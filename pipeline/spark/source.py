"""The `tierbroker` PySpark data source (PySpark >= 4.0 `pyspark.sql.datasource` API).

`spark.read.format("tierbroker").option("storage", url).option("topic", name).load()`
reads a topic's remote tier straight from the object store, with the schema of
Spark's own Kafka source (key, value, topic, partition, offset, timestamp,
timestampType, headers), so jobs written for `format("kafka")` run unchanged.
Options are in `pipeline.spark.plan`.

Planning runs in Spark's planner worker; each input partition (`SplitPartition`)
carries its storage URL, keys and byte range, so executors need nothing else.
Executors yield Arrow record batches (`DataSourceReader.read` may, since 4.0),
built column by column from record batches parsed by aiokafka's C record parser.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from tierbroker.pipeline.segments import iter_batches_from, parse_batch, start_position
from tierbroker.pipeline.spark.plan import ReadOptions, Split, plan
from tierbroker.pipeline.storage import ObjectNotFoundError, ObjectStore, open_store

log = logging.getLogger(__name__)

ROWS_PER_BATCH = 8192
CHUNK_BYTES = 8 * 1024 * 1024

KAFKA_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
        StructField(
            "headers",
            ArrayType(
                StructType([StructField("key", StringType()), StructField("value", BinaryType())])
            ),
        ),
    ]
)
"""Spark's Kafka source schema with `includeHeaders=true`, field for field."""

_stores: dict[tuple[str, tuple[tuple[str, str], ...]], ObjectStore] = {}
_stores_lock = threading.Lock()


def _store(split: Split) -> ObjectStore:
    """One store (one S3 client) per URL and options in a Python worker, reused across tasks."""
    key = (split.storage, split.store_options)
    with _stores_lock:
        store = _stores.get(key)
        if store is None:
            store = _stores[key] = open_store(split.storage, dict(split.store_options))
        return store


class SplitPartition(InputPartition):
    """An input partition: one `Split` (segment range or byte range)."""

    def __init__(self, split: Split) -> None:
        super().__init__(split)
        self.split = split


class TierbrokerReader(DataSourceReader):
    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema

    def partitions(self) -> list[InputPartition]:
        return [SplitPartition(s) for s in plan(self.options)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        split: Split | None = partition.value
        if split is None:
            return  # nothing to read: Spark plans one empty partition for an empty list
        where = f"{split.segment.topic}-{split.segment.partition}"
        schema = to_arrow_schema(self.schema, timezone="UTC")
        try:
            yield from _read_split(split, schema)
        except ObjectNotFoundError as e:
            if split.fail_on_data_loss:
                raise RuntimeError(
                    f"{where}: segment {split.segment.segment_id} "
                    f"(offsets {split.first_offset}..{split.last_offset}) is gone"
                    f" (deleted by retention?): {e}; set failOnDataLoss=false to skip it"
                ) from e
            log.warning("skipping segment %s: %s", split.segment.segment_id, e)


def _read_split(split: Split, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    store = _store(split)
    segment = split.segment
    position = start_position(store, split.range, split.first_offset) if split.seek else 0
    position = max(position, split.byte_start)
    columns = _Columns(segment.topic, segment.partition)
    for batch in iter_batches_from(store, segment.log_key, position, split.byte_end, CHUNK_BYTES):
        if batch.base_offset > split.last_offset:
            break
        if batch.last_offset < split.first_offset or batch.is_control:
            continue
        parsed = parse_batch(batch)
        records = list(parsed)
        if batch.base_offset < split.first_offset or batch.last_offset > split.last_offset:
            records = [r for r in records if split.first_offset <= r.offset <= split.last_offset]
        columns.extend(records, parsed.timestamp_type)
        if columns.rows >= ROWS_PER_BATCH:
            yield columns.take(schema)
    if columns.rows:
        yield columns.take(schema)


_MAX_MS = (2**63 - 1) // 1000


class _Columns:
    """Column buffers of the rows of one Arrow record batch."""

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self._reset()

    def _reset(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.timestamps: list[int] = []  # ms
        self.kinds: list[int] = []
        self.headers: list[list[dict[str, Any]]] = []

    @property
    def rows(self) -> int:
        return len(self.offsets)

    def extend(self, records: list[Any], kind: int) -> None:
        """Add the records of one batch, whose timestamp type is `kind`."""
        self.keys += [r.key for r in records]
        self.values += [r.value for r in records]
        self.offsets += [r.offset for r in records]
        self.timestamps += [r.timestamp for r in records]
        self.kinds += [kind] * len(records)
        self.headers += [[{"key": k, "value": v} for k, v in r.headers] for r in records]

    def take(self, schema: pa.Schema) -> pa.RecordBatch:
        n = self.rows
        # Spark's timestamps are microseconds; Kafka's are milliseconds. As in Spark's
        # Kafka source, one beyond Spark's range (about 292,000 years) fails the read.
        try:
            micros = pc.multiply_checked(pa.array(self.timestamps, pa.int64()), 1000)
        except pa.ArrowInvalid:
            bad = next(i for i, ms in enumerate(self.timestamps) if abs(ms) > _MAX_MS)
            raise ValueError(
                f"{self.topic}-{self.partition}: the record at offset {self.offsets[bad]} has "
                f"timestamp {self.timestamps[bad]} ms, beyond Spark's timestamp range"
            ) from None
        data = [
            pa.array(self.keys, schema.field("key").type),
            pa.array(self.values, schema.field("value").type),
            pa.repeat(pa.scalar(self.topic, pa.string()), n),
            pa.repeat(pa.scalar(self.partition, pa.int32()), n),
            pa.array(self.offsets, pa.int64()),
            micros.cast(schema.field("timestamp").type),
            pa.array(self.kinds, pa.int32()),
            pa.array(self.headers, schema.field("headers").type),
        ]
        self._reset()
        return pa.RecordBatch.from_arrays(data, schema=schema)


class TierbrokerDataSource(DataSource):
    """`format("tierbroker")`: a topic's remote tier, read from the object store."""

    @classmethod
    def name(cls) -> str:
        return "tierbroker"

    def schema(self) -> StructType:
        return KAFKA_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        if [f.name for f in schema.fields] != KAFKA_SCHEMA.fieldNames():
            raise ValueError(f"the tierbroker source has Spark's Kafka schema: {KAFKA_SCHEMA}")
        return TierbrokerReader(ReadOptions.parse(dict(self.options)), schema)
