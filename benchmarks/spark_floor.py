"""`format("tierbroker-floor")`: what Spark spends on a Python data source that reads nothing.

The source has the `tierbroker` source's default schema (Spark's Kafka schema
without headers) and plans `partitions` input partitions sharing `rows` rows of
`valueSize`-byte values, so that it can be given the very partitioning of the
source it is compared with; each partition yields one prebuilt Arrow batch of
them, over and over, from Python workers set up as the `tierbroker` source sets
them up. Spark's cost for such a source (Python workers, Arrow to the
JVM, rows, the query) is a floor under any Python data source reading the same
rows in as many input partitions.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from tierbroker.pipeline.spark.read import set_up_worker
from tierbroker.pipeline.spark.source import KAFKA_SCHEMA_WITHOUT_HEADERS

ROWS_PER_BATCH = 8192


class FloorReader(DataSourceReader):
    def __init__(self, rows: int, value_size: int, partitions: int) -> None:
        self.rows = rows
        self.value_size = value_size
        self.count = partitions

    def partitions(self) -> list[InputPartition]:
        share, extra = divmod(self.rows, self.count)
        return [InputPartition(share + (i < extra)) for i in range(self.count)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        set_up_worker()  # as the sources it is compared with do
        schema = to_arrow_schema(KAFKA_SCHEMA_WITHOUT_HEADERS, timezone="UTC")
        rows = partition.value
        n = max(1, min(ROWS_PER_BATCH, rows))
        batch = pa.RecordBatch.from_arrays(
            [
                pa.nulls(n, pa.binary()),
                pa.array([b"v" * self.value_size] * n, pa.binary()),
                pa.array(["floor"] * n, pa.string()),
                pa.array([0] * n, pa.int32()),
                pa.array(range(n), pa.int64()),
                pa.array([0] * n, pa.int64()).cast(schema.field("timestamp").type),
                pa.array([0] * n, pa.int32()),
            ],
            schema=schema,
        )
        full, rest = divmod(rows, n)
        for _ in range(full):
            yield batch
        if rest:
            yield batch.slice(0, rest)


class FloorDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "tierbroker-floor"

    def schema(self) -> StructType:
        return KAFKA_SCHEMA_WITHOUT_HEADERS

    def reader(self, schema: StructType) -> DataSourceReader:
        return FloorReader(
            int(self.options["rows"]),
            int(self.options["valueSize"]),
            int(self.options["partitions"]),
        )
