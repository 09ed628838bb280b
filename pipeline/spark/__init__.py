"""The `tierbroker` Spark data source: a topic's remote tier as Spark's Kafka schema.

    from tierbroker.pipeline.spark import register
    register(spark)
    df = spark.read.format("tierbroker").option("storage", "s3://bucket/prefix?...") \\
        .option("topic", "events").option("startingOffsets", "earliest").load()

Executors import this package, so it must be installed (or on PYTHONPATH) where
they run, with pyspark >= 4.0 and pyarrow.
"""

from __future__ import annotations

from typing import Any

from tierbroker.pipeline.spark.source import KAFKA_SCHEMA, TierbrokerDataSource

__all__ = ["KAFKA_SCHEMA", "TierbrokerDataSource", "register"]


def register(spark: Any) -> None:
    """Register format "tierbroker" with a SparkSession (once per session is enough)."""
    spark.dataSource.register(TierbrokerDataSource)
