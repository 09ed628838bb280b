"""The `tierbroker` Spark source (batch) and the Parquet export, on real brokers' remote tiers.

Two tiers, each test running on both where it applies: LocalFs (`tiered_topic`:
200k records, five codecs, keys, headers, null values, 1 MiB segments) and S3
(moto's standalone server; a second broker with the S3 plugin, bucket `lake`,
prefix `tiered/`, topic `events`: 20k records in 256 KiB segments). Both topics
have an untiered tail. The reference is what confluent-kafka reads through the
broker; Spark (local[2], no UI) must return exactly its records: same count,
min/max offset per partition, and an order-independent checksum over (partition,
offset, key, value, headers), then the same rows, compared inside Spark.

The session is made as a user makes it, without PYSPARK_PYTHON: `register` must
give Spark's Python workers an interpreter that imports tierbroker and pyarrow
(`python3` from PATH need not).
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from tests.integration.broker_process import ROOT, BrokerProcess
from tests.integration.moto_server import CREDENTIALS, MotoServer
from tests.integration.pipeline_topic import (
    BROKER_OVERRIDES,
    Row,
    TieredTopic,
    read_with_confluent,
    tiered_topic_on,
)
from tests.integration.spark_rows import assert_same_rows, fingerprint
from tests.integration.transactional_topic import transactional_topic
from tests.spark_session import spark_session
from tierbroker.pipeline.discovery import SegmentDiscovery
from tierbroker.pipeline.spark.options import ReadOptions
from tierbroker.pipeline.spark.plan import BrokerRange, plan
from tierbroker.pipeline.storage import open_store

pytestmark = pytest.mark.slow
try:
    import pyspark  # noqa: F401
except ImportError as missing:
    raise ImportError(
        "PySpark is missing: `make test` installs it (pip install 'pyspark>=4.0')"
    ) from missing

S3_TOPIC = "events"


@dataclass
class Tier:
    broker: BrokerProcess
    topic: str
    storage: str
    rows: list[Row]  # every record below `ends`, by partition then offset (confluent-kafka)
    ends: dict[int, int]  # the log end offsets when `rows` were read
    remote_ends: dict[int, int]  # exclusive
    segment_bytes: int
    store_options: dict[str, str] = field(default_factory=dict)

    def remote_rows(self) -> list[Row]:
        return [r for r in self.rows if r[1] < self.remote_ends[r[0]]]

    def options(self, **extra: str) -> dict[str, str]:
        return {"storage": self.storage, "subscribe": self.topic, **self.store_options, **extra}


@pytest.fixture(scope="module")
def local_tier(tiered_topic: TieredTopic) -> Tier:
    t = tiered_topic
    rows = read_with_confluent(t.broker.bootstrap, t.topic, t.ends)
    return Tier(t.broker, t.topic, t.storage, rows, t.ends, t.remote_ends, 1 << 20)


@contextmanager
def tier_on_s3(
    directory: Path,
    bucket: str,
    prefix: str,
    topic: str,
    settings: dict[str, str],
    read_settings: dict[str, str],
) -> Iterator[Tier]:
    """A broker keeping `topic` (20k records, two partitions) in moto's S3 under `prefix`,
    with the `rsm.config.` `settings` (the prefix removed); `read_settings`, those readers
    take too."""
    server = MotoServer().start()
    try:
        server.create_bucket(bucket)
        overrides = {
            **BROKER_OVERRIDES,
            **server.rsm_overrides(bucket),
            "rsm.config.key.prefix": prefix,
            **{f"rsm.config.{k}": v for k, v in {**settings, **read_settings}.items()},
        }
        broker = BrokerProcess(directory, overrides).start()
        try:
            status = tiered_topic_on(broker, topic, 2, 20_000)
            ends = {p: r["log_end_offset"] for p, r in status.items()}
            remote_ends = {p: r["remote_log_end_offset"] + 1 for p, r in status.items()}
            yield Tier(
                broker,
                topic,
                f"s3://{bucket}/{prefix}?endpoint={server.endpoint}&path_style=true",
                read_with_confluent(broker.bootstrap, topic, ends),
                ends,
                remote_ends,
                256 * 1024,
                {
                    "storage.aws.access.key.id": CREDENTIALS["aws_access_key_id"],
                    "storage.aws.secret.access.key": CREDENTIALS["aws_secret_access_key"],
                    **read_settings,
                },
            )
        finally:
            broker.stop()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def s3_tier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tier]:
    directory = tmp_path_factory.mktemp("s3-tier")
    with tier_on_s3(directory, "lake", "tiered/", S3_TOPIC, {}, {}) as tier:
        yield tier


@pytest.fixture(scope="module")
def sealed_tier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tier]:
    """A broker storing its segments compressed and encrypted (key `k1` from a file) in
    moto's S3; readers get the key file through their storage options."""
    keys = tmp_path_factory.mktemp("keys")
    (keys / "k1.key").write_bytes(os.urandom(32))
    key_file = {"encryption.keys": "k1", "encryption.keys.k1.file": str(keys / "k1.key")}
    sealing = {
        "encryption.enabled": "true",
        "encryption.key.id": "k1",
        "compression.enabled": "true",
        "chunk.size": "65536",
    }
    directory = tmp_path_factory.mktemp("sealed")
    with tier_on_s3(directory, "sealed", "", "sealed", sealing, key_file) as tier:
        yield tier


