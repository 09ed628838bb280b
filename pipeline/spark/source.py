"""The `tierbroker` PySpark data source (PySpark >= 4.0 `pyspark.sql.datasource` API).

`spark.read.format("tierbroker").option("storage", url).option("subscribe", name).load()`
reads a topic's remote tier straight from the object store, and with
`kafka.bootstrap.servers` the rest of the topic through the brokers, with the
schema of Spark's own Kafka source (key, value, topic, partition, offset,
timestamp, timestampType, and headers with `includeHeaders=true`), so jobs written
for `format("kafka")` run unchanged. `spark.readStream.format("tierbroker")` is the
same source as a stream (`pipeline.spark.stream`). Options are in
`pipeline.spark.options`, planning in `pipeline.spark.plan`, reading in
`pipeline.spark.read`.

Planning runs in Spark's planner worker; each input partition (`TaskPartition`)
carries its storage URL, keys and byte ranges, so executors need nothing else.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyspark
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
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

from tierbroker.pipeline.spark.options import ReadOptions, include_headers
from tierbroker.pipeline.spark.plan import Task, plan
from tierbroker.pipeline.spark.read import read_task

_COLUMNS = [
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
]
_HEADERS = StructField(
    "headers",
    ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())])),
)
KAFKA_SCHEMA = StructType([*_COLUMNS, _HEADERS])
"""Spark's Kafka source schema with `includeHeaders=true`, field for field."""
KAFKA_SCHEMA_WITHOUT_HEADERS = StructType(_COLUMNS)
"""Spark's Kafka source schema (`includeHeaders=false`, its default)."""


class TaskPartition(InputPartition):
    """An input partition: one `Task` (consecutive pieces of one Kafka partition)."""

    def __init__(self, task: Task) -> None:
        super().__init__(task)
        self.task = task


def read_partition(partition: InputPartition, schema: StructType) -> Iterator[pa.RecordBatch]:
    """The records of an input partition (none for Spark's empty one)."""
    task: Task | None = partition.value
    if task is None:
        return iter(())  # Spark plans one empty partition when there is nothing to read
    return read_task(task, to_arrow_schema(schema, timezone="UTC"))


class TierbrokerReader(DataSourceReader):
    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema

    def partitions(self) -> list[InputPartition]:
        return [TaskPartition(t) for t in plan(self.options)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition, self.schema)


class TierbrokerDataSource(DataSource):
    """`format("tierbroker")`: a topic read from the remote tier (and the brokers)."""

    @classmethod
    def name(cls) -> str:
        return "tierbroker"

    def schema(self) -> StructType:
        headers = include_headers(dict(self.options))
        return KAFKA_SCHEMA if headers else KAFKA_SCHEMA_WITHOUT_HEADERS

    def _check(self, schema: StructType, options: ReadOptions) -> None:
        expected = KAFKA_SCHEMA if options.include_headers else KAFKA_SCHEMA_WITHOUT_HEADERS
        if [f.name for f in schema.fields] != expected.fieldNames():
            raise ValueError(f"the tierbroker source has Spark's Kafka schema: {expected}")

    def reader(self, schema: StructType) -> DataSourceReader:
        options = ReadOptions.parse(dict(self.options))
        self._check(schema, options)
        return TierbrokerReader(options, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        if tuple(int(x) for x in pyspark.__version__.split(".")[:2]) < (4, 2):
            raise RuntimeError(
                f"readStream.format('tierbroker') needs PySpark >= 4.2 (read limits, "
                f"Trigger.AvailableNow), not {pyspark.__version__}"
            )
        from tierbroker.pipeline.spark.stream import TierbrokerStreamReader

        options = ReadOptions.parse(dict(self.options), streaming=True)
        self._check(schema, options)
        return TierbrokerStreamReader(options, schema)
