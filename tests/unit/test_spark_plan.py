"""The `tierbroker` Spark source's options, planning and reading, without a Spark session.

The remote tier is written with the real LocalFs plugin (`copy_segment`): one
partition of ten segments of 100 offsets, in batches of 10 records.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from tests.unit.test_pipeline_discovery import TOPIC, copy_segment, record_ts, rsm_for
from tierbroker.pipeline.spark.options import KNOWN, ReadOptions
from tierbroker.pipeline.spark.plan import BrokerRange, RemoteSlice, Task, plan
from tierbroker.pipeline.spark.read import read_task
from tierbroker.pipeline.spark.source import KAFKA_SCHEMA, KAFKA_SCHEMA_WITHOUT_HEADERS
from tierbroker.pipeline.spark.stream import rate_limit

SEGMENTS, PER_SEGMENT = 10, 100


@pytest.fixture
async def remote(tmp_path: Path) -> Path:
    remote, work = tmp_path / "remote", tmp_path / "work"
    work.mkdir()
    rsm = rsm_for(remote)
    for i in range(SEGMENTS):
        await copy_segment(rsm, work, 0, i * PER_SEGMENT, (i + 1) * PER_SEGMENT - 1)
    return remote


def options(remote: Path, **extra: str) -> ReadOptions:
    return ReadOptions.parse({"storage": remote.as_uri(), "subscribe": TOPIC, **extra})


def offsets_of(task: Task) -> list[int]:
    out: list[int] = []
    for piece in task.pieces:
        if isinstance(piece, RemoteSlice):
            out += range(piece.first_offset, piece.last_offset + 1)
        else:
            out += range(piece.first_offset, piece.end_offset)
    return out


def read(tasks: list[Task], headers: bool = False) -> list[pa.RecordBatch]:
    schema = to_arrow_schema(
        KAFKA_SCHEMA if headers else KAFKA_SCHEMA_WITHOUT_HEADERS, timezone="UTC"
    )
    return [batch for task in tasks for batch in read_task(task, schema)]


def read_offsets(tasks: list[Task]) -> list[int]:
    return [o for batch in read(tasks) for o in batch.column("offset").to_pylist()]


async def test_consecutive_segments_are_packed_into_input_partitions(remote: Path) -> None:
    [task] = plan(options(remote))  # 10 small segments: one input partition
    assert len(task.pieces) == SEGMENTS and offsets_of(task) == list(range(1000))
    segment_bytes = task.pieces[1].estimated_bytes  # type: ignore[union-attr]

    tasks = plan(options(remote, maxBytesPerPartition=str(int(segment_bytes * 3.5))))
    assert [len(t.pieces) for t in tasks] == [3, 3, 3, 1]
    assert [o for t in tasks for o in offsets_of(t)] == list(range(1000))
    assert read_offsets(tasks) == list(range(1000))


async def test_max_records_and_min_partitions_split_as_sparks_kafka_source(remote: Path) -> None:
    tasks = plan(options(remote, maxRecordsPerPartition="150"))
    assert [t.offsets for t in tasks] == [142, 143, 143, 143, 143, 143, 143]  # ceil(1000/150)
    assert [o for t in tasks for o in offsets_of(t)] == list(range(1000))
    assert read_offsets(tasks) == list(range(1000))  # cut inside batches: index, then filter

    tasks = plan(options(remote, minPartitions="4"))
    assert [t.offsets for t in tasks] == [250, 250, 250, 250]
    assert read_offsets(tasks) == list(range(1000))

    bounded = options(remote, startingOffsets='{"events":{"0":95}}', minPartitions="2")
    tasks = plan(bounded)
    assert [offsets_of(t)[0] for t in tasks] == [95, 547] and read_offsets(tasks)[0] == 95


async def test_headers_only_when_asked(remote: Path) -> None:
    [batch, *_] = read(plan(options(remote)))
    assert batch.schema.names == KAFKA_SCHEMA_WITHOUT_HEADERS.fieldNames()
    [batch, *_] = read(plan(options(remote, includeHeaders="true")), headers=True)
    assert batch.column("headers")[3].as_py() == [{"key": "h", "value": b"3"}]


@pytest.mark.parametrize("fail", [True, False])
async def test_a_segment_deleted_after_planning(remote: Path, fail: bool) -> None:
    tasks = plan(options(remote, failOnDataLoss=str(fail).lower()))
    gone = tasks[0].pieces[3]
    assert isinstance(gone, RemoteSlice)
    os.remove(remote / gone.segment.log_key)
    if fail:
        with pytest.raises(RuntimeError, match=r"is gone .* set failOnDataLoss=false"):
            read_offsets(tasks)
    else:
        assert read_offsets(tasks) == [o for o in range(1000) if not 300 <= o < 400]


async def test_without_brokers_nothing_plans_a_broker_range(remote: Path) -> None:
    tasks = plan(options(remote, endingOffsets='{"events":{"0":5000}}'))
    assert not any(isinstance(p, BrokerRange) for t in tasks for p in t.pieces)
    assert offsets_of(tasks[-1])[-1] == 999  # latest: the end of the remote tier


def test_unknown_options_are_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown option.*startingOffset\b") as error:
        ReadOptions.parse({"storage": "file:///", "subscribe": "t", "startingOffset": "earliest"})
    assert all(name in str(error.value) for name in KNOWN)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({}, "One of the options subscribe"),
        ({"subscribe": "t", "assign": '{"t":[0]}'}, "Only one of the options"),
        ({"subscribe": "t", "topic": "t"}, "synonyms"),
        ({"subscribePattern": "("}, "subscribePattern"),
        ({"assign": "[0]"}, "assign"),
        ({"subscribe": "t", "minPartitions": "0"}, "minPartitions must be positive"),
        ({"subscribe": "t", "startingOffsets": "latest"}, "can't be latest for batch"),
        ({"subscribe": "t", "endingOffsets": '{"t":{"0":-2}}'}, "can't be earliest"),
        ({"subscribe": "t", "includeHeaders": "yes"}, "true or false"),
        ({"subscribe": "t", "kafka.client.rack": "a"}, "need kafka.bootstrap.servers"),
        (
            {"subscribe": "t", "kafka.bootstrap.servers": "b:9092", "kafka.auto.offset.reset": "x"},
            "'auto.offset.reset' is not supported",
        ),
        (
            {"subscribe": "t", "kafka.isolation.level": "serializable"},
            "read_uncommitted \\(the default\\) or read_committed",
        ),
        (
            {"subscribe": "t", "startingOffsetsByTimestampStrategy": "earliest"},
            "error or latest",
        ),
    ],
)
def test_options_are_checked_as_spark_checks_them(extra: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ReadOptions.parse({"storage": "file:///", **extra})


def test_read_committed_needs_no_broker() -> None:
    """The isolation level says what is read, from the object store too."""
    base = {"storage": "file:///", "subscribe": "t"}
    assert ReadOptions.parse({**base, "kafka.isolation.level": "READ_COMMITTED"}).read_committed
    assert not ReadOptions.parse(base).read_committed
    assert not ReadOptions.parse(base).through_broker


def test_streams_refuse_ending_offsets_and_start_at_latest() -> None:
    base = {"storage": "file:///", "subscribe": "t"}
    assert ReadOptions.parse(base, streaming=True).starting.offsets == "latest"
    with pytest.raises(ValueError, match="not valid in streaming"):
        ReadOptions.parse({**base, "endingOffsets": "latest"}, streaming=True)


def test_max_offsets_per_trigger_is_shared_as_spark_shares_it() -> None:
    start = {("t", 0): 0, ("t", 1): 100, ("t", 2): 5}
    until = {("t", 0): 1000, ("t", 1): 400, ("t", 2): 6}
    limited = rate_limit(130, start, until)
    # backlogs 1000, 300, 1 of 1301: 99.9 -> 99, 29.9 -> 29, 0.0999 -> 1 (never starved)
    assert limited == {("t", 0): 99, ("t", 1): 129, ("t", 2): 6}
    assert rate_limit(10_000, start, until) == until


async def test_pushed_filters_narrow_the_plan_and_leave_the_rest_to_spark(remote: Path) -> None:
    from pyspark.sql.datasource import EqualTo, GreaterThan, GreaterThanOrEqual, In, LessThan, Not

    from tierbroker.pipeline.spark.source import FilteringReader

    reader = FilteringReader(
        options(remote, maxBytesPerPartition="1"), KAFKA_SCHEMA_WITHOUT_HEADERS
    )
    when = datetime.fromtimestamp(record_ts(450) / 1000, UTC)
    filters = [
        EqualTo(("partition",), 0),
        GreaterThanOrEqual(("offset",), 250),
        LessThan(("offset",), 720),
        In(("offset",), [300, 301, 650]),
        GreaterThan(("timestamp",), when),
        Not(EqualTo(("offset",), 300)),
        EqualTo(("key",), b"k3"),
    ]
    left = list(reader.pushFilters(filters))
    assert left == filters[3:]  # offset IN: its span only; timestamps: segments only
    planned = [o for p in reader.partitions() for o in offsets_of(p.value)]
    assert planned == list(range(400, 651))  # segments below 400 end before the timestamp
    other = FilteringReader(options(remote), KAFKA_SCHEMA_WITHOUT_HEADERS)
    assert list(other.pushFilters([In(("partition",), [3])])) == []
    assert other.partitions() == []


async def test_a_stream_follows_the_remote_tier_at_its_read_limit(
    remote: Path, tmp_path: Path
) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    from tierbroker.pipeline.spark.stream import TierbrokerStreamReader

    def stream(**extra: str) -> TierbrokerStreamReader:
        raw = {"storage": remote.as_uri(), "subscribe": TOPIC, **extra}
        parsed = ReadOptions.parse(raw, streaming=True)
        return TierbrokerStreamReader(parsed, KAFKA_SCHEMA_WITHOUT_HEADERS)

    def offsets(reader: TierbrokerStreamReader, start: Any, end: Any) -> list[int]:
        parts = reader.partitions(start, end)
        return [o for p in parts for o in read_offsets([p.value])]

    assert stream().initialOffset() == {TOPIC: {"0": 1000}}  # latest, as Spark's streams
    reader = stream(startingOffsets="earliest", maxOffsetsPerTrigger="250")
    start = reader.initialOffset()
    assert start == {TOPIC: {"0": 0}}
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert end == {TOPIC: {"0": 250}} and reader.getDefaultReadLimit() == ReadMaxRows(250)
    assert offsets(reader, start, end) == list(range(250))
    assert reader.latestOffset(end, ReadAllAvailable()) == {TOPIC: {"0": 1000}}

    work = tmp_path / "more"
    work.mkdir()
    await copy_segment(rsm_for(remote), work, 0, 1000, 1099)  # uploaded meanwhile
    assert reader.latestOffset(end, ReadAllAvailable()) == {TOPIC: {"0": 1100}}

    delete_first_segment(remote)  # retention, before a restarted query replays [0, 250)
    replay = stream(startingOffsets="earliest")
    with pytest.raises(RuntimeError, match=r"offsets 0\.\.99 are gone"):
        replay.partitions(start, end)
    lenient = stream(startingOffsets="earliest", failOnDataLoss="false")
    lenient.latestOffset(start, ReadAllAvailable())
    assert offsets(lenient, start, end) == list(range(100, 250))
    for each in (reader, replay, lenient):
        each.stop()


def delete_first_segment(remote: Path) -> None:
    for path in remote.rglob("00000000000000000000-*"):
        path.unlink()
