"""Spark's own Kafka source (`spark-sql-kafka-0-10`), from the jars `make peers` fetches.

`kafka_source_jars()` is the `spark.jars` value a session needs for `format("kafka")`;
`read_kafka` reads a topic's offset ranges with it as a batch DataFrame (the columns of
Spark's Kafka source, headers included), `read_all` reads them through and returns how
many rows and value bytes it read: what the benchmark times against the `tierbroker`
source. The jars are the newest release Maven Central serves (peers/spark-kafka/pom.xml),
which may be older than the installed PySpark; tests/integration/test_spark_kafka_source.py
shows that pair reading correctly.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

POM = Path(__file__).parent.parent / "peers" / "spark-kafka" / "pom.xml"
INSTALL = "make peers (fetches Spark's Kafka source with Maven, once per machine)"


def kafka_source_jars() -> str:
    """The jars of Spark's Kafka source, comma-separated as `spark.jars` takes them."""
    pinned = re.search(r"<spark.version>(.+)</spark.version>", POM.read_text())
    assert pinned is not None, f"no <spark.version> in {POM}"
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    directory = cache / "tierbroker" / f"spark-kafka-{pinned.group(1)}"
    if not (directory / ".complete").exists():
        raise RuntimeError(f"Spark's Kafka source is not in {directory}: {INSTALL}")
    return ",".join(str(jar) for jar in sorted(directory.glob("*.jar")))


def read_kafka(spark: Any, bootstrap: str, topic: str, ends: dict[int, int]) -> Any:
    """Offsets 0 (or the log start) to `ends` (exclusive, by partition) of `topic`, as
    Spark's Kafka source reads them through the broker at `bootstrap`."""
    return (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", json.dumps({topic: {str(p): e for p, e in ends.items()}}))
        .option("includeHeaders", "true")
        .load()
    )


def read_all(spark: Any, bootstrap: str, topic: str, ends: dict[int, int]) -> tuple[int, int]:
    """Read the range through with Spark's Kafka source: (rows, value bytes), one job
    that touches every value."""
    from pyspark.sql import functions as F

    frame = read_kafka(spark, bootstrap, topic, ends)
    row = frame.agg(F.count("*"), F.sum(F.coalesce(F.length("value"), F.lit(0)))).first()
    return int(row[0]), int(row[1] or 0)
