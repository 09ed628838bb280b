"""`RemoteLogMetadataManager`: the contract of the plugin that records what is in the
remote tier (KIP-405), and `MetadataTopic`, what a topic-based one needs from the broker.

Writes go through the segment state machine (`RemoteLogSegmentState`); reads are
answered from memory. Only COPY_SEGMENT_FINISHED segments are returned for reads
and counted by `remote_log_size`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Protocol

from tierbroker.storage.remote.lineage import Lineage
from tierbroker.storage.remote.segment_metadata import (
    RemoteLogSegmentMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)
from tierbroker.storage.remote.storage_manager import RemoteStorageError


class MetadataTopic(Protocol):
    """An internal topic a metadata manager appends to and replays (given by the broker)."""

    @property
    def num_partitions(self) -> int: ...

    async def ensure_created(self) -> None:
        """Create the topic if it does not exist yet."""

    async def append(self, partition: int, key: bytes, value: bytes) -> int:
        """Append one record; its offset, once it is durable (its partition's ISR has it)."""

    def read(self, partition: int, start_offset: int) -> Iterator[tuple[int, bytes, bytes | None]]:
        """(offset, key, value) of the records from `start_offset` to the end; raises
        KafkaError if this broker holds no replica of the partition."""

    async def fetch(
        self, partition: int, start_offset: int
    ) -> tuple[list[tuple[int, bytes, bytes | None]], int]:
        """(offset, key, value) of the records from `start_offset` up to the partition's high
        watermark, read from its leader wherever it is, and that high watermark; raises
        KafkaError while it cannot be read."""

    def follow(self, on_records: Callable[[int], None]) -> None:
        """Have `on_records(partition)` called when new records of a partition are readable
        here (replicated from other brokers, or appended)."""

    async def close(self) -> None:
        """Release what it holds (connections to other brokers)."""


class RemoteLogMetadataManager(abc.ABC):
    @abc.abstractmethod
    def configure(self, configs: Mapping[str, str]) -> None:
        """Receive the `rlmm.config.` properties (prefix removed)."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Load the recorded state; called once before any other call."""

    @abc.abstractmethod
    async def add_remote_log_segment_metadata(self, metadata: RemoteLogSegmentMetadata) -> None:
        """Record a new segment whose copy starts; ValueError unless COPY_SEGMENT_STARTED."""

    @abc.abstractmethod
    async def update_remote_log_segment_metadata(self, metadata: RemoteLogSegmentMetadata) -> None:
        """Record a known segment's next state; repeating the current state is a no-op.

        ValueError for an unknown segment or a move the state machine forbids.
        """

    @abc.abstractmethod
    async def put_remote_partition_delete_metadata(
        self, tip: TopicIdPartition, state: RemotePartitionDeleteState
    ) -> None:
        """Record the progress of deleting a whole partition's remote data."""

    @abc.abstractmethod
    def remote_log_segment_metadata(
        self, tip: TopicIdPartition, leader_epoch: int, offset: int
    ) -> RemoteLogSegmentMetadata | None:
        """The readable segment holding `offset` in `leader_epoch`, if any: the caller
        takes the epoch of the offset from its own lineage (its leader-epoch cache), so
        it is never given a segment of another lineage."""

    @abc.abstractmethod
    def highest_offset_for_epoch(self, tip: TopicIdPartition, leader_epoch: int) -> int | None:
        """The highest remote offset written in `leader_epoch`, if any."""

    @abc.abstractmethod
    def list_remote_log_segments(self, tip: TopicIdPartition) -> Iterator[RemoteLogSegmentMetadata]:
        """Every known segment of the partition, in any state but deleted, by start offset."""

    @abc.abstractmethod
    def readable_segments(self, tip: TopicIdPartition) -> list[RemoteLogSegmentMetadata]:
        """The COPY_SEGMENT_FINISHED segments that are read, by start offset."""

    @abc.abstractmethod
    def superseded_segments(self, tip: TopicIdPartition) -> list[RemoteLogSegmentMetadata]:
        """Finished segments wholly covered by another one: to delete, never read."""

    @abc.abstractmethod
    def remote_log_size(
        self, tip: TopicIdPartition, leader_epoch: int, lineage: Lineage | None = None
    ) -> int:
        """Bytes of the readable segments of the lineage ending in `leader_epoch` (KIP-852).

        `lineage`: the caller's leader-epoch entries, which a new leader has before the
        remote tier holds anything of its epoch; else the lineage the remote tier tells
        (`storage.remote.lineage`)."""

    @abc.abstractmethod
    def partitions(self) -> list[TopicIdPartition]:
        """Every partition with remote metadata (deleted partitions until their data is gone)."""

    @abc.abstractmethod
    def remote_partition_delete_state(
        self, tip: TopicIdPartition
    ) -> RemotePartitionDeleteState | None:
        """How far deleting the partition's remote data has come, if it was asked for."""

    def on_partition_leadership_changes(  # noqa: B027 (optional hook)
        self, leaders: Iterable[TopicIdPartition], followers: Iterable[TopicIdPartition]
    ) -> None:
        """This broker now leads or follows these partitions."""

    def on_stop_partitions(self, partitions: Iterable[TopicIdPartition]) -> None:  # noqa: B027
        """This broker no longer hosts these partitions."""

    def is_ready(self, tip: TopicIdPartition) -> bool:
        """Whether the partition's metadata is known up to what was written before this
        broker led or followed it: until then, its tiering work waits (Kafka's readiness)."""
        return True

    def require_ready(self, tip: TopicIdPartition) -> None:
        """Raise a retriable error until `is_ready`: work done on a partial view would
        upload a segment again or miss the remote tier."""
        if not self.is_ready(tip):
            raise RemoteStorageError(f"{tip}: remote log metadata not caught up yet")

    def maybe_snapshot(self) -> None:  # noqa: B027 (optional hook)
        """Persist recorded state if it is due (called periodically)."""

    async def close(self) -> None:  # noqa: B027 (optional hook)
        """Persist what needs persisting and release resources."""

    async def abandon(self) -> None:
        """Release resources, persisting nothing more: what a crash leaves behind."""
        await self.close()
