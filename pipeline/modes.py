"""The consumption modes of `TieredConsumer`, its counters, and its rebalance listener.

The modes are those of the Pinterest broker-decoupled consumer (see `pipeline.consumer`
for what each one reads from where). The listener lets the consumer pause newly
assigned partitions before the wrapped aiokafka consumer's first fetch, so a
REMOTE_ONLY consumer never asks the broker for record bytes, then calls the
user's listener.
"""

from __future__ import annotations

import asyncio
import enum
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from aiokafka import ConsumerRebalanceListener
from aiokafka.structs import TopicPartition

Hook = Callable[[set[TopicPartition]], None]


class ConsumptionMode(enum.Enum):
    KAFKA_ONLY = "KAFKA_ONLY"
    KAFKA_PREFERRED = "KAFKA_PREFERRED"
    REMOTE_PREFERRED = "REMOTE_PREFERRED"
    REMOTE_ONLY = "REMOTE_ONLY"

    @classmethod
    def of(cls, mode: ConsumptionMode | str) -> ConsumptionMode:
        """A member, or the member named (case-insensitive: "remote_only" works)."""
        if isinstance(mode, ConsumptionMode):
            return mode
        try:
            return cls[mode.strip().upper()]
        except KeyError:
            names = list(cls.__members__)
            raise ValueError(f"unknown consumption mode {mode!r}: one of {names}") from None


@dataclass
class TieredConsumerStats:
    """Records returned per partition and source, and bytes read from the object store."""

    broker_records: Counter[TopicPartition] = field(default_factory=Counter)
    remote_records: Counter[TopicPartition] = field(default_factory=Counter)
    remote_bytes: Counter[TopicPartition] = field(default_factory=Counter)


class TieredRebalanceListener(ConsumerRebalanceListener):  # type: ignore[misc]
    """Pauses newly assigned partitions before the wrapped consumer fetches, then the user's."""

    def __init__(
        self, on_assigned: Hook, on_revoked: Hook, user: ConsumerRebalanceListener | None
    ) -> None:
        self.on_assigned = on_assigned
        self.on_revoked = on_revoked
        self.user = user

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        self.on_revoked(set(revoked))
        if self.user is not None:
            result = self.user.on_partitions_revoked(revoked)
            if asyncio.iscoroutine(result):
                await result

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        self.on_assigned(set(assigned))
        if self.user is not None:
            result = self.user.on_partitions_assigned(assigned)
            if asyncio.iscoroutine(result):
                await result
