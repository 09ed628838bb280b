"""`TopicBasedRemoteLogMetadataManager`: remote-tier metadata kept in `__remote_log_metadata`.

Every change is an event appended to the partition `hash(topic id partition) %
N` of the metadata topic, then applied to the in-memory `RemoteLogMetadataCache`.
Event values are JSON::

    {"type": "segment", "metadata": {...RemoteLogSegmentMetadata.to_json()...}}
    {"type": "partition_delete", "topic_id": ..., "topic": ..., "partition": ..., "state": ...}

A snapshot file (`remote-log-metadata.snapshot` in the first log dir: the cache's
segments and delete states, and the next offset to read in each metadata
partition) is written atomically at most every `snapshot.interval.ms` and at
close, so a restart replays only the events after it, never the whole topic
from offset 0. As in Kafka, a segment is added in COPY_SEGMENT_STARTED and only
a known segment is updated, along the KIP-405 state machine; an event that breaks
this is refused before it is appended, and skipped with a warning on replay, so a
deleted segment never comes back. Not shared between tasks: the event loop
serialises calls.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from storage.checkpoints import write_atomically
from storage.remote.metadata_cache import RemoteLogMetadataCache
from storage.remote.metadata_manager import MetadataTopic, RemoteLogMetadataManager
from storage.remote.segment_metadata import (
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    RemotePartitionDeleteState,
    TopicIdPartition,
)
from storage.topic_partition import TopicPartition

log = logging.getLogger(__name__)

SNAPSHOT_FILE = "remote-log-metadata.snapshot"
SNAPSHOT_VERSION = 2
STARTED = RemoteLogSegmentState.COPY_SEGMENT_STARTED


class TopicBasedRemoteLogMetadataManager(RemoteLogMetadataManager):
    def __init__(self, topic: MetadataTopic, snapshot_dir: Path) -> None:
        self.topic = topic
        self.snapshot_path = snapshot_dir / SNAPSHOT_FILE
        self.cache = RemoteLogMetadataCache()
        self.next_offsets: dict[int, int] = {}
        self.snapshot_interval_ms = 30_000
        self.replayed_events = 0  # events read from the topic at start (after the snapshot)
        self._dirty = False
        self._last_snapshot_ms = 0.0

    def configure(self, configs: Mapping[str, str]) -> None:
        self.snapshot_interval_ms = int(
            configs.get("snapshot.interval.ms", self.snapshot_interval_ms)
        )

    # Loading -------------------------------------------------------------------------

    async def start(self) -> None:
        # Created now, as Kafka's RLMM does when it initialises: creating its partitions
        # on the first copy stalled the broker while it served produce.
        self.topic.ensure_created()
        self._load_snapshot()
        for partition in range(self.topic.num_partitions):
            for offset, _key, value in self.topic.read(
                partition, self.next_offsets.get(partition, 0)
            ):
                if value is not None:
                    self._replay(partition, offset, value)
                self.next_offsets[partition] = offset + 1
                self.replayed_events += 1
        self._dirty = self.replayed_events > 0
        log.info(
            "remote log metadata: %d partitions known, %d events replayed after the snapshot",
            len(self.cache.partitions()),
            self.replayed_events,
        )

    def _load_snapshot(self) -> None:
        try:
            data = json.loads(self.snapshot_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return
        except ValueError as e:
            log.warning("ignoring unreadable %s: %s", self.snapshot_path, e)
            return
        if data.get("version") != SNAPSHOT_VERSION:
            log.warning("ignoring %s of version %s", self.snapshot_path, data.get("version"))
            return
        self.next_offsets = {int(p): o for p, o in data["next_offsets"].items()}
        superseded = set(data["superseded"])
        for segment in data["segments"]:
            self.cache.restore(
                RemoteLogSegmentMetadata.from_json(segment), segment["segment_id"] in superseded
            )
        for d in data["partition_deletes"]:
            self._apply({"type": "partition_delete", **d})

    def _replay(self, partition: int, offset: int, value: bytes) -> None:
        try:
            self._apply(json.loads(value))
        except (ValueError, KeyError) as e:
            log.warning("skipping remote log metadata at %d:%d: %s", partition, offset, e)

    def _check(self, metadata: RemoteLogSegmentMetadata) -> None:
        """Kafka's rules: add in COPY_SEGMENT_STARTED, update only a known segment."""
        known = self.cache.contains(metadata)
        if metadata.state == STARTED and known:
            raise ValueError(f"segment {metadata.segment_id.id} is already known")
        if metadata.state != STARTED and not known:
            raise ValueError(f"segment {metadata.segment_id.id} is unknown")
        self.cache.check(metadata)

    def _apply(self, event: dict[str, Any]) -> None:
        if event["type"] == "segment":
            metadata = RemoteLogSegmentMetadata.from_json(event["metadata"])
            self._check(metadata)
            self.cache.put(metadata)
        elif event["type"] == "partition_delete":
            tip = TopicIdPartition(
                uuid.UUID(event["topic_id"]), TopicPartition(event["topic"], event["partition"])
            )
            self.cache.put_partition_delete(tip, RemotePartitionDeleteState[event["state"]])

    # Writes --------------------------------------------------------------------------

    def _partition_of(self, tip: TopicIdPartition) -> int:
        key = f"{tip.topic_id}:{tip.topic_partition.partition}".encode()
        return zlib.crc32(key) % self.topic.num_partitions

    async def _publish(self, tip: TopicIdPartition, event: dict[str, Any]) -> None:
        partition = self._partition_of(tip)
        offset = await self.topic.append(partition, str(tip).encode(), json.dumps(event).encode())
        self._apply(event)
        self.next_offsets[partition] = max(self.next_offsets.get(partition, 0), offset + 1)
        self._dirty = True

    async def add_remote_log_segment_metadata(self, metadata: RemoteLogSegmentMetadata) -> None:
        if metadata.state != STARTED:
            raise ValueError(f"a segment is added in {STARTED.name}, not {metadata.state.name}")
        await self._publish_segment(metadata)

    async def update_remote_log_segment_metadata(self, metadata: RemoteLogSegmentMetadata) -> None:
        if metadata.state == STARTED:
            raise ValueError(f"{STARTED.name} is not an update")
        await self._publish_segment(metadata)

    async def _publish_segment(self, metadata: RemoteLogSegmentMetadata) -> None:
        # A refused event never reaches the topic, so replay cannot trip over it.
        self._check(metadata)
        await self._publish(
            metadata.topic_id_partition, {"type": "segment", "metadata": metadata.to_json()}
        )

    async def put_remote_partition_delete_metadata(
        self, tip: TopicIdPartition, state: RemotePartitionDeleteState
    ) -> None:
        await self._publish(tip, {"type": "partition_delete", **_delete_json(tip, state)})

    # Reads ---------------------------------------------------------------------------

    def remote_log_segment_metadata(
        self, tip: TopicIdPartition, offset: int
    ) -> RemoteLogSegmentMetadata | None:
        return self.cache.segment_for_offset(tip, offset)

    def highest_offset_for_epoch(self, tip: TopicIdPartition, leader_epoch: int) -> int | None:
        return self.cache.highest_offset_for_epoch(tip, leader_epoch)

    def list_remote_log_segments(self, tip: TopicIdPartition) -> Iterator[RemoteLogSegmentMetadata]:
        return self.cache.all_segments(tip)

    def readable_segments(self, tip: TopicIdPartition) -> list[RemoteLogSegmentMetadata]:
        return self.cache.readable_segments(tip)

    def superseded_segments(self, tip: TopicIdPartition) -> list[RemoteLogSegmentMetadata]:
        return self.cache.superseded_segments(tip)

    def remote_log_size(self, tip: TopicIdPartition, leader_epoch: int) -> int:
        return self.cache.remote_log_size(tip, leader_epoch)

    def partitions(self) -> list[TopicIdPartition]:
        return self.cache.partitions()

    def remote_partition_delete_state(
        self, tip: TopicIdPartition
    ) -> RemotePartitionDeleteState | None:
        return self.cache.delete_state(tip)

    # Snapshots -----------------------------------------------------------------------

    def maybe_snapshot(self) -> None:
        """Write the snapshot if something changed and the interval has passed."""
        now = time.monotonic() * 1000
        if self._dirty and now - self._last_snapshot_ms >= self.snapshot_interval_ms:
            self.snapshot()

    def snapshot(self) -> None:
        segments = [
            m.to_json() for tip in self.cache.partitions() for m in self.cache.all_segments(tip)
        ]
        deletes = [
            _delete_json(tip, state)
            for tip in self.cache.partitions()
            if (state := self.cache.delete_state(tip)) is not None
        ]
        superseded = [
            str(m.segment_id.id)
            for tip in self.cache.partitions()
            for m in self.cache.superseded_segments(tip)
        ]
        document = {
            "version": SNAPSHOT_VERSION,
            "next_offsets": {str(p): o for p, o in self.next_offsets.items()},
            "segments": segments,
            "superseded": superseded,
            "partition_deletes": deletes,
        }
        write_atomically(self.snapshot_path, json.dumps(document))
        self._dirty = False
        self._last_snapshot_ms = time.monotonic() * 1000

    async def close(self) -> None:
        if self._dirty:
            self.snapshot()


def _delete_json(tip: TopicIdPartition, state: RemotePartitionDeleteState) -> dict[str, Any]:
    tp = tip.topic_partition
    return {
        "topic_id": str(tip.topic_id),
        "topic": tp.topic,
        "partition": tp.partition,
        "state": state.name,
    }
