"""The `tierbroker` Spark source and the Parquet export, on a real broker's remote tier.

The data set is `tiered_topic` (200k records, five codecs, keys, headers, null
values); the records of its remote tier, as read through the broker, are the
reference ("the remote set"). Spark (local[2], no UI) must return exactly that set:
same count, min/max offset per partition, and an order-independent checksum over
(partition, offset, key, value, headers); offset and timestamp bounds must return
exactly their range. One small case runs over S3 (moto's standalone server): the
README's Spark example, as written, and a bounded `TieredConsumer` read.

The session is made as a user makes it, without PYSPARK_PYTHON: `register` must
give Spark's Python workers an interpreter that imports tierbroker and pyarrow
(`python3` from PATH need not).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from tests.integration.broker_process import ROOT, BrokerProcess
from tests.integration.moto_server import MotoServer
from tests.integration.pipeline_topic import (
    BROKER_OVERRIDES,
    TOPIC,
    Row,
    TieredTopic,
    small_tiered_topic,
)
from tierbroker.pipeline.discovery import SegmentDiscovery
from tierbroker.pipeline.storage import open_store

pytestmark = pytest.mark.slow
try:
    import pyspark  # noqa: F401
except ImportError as missing:
    raise ImportError(
        "PySpark is missing: `make test` installs it (pip install 'pyspark>=4.0')"
    ) from missing


@dataclass
class Tier:
    broker: BrokerProcess
    storage: str
    rows: list[Row]  # the remote set, by partition then offset
    remote_ends: dict[int, int]  # exclusive


def checksum(rows: list[Row]) -> int:
    """Order-independent: the sum of a hash of (partition, offset, key, value, headers)."""
    total = 0
    for partition, offset, key, value, headers, *_ in rows:
        digest = hashlib.blake2b(
            repr((partition, offset, key, value, headers)).encode(), digest_size=8
        )
        total = (total + int.from_bytes(digest.digest(), "big")) % (1 << 64)
    return total


def summary(rows: list[Row]) -> dict[int, tuple[int, int, int]]:
    by: dict[int, list[int]] = {}
    for row in rows:
        by.setdefault(row[0], []).append(row[1])
    return {p: (len(o), min(o), max(o)) for p, o in by.items()}


@pytest.fixture(scope="module")
def tier(tiered_topic: TieredTopic) -> Tier:
    return Tier(
        tiered_topic.broker,
        tiered_topic.storage,
        tiered_topic.remote_rows(),
        tiered_topic.remote_ends,
    )


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from pyspark.sql import SparkSession

    from tierbroker.pipeline.spark import register

    saved = {k: os.environ.get(k) for k in ("PYSPARK_PYTHON", "PYTHONPATH")}
    os.environ.pop("PYSPARK_PYTHON", None)  # register() chooses the workers' interpreter
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), saved["PYTHONPATH"]]))
    session = (
        SparkSession.builder.master("local[2]")
        .appName("tierbroker-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .getOrCreate()
    )
    register(session)
    yield session
    session.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def load(spark: Any, tier: Tier, **options: str) -> Any:
    reader = spark.read.format("tierbroker").option("storage", tier.storage).option("topic", TOPIC)
    return reader.options(**options).load()


def collect(frame: Any) -> list[Row]:
    rows = frame.selectExpr(
        "partition", "offset", "key", "value", "headers", "unix_millis(timestamp)", "timestampType"
    ).collect()
    return sorted(
        (
            (
                r[0],
                r[1],
                None if r[2] is None else bytes(r[2]),
                None if r[3] is None else bytes(r[3]),
                tuple((h.key, None if h.value is None else bytes(h.value)) for h in r[4]),
                r[5],
                r[6],
            )
            for r in rows
        ),
        key=lambda r: (r[0], r[1]),
    )


def test_schema_is_the_kafka_sources(spark: Any, tier: Tier) -> None:
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

    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    kafka = [  # Spark's KafkaRecordToRowConverter, includeHeaders=true
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("topic", StringType(), True),
        StructField("partition", IntegerType(), True),
        StructField("offset", LongType(), True),
        StructField("timestamp", TimestampType(), True),
        StructField("timestampType", IntegerType(), True),
        StructField("headers", ArrayType(header, True), True),
    ]
    schema = load(spark, tier).schema
    assert len(schema.fields) == len(kafka)
    for got, expected in zip(schema.fields, kafka, strict=True):
        assert got == expected


def test_reads_exactly_the_remote_set(spark: Any, tier: Tier) -> None:
    frame = load(spark, tier)
    segments = sum(len(SegmentDiscovery(open_store(tier.storage)).ranges(TOPIC, p)) for p in (0, 1))
    assert frame.rdd.getNumPartitions() == segments > 2  # one input partition per segment
    agg = frame.groupBy("partition").agg({"*": "count", "offset": "min"}).collect()
    maxima = dict(frame.groupBy("partition").agg({"offset": "max"}).collect())
    spark_summary = {r[0]: (r["count(1)"], r["min(offset)"], maxima[r[0]]) for r in agg}
    assert spark_summary == summary(tier.rows)
    rows = collect(frame)
    assert checksum(rows) == checksum(tier.rows)
    assert rows == tier.rows  # timestamps and types too
    assert {row[4][0][0] for row in rows} == {"i"} and any(len(r[4]) == 2 for r in rows)

    split = load(spark, tier, maxBytesPerPartition="65536")
    assert split.rdd.getNumPartitions() > segments  # big segments cut at index entries
    assert split.count() == len(tier.rows)
    assert split.exceptAll(frame).isEmpty()  # the same rows, compared inside Spark


def test_offset_bounds_return_exactly_their_range(spark: Any, tier: Tier) -> None:
    end0 = tier.remote_ends[0]
    frame = load(
        spark,
        tier,
        startingOffsets=json.dumps({TOPIC: {"0": 23, "1": -2}}),
        endingOffsets=json.dumps({TOPIC: {"0": end0 - 100, "1": -1}}),
        maxBytesPerPartition="100000",
    )
    expected = [r[:2] for r in tier.rows if r[0] == 1 or 23 <= r[1] < end0 - 100]
    assert sorted(tuple(r) for r in frame.select("partition", "offset").collect()) == expected
    latest = load(spark, tier, startingOffsets="latest")
    assert latest.count() == 0
    one = load(spark, tier, partitions="1", endingOffsets=json.dumps({TOPIC: {"1": 1}}))
    assert collect(one) == [tier.rows[[r[0] for r in tier.rows].index(1)]]


async def broker_offsets_for(bootstrap: str, timestamp: int) -> dict[int, int | None]:
    """The broker's ListOffsets answer for a timestamp, per partition."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        found = await consumer.offsets_for_times(
            {TopicPartition(TOPIC, p): timestamp for p in (0, 1)}
        )
    finally:
        await consumer.stop()
    return {tp.partition: None if o is None else o.offset for tp, o in found.items()}


