"""`TierRouter`: where a `TieredConsumer` partition starts, and which tier serves its position.

Positions: the wrapped aiokafka consumer runs with `auto_offset_reset="none"`, so a
partition without a committed offset, or whose offset the broker refuses
(OffsetOutOfRange), comes here. The policy applies over both tiers: `earliest` is
the lowest offset the broker or the object store holds (REMOTE_ONLY: the remote
tier's first offset), `latest` the broker's end (REMOTE_ONLY: the remote tier's
end). An offset the broker refuses but the object store holds below the broker's
log start is read from the object store (the KAFKA_PREFERRED fallback).

Routes, per mode: REMOTE_ONLY always the object store; REMOTE_PREFERRED the object
store where it holds the offset; KAFKA_PREFERRED the object store only below the
broker's log start (known once the broker refused an offset or a reset asked it),
and only up to it (`until`); KAFKA_ONLY never gets here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import NoOffsetForPartitionError, OffsetOutOfRangeError
from aiokafka.structs import TopicPartition

from tierbroker.pipeline.modes import ConsumptionMode
from tierbroker.pipeline.remote_fetcher import RemoteFetcher

log = logging.getLogger(__name__)


class TierRouter:
    def __init__(
        self,
        kafka: AIOKafkaConsumer,
        fetcher: RemoteFetcher,
        mode: ConsumptionMode,
        reset: str,
        group_id: str | None,
        seek: Callable[[TopicPartition, int], None],
    ) -> None:
        self.kafka = kafka
        self.fetcher = fetcher
        self.mode = mode
        self.reset_policy = reset
        self.group_id = group_id
        self.seek = seek
        self.positioned: set[TopicPartition] = set()
        self.broker_start: dict[TopicPartition, int] = {}

    def forget(self, tp: TopicPartition) -> None:
        self.positioned.discard(tp)
        self.broker_start.pop(tp, None)

    async def ensure_position(self, tp: TopicPartition) -> None:
        """A position for `tp`: its committed offset if any (aiokafka applies it), else reset."""
        if tp in self.positioned:
            return
        committed = await self.kafka.committed(tp) if self.group_id is not None else None
        if committed is None:
            await self.reset(tp, self.reset_policy)
        self.positioned.add(tp)

    async def reset(self, tp: TopicPartition, policy: str) -> None:
        """Seek to the `earliest` or `latest` offset over both tiers (`none` raises)."""
        if policy == "none":
            raise NoOffsetForPartitionError(tp)
        bounds = await self.fetcher.bounds(tp)
        if self.mode is ConsumptionMode.REMOTE_ONLY:
            offset = 0 if bounds is None else bounds[0 if policy == "earliest" else 1]
        elif policy == "earliest":
            start = int((await self.kafka.beginning_offsets([tp]))[tp])
            self.broker_start[tp] = start
            offset = start if bounds is None else min(start, bounds[0])
        else:
            offset = int((await self.kafka.end_offsets([tp]))[tp])
        log.info("%s: %s position %d (%s)", tp, policy, offset, self.mode.name)
        self.seek(tp, offset)

    async def out_of_range(self, tp: TopicPartition, offset: int) -> None:
        """The broker refused `offset`: read it from the object store if there, else reset."""
        start = self.broker_start[tp] = int((await self.kafka.beginning_offsets([tp]))[tp])
        await self.fetcher.ranges(tp, refresh=True)
        if offset < start and await self.fetcher.covers(tp, offset):
            log.info(
                "%s: offset %d is below the broker's log start %d: reading the object store",
                tp,
                offset,
                start,
            )
            return
        if self.reset_policy == "none":
            raise OffsetOutOfRangeError({tp: offset})
        await self.reset(tp, self.reset_policy)

    async def is_remote(self, tp: TopicPartition, offset: int) -> bool:
        """Whether the object store serves `offset` of `tp` in this mode."""
        if self.mode is ConsumptionMode.REMOTE_ONLY:
            return True
        if self.mode is ConsumptionMode.REMOTE_PREFERRED:
            return await self.fetcher.covers(tp, offset)
        start = self.broker_start.get(tp)
        return start is not None and offset < start and await self.fetcher.covers(tp, offset)

    def until(self, tp: TopicPartition) -> int | None:
        """Where object-store reads of `tp` must stop (KAFKA_PREFERRED: the broker's start)."""
        if self.mode is ConsumptionMode.KAFKA_PREFERRED:
            return self.broker_start.get(tp)
        return None
