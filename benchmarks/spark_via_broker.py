"""`format("tierbroker-via-broker")`: Spark reading a topic through the broker, emulated.

Spark's own Kafka source (`spark-sql-kafka-0-10`) is a jar that is not on this
machine; this Python source stands in for it. Like it, it plans one input
partition per Kafka partition and reads each offset range with a Kafka consumer
(librdkafka here, through the `tierbroker` source's own broker reader), and it
builds Arrow batches of the same schema with the `tierbroker` source's own column
code, in Python workers set up the same way. Spark's overhead is then the same on
both sides; the difference is where the bytes come from and how they become
columns: the broker and a client's messages, or the object store and its batches.

Options: `bootstrap`, `topic`, `ends` (JSON: partition -> exclusive end offset).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from tierbroker.pipeline.spark.kafka_client import read_range
from tierbroker.pipeline.spark.read import ROWS_PER_BATCH, Columns, set_up_worker
from tierbroker.pipeline.spark.source import KAFKA_SCHEMA_WITHOUT_HEADERS


class ViaBrokerReader(DataSourceReader):
    def __init__(self, bootstrap: str, topic: str, ends: dict[int, int]) -> None:
        self.config = {"bootstrap.servers": bootstrap, "group.id": f"via-broker-{uuid.uuid4()}"}
        self.topic = topic
        self.ends = ends

    def partitions(self) -> list[InputPartition]:
        return [InputPartition((p, end)) for p, end in sorted(self.ends.items())]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        number, end = partition.value
        schema = to_arrow_schema(KAFKA_SCHEMA_WITHOUT_HEADERS, timezone="UTC")
        columns = Columns(self.topic, number, schema)
        for messages in read_range(self.config, self.topic, number, 0, end, 120_000, True):
            columns.extend_messages(messages)
            set_up_worker()
            if columns.rows >= ROWS_PER_BATCH:
                yield columns.take()
        if columns.rows:
            yield columns.take()


class ViaBrokerDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "tierbroker-via-broker"

    def schema(self) -> StructType:
        return KAFKA_SCHEMA_WITHOUT_HEADERS

    def reader(self, schema: StructType) -> DataSourceReader:
        ends = {int(p): int(e) for p, e in json.loads(self.options["ends"]).items()}
        return ViaBrokerReader(self.options["bootstrap"], self.options["topic"], ends)