@pytest.fixture(scope="module", params=["local", "s3"])
def tier(request: pytest.FixtureRequest) -> Tier:
    found: Tier = request.getfixturevalue(f"{request.param}_tier")
    assert all(found.ends[p] > found.remote_ends[p] for p in found.ends)  # an untiered tail
    return found


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    parquet = {"spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS"}
    with spark_session("tierbroker-tests", **parquet) as session:
        yield session


def load(spark: Any, tier: Tier, **options: str) -> Any:
    return spark.read.format("tierbroker").options(**tier.options(**options)).load()


def error_of(action: Any) -> str:
    """The message of the error Spark raises for `action` (wrapping the source's)."""
    from pyspark.errors import PySparkException

    with pytest.raises(PySparkException) as raised:
        action()
    return str(raised.value)


# Reading ------------------------------------------------------------------------------------


def test_schema_is_the_kafka_sources(spark: Any, local_tier: Tier) -> None:
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
    kafka = [  # Spark's KafkaRecordToRowConverter
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("topic", StringType(), True),
        StructField("partition", IntegerType(), True),
        StructField("offset", LongType(), True),
        StructField("timestamp", TimestampType(), True),
        StructField("timestampType", IntegerType(), True),
    ]
    assert list(load(spark, local_tier).schema.fields) == kafka  # includeHeaders=false
    with_headers = load(spark, local_tier, includeHeaders="true").schema.fields
    assert list(with_headers) == [*kafka, StructField("headers", ArrayType(header, True), True)]


def test_reads_exactly_the_remote_set(spark: Any, tier: Tier) -> None:
    frame = load(spark, tier, includeHeaders="true")
    # Consecutive segments packed: one input partition per Kafka partition at this size.
    assert frame.rdd.getNumPartitions() == len(tier.ends)
    assert_same_rows(spark, frame, tier.remote_rows())

    # 384 KiB: 1 MiB segments (LocalFs) cut in three, 256 KiB ones (S3) one per partition.
    cut = load(spark, tier, maxBytesPerPartition=str(384 * 1024), includeHeaders="true")
    tasks = plan(ReadOptions.parse(tier.options(maxBytesPerPartition=str(384 * 1024))))
    store = open_store(tier.storage, tier.store_options)
    segments = sum(len(SegmentDiscovery(store).ranges(tier.topic, p)) for p in tier.ends)
    assert cut.rdd.getNumPartitions() == len(tasks) >= segments - len(tier.ends) > 0
    assert fingerprint(cut) == fingerprint(frame)


def test_the_whole_topic_through_the_brokers(spark: Any, tier: Tier) -> None:
    options = {"kafka.bootstrap.servers": tier.broker.bootstrap, "includeHeaders": "true"}
    tasks = plan(ReadOptions.parse(tier.options(**options)))
    tails = {t.partition: p for t in tasks for p in t.pieces if isinstance(p, BrokerRange)}
    assert {p: (r.first_offset, r.end_offset) for p, r in tails.items()} == {
        p: (tier.remote_ends[p], tier.ends[p]) for p in tier.ends
    }
    frame = load(spark, tier, **options)
    assert_same_rows(spark, frame, tier.rows, exact=False)
    tail = [r for r in tier.rows if r[1] >= tier.remote_ends[r[0]]]  # through the broker
    ends = " OR ".join(f"(partition = {p} AND offset >= {e})" for p, e in tier.remote_ends.items())
    assert_same_rows(spark, frame.where(ends), tail)


