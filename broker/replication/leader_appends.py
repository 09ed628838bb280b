"""`LeaderAppends`: a leader's appends of produced batches, re-encoding off the event loop.

A topic whose `compression.type` names a codec stores a batch produced with another
codec re-encoded (`log_validator`): gzip takes about 14 ms per MB, and one Produce
request may carry a full batch for each of many partitions. Such an append of
`RECOMPRESS_IN_WORKER_BYTES` or more is validated and re-encoded in the default
executor, then written on the loop. Every other append is written at once, with no
await, as before.

Invariant: a partition's appends are written in the order they arrived, so an
idempotent producer's sequence numbers still follow each other: while one of them
waits on a worker, later appends to that partition wait behind it. Used from the
event loop only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tierbroker.broker.replication.partition import Partition
from tierbroker.storage.log import CLIENT_APPEND, AppendOptions, LogAppendInfo, now_ms
from tierbroker.storage.log_validator import recompresses, validate_batches
from tierbroker.storage.topic_partition import TopicPartition

RECOMPRESS_IN_WORKER_BYTES = 256 << 10


class LeaderAppends:
    def __init__(self, partition_of: Callable[[TopicPartition], Partition]) -> None:
        """`partition_of`: the partition led here now (raises as `partition_or_error`)."""
        self.partition_of = partition_of
        self._last: dict[TopicPartition, asyncio.Future[None]] = {}  # the latest in a worker

    async def append(
        self,
        tp: TopicPartition,
        records: bytearray,
        required_acks: int,
        options: AppendOptions = CLIENT_APPEND,
    ) -> LogAppendInfo:
        partition = self.partition_of(tp)
        before = self._last.get(tp)
        offload = len(records) >= RECOMPRESS_IN_WORKER_BYTES and recompresses(
            records, partition.log.config
        )
        if before is None and not offload:
            return partition.append_records_to_leader(records, required_acks, None, options)
        done = asyncio.get_running_loop().create_future()
        self._last[tp] = done
        try:
            if before is not None:
                await asyncio.wait([before])
            validated = None
            if offload:
                config = partition.log.config
                validated = await asyncio.get_running_loop().run_in_executor(
                    None, validate_batches, records, config, now_ms(), tp
                )
            # Leadership may have moved meanwhile: the partition as it is now decides.
            partition = self.partition_of(tp)
            return partition.append_records_to_leader(records, required_acks, validated, options)
        finally:
            done.set_result(None)
            if self._last.get(tp) is done:
                del self._last[tp]