async def test_timestamp_bounds_return_exactly_their_range(spark: Any, tier: Tier) -> None:
    partition0 = [r for r in tier.rows if r[0] == 0]
    start_ts = partition0[len(partition0) // 3][5]
    end_ts = partition0[2 * len(partition0) // 3][5]

    def first_at_or_after(ts: int, rows: list[Row]) -> int:
        return next((r[1] for r in rows if r[5] >= ts), rows[-1][1] + 1)

    expected = []
    broker_start = await broker_offsets_for(tier.broker.bootstrap, start_ts)
    for p in (0, 1):
        rows = [r for r in tier.rows if r[0] == p]
        lo, hi = first_at_or_after(start_ts, rows), first_at_or_after(end_ts, rows)
        assert broker_start[p] == lo  # the same answer as the broker's ListOffsets
        expected += [r for r in rows if lo <= r[1] < hi]
    frame = load(spark, tier, startingTimestamp=str(start_ts), endingTimestamp=str(end_ts))
    assert collect(frame) == expected and expected


def test_export_to_parquet_resumes(spark: Any, tier: Tier, tmp_path: Path, capsys: Any) -> None:
    from tierbroker.pipeline.jobs import export

    out = tmp_path / "lake"
    args = ["--storage", tier.storage, "--topic", TOPIC, "--to", str(out), "--format", "parquet"]
    assert export.main([*args, "--max-segments", "2", "--segments-per-job", "1"]) == 0
    assert len(list((out / "_exported_segments").iterdir())) == 2
    assert export.main(args) == 0  # the rest
    assert export.main(args) == 0  # nothing left
    printed = capsys.readouterr().out
    assert "2/2 segments" in printed and "0 to export now" in printed

    table = ds.dataset(out, format="parquet", partitioning="hive").to_table()
    rows = sorted(
        (
            (
                int(r["partition"]),
                r["offset"],
                r["key"],
                r["value"],
                tuple((h["key"], h["value"]) for h in r["headers"]),
                int(r["timestamp"].timestamp() * 1000),
                r["timestampType"],
            )
            for r in table.to_pylist()
        ),
        key=lambda r: (r[0], r[1]),
    )
    assert rows == tier.rows
    assert {str(r["topic"]) for r in table.to_pylist()} == {TOPIC}
    for r in table.select(["timestamp", "date"]).to_pylist():
        assert str(r["date"]) == r["timestamp"].date().isoformat()


def readme_spark_example(endpoint: str) -> str:
    """The README's Spark example, its S3 endpoint (MinIO's default port) made `endpoint`."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "register(" in b]
    assert "http://127.0.0.1:9000" in block
    return block.replace("http://127.0.0.1:9000", endpoint)


async def test_s3_remote_tier(spark: Any, tmp_path: Path, capsys: Any) -> None:
    """The README's example reads the tier a broker wrote to S3 (its bucket, prefix and
    topic); a bounded TieredConsumer read returns every remote record, then stops."""
    from tierbroker.pipeline import TieredConsumer

    assert "PYSPARK_PYTHON" not in os.environ
    server = MotoServer().start()
    try:
        server.create_bucket("lake")
        overrides = {
            **BROKER_OVERRIDES,
            **server.rsm_overrides("lake"),
            "rsm.config.key.prefix": "tiered/",
        }
        broker = BrokerProcess(tmp_path, overrides).start()
        try:
            topic = "events"
            end = small_tiered_topic(broker, topic)["remote_log_end_offset"] + 1
            example: dict[str, Any] = {}
            exec(readme_spark_example(server.endpoint), example)
            frame = example["df"]
            assert frame.count() == end
            assert frame.selectExpr("max(offset)").first()[0] == end - 1
            assert f"|0|{end}|" in capsys.readouterr().out.replace(" ", "")  # df...show()

            storage = f"s3://lake/tiered/?endpoint={server.endpoint}&path_style=true"
            consumer = TieredConsumer(
                topic,
                mode="REMOTE_ONLY",
                bounded=True,
                bootstrap_servers=broker.bootstrap,
                group_id="backfill",
                auto_offset_reset="earliest",
                storage=storage,
                storage_options={
                    "storage.aws.access.key.id": "testing",
                    "storage.aws.secret.access.key": "testing",
                },
            )
            await consumer.start()
            try:
                offsets = [record.offset async for record in consumer]
                tp = TopicPartition(topic, 0)
                assert offsets == list(range(end))
                assert await consumer.position(tp) == await consumer.end_offset(tp) == end
                assert await consumer.at_end() and await consumer.getmany(timeout_ms=5000) == {}
                assert consumer.stats.broker_records == {}
            finally:
                await consumer.stop()
        finally:
            broker.stop()
    finally:
        server.stop()