def test_partitioning_options(spark: Any, tier: Tier) -> None:
    from pyspark.sql.functions import spark_partition_id

    total = len(tier.remote_rows())
    limit = total // 7
    capped = load(spark, tier, maxRecordsPerPartition=str(limit))
    sizes = [r[1] for r in capped.groupBy(spark_partition_id()).count().collect()]
    assert max(sizes) <= limit and sum(sizes) == total and len(sizes) >= 7

    spread = load(spark, tier, minPartitions="9")
    assert 9 <= spread.rdd.getNumPartitions() <= 10  # Spark's rounding, over 2 partitions
    assert spread.count() == total


def test_offset_bounds_return_exactly_their_range(spark: Any, tier: Tier) -> None:
    end0 = tier.remote_ends[0]
    frame = load(
        spark,
        tier,
        startingOffsets=json.dumps({tier.topic: {"0": 23, "1": -2}}),
        endingOffsets=json.dumps({tier.topic: {"0": end0 - 100, "1": -1}}),
        maxBytesPerPartition="100000",
    )
    expected = [r[:2] for r in tier.remote_rows() if r[0] == 1 or 23 <= r[1] < end0 - 100]
    assert sorted(tuple(r) for r in frame.select("partition", "offset").collect()) == expected
    assert "can't be latest for batch" in error_of(
        lambda: load(spark, tier, startingOffsets="latest").count()
    )


async def broker_offsets_for(tier: Tier, timestamp: int) -> dict[int, int | None]:
    """The broker's ListOffsets answer for a timestamp, per partition."""
    consumer = AIOKafkaConsumer(bootstrap_servers=tier.broker.bootstrap)
    await consumer.start()
    try:
        found = await consumer.offsets_for_times(
            {TopicPartition(tier.topic, p): timestamp for p in tier.ends}
        )
    finally:
        await consumer.stop()
    return {tp.partition: None if o is None else o.offset for tp, o in found.items()}


