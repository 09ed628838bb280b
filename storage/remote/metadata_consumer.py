"""`ConsumerTask`: reads the `__remote_log_metadata` partitions this broker needs, from
their leaders, as Kafka's `ConsumerTask` does.

A broker needs the metadata partitions holding the events of the user partitions it leads
or follows (its assignment); it may host no replica of them, so each is fetched as a
consumer fetches, from its leader wherever that is (`MetadataTopic.fetch`). One task per
broker polls them all, concurrently, in rounds; a round that brings nothing is followed by
a short pause (fetches answer at once: the broker answers a connection's requests in
order, so long polls on one connection would queue).

Readiness (Kafka's `isReady`): a user partition assigned here is ready once its metadata
partition has been consumed up to the high watermark seen by a fetch that began after the
assignment, so every event written before this broker led or followed it is applied. A
leader copies, expires and restores its offsets, and a follower rebuilds from the remote
tier, only once ready: a leader that did not know a segment was uploaded would upload it
again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from tierbroker.protocol.errors import KafkaError
from tierbroker.storage.remote.metadata_manager import MetadataTopic
from tierbroker.storage.remote.segment_metadata import TopicIdPartition

log = logging.getLogger(__name__)

Records = list[tuple[int, bytes, bytes | None]]
_IDLE_S = 0.1  # pause after a round that brought nothing (Kafka's consumer polls every 100 ms)
_RETRY_S = 0.5  # pause after a failed fetch (no leader, leader unreachable)
# A fetch from a leader that died mid-request would hold every partition's round.
_FETCH_TIMEOUT_S = 3.0


class ConsumerTask:
    def __init__(
        self,
        topic: MetadataTopic,
        partition_of: Callable[[TopicIdPartition], int],
        next_offset: Callable[[int], int],
        apply: Callable[[int, Records], None],
    ) -> None:
        """`next_offset(p)`: the next offset to read in metadata partition `p`;
        `apply(p, records)`: apply fetched records (those below the next offset skipped)."""
        self.topic = topic
        self.partition_of = partition_of
        self.next_offset = next_offset
        self.apply = apply
        self.assigned: dict[TopicIdPartition, int] = {}  # user partition -> metadata partition
        self._generation = 0  # counts assignments
        self._unready: dict[int, int] = {}  # metadata partition -> generation that needs it read
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def assign(self, tips: list[TopicIdPartition]) -> None:
        """This broker leads or follows these partitions: read their metadata partitions up
        to their current end before they are ready."""
        if not tips:
            return
        self._generation += 1
        for tip in tips:
            partition = self.partition_of(tip)
            self.assigned[tip] = partition
            self._unready[partition] = self._generation
        self._wake.set()

    def unassign(self, tips: list[TopicIdPartition]) -> None:
        for tip in tips:
            self.assigned.pop(tip, None)

    def is_ready(self, tip: TopicIdPartition) -> bool:
        partition = self.assigned.get(tip)
        return partition is not None and partition not in self._unready

    def partitions(self) -> set[int]:
        return set(self.assigned.values())

    async def consume(self, partition: int) -> int:
        """Fetch the partition once from its next offset and apply what came; the number of
        records. Raises KafkaError or TimeoutError if it cannot be read now."""
        generation = self._generation
        start = self.next_offset(partition)
        async with asyncio.timeout(_FETCH_TIMEOUT_S):
            records, high_watermark = await self.topic.fetch(partition, start)
        self.apply(partition, records)
        # Caught up to an end seen after the assignment: everything written before it is applied.
        needed = self._unready.get(partition)
        caught_up = self.next_offset(partition) >= high_watermark
        if needed is not None and needed <= generation and caught_up:
            del self._unready[partition]
        return len(records)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="rlmm-consumer")

    async def _run(self) -> None:
        while True:
            partitions = sorted(self.partitions())
            if not partitions:
                self._wake.clear()
                await self._wake.wait()
                continue
            self._wake.clear()
            counts = await asyncio.gather(*(self._consume_logged(p) for p in partitions))
            if max(counts) <= 0:  # nothing came, or a fetch failed
                try:
                    async with asyncio.timeout(_IDLE_S if min(counts) == 0 else _RETRY_S):
                        await self._wake.wait()
                except TimeoutError:
                    pass

    async def _consume_logged(self, partition: int) -> int:
        """`consume`, a failure logged and counted as -1 (the round retries after a pause);
        an unexpected error is logged with its traceback and the task goes on."""
        try:
            return await self.consume(partition)
        except (KafkaError, TimeoutError) as e:
            log.debug("remote log metadata partition %d not read now: %r", partition, e)
        except Exception:
            log.exception("reading remote log metadata partition %d failed", partition)
        return -1

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])
            self._task = None
