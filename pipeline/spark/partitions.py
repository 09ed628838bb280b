"""Spark's input partitions of a tierbroker read, batch or stream: one per planned `Task`."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from tierbroker.pipeline.spark.plan import Task
from tierbroker.pipeline.spark.read import read_task


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
