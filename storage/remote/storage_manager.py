"""`RemoteStorageManager`: the contract of a remote-tier storage plugin (KIP-405).

A plugin stores and serves segments and their indexes; it knows nothing of
offsets or leaders. Every method may be retried: copying a segment again
overwrites it, deleting a missing one succeeds. A copy that fails must remove
what it uploaded. The plugin writes a small manifest (see `ObjectKeyLayout`)
after all other objects of a segment: readers outside the broker trust a segment
only once its manifest exists.

A plugin may also keep each partition's `PartitionIndex` beside its segments
(`write_partition_index`, `delete_partition_index`): the built-in ones do, so a
topic can be restored from the bucket alone.

A plugin counts every request it makes to its store, and the bytes each carries, on
its `meter` (`ObjectStoreMeter`, made by `__init__`: a plugin's own `__init__` calls
it), by topic and billing class; the broker shows them per topic on Prometheus and in
`tierbroker tier status --cost`.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tierbroker.storage.remote.request_meter import ObjectStoreMeter
from tierbroker.storage.remote.segment_metadata import RemoteLogSegmentMetadata, TopicIdPartition


class IndexType(enum.Enum):
    OFFSET = "index"
    TIMESTAMP = "timeindex"
    PRODUCER_SNAPSHOT = "snapshot"
    LEADER_EPOCH = "leader-epoch-checkpoint"
    TRANSACTION = "txnindex"


@dataclass(frozen=True, slots=True)
class LogSegmentData:
    """What is copied for one segment: its files, and the leader epochs it holds."""

    log_segment: Path
    offset_index: Path
    time_index: Path
    transaction_index: Path | None
    producer_snapshot_index: Path | None
    leader_epoch_index: bytes

    def indexes(self) -> dict[IndexType, Path | bytes]:
        """The indexes to copy, each a file or bytes (absent ones left out)."""
        sources: dict[IndexType, Path | bytes | None] = {
            IndexType.OFFSET: self.offset_index,
            IndexType.TIMESTAMP: self.time_index,
            IndexType.PRODUCER_SNAPSHOT: self.producer_snapshot_index,
            IndexType.TRANSACTION: self.transaction_index,
            IndexType.LEADER_EPOCH: self.leader_epoch_index,
        }
        return {t: source for t, source in sources.items() if source is not None}


class RemoteStorageError(Exception):
    """A remote call failed; `retriable` says whether trying again may help."""

    def __init__(self, message: str, retriable: bool = True) -> None:
        super().__init__(message)
        self.retriable = retriable


class RemoteResourceNotFoundError(RemoteStorageError):
    """The segment or index does not exist in the remote tier."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retriable=False)


class RemoteStorageManager(abc.ABC):
    def __init__(self) -> None:
        self.meter = ObjectStoreMeter()

    @abc.abstractmethod
    def configure(self, configs: Mapping[str, str]) -> None:
        """Receive the `rsm.config.` properties (prefix removed) and broker ids."""

    @abc.abstractmethod
    async def copy_log_segment_data(
        self, metadata: RemoteLogSegmentMetadata, data: LogSegmentData
    ) -> bytes | None:
        """Upload a segment, its indexes, and last its manifest. What it returns (KIP-917's
        custom metadata, at most `remote.log.metadata.custom.metadata.max.bytes`) is kept
        with the segment's metadata, so every later call about the segment has it."""

    @abc.abstractmethod
    async def fetch_log_segment(
        self,
        metadata: RemoteLogSegmentMetadata,
        start_position: int,
        end_position: int | None = None,
    ) -> bytes:
        """Bytes [start_position, end_position] of the segment (end inclusive, None: to the end)."""

    @abc.abstractmethod
    async def fetch_index(self, metadata: RemoteLogSegmentMetadata, index_type: IndexType) -> bytes:
        """One index of the segment, whole."""

    @abc.abstractmethod
    async def delete_log_segment_data(self, metadata: RemoteLogSegmentMetadata) -> None:
        """Remove every object of the segment; succeeds if they are already gone."""

    async def write_partition_index(self, tip: TopicIdPartition, document: bytes) -> bool:
        """Replace the partition's index (`storage.remote.partition_index`) atomically: a
        reader finds the old document or the new one, whole. False: this plugin keeps no
        index (the default), and the broker stops asking."""
        return False

    async def delete_partition_index(self, tip: TopicIdPartition) -> None:  # noqa: B027
        """Remove the partition's index (its remote data is gone); succeeds if it is absent."""

    async def check(self, timeout_s: float) -> bool:
        """Try the store once, as copies will use it (it exists, takes these credentials,
        answers), within about `timeout_s`. True if it works; if not, raise
        `RemoteStorageError` saying what to fix (the bucket or directory, and the property).
        False: this plugin has no check (the default), so the store's health is known from
        the first copy or read."""
        return False

    async def start(self) -> None:  # noqa: B027 (optional hook)
        """Open clients before the first call, so the first copy or read does not pay for it."""

    async def close(self) -> None:  # noqa: B027 (optional hook)
        """Release clients and connections."""
