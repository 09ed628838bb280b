"""`TieredConsumer` against a real tiered broker: every mode reads every record identically.

The data set is `tiered_topic` (200k records, five codecs, keys, headers, null keys
and values, copied to LocalFs and mostly deleted locally). The broker path
(KAFKA_ONLY) must equal the reference read through the broker; the other modes must
return equal `ConsumerRecord`s in the same order. While REMOTE_ONLY reads, the
broker's `BytesOutPerSec` and `RemoteFetchBytesPerSec` for the topic stay put: no
record byte came from the broker.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from aiokafka.structs import ConsumerRecord, TopicPartition
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import AdminClient

from tests.integration.pipeline_topic import (
    CODECS,
    TieredTopic,
    broker_counter,
    small_tiered_topic,
)
from tierbroker.pipeline import ConsumptionMode, TieredConsumer
from tierbroker.pipeline.discovery import SegmentDiscovery
from tierbroker.pipeline.storage import open_store

Record = ConsumerRecord[Any, Any]


def wait_for(condition: Any, what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


async def read_until(
    consumer: TieredConsumer, ends: dict[TopicPartition, int], timeout_s: float = 180
) -> dict[TopicPartition, list[Record]]:
    """Every record up to `ends` (exclusive), by partition, in the order returned."""
    got: dict[TopicPartition, list[Record]] = {tp: [] for tp in ends}
    deadline = time.monotonic() + timeout_s

    async def done() -> bool:
        if consumer.assignment() != set(ends):
            return False  # the group has not assigned them yet
        return all([await consumer.position(tp) >= end for tp, end in ends.items()])

    while not await done():
        assert time.monotonic() < deadline, (consumer.mode, consumer.stats, consumer.assignment())
        for tp, records in (await consumer.getmany(timeout_ms=500, max_records=3000)).items():
            got[tp].extend(records)
    return got


def as_row(r: Record) -> tuple[Any, ...]:
    return (r.partition, r.offset, r.key, r.value, tuple(r.headers), r.timestamp, r.timestamp_type)


async def test_every_mode_reads_every_record(tiered_topic: TieredTopic) -> None:
    t = tiered_topic
    tps = [TopicPartition(t.topic, p) for p in sorted(t.ends)]
    ends = {tp: t.ends[tp.partition] for tp in tps}
    remote_ends = {tp: t.remote_ends[tp.partition] for tp in tps}
    common: dict[str, Any] = {"bootstrap_servers": t.broker.bootstrap, "storage": t.storage}
    timings = {}

    # REMOTE_ONLY, in a group: no record byte of the topic may leave the broker meanwhile.
    out_before = broker_counter(t.broker, "BytesOutPerSec", t.topic)
    remote_before = broker_counter(t.broker, "RemoteFetchBytesPerSec", t.topic)
    started = time.monotonic()
    consumer = TieredConsumer(
        t.topic,
        mode="REMOTE_ONLY",
        group_id="remote-only",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        **common,
    )
    await consumer.start()
    try:
        remote_only = await read_until(consumer, remote_ends)
        assert await consumer.getmany(timeout_ms=1000) == {}  # stops at the end of the tier
        await consumer.commit()
        assert {tp: await consumer.committed(tp) for tp in tps} == remote_ends
        assert consumer.stats.broker_records == {}
        assert all(consumer.stats.remote_records[tp] == remote_ends[tp] for tp in tps)
    finally:
        await consumer.stop()
    timings["REMOTE_ONLY"] = time.monotonic() - started
    assert broker_counter(t.broker, "BytesOutPerSec", t.topic) == out_before
    assert broker_counter(t.broker, "RemoteFetchBytesPerSec", t.topic) == remote_before

    reference: dict[TopicPartition, list[Record]] = {}
    for mode in ConsumptionMode:
        if mode is ConsumptionMode.REMOTE_ONLY:
            continue  # read above, through the group
        started = time.monotonic()
        consumer = TieredConsumer(mode=mode, auto_offset_reset="earliest", **common)
        await consumer.start()
        try:
            consumer.assign(tps)
            got = await read_until(consumer, ends)
        finally:
            await consumer.stop()
        timings[mode.name] = time.monotonic() - started
        if mode is ConsumptionMode.KAFKA_ONLY:
            reference = got
            assert [as_row(r) for tp in tps for r in got[tp]] == t.rows
        assert got == reference, mode
        stats = consumer.stats
        if mode is ConsumptionMode.REMOTE_PREFERRED:
            assert all(stats.remote_records[tp] == remote_ends[tp] for tp in tps)
            assert all(stats.broker_records[tp] == ends[tp] - remote_ends[tp] for tp in tps)
        if mode is ConsumptionMode.KAFKA_PREFERRED:
            assert stats.remote_records == {}
            assert sum(stats.broker_records.values()) == len(t.rows)

    for tp in tps:
        assert remote_only[tp] == reference[tp][: remote_ends[tp]]
    assert {dict(r.headers)["codec"] for r in reference[tps[0]]} == {c.encode() for c in CODECS}

    # Deserializers apply to object-store records as to the broker's.
    consumer = TieredConsumer(
        mode=ConsumptionMode.REMOTE_ONLY,
        key_deserializer=lambda k: k.decode() if k is not None else None,
        value_deserializer=lambda v: len(v) if v is not None else None,
        **common,
    )
    await consumer.start()
    try:
        consumer.assign(tps[:1])
        consumer.seek(tps[0], 100)
        got = await read_until(consumer, {tps[0]: 400})
    finally:
        await consumer.stop()
    assert [(r.offset, r.key, r.value) for r in got[tps[0]][:300]] == [
        (
            r.offset,
            None if r.key is None else r.key.decode(),
            None if r.value is None else len(r.value),
        )
        for r in reference[tps[0]][100:400]
    ]
    print("\nreads of 200k records:", {k: f"{v:.1f}s" for k, v in timings.items()})


async def test_log_start_moving_into_the_remote_tier(
    tiered_topic: TieredTopic, caplog: pytest.LogCaptureFixture
) -> None:
    """KAFKA_PREFERRED below the broker's log start reads the object store, then the broker;
    REMOTE_ONLY at an offset deleted by retention skips forward with a warning."""
    broker, topic = tiered_topic.broker, "pipeline-moving"
    end = small_tiered_topic(broker, topic)["log_end_offset"]
    storage = tiered_topic.storage
    common: dict[str, Any] = {"bootstrap_servers": broker.bootstrap, "storage": storage}
    tp = TopicPartition(topic, 0)

    consumer = TieredConsumer(mode="KAFKA_ONLY", auto_offset_reset="earliest", **common)
    await consumer.start()
    try:
        consumer.assign([tp])
        reference = (await read_until(consumer, {tp: end}))[tp]
    finally:
        await consumer.stop()

    # DeleteRecords into the middle of the second remote segment.
    discovery = SegmentDiscovery(open_store(storage))
    segment = discovery.ranges(topic, 0)[1].segment
    cut = (segment.start_offset + segment.end_offset) // 2
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.delete_records([CTopicPartition(topic, 0, cut)]).values():
        future.result(15)
    wait_for(
        lambda: discovery.ranges(topic, 0)[0].first_offset == segment.start_offset,
        "remote segments below the new log start to be deleted",
    )
    consumer = TieredConsumer(mode="KAFKA_PREFERRED", auto_offset_reset="none", **common)
    await consumer.start()
    try:
        consumer.assign([tp])
        consumer.seek(tp, segment.start_offset)
        got = await read_until(consumer, {tp: end})
    finally:
        await consumer.stop()
    assert got[tp] == reference[segment.start_offset :]
    assert consumer.stats.remote_records[tp] == cut - segment.start_offset
    assert consumer.stats.broker_records[tp] == end - cut

    consumer = TieredConsumer(mode="REMOTE_ONLY", **common)
    await consumer.start()
    try:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        with caplog.at_level(logging.WARNING, logger="tierbroker.pipeline.remote_fetcher"):
            first = await consumer.getone()
    finally:
        await consumer.stop()
    assert first == reference[segment.start_offset]
    assert f"skipping forward to {segment.start_offset}" in caplog.text


async def test_a_bounded_read_stops_at_its_end(tiered_topic: TieredTopic) -> None:
    """REMOTE_PREFERRED, bounded: every remote record, none of the broker's tail, then the end.
    KAFKA_PREFERRED with end_offsets past the remote end: broker records up to it, not one more.
    """
    t = tiered_topic
    tps = [TopicPartition(t.topic, p) for p in sorted(t.ends)]
    remote_ends = {tp: t.remote_ends[tp.partition] for tp in tps}
    assert all(remote_ends[tp] < t.ends[tp.partition] for tp in tps)  # an untiered tail exists
    common: dict[str, Any] = {"bootstrap_servers": t.broker.bootstrap, "storage": t.storage}
    rows = {tp: [r for r in t.rows if r[0] == tp.partition] for tp in tps}

    consumer = TieredConsumer(
        mode="REMOTE_PREFERRED", bounded=True, auto_offset_reset="earliest", **common
    )
    await consumer.start()
    try:
        consumer.assign(tps)
        got: dict[TopicPartition, list[Record]] = {tp: [] for tp in tps}
        while not await consumer.at_end():
            for tp, records in (await consumer.getmany(timeout_ms=500, max_records=5000)).items():
                got[tp].extend(records)
        assert await consumer.getmany(timeout_ms=5000) == {}
        with pytest.raises(EOFError):
            await consumer.getone()
        for tp in tps:
            assert await consumer.end_offset(tp) == remote_ends[tp]
            assert [as_row(r) for r in got[tp]] == rows[tp][: remote_ends[tp]]
        assert consumer.stats.broker_records == {}
    finally:
        await consumer.stop()

    tp = tps[0]
    end = remote_ends[tp] + 50  # in the broker's part of the log
    consumer = TieredConsumer(
        mode="KAFKA_PREFERRED", end_offsets={tp: end}, auto_offset_reset="earliest", **common
    )
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        offsets = []
        while not await consumer.at_end():  # whole fetches: the broker sends past the end
            for records in (await consumer.getmany(timeout_ms=500)).values():
                offsets += [r.offset for r in records]
        assert offsets == [r[1] for r in rows[tp][:end]]
        assert await consumer.position(tp) == end
        assert [record async for record in consumer] == []
    finally:
        await consumer.stop()

    with pytest.raises(ValueError, match="KAFKA_ONLY"):
        TieredConsumer(mode="KAFKA_ONLY", bounded=True, **common)
