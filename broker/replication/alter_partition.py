"""`AlterPartitionManager`: a leader's ISR changes, written to the partition state.

As Kafka's ZooKeeper-mode leaders do (`ZkAlterPartitionManager`): the new state (same
leader and leader epoch, the new ISR) is written conditionally on the partition epoch
(the state znode's version) the leader holds. Success makes it the committed ISR and
the new version the partition epoch. A version conflict means the controller (or an
earlier write of this leader that timed out) changed the state: if the state now holds
is the one wanted, it is taken; otherwise the change is dropped and the leader waits
for the state the controller wrote, which its metadata cache delivers. One change per
partition is in flight at a time (`Partition.pending_isr`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from tierbroker.broker.metadata import zk_data as zk
from tierbroker.broker.metadata.store import BadVersionError, MetadataStore, StoreError
from tierbroker.broker.metadata.zk_data import PartitionState
from tierbroker.broker.replication.partition import Partition

log = logging.getLogger(__name__)


class AlterPartitionManager:
    def __init__(
        self, store: MetadataStore, on_committed: Callable[[Partition, bool], None]
    ) -> None:
        self.store = store
        self.on_committed = on_committed  # (partition, expanded): the ISR changed
        self._tasks: set[asyncio.Task[None]] = set()

    def submit(self, partition: Partition, isr: frozenset[int]) -> None:
        """Ask for `isr` (the partition must be leader, with no change in flight)."""
        partition.pending_isr = isr
        state = PartitionState(
            partition.leader_id,
            partition.leader_epoch,
            tuple(sorted(isr)),
            partition.controller_epoch,
            partition.partition_epoch,
        )
        task = asyncio.get_running_loop().create_task(
            self._write(partition, state), name=f"alter-partition-{partition.topic_partition}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _write(self, partition: Partition, state: PartitionState) -> None:
        tp = partition.topic_partition
        path = zk.state_path(tp.topic, tp.partition)
        expanded = len(state.isr) > len(partition.isr)
        try:
            stat = await self.store.set(path, state.encode(), state.partition_epoch)
            version = stat.version
        except BadVersionError:
            try:
                data, found = await self.store.get(path)
            except StoreError as e:
                self._drop(partition, state, str(e))
                return
            current = PartitionState.decode(data, found.version)
            if (current.leader, current.leader_epoch, current.isr) != (
                state.leader,
                state.leader_epoch,
                state.isr,
            ):
                self._drop(partition, state, "the partition state changed meanwhile")
                return
            version = found.version
        except StoreError as e:
            self._drop(partition, state, str(e))
            return
        if partition.leader_epoch != state.leader_epoch:
            return  # a new leadership replaced this one meanwhile
        if partition.partition_epoch <= version:  # else the metadata cache delivered it first
            partition.isr = frozenset(state.isr)
            partition.partition_epoch = version
        partition.pending_isr = None
        log.info(
            "%s: ISR %s %s (partition epoch %d)",
            tp,
            "expanded to" if expanded else "shrunk to",
            list(state.isr),
            version,
        )
        self.on_committed(partition, expanded)

    def _drop(self, partition: Partition, state: PartitionState, reason: str) -> None:
        log.info(
            "%s: ISR change to %s not written: %s",
            partition.topic_partition,
            list(state.isr),
            reason,
        )
        if partition.leader_epoch == state.leader_epoch:
            partition.pending_isr = None

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
