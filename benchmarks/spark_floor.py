"""`format("tierbroker-floor")`: what Spark spends on a Python data source that reads nothing.

The source has the `tierbroker` schema and plans one input partition per 8 MiB of
1 KiB values, like a tiered topic's segments; each partition yields one
prebuilt Arrow batch of them, over and over. Spark's cost for such a source
(Python workers, Arrow to the JVM, rows, the query) is a floor under any Python
data source reading the same rows.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from tierbroker.pipeline.spark.source import KAFKA_SCHEMA

ROWS_PER_BATCH = 8192
PARTITION_BYTES = 8 * 1024 * 1024


class FloorReader(DataSourceReader):
    def __init__(self, total_bytes: int, value_size: int) -> None:
        self.total_bytes = total_bytes
        self.value_size = value_size

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(i) for i in range(self.total_bytes // PARTITION_BYTES)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        schema = to_arrow_schema(KAFKA_SCHEMA, timezone="UTC")
        n = max(1, min(ROWS_PER_BATCH, PARTITION_BYTES // self.value_size))
        batch = pa.RecordBatch.from_arrays(
            [
                pa.nulls(n, pa.binary()),
                pa.array([b"v" * self.value_size] * n, pa.binary()),
                pa.array(["floor"] * n, pa.string()),
                pa.array([0] * n, pa.int32()),
                pa.array(range(n), pa.int64()),
                pa.array([0] * n, pa.int64()).cast(schema.field("timestamp").type),
                pa.array([0] * n, pa.int32()),
                pa.array([[]] * n, schema.field("headers").type),
            ],
            schema=schema,
        )
        for _ in range(PARTITION_BYTES // (n * self.value_size)):
            yield batch


class FloorDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "tierbroker-floor"

    def schema(self) -> StructType:
        return KAFKA_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return FloorReader(int(self.options["bytes"]), int(self.options["valueSize"]))
