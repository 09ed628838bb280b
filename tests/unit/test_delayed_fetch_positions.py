"""A delayed fetch waiting at the high watermark is checked on each wake from the
positions the log keeps (Kafka's DelayedFetch and LogOffsetMetadata): no read and no
batch header until it has min_bytes, and it then answers what was appended."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from tests.unit.replicas import lead_log, replica_manager
from tierbroker.broker.replication.replica_manager import FetchParams, FetchRequestPartition
from tierbroker.protocol.errors import ErrorCode
from tierbroker.protocol.records import build_batch
from tierbroker.storage.log import Log
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.log_manager import LogManager
from tierbroker.storage.segment import BatchLocation, LogSegment
from tierbroker.storage.topic_partition import TopicPartition

TP = TopicPartition("delayed", 0)


async def test_a_woken_delayed_fetch_reads_no_header_until_it_has_min_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lg = Log(tmp_path / "delayed-0", TP, LogConfig(), uuid.uuid4())
    replicas = replica_manager(LogManager([tmp_path]))
    lead_log(replicas, lg)
    await replicas.append_records({TP: bytes(build_batch([(None, b"x" * 100, [], 0)] * 20))})
    start = lg.high_watermark
    params = FetchParams(max_wait_ms=30_000, min_bytes=3000, max_bytes=1 << 20)
    fetch = asyncio.create_task(
        replicas.fetch_messages(params, [FetchRequestPartition(TP, start, 1 << 20)])
    )
    await asyncio.sleep(0)  # the fetch reads nothing at the high watermark and waits
    assert not fetch.done()

    translated: list[int] = []
    translate = LogSegment.translate_offset

    def counting(segment: LogSegment, offset: int, start_position: int = 0) -> BatchLocation | None:
        translated.append(offset)
        return translate(segment, offset, start_position)

    monkeypatch.setattr(LogSegment, "translate_offset", counting)
    for _ in range(3):  # each append wakes the fetch; it stays short of min_bytes
        await replicas.append_records({TP: bytes(build_batch([(None, b"y" * 100, [], 0)] * 5))})
        await asyncio.sleep(0)
        assert not fetch.done()
    assert translated == []

    await replicas.append_records({TP: bytes(build_batch([(None, b"z" * 3000, [], 0)]))})
    [answer] = await asyncio.wait_for(fetch, 10)  # the test's guard, far below max_wait_ms
    assert answer.error == ErrorCode.none
    assert answer.records is not None
    assert answer.size >= params.min_bytes
    assert answer.high_watermark == lg.log_end_offset == start + 16
    lg.close()