async def test_timestamp_bounds_return_exactly_their_range(spark: Any, tier: Tier) -> None:
    remote = tier.remote_rows()
    partition0 = [r for r in remote if r[0] == 0]
    start_ts = partition0[len(partition0) // 3][5]
    end_ts = max(partition0[2 * len(partition0) // 3][5], start_ts + 1)  # records share ms

    def first_at_or_after(ts: int, rows: list[Row]) -> int:
        return next((r[1] for r in rows if r[5] >= ts), rows[-1][1] + 1)

    expected = []
    broker_start = await broker_offsets_for(tier, start_ts)
    for p in tier.ends:
        rows = [r for r in remote if r[0] == p]
        lo, hi = first_at_or_after(start_ts, rows), first_at_or_after(end_ts, rows)
        assert broker_start[p] == lo  # the same answer as the broker's ListOffsets
        expected += [r[:2] for r in rows if lo <= r[1] < hi]
    frame = load(spark, tier, startingTimestamp=str(start_ts), endingTimestamp=str(end_ts))
    assert sorted(tuple(r) for r in frame.select("partition", "offset").collect()) == expected
    assert expected

    after_all = str(max(r[5] for r in tier.rows) + 1)
    by_partition = json.dumps({tier.topic: {"1": start_ts}})  # partition 0: earliest
    frame = load(spark, tier, startingOffsetsByTimestamp=by_partition)
    lo = first_at_or_after(start_ts, [r for r in remote if r[0] == 1])
    assert frame.count() == sum(1 for r in remote if r[0] == 0 or r[1] >= lo)

    assert "No offset matched from request of topic-partition" in error_of(
        lambda: load(spark, tier, startingTimestamp=after_all).count()
    )
    assert load(
        spark, tier, startingTimestamp=after_all, startingOffsetsByTimestampStrategy="latest"
    ).isEmpty()


def test_filters_on_partition_offset_and_timestamp_narrow_the_plan(spark: Any, tier: Tier) -> None:
    one_per_segment = str(tier.segment_bytes * 3 // 2)
    frame = load(spark, tier, maxBytesPerPartition=one_per_segment)
    every = frame.rdd.getNumPartitions()

    picked = frame.where("partition = 1 AND offset >= 100 AND offset < 1100")
    assert sorted(tuple(r) for r in picked.select("partition", "offset").collect()) == [
        (1, o) for o in range(100, 1100)
    ]
    assert picked.rdd.getNumPartitions() < every // 2  # one partition, a few segments

    remote = tier.remote_rows()
    store = open_store(tier.storage, tier.store_options)
    *older, _ = SegmentDiscovery(store).ranges(tier.topic, 0)
    ts = max(r.segment.max_timestamp_ms for r in older) + 1  # partition 0: its last segment
    moment = datetime.fromtimestamp(ts / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    later = frame.where(f"timestamp >= TIMESTAMP '{moment}'")
    assert later.count() == sum(1 for r in remote if r[5] >= ts)
    assert later.rdd.getNumPartitions() < every  # the older segments of partition 0: pruned


def test_assign_and_subscribe_pattern(spark: Any, tier: Tier) -> None:
    base = {k: v for k, v in tier.options().items() if k != "subscribe"}

    def read(**strategy: str) -> Any:
        return spark.read.format("tierbroker").options(**base, **strategy).load()

    assigned = read(assign=json.dumps({tier.topic: [1]}))
    ones = [r[:2] for r in tier.remote_rows() if r[0] == 1]
    assert sorted(tuple(r) for r in assigned.select("partition", "offset").collect()) == ones
    pattern = f"{re.escape(tier.topic[:-1])}[{tier.topic[-1]}]"  # that topic alone
    assert read(subscribePattern=pattern).count() == len(tier.remote_rows())
    assert read(subscribePattern="nothing-matches-.*").isEmpty()
    both = error_of(lambda: read(subscribe=tier.topic, assign='{"x":[0]}').count())
    assert "Only one of the options subscribe" in both


def test_unknown_and_unsupported_options_are_refused(spark: Any, local_tier: Tier) -> None:
    message = error_of(lambda: load(spark, local_tier, startingOffset="earliest").count())
    assert "unknown option(s) startingoffset" in message.lower()  # Spark lowers option keys
    assert "maxRecordsPerPartition" in message
    message = error_of(
        lambda: load(spark, local_tier, **{"kafka.isolation.level": "serializable"}).count()
    )
    assert "kafka.isolation.level=serializable" in message


def test_read_committed_leaves_out_aborted_transactions(
    spark: Any, local_tier: Tier, tmp_path: Path
) -> None:
    """From the object store alone, the committed records up to what it proves decided;
    through the brokers too, every committed record; read uncommitted, the aborted ones
    as well (never the markers). The export job read committed exports whole segments
    below what the store proves decided, and leaves the one past it for a later run."""
    topic = transactional_topic(local_tier.broker, f"spark-txn-{uuid.uuid4().hex[:6]}")

    def values(**options: str) -> list[tuple[int, bytes]]:
        frame = spark.read.format("tierbroker").options(
            storage=topic.storage, subscribe=topic.name, **options
        )
        return [(r.offset, bytes(r.value)) for r in frame.load().orderBy("offset").collect()]

    remote = values(**{"kafka.isolation.level": "read_committed"})
    assert [v for _, v in remote] == topic.committed
    assert max(offset for offset, _ in remote) < topic.open_at
    broker = {"kafka.bootstrap.servers": local_tier.broker.bootstrap}
    everything = values(**broker, **{"kafka.isolation.level": "read_committed"})
    assert [v for _, v in everything] == topic.committed
    uncommitted = [v for _, v in values(**broker)]
    assert len(uncommitted) == 120 + 2  # every data record, markers left out

    from tierbroker.pipeline.jobs import export

    def export_to(out: Path, *more: str) -> None:
        assert (
            export.main(
                ["--storage", topic.storage, "--topic", topic.name, "--to", str(out), *more]
            )
            == 0
        )

    out = tmp_path / "committed"
    export_to(out, "--isolation-level", "read_committed")
    table = ds.dataset(out, format="parquet", partitioning="hive").to_table()
    exported = [bytes(r["value"]) for r in sorted(table.to_pylist(), key=lambda r: r["offset"])]
    assert exported and exported == topic.committed[: len(exported)]
    markers = [json.loads(m.read_text()) for m in (out / "_exported_segments").iterdir()]
    assert max(m["end_offset"] for m in markers) < topic.open_at
    export_to(tmp_path / "all")  # read uncommitted: every segment
    assert len(list((tmp_path / "all" / "_exported_segments").iterdir())) > len(markers)


# The export job -----------------------------------------------------------------------------


def test_export_to_parquet_resumes(
    spark: Any, local_tier: Tier, tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tierbroker.pipeline.jobs import export

    tier = local_tier
    out = tmp_path / "lake"
    args = ["--storage", tier.storage, "--topic", tier.topic, "--to", str(out)]
    assert export.main([*args, "--max-segments", "2", "--segments-per-job", "1"]) == 0
    assert len(list((out / "_exported_segments").iterdir())) == 2
    assert export.main(args) == 0  # the rest
    with monkeypatch.context() as m:  # nothing left: done without a Spark session
        m.setattr(export, "_session", lambda _master: pytest.fail("Spark started"))
        assert export.main(args) == 0
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
    assert rows == tier.remote_rows()
    assert {str(r["topic"]) for r in table.to_pylist()} == {tier.topic}
    for r in table.select(["timestamp", "date"]).to_pylist():
        assert str(r["date"]) == r["timestamp"].date().isoformat()


# S3: the README's example, and a bounded TieredConsumer ---------------------------------------


def readme_spark_example(endpoint: str) -> str:
    """The README's Spark example, its S3 endpoint (MinIO's default port) made `endpoint`."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "register(" in b]
    assert "http://127.0.0.1:9000" in block
    return block.replace("http://127.0.0.1:9000", endpoint)  # moto takes any credentials


async def test_s3_readme_example_and_a_bounded_tiered_consumer(
    spark: Any, s3_tier: Tier, capsys: Any
) -> None:
    """The README's example reads the tier a broker wrote to S3 (its bucket, prefix and
    topic); a bounded TieredConsumer read returns every remote record, then stops."""
    from tierbroker.pipeline import TieredConsumer

    tier = s3_tier
    assert "PYSPARK_PYTHON" not in os.environ
    endpoint = tier.storage.split("endpoint=")[1].split("&")[0]
    example: dict[str, Any] = {}
    exec(readme_spark_example(endpoint), example)
    assert example["df"].count() == len(tier.remote_rows())
    shown = capsys.readouterr().out.replace(" ", "")
    for p, end in tier.remote_ends.items():
        assert f"|{p}|{end}|" in shown  # df.groupBy("partition").count().show()

    consumer = TieredConsumer(
        tier.topic,
        mode="REMOTE_ONLY",
        bounded=True,
        bootstrap_servers=tier.broker.bootstrap,
        group_id="backfill",
        auto_offset_reset="earliest",
        storage=tier.storage,
        storage_options=tier.store_options,
    )
    await consumer.start()
    try:
        read = sorted([(record.partition, record.offset) async for record in consumer])
        assert read == [r[:2] for r in tier.remote_rows()]
        for p, end in tier.remote_ends.items():
            tp = TopicPartition(tier.topic, p)
            assert await consumer.position(tp) == await consumer.end_offset(tp) == end
        assert await consumer.at_end() and await consumer.getmany(timeout_ms=5000) == {}
        assert consumer.stats.broker_records == {}
    finally:
        await consumer.stop()


async def test_compressed_and_encrypted_segments_read_back_and_a_wrong_key_is_refused(
    spark: Any, sealed_tier: Tier, tmp_path: Path
) -> None:
    """Spark and a TieredConsumer read the sealed tier's segments exactly as the broker
    serves them; the stored bytes hold no record in the clear; a wrong key fails both
    with one clear error, never other rows."""
    from tierbroker.pipeline import TieredConsumer
    from tierbroker.storage.remote.segment_codec import SegmentDecodeError

    tier = sealed_tier
    expected = tier.remote_rows()
    assert_same_rows(spark, load(spark, tier, includeHeaders="true"), expected)
    store = open_store(tier.storage, tier.store_options)
    logs = [o for o in store.list_objects("") if o.key.endswith(".log")]
    some_value = next(r[3] for r in expected if r[3])
    assert logs and all(some_value not in store.get(o.key) for o in logs[:3])
    manifests = [o.key for o in store.list_objects("") if o.key.endswith(".manifest.json")]
    entries = [json.loads(store.get(key))["objects"]["log"] for key in manifests]
    assert entries and all(e["encryption"]["key_id"] == "k1" for e in entries)

    async def tiered_read(options: dict[str, str]) -> list[tuple[int, int]]:
        consumer = TieredConsumer(
            tier.topic,
            mode="REMOTE_ONLY",
            bounded=True,
            bootstrap_servers=tier.broker.bootstrap,
            group_id=f"sealed-{uuid.uuid4()}",
            auto_offset_reset="earliest",
            storage=tier.storage,
            storage_options=options,
        )
        await consumer.start()
        try:
            return sorted([(record.partition, record.offset) async for record in consumer])
        finally:
            await consumer.stop()

    assert await tiered_read(tier.store_options) == [r[:2] for r in expected]
    (tmp_path / "other.key").write_bytes(os.urandom(32))
    wrong = {**tier.store_options, "encryption.keys.k1.file": str(tmp_path / "other.key")}
    with pytest.raises(SegmentDecodeError, match="key 'k1' does not open its data key"):
        await tiered_read(wrong)
    message = error_of(
        lambda: (
            spark.read.format("tierbroker").options(**{**tier.options(), **wrong}).load().count()
        )
    )
    assert "key 'k1' does not open its data key" in message
