"""`ControllerContext`: what the controller's parts read and write through.

The partition state machine and the reassigner run inside the controller's event task
and act on its state; they see the controller through this interface, so neither
imports it. `Controller` is the one implementation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from tierbroker.broker.metadata.store import MetadataStore, Op, Stat
from tierbroker.broker.metadata.zk_data import TopicAssignment
from tierbroker.storage.topic_partition import TopicPartition


class ControllerContext(Protocol):
    @property
    def store(self) -> MetadataStore: ...

    @property
    def epoch(self) -> int:
        """The controller epoch, stamped on every partition state it writes."""
        ...

    @property
    def live_brokers(self) -> dict[int, int]:
        """Registered brokers: id to broker epoch."""
        ...

    @property
    def assignments(self) -> dict[str, TopicAssignment]: ...

    @property
    def unclean_election_enabled(self) -> Callable[[str], bool]: ...

    def is_eligible(self, broker: int) -> bool:
        """Whether `broker` may lead or join an ISR: live and not shutting down."""
        ...

    def replicas(self, tp: TopicPartition) -> tuple[int, ...]: ...

    def maybe_complete_reassignment(self, tp: TopicPartition) -> None: ...

    async def write(self, ops: Sequence[Op]) -> list[str | Stat | None]:
        """Apply `ops` fenced by the controller epoch."""
        ...
