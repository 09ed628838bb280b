"""Comparing what Spark read with reference rows, inside Spark (no Python row per record).

The reference rows (`pipeline_topic.Row`, as a stock client read them) become a
DataFrame through Arrow; both sides must have the same count and min/max offset
per partition, the same order-independent checksum (the sum of a hash of
partition, offset, key, value and headers of every row), and the same rows.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyspark.sql import functions as F

from tests.integration.pipeline_topic import Row

COLUMNS = (
    "partition",
    "offset",
    "key",
    "value",
    "headers",
    "unix_millis(timestamp) AS timestamp",
    "timestampType",
)
HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def reference(spark: Any, rows: list[Row]) -> Any:
    """The rows as a DataFrame of COLUMNS (through Arrow: no Python row objects)."""
    columns = list(zip(*rows, strict=True)) if rows else [[]] * 7
    table = pa.table(
        {
            "partition": pa.array(columns[0], pa.int32()),
            "offset": pa.array(columns[1], pa.int64()),
            "key": pa.array(columns[2], pa.binary()),
            "value": pa.array(columns[3], pa.binary()),
            "headers": pa.array(
                [[{"key": k, "value": v} for k, v in h] for h in columns[4]], HEADERS
            ),
            "timestamp": pa.array(columns[5], pa.int64()),
            "timestampType": pa.array(columns[6], pa.int32()),
        }
    )
    return spark.createDataFrame(table)


def fingerprint(frame: Any) -> dict[int, tuple[int, int, int, int]]:
    """Per partition: count, min offset, max offset, and an order-independent checksum (the
    sum of a hash of partition, offset, key, value and headers of every row); one job."""
    rows = frame.groupBy("partition").agg(
        F.count("*"),
        F.min("offset"),
        F.max("offset"),
        F.sum(F.xxhash64("partition", "offset", "key", "value", "headers").cast("decimal(38,0)")),
    )
    return {r[0]: (r[1], r[2], r[3], int(r[4])) for r in rows.collect()}


def assert_same_rows(spark: Any, frame: Any, rows: list[Row], exact: bool = True) -> None:
    """Same fingerprint; with `exact`, the same rows too (timestamps and their types)."""
    got, want = frame.selectExpr(*COLUMNS), reference(spark, rows)
    assert fingerprint(got) == fingerprint(want)
    if exact:  # as many rows on each side: none left over one way means none the other
        assert got.exceptAll(want).isEmpty()
