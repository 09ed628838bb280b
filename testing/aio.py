"""`AsyncTierbrokerCluster`: `TierbrokerCluster`'s helpers as coroutines.

Each runs the blocking helper in a worker thread (`asyncio.to_thread`), so a test's event
loop, and an application under test on it, keeps running while the helper waits: an
`async with cluster.aio.assert_produces(...)` block can await the application that
produces. Get one from `TierbrokerCluster.aio`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Protocol

from tierbroker.testing.clients import ProducedRecord, Record
from tierbroker.testing.views import ConfigValue, PartitionTier, Produced


class BlockingHelpers(Protocol):
    """The helpers of `TierbrokerCluster` this class runs in threads."""

    def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int | None,
        config: Mapping[str, ConfigValue] | None,
        timeout_s: float,
    ) -> None: ...
    def produce(
        self,
        topic: str,
        records: Iterable[ProducedRecord],
        partition: int | None,
        headers: dict[str, bytes] | None,
        timeout_s: float,
    ) -> list[tuple[int, int]]: ...
    def records(
        self,
        topic: str,
        partition: int,
        from_offset: int,
        client_rack: str | None,
        timeout_s: float,
    ) -> list[Record]: ...
    def end_offsets(self, topic: str) -> dict[int, int]: ...
    def wait_produced(
        self, topic: str, count: int, before: dict[int, int], timeout_s: float
    ) -> list[Record]: ...
    def committed(self, group: str, timeout_s: float) -> dict[tuple[str, int], int]: ...
    def wait_tiered(self, topic: str, timeout_s: float) -> dict[int, PartitionTier]: ...
    def stop_broker(self, broker_id: int) -> None: ...
    def kill_broker(self, broker_id: int) -> None: ...
    def start_broker(self, broker_id: int) -> None: ...


class AsyncTierbrokerCluster:
    def __init__(self, cluster: BlockingHelpers) -> None:
        self.cluster = cluster

    async def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int | None = None,
        config: Mapping[str, ConfigValue] | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        await asyncio.to_thread(
            self.cluster.create_topic, name, partitions, replication_factor, config, timeout_s
        )

    async def produce(
        self,
        topic: str,
        records: Iterable[ProducedRecord],
        partition: int | None = None,
        headers: dict[str, bytes] | None = None,
        timeout_s: float = 30.0,
    ) -> list[tuple[int, int]]:
        return await asyncio.to_thread(
            self.cluster.produce, topic, list(records), partition, headers, timeout_s
        )

    async def records(
        self,
        topic: str,
        partition: int = 0,
        from_offset: int = 0,
        client_rack: str | None = None,
        timeout_s: float = 30.0,
    ) -> list[Record]:
        return await asyncio.to_thread(
            self.cluster.records, topic, partition, from_offset, client_rack, timeout_s
        )

    @asynccontextmanager
    async def assert_produces(
        self, topic: str, count: int, timeout_s: float = 10.0
    ) -> AsyncIterator[Produced]:
        before = await asyncio.to_thread(self.cluster.end_offsets, topic)
        produced = Produced()
        yield produced
        produced.records = await asyncio.to_thread(
            self.cluster.wait_produced, topic, count, before, timeout_s
        )

    async def committed(self, group: str, timeout_s: float = 30.0) -> dict[tuple[str, int], int]:
        return await asyncio.to_thread(self.cluster.committed, group, timeout_s)

    async def wait_tiered(self, topic: str, timeout_s: float = 30.0) -> dict[int, PartitionTier]:
        return await asyncio.to_thread(self.cluster.wait_tiered, topic, timeout_s)

    async def stop_broker(self, broker_id: int) -> None:
        await asyncio.to_thread(self.cluster.stop_broker, broker_id)

    async def kill_broker(self, broker_id: int) -> None:
        await asyncio.to_thread(self.cluster.kill_broker, broker_id)

    async def start_broker(self, broker_id: int) -> None:
        await asyncio.to_thread(self.cluster.start_broker, broker_id)
