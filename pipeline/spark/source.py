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

from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyspark
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
    Not,
)
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
from tierbroker.pipeline.spark.partitions import TaskPartition, read_partition
from tierbroker.pipeline.spark.plan import NO_FILTERS, plan

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


class TierbrokerReader(DataSourceReader):
    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self.pushed = NO_FILTERS

    def partitions(self) -> list[InputPartition]:
        return [TaskPartition(t) for t in plan(self.options, self.pushed)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition, self.schema)


class FilteringReader(TierbrokerReader):
    """The batch reader taking Spark's pushed-down filters (PySpark >= 4.1, with
    `spark.sql.python.filterPushdown.enabled`, which PySpark requires of such a reader).

    Comparisons, `=` and `IN` on `partition` and `offset` narrow the plan and are
    done here exactly (except `IN` on offsets, narrowed to its span); `>`, `>=` and
    `=` on `timestamp` prune the segments whose largest timestamp is lower, and
    Spark still applies them to the rows. Spark evaluates every other filter.
    """

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        for f in filters:
            if not self._push(f):
                yield f

    def _push(self, f: Filter) -> bool:
        """Narrow `self.pushed` by `f`; True if no row it leaves fails `f`."""
        attribute: tuple[str, ...] = getattr(f, "attribute", ())
        value: Any = getattr(f, "value", None)
        if isinstance(f, Not) or attribute not in (("partition",), ("offset",), ("timestamp",)):
            return False
        column = attribute[0]
        if column == "timestamp":
            if (
                isinstance(f, EqualTo | GreaterThan | GreaterThanOrEqual)
                and isinstance(value, datetime)
                and value.tzinfo is not None  # PySpark's are in UTC
            ):  # a record at `lowest` ms or later may pass
                lowest = (value - _EPOCH) // timedelta(milliseconds=1)
                start = self.pushed.timestamp_from_ms
                self.pushed = replace(
                    self.pushed, timestamp_from_ms=lowest if start is None else max(start, lowest)
                )
            return False
        interval = self.pushed.interval(column)
        if isinstance(f, In) and all(isinstance(v, int) for v in value):
            self.pushed = self.pushed.with_interval(column, interval.only(frozenset(value)))
            return column == "partition"  # offsets: only their span is planned
        bounds = _BOUNDS.get(type(f))
        if bounds is None or not isinstance(value, int) or isinstance(value, bool):
            return False
        self.pushed = self.pushed.with_interval(column, interval.narrowed(*bounds(value)))
        return True


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_BOUNDS: dict[type, Callable[[int], tuple[int | None, int | None]]] = {
    EqualTo: lambda v: (v, v + 1),
    GreaterThan: lambda v: (v + 1, None),
    GreaterThanOrEqual: lambda v: (v, None),
    LessThan: lambda v: (None, v),
    LessThanOrEqual: lambda v: (None, v + 1),
}
"""[low, high) of the integers a comparison with v keeps."""


class TierbrokerDataSource(DataSource):
    """`format("tierbroker")`: a topic read from the remote tier (and the brokers)."""

    filter_pushdown = False  # FilteringReader, which PySpark takes only with pushdown on

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
        if self.filter_pushdown:
            return FilteringReader(options, schema)
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


class FilteringDataSource(TierbrokerDataSource):
    """`format("tierbroker")` taking pushed-down filters (see `FilteringReader`)."""

    filter_pushdown = True
