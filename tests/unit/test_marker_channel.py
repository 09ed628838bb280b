"""The transaction marker channel's supervision: an unexpected error writing markers
through a leader is logged and retried, not the end of the transaction's markers (a
transaction left prepared holds its producer at CONCURRENT_TRANSACTIONS)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tierbroker.broker.coordinator.transaction.marker_channel import (
    TransactionMarkerChannelManager,
    TxnMarkers,
)
from tierbroker.broker.network.inter_broker import InterBrokerChannel
from tierbroker.protocol.errors import ErrorCode
from tierbroker.storage.topic_partition import TopicPartition

TP = TopicPartition("out", 0)


class FlakyReplicas:
    """This broker leads `TP`; its first marker write raises."""

    broker_id = 0

    def __init__(self) -> None:
        self.calls = 0

    async def write_txn_marker(self, *_args: Any) -> dict[TopicPartition, ErrorCode]:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("a bug")
        return {TP: ErrorCode.none}


class Cache:
    def __init__(self) -> None:
        self.topics = {"out": object()}
        self.brokers: dict[int, object] = {}

    def leader(self, _tp: TopicPartition) -> int:
        return 0


async def test_an_unexpected_error_is_logged_and_the_markers_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    replicas = FlakyReplicas()
    channel = TransactionMarkerChannelManager(
        replicas,  # type: ignore[arg-type]
        Cache(),  # type: ignore[arg-type]
        1000,
        InterBrokerChannel(),
        retry_backoff_ms=1,
    )
    written = asyncio.Event()

    async def on_written() -> None:
        written.set()

    channel.send(TxnMarkers("t", 7, 0, True, 1, frozenset({TP}), 0), lambda: True, on_written)
    await asyncio.wait_for(written.wait(), 5)
    assert replicas.calls == 2
    assert "writing markers through broker 0 failed; retrying" in caplog.text
    await channel.close()
