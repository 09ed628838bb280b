"""`TieredPartition`: what the remote-log tasks need to know about one partition.

The log is the broker's local `Log`; `leader` is false once the broker stops
leading, and tasks then do nothing. Copies in progress are listed so expiration
never mistakes them for copies abandoned by a crash. `restore`, until the copy task
runs it once the remote metadata is ready, sets the log's remote offsets from the
remote tier; expiration waits for it. `index_written` is the `PartitionIndex` this
leadership last wrote to the remote tier (`PartitionIndexWriter`); `index_deleted`, that
expiration deleted it with the partition's remote data (tiering turned off).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from tierbroker.storage.log import Log
from tierbroker.storage.remote.partition_index import PartitionIndex
from tierbroker.storage.remote.segment_metadata import TopicIdPartition


@dataclass(slots=True)
class TieredPartition:
    tip: TopicIdPartition
    log: Log
    leader: bool = True
    copying: set[uuid.UUID] = field(default_factory=set)
    restore: Callable[[], Awaitable[None]] | None = None
    index_written: PartitionIndex | None = None
    index_deleted: bool = False

    @property
    def topic(self) -> str:
        return self.tip.topic_partition.topic
